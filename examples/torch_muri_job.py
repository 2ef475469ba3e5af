"""A preemptible job with a chosen stage profile, for the Muri scheduler (cluster mode).

    elastictrain submit --gpus 1 --steps 200 -- examples/torch_muri_job.py --steps 200 \
        --load-ms 40 --compute-ms 10 --ckpt-dir /abs/ckpt-a --out /abs/a.json

It runs the same alone and inside a group task (`etrun --group`, which the scheduler starts when
it interleaves jobs): its process group comes from ``elastictrain_torch.init_process_group()``,
its randomness from its own generators, and its paths should be absolute (grouped jobs share one
working directory). Each step has four stages, in Muri's four resources:

* ``load``: waits ``--load-ms`` (storage I/O: the CPU is free);
* ``preprocess``: ``--cpu-ms`` of busy CPU work (augmentation);
* ``compute``: a small forward/backward, then waits ``--compute-ms`` (the GPU's time: on a GPU
  the host is free while kernels run, which the wait stands in for on a CPU-only machine);
* ``sync``: the DDP all-reduce and the optimizer step, then waits ``--sync-ms`` (the network).

With ``--straggle-at``, the ranks of the node whose agent has ``ET_STRAGGLER=1`` (or, in cluster
mode, of the node ``--straggle-node`` names) turn slow at that step (the straggler tests and
benchmark). With ``--uneven`` each rank asks for its part of the
global batch (``--batch`` x world) every step (``job.local_batch``), scales its loss by the factor
that comes with it, and its compute time is per sample: the coordinator can then give a
straggler fewer samples instead of replacing its node. Samples come from the coordinator's exactly-once shards; every rank keeps a ledger of the samples
trained (all-gathered), checkpointed with the model. At the end rank 0 writes ``--out`` with the
ledger's min/max (1 and 1: exactly once), the steps, and the restart reasons seen.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import elastictrain as et
from elastictrain.runtime import jobctx
from elastictrain_torch import TorchCheckpointer, init_process_group


def busy(ms: float, w: torch.Tensor) -> None:
    """``ms`` of CPU work in torch ops (which release the GIL, as real augmentation does)."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        torch.tanh(w @ w)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100, help="the steps of one epoch at the starting world size")
    ap.add_argument("--samples", type=int, default=0, help="dataset size (default: 8 per step per worker)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--load-ms", type=float, default=5.0)
    ap.add_argument("--cpu-ms", type=float, default=0.0)
    ap.add_argument("--compute-ms", type=float, default=5.0)
    ap.add_argument("--sync-ms", type=float, default=0.0)
    ap.add_argument("--ckpt-every", type=int, default=20)
    ap.add_argument("--straggle-at", type=int, default=-1,
                    help="from this step, where ET_STRAGGLER=1 is set (one node's agent), compute takes "
                    "--straggle-factor times longer (a slow GPU)")
    ap.add_argument("--straggle-factor", type=float, default=3.0)
    ap.add_argument("--straggle-node", default=None, help="(cluster mode) the ranks on this node straggle, not "
                    "those of the agent with ET_STRAGGLER=1")
    ap.add_argument("--uneven", action="store_true",
                    help="take this rank's part of the global batch from job.local_batch() every step; "
                    "--compute-ms is then per --batch samples")
    ap.add_argument("--fail-in-group-at", type=int, default=-1,
                    help="raise at this step when running interleaved with other jobs (failure isolation)")
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    job = et.init()
    torch.set_num_threads(1)
    pg = init_process_group("gloo")
    rank, world = dist.get_rank(pg), dist.get_world_size(pg)
    samples = args.samples or args.steps * args.batch * world
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(samples, 16, generator=gen)
    y = (x[:, :3].sum(1) > 0).long()
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model = DDP(net, process_group=pg)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    shards = job.shards(et.DatasetSpec("train", samples, args.batch * 4, epochs=1, seed=3))
    ledger = torch.zeros(samples, dtype=torch.int32)
    # rng=False: it draws no random numbers while it trains (its data order is the shards'); grouped,
    # the global generators are the group's, not its own
    ckpt = TorchCheckpointer(args.ckpt_dir, model=net, optimizer=opt, shards=shards, job=job, rng=False,
                             extra_state={"progress": {"step": 0, "ledger": ledger, "reasons": []}})
    ckpt.install_preemption_handler()
    info = ckpt.restore()
    progress = ckpt.state["progress"]
    step, ledger = progress["step"], progress["ledger"]
    reasons = list(progress["reasons"]) + [f"{job.restart_reason}@{step}"]
    print(f"[muri-job] generation {job.generation} ({job.restart_reason}), world {world}, "
          f"{'resumed from ' + info.name if info else 'fresh start'} at step {step}", flush=True)
    straggler = os.environ.get("ET_STRAGGLER") == "1" or \
        (args.straggle_node is not None and args.straggle_node == os.environ.get("ET_NODE_NAME"))
    it = iter(shards)
    work = torch.randn(64, 64, generator=gen) / 8
    pad = torch.full((args.batch * world if args.uneven else args.batch,), -1, dtype=torch.long)
    while True:  # until every rank is out of data (a rank may run dry first after a restart or a resize)
        part, scale = job.local_batch(args.batch * world, step) if args.uneven else (args.batch, 1.0)
        with et.stage("load"):
            idx = [i for _, i in zip(range(part), it)]
            time.sleep(args.load_ms / 1000)
        with et.stage("preprocess"):
            busy(args.cpu_ms, work)
            ib = torch.tensor(idx, dtype=torch.long)
            xb, yb = x[ib], y[ib]
        with et.stage("compute"):
            loss = nn.functional.cross_entropy(model(xb), yb) * scale if len(idx) else model(x[:1]).sum() * 0
            loss.backward()
            slow = args.straggle_factor if 0 <= args.straggle_at <= step and straggler else 1.0
            per = len(idx) / args.batch if args.uneven else 1.0  # (uneven: the GPU's time is per sample)
            time.sleep(args.compute_ms * slow * per / 1000)
        with et.stage("sync"):
            opt.step()
            opt.zero_grad()
            got = pad.clone()
            got[:len(ib)] = ib
            every = [torch.empty_like(got) for _ in range(world)]
            dist.all_gather(every, got, group=pg)
            got = torch.cat(every)
            got = got[got >= 0]
            if len(got) == 0:
                break  # no rank had a sample: the epoch is over
            ledger.index_add_(0, got, torch.ones_like(got, dtype=torch.int32))
            time.sleep(args.sync_ms / 1000)
        step += 1
        job.report_step(step)  # (cheap; the monitor's step and busy times, the scheduler's progress)
        if step == args.fail_in_group_at and jobctx.current() is not None:
            raise RuntimeError(f"injected failure at step {step}, inside a group")
        ckpt.state["progress"] = {"step": step, "ledger": ledger, "reasons": reasons}
        if ckpt.preempted(step):
            print(f"[muri-job] preempted at step {step}: saved, exiting {et.PREEMPTED_EXIT_CODE}", flush=True)
            shards.close(release=False)
            return et.PREEMPTED_EXIT_CODE
        if step % args.ckpt_every == 0:
            ckpt.save(step)
    ckpt.save(step)
    ckpt.wait()
    if rank == 0:
        out = {"steps": step, "min": int(ledger.min()), "max": int(ledger.max()), "reasons": reasons,
               "world": world, "finished_at": time.time()}
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f)
        os.replace(tmp, args.out)
        print(f"[muri-job] done: {step} steps, ledger min {out['min']} max {out['max']}", flush=True)
    shards.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
