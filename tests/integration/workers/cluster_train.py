"""A real, preemptible data-parallel training job for the cluster tests (gloo DDP on CPU).

Every step each rank trains a small MLP on its batch from the coordinator's exactly-once shards,
and the ranks all-gather the sample indices of the step, so every replica keeps the same
ledger (how often each sample was trained on) as part of the checkpointed state. SIGTERM (a
preemption) makes every rank stop at the same step, save, and exit with the preempted code; a
new run restores the newest committed checkpoint (model, optimizer, ledger, data cursor).

At the end rank 0 writes ``--out``: the ledger's min/max, the steps, and the restart reasons
seen, so a test can check that every sample was trained on exactly once per epoch.
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
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    spec = et.DatasetSpec("train", args.samples, 100, epochs=args.epochs, seed=5)
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
    for epoch in range(epoch0, args.epochs):
        loader.set_epoch(epoch)
        for batch in even_batches(loader):
            idx = pad.clone()
            if batch is not None:
                xb, yb, ib = batch
                loss = nn.functional.cross_entropy(model(xb), yb)
                idx[:len(ib)] = ib
            else:
                loss = sum(p.sum() for p in model.parameters()) * 0.0  # keeps DDP's collectives in step
            opt.zero_grad()
            loss.backward()
            opt.step()
            every = [torch.empty_like(idx) for _ in range(world)]
            dist.all_gather(every, idx)
            got = torch.cat(every)
            got = got[got >= 0]
            ledger[epoch].index_add_(0, got, torch.ones_like(got, dtype=torch.int32))
            step += 1
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
               "reasons": reasons, "world": world, "finished_at": time.time()}
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
