"""The end of an epoch: how long ranks that ran out of data wait for the others.

A synchronous data-parallel job of W ranks (threads of this process, each with its own
ShardIterator and HTTP session) trains from a real coordinator (``elastictrain coordinator``,
SQLite). Each step every rank takes its part of the global batch from its iterator, the ranks
meet at a barrier (the all-reduce), and the step's compute is a sleep of ``--step-ms``, the same on
every rank (a straggler's smaller part is what evens its step time out, as the coordinator's
straggler shares do). A rank out of data runs empty steps until every rank is out
(``even_batches``), so the epoch lasts as long as its slowest rank's data.

Jobs: ``uniform`` (4 equal ranks) and ``straggler`` (4 ranks, one with a third of a full share,
``split_batch`` weights 1, 1, 1, 1/3). Layouts, in the same run:

* ``before`` (the baseline): every rank prefetches 2 leases regardless (``pace=False``), shards of
  ``shard_size`` (``taper=0``): the behaviour of the previous release;
* ``paced``: prefetches say what the rank holds and its rate (``pace=True``, the default), and the
  coordinator answers ``later`` to one that would leave the rank busy after the rest run dry;
* ``paced_taper<T>``: the same, with the end of each epoch in shrinking shards (``taper=T``).

Figures per job and layout: ``epoch_end_extra_steps_<job>_<layout>`` (steps over the ideal, the
global batch filled at every step; mean over the epochs after the first, whose rates are still
being measured), ``epoch_seconds_<job>_<layout>`` (wall time of those epochs, mean),
``epoch_end_idle_rank_steps_<job>_<layout>`` (steps a rank ran empty, summed over ranks),
``leases_deferred_<job>_<layout>`` (prefetches answered ``later``, per epoch),
``leases_per_epoch_<job>_<layout>`` (shards an epoch: what shrinking costs the coordinator), and ``epoch_seconds_<job>_<layout>_vs_before`` (the ratio).
``--quick``: 3 epochs of 20,000 samples instead of 5 of 40,000.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from elastictrain import CoordinatorClient, DatasetSpec  # noqa: E402
from elastictrain.coordinator.process import CoordinatorProcess  # noqa: E402
from elastictrain.runtime.batch_shares import split_batch  # noqa: E402
from elastictrain.runtime.shards import ShardIterator  # noqa: E402


def run_job(url: str, token: str, name: str, spec: DatasetSpec, parts: list[int], pace: bool,
            step_s: float) -> list[dict]:
    """Per epoch: steps, idle rank-steps, seconds, leases, deferred prefetches."""
    world = len(parts)
    admin = CoordinatorClient(url, token, retry_for=30.0)
    admin.create_job(name, 1, world)
    gen = admin.open_generation(name, 0, world, "start").generation
    admin.register_dataset(name, spec)
    iters = [ShardIterator(CoordinatorClient(url, token, retry_for=30.0), name, spec, generation=gen, worker=r,
                           register=False, pace=pace) for r in range(world)]
    got = [0] * world
    barrier = threading.Barrier(world, timeout=120)  # a failed rank breaks it
    recs: list[list[dict]] = [[] for _ in range(world)]

    def rank(r: int) -> None:
        it = iters[r]
        for epoch in range(spec.epochs):
            it.set_max_epoch(epoch)
            samples = it.samples()
            deferred0 = it.deferred
            steps = idle = 0
            barrier.wait()
            t0 = time.perf_counter()
            while True:
                n = 0
                for _ in range(parts[r]):
                    if next(samples, None) is None:
                        break
                    n += 1
                got[r] = n
                barrier.wait()
                total = sum(got)
                barrier.wait()  # every rank has read this step's counts
                if not total:
                    break
                steps += 1
                idle += n == 0
                time.sleep(step_s)
            recs[r].append({"steps": steps, "idle": idle, "seconds": time.perf_counter() - t0,
                            "deferred": it.deferred - deferred0})

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for it in iters:
        it.close()
    if any(len(rs) != spec.epochs for rs in recs):
        raise SystemExit(f"job {name}: a rank failed (see above)")
    out = [dict(recs[0][e], idle=sum(rs[e]["idle"] for rs in recs), deferred=sum(rs[e]["deferred"] for rs in recs))
           for e in range(spec.epochs)]
    admin.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shard-size", type=int, default=500)
    ap.add_argument("--batch", type=int, default=256, help="global batch")
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--taper", type=int, default=8)
    args = ap.parse_args()
    samples, epochs = (20_000, 3) if args.quick else (40_000, 5)
    jobs = {"uniform": [1.0] * 4, "straggler": [1.0, 1.0, 1.0, 1 / 3]}
    layouts = {"before": (0, False), "paced": (0, True), f"paced_taper{args.taper}": (args.taper, True)}
    with tempfile.TemporaryDirectory() as tmp, CoordinatorProcess(
            os.path.join(tmp, "c.db"), os.path.join(tmp, "token"), log_file=os.path.join(tmp, "coordinator.log")) as proc:
        print(f"# coordinator {proc.url}; {samples} samples an epoch, shards of {args.shard_size}, global batch "
              f"{args.batch}, {args.step_ms:g} ms a step, prefetch 2, {epochs} epochs (the first not counted)")
        for job, weights in jobs.items():
            parts = split_batch(args.batch, weights)
            ideal = -(-samples // args.batch)
            print(f"epoch_steps_{job}_ideal: {ideal} steps  # parts {parts}")
            secs = {}
            for layout, (taper, pace) in layouts.items():
                spec = DatasetSpec("train", samples, args.shard_size, epochs=epochs, seed=1, taper=taper)
                recs = run_job(proc.url, proc.token, f"{job}-{layout}", spec, parts, pace, args.step_ms / 1000)[1:]
                mean = lambda k: statistics.fmean(r[k] for r in recs)  # noqa: E731
                secs[layout] = mean("seconds")
                print(f"epoch_end_extra_steps_{job}_{layout}: {mean('steps') - ideal:.1f} steps")
                print(f"epoch_seconds_{job}_{layout}: {secs[layout]:.3f} s")
                print(f"epoch_end_idle_rank_steps_{job}_{layout}: {mean('idle'):.1f} rank-steps")
                print(f"leases_deferred_{job}_{layout}: {mean('deferred'):.1f} per epoch")
                print(f"leases_per_epoch_{job}_{layout}: {spec.shards_per_epoch} leases")
            for layout in layouts:
                if layout != "before":
                    print(f"epoch_seconds_{job}_{layout}_vs_before: {secs[layout] / secs['before']:.3f} x")


if __name__ == "__main__":
    main()
