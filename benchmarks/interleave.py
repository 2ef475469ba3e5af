"""Interleaving two jobs with complementary stages in one process: alone, time-shared, with
per-resource locks, and with the Muri executor (elastictrain.runtime.interleave).

Job A is I/O-bound: its load stage waits on storage (a sleep standing for a read), its compute
stage is a short torch matmul chain. Job B is the reverse: a short load, a long compute. Both
run on CPU with one torch thread (the "GPU" here is one core). For each mode the script prints
each job's normalized throughput (iterations/s in that mode over iterations/s alone), their sum,
the sum eq. 3 predicts for the executor (each job's time alone over the interleaved iteration
time of the best ordering, from the profiles measured alone), and the ratios:

* ``interleave_vs_predicted``: measured sum / predicted sum (target >= 0.9);
* ``interleave_vs_timeshare``: measured sum / time-sharing's sum (target >= 1.3).

Baselines, measured in the same run: time-sharing (whole iterations alternate, as GPU
time-slicing does) and plain per-resource locks (a job takes a resource's lock for each stage,
with no phase order). ``--device cuda`` runs the compute stage on the GPU instead (one CUDA
context; each job on its own stream in the executor). Prints ``name: value unit``;
``--quick`` runs fewer iterations.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import elastictrain as et  # noqa: E402
from elastictrain.policies.interleaving import best_ordering  # noqa: E402
from elastictrain.runtime.interleave import GroupJob, InterleaveGroup  # noqa: E402
from elastictrain.runtime.stages import Recorder, use_recorder  # noqa: E402

RESOURCES = ("load", "compute")


class Job:
    def __init__(self, name: str, io_s: float, target_compute_s: float, device: str) -> None:
        self.name, self.io_s, self.device = name, io_s, device
        self.a = torch.randn(256, 256, device=device)
        self.reps = 1
        t = self._compute_time(8)  # calibrate the compute stage to its target length
        self.reps = max(1, round(8 * target_compute_s / t))

    def _compute_time(self, reps: int) -> float:
        self.reps = reps
        self.compute()
        t = time.perf_counter()
        for _ in range(3):
            self.compute()
        return (time.perf_counter() - t) / 3

    def compute(self) -> float:
        x = self.a
        for _ in range(self.reps):
            x = torch.tanh(x @ self.a)
        if self.device == "cuda":
            torch.cuda.current_stream().synchronize()
        return float(x[0, 0])

    def loop(self, stop: threading.Event, counts: list, i: int):
        """The training loop: iterations until ``stop`` is set; counts[i] = iterations done."""
        def run():
            s = 0.0
            while not stop.is_set():
                with et.stage("load"):
                    time.sleep(self.io_s)
                with et.stage("compute"):
                    s += self.compute()
                counts[i] += 1
            return s
        return run


class _Locks:
    """Per-resource locks as a stage gate: a stage holds its resource's lock."""

    def __init__(self) -> None:
        self.locks = {r: threading.Lock() for r in RESOURCES}

    def enter(self, stage: str) -> None:
        self.locks[stage].acquire()

    def exit(self, stage: str) -> None:
        self.locks[stage].release()


class _TimeShare:
    """Whole iterations take turns (round robin, as GPU time-slicing does)."""

    def __init__(self, n: int) -> None:
        self.cond, self.turn, self.n, self.members = threading.Condition(), 0, n, {}

    def member(self, i: int) -> "_TimeShare._Member":
        return _TimeShare._Member(self, i)

    class _Member:
        def __init__(self, ts, i):
            self.ts, self.i = ts, i

        def enter(self, stage: str) -> None:
            if stage == RESOURCES[0]:
                with self.ts.cond:
                    self.ts.cond.wait_for(lambda: self.ts.turn == self.i)

        def exit(self, stage: str) -> None:
            if stage == RESOURCES[-1]:
                with self.ts.cond:
                    self.ts.turn = (self.ts.turn + 1) % self.ts.n
                    self.ts.cond.notify_all()


def _timed(target_fns: list, seconds: float, stop: threading.Event, counts: list) -> list[float]:
    """Run the loops concurrently for ``seconds``; iterations/s of each while all ran."""
    threads = [threading.Thread(target=f, daemon=True) for f in target_fns]
    for t in threads:
        t.start()
    time.sleep(seconds * 0.2)  # warm up
    start, c0 = time.perf_counter(), list(counts)
    time.sleep(seconds)
    c1, dt = list(counts), time.perf_counter() - start
    stop.set()
    return [(b - a) / dt for a, b in zip(c0, c1)], threads


def alone(job: Job, seconds: float) -> tuple[float, dict]:
    rec = Recorder()
    stop, counts = threading.Event(), [0]

    def run():
        use_recorder(rec, None)
        job.loop(stop, counts, 0)()

    (rate,), threads = _timed([run], seconds, stop, counts)
    for t in threads:
        t.join()
    its = rec.iterations[2:]
    prof = {s: sum(it.get(s, 0.0) for it in its) / len(its) for s in RESOURCES}
    return rate, prof


def with_gate(jobs: list[Job], seconds: float, gates: list) -> list[float]:
    stop, counts = threading.Event(), [0] * len(jobs)

    def runner(i):
        def run():
            use_recorder(Recorder(), gates[i])
            jobs[i].loop(stop, counts, i)()
        return run

    rates, threads = _timed([runner(i) for i in range(len(jobs))], seconds, stop, counts)
    for t in threads:
        t.join()
    return rates


def interleaved(jobs: list[Job], seconds: float, profiles: list[dict]) -> tuple[list[float], tuple]:
    stop, counts = threading.Event(), [0] * len(jobs)
    group = InterleaveGroup([GroupJob(j.name, j.loop(stop, counts, i), p)
                             for i, (j, p) in enumerate(zip(jobs, profiles))], resources=RESOURCES)
    out: dict = {}
    runner = threading.Thread(target=lambda: out.setdefault("results", group.run(timeout=600)), daemon=True)
    rates, _ = _timed([runner.start], seconds, stop, counts)
    runner.join()
    for r in out["results"]:
        if not r.ok:
            raise RuntimeError(f"job {r.name} failed:\n{r.traceback}")
    return rates, group.offsets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--io-ms", type=float, default=20.0, help="job A's load stage (B's compute is as long)")
    ap.add_argument("--short-ms", type=float, default=5.0, help="job A's compute and B's load")
    args = ap.parse_args()
    torch.set_num_threads(1)
    seconds = 2.0 if args.quick else 8.0
    long_s, short_s = args.io_ms / 1000, args.short_ms / 1000
    jobs = [Job("io_bound", long_s, short_s, args.device), Job("compute_bound", short_s, long_s, args.device)]
    solo, profiles = zip(*(alone(j, seconds) for j in jobs))
    for j, r, p in zip(jobs, solo, profiles):
        print(f"interleave_{j.name}_alone: {1000 / r:.2f} ms/iteration")
        print(f"interleave_{j.name}_load: {1000 * p['load']:.2f} ms")
        print(f"interleave_{j.name}_compute: {1000 * p['compute']:.2f} ms")
    ts, locks = _TimeShare(len(jobs)), _Locks()
    t_best, _ = best_ordering([tuple(p[s] for s in RESOURCES) for p in profiles], len(RESOURCES))
    predicted = sum((1 / r) / t_best for r in solo)
    modes = {
        "timeshare": with_gate(jobs, seconds, [ts.member(i) for i in range(len(jobs))]),
        "locks": with_gate(jobs, seconds, [locks] * len(jobs)),
    }
    modes["interleave"], offsets = interleaved(jobs, seconds, list(profiles))
    sums = {}
    for mode, rates in modes.items():
        norm = [r / s for r, s in zip(rates, solo)]
        sums[mode] = sum(norm)
        for j, v in zip(jobs, norm):
            print(f"interleave_{mode}_{j.name}_normalized: {v:.3f} x")
        print(f"interleave_{mode}_sum: {sums[mode]:.3f} x")
    print(f"interleave_offsets: {' '.join(map(str, offsets))} slots")
    print(f"interleave_predicted_sum: {predicted:.3f} x")
    print(f"interleave_vs_predicted: {sums['interleave'] / predicted:.3f} x")
    print(f"interleave_vs_timeshare: {sums['interleave'] / sums['timeshare']:.3f} x")
    print(f"locks_vs_predicted: {sums['locks'] / predicted:.3f} x")


if __name__ == "__main__":
    main()
