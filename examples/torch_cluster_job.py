"""A preemptible data-parallel training job for the scheduler (gloo DDP on CPU; CUDA untouched).

    elastictrain submit --gpus 2 -- examples/torch_cluster_job.py --epochs 3 --ckpt-dir ckpt --out result.json

(or under ``etrun`` directly). What makes a script schedulable, i.e. preemptible and resumable
with nothing lost or repeated:

* data from the coordinator's exactly-once shards (``job.shards`` + ``ElasticDataLoader``);
* a ``TorchCheckpointer`` with the shards attached and ``install_preemption_handler()``: on the
  scheduler's SIGTERM, ``ckpt.preempted(step)`` makes every rank stop at the same step, save,
  and commit the data cursor; the script then exits with ``et.PREEMPTED_EXIT_CODE`` (75);
* ``ckpt.restore()`` at start: a resumed run (``ET_RESTART_REASON=preempt``) continues from the
  newest committed checkpoint, model, optimizer, data cursor and all. The checkpointer also
  reports the training step, from which the scheduler measures iteration time and progress.

Every step the ranks also all-gather the indices of the samples they trained on, so every replica
keeps the same ledger (how often each sample was seen) in the checkpointed state; at the end
rank 0 writes ``--out`` with the ledger's min/max per epoch (1 and 1: exactly once), the steps,
and the restart reasons seen.
"""

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset

import elastictrain as et
from elastictrain_torch import ElasticDataLoader, TorchCheckpointer, even_batches


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=1200)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--hidden", type=int, default=16, help="the model's width (larger: more compute per sample)")
    ap.add_argument("--shard-size", type=int, default=100, help="samples per data shard (lease)")
    ap.add_argument("--cpu-work", type=int, default=0,
                    help="CPU work per step (matmuls of 256x256, no parameters): a CPU-bound input pipeline")
    ap.add_argument("--spike-mib", type=int, default=0,
                    help="rank 0 briefly needs this much more memory every --spike-every steps (a memory spike)")
    ap.add_argument("--spike-every", type=int, default=100)
    ap.add_argument("--spike-min-world", type=int, default=1,
                    help="spike only while the job runs with at least this many workers (memory that grows at scale)")
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    job = et.init()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 8, generator=g)
    y = (x[:, :2].sum(1) > 0).long()
    model = DDP(nn.Sequential(nn.Linear(8, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                              nn.Linear(args.hidden, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    spec = et.DatasetSpec("train", args.samples, args.shard_size, epochs=args.epochs, seed=5)
    shards = job.shards(spec)
    ledger = torch.zeros(args.epochs, args.samples, dtype=torch.int32)
    reasons: list = []
    ckpt = TorchCheckpointer(args.ckpt_dir, model=model.module, optimizer=opt, shards=shards, job=job,
                             extra_state={"progress": {"step": 0, "epoch": 0, "ledger": ledger, "reasons": reasons}})
    ckpt.install_preemption_handler()
    info = ckpt.restore()
    progress = ckpt.state["progress"]
    step, epoch0, ledger = progress["step"], progress["epoch"], progress["ledger"]
    reasons = list(progress["reasons"]) + [f"{job.restart_reason}@{step}"]
    print(f"[train] generation {job.generation} ({job.restart_reason}), world {world}, "
          f"{'resumed from ' + info.name if info else 'fresh start'} at step {step}", flush=True)
    loader = ElasticDataLoader(TensorDataset(x, y, torch.arange(args.samples)), shards, batch_size=args.batch)
    pad = torch.full((args.batch,), -1, dtype=torch.long)
    work = torch.randn(256, 256, generator=g) / 16
    for epoch in range(epoch0, args.epochs):
        loader.set_epoch(epoch)
        for batch in even_batches(loader):
            idx = pad.clone()
            # a rank out of data still runs an (empty) step, so DDP's allreduce stays in step
            xb, yb, ib = batch if batch is not None else (x[:0], y[:0], torch.arange(0))
            w = work
            for _ in range(args.cpu_work):  # augmentation-like CPU work on the batch's way in
                w = torch.tanh(w @ work)
            loss = nn.functional.cross_entropy(model(xb), yb, reduction="sum") / args.batch
            idx[:len(ib)] = ib
            opt.zero_grad()
            loss.backward()
            opt.step()
            every = [torch.empty_like(idx) for _ in range(world)]
            dist.all_gather(every, idx)
            got = torch.cat(every)
            got = got[got >= 0]
            ledger[epoch].index_add_(0, got, torch.ones_like(got, dtype=torch.int32))
            step += 1
            if args.spike_mib and rank == 0 and world >= args.spike_min_world and step % args.spike_every == 0:
                spike = torch.ones(args.spike_mib << 20, dtype=torch.uint8)  # touched: resident
                del spike
            ckpt.state["progress"] = {"step": step, "epoch": epoch, "ledger": ledger, "reasons": reasons}
            if ckpt.preempted(step):
                print(f"[train] preempted at step {step}: saved, exiting {et.PREEMPTED_EXIT_CODE}", flush=True)
                shards.close(release=False)
                return et.PREEMPTED_EXIT_CODE
            if step % args.ckpt_every == 0:
                ckpt.save(step)
            time.sleep(args.step_sleep)
        ckpt.state["progress"] = {"step": step, "epoch": epoch + 1, "ledger": ledger, "reasons": reasons}
        ckpt.save(step)
    ckpt.wait()
    if rank == 0:
        out = {"steps": step, "min": int(ledger.min()), "max": int(ledger.max()), "epochs": args.epochs,
               "reasons": reasons, "world": world, "finished_at": time.time(),
               "memory_limit": os.environ.get("ET_MEMORY_LIMIT")}  # the last run's per-worker limit, if any
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f)
        os.replace(tmp, args.out)
        print(f"[train] done: {step} steps, ledger min {out['min']} max {out['max']}", flush=True)
    shards.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
