"""Elastic DDP training on CPU (gloo) with exactly-once data and checkpoint/resume.

Run it under etrun (the README's demo command does this)::

    etrun --nproc-per-node 2 --max-restarts 3 examples/torch_ddp_elastic.py --crash-at-step 40

Every rank reads its samples from the coordinator's shards through ``ElasticDataLoader``.
Every ``--ckpt-every`` steps a ``TorchCheckpointer`` snapshots model, optimizer, RNG and
progress (rank 0 persists it in the background, atomically and checksummed) and every rank
commits its data cursor with that checkpoint. ``--crash-at-step`` kills rank 1 once,
to show a recovery: etrun restarts the group, rank 0 restores the newest committed
checkpoint, and the coordinator hands out exactly the samples that checkpoint had not seen.
The script keeps a ledger (how often each sample was trained on, saved in the checkpoint)
and checks at the end that every sample was seen exactly once per epoch.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset

import elastictrain as et
from elastictrain_torch import ElasticDataLoader, TorchCheckpointer, even_batches


class Synthetic(Dataset):
    """A fixed random classification problem: a teacher MLP labels Gaussian inputs."""

    def __init__(self, n: int, dim: int = 32, classes: int = 4, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        teacher = torch.randn(dim, classes, generator=g)
        self.y = (self.x @ teacher).argmax(dim=1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=12_000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--shard-size", type=int, default=500)
    ap.add_argument("--ckpt-dir", default="runs/demo/checkpoints")
    ap.add_argument("--ckpt-every", type=int, default=20)
    ap.add_argument("--crash-at-step", type=int, default=-1, help="rank 1 dies once at this step")
    ap.add_argument("--crash-by-sigkill", action="store_true",
                    help="rank 1 dies of SIGKILL at --crash-at-step (as the kernel's OOM killer would kill it)")
    ap.add_argument("--alloc-at-step", type=int, default=-1,
                    help="rank 1 allocates --alloc-mib MiB at this step, in every generation (for --memory-limit)")
    ap.add_argument("--alloc-mib", type=int, default=0)
    args = ap.parse_args()

    job = et.init()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    say = print if rank == 0 else (lambda *a, **k: None)
    os.makedirs(args.ckpt_dir, exist_ok=True)

    torch.manual_seed(0)
    data = Synthetic(args.samples)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    spec = et.DatasetSpec("train", args.samples, args.shard_size, epochs=args.epochs, seed=1)

    ledger = torch.zeros(args.samples, dtype=torch.int32)  # committed training passes per sample
    shards = job.shards(spec)
    ckpt = TorchCheckpointer(args.ckpt_dir, model=model.module, optimizer=opt, shards=shards, job=job,
                             extra_state={"progress": {"step": 0, "epoch": 0, "ledger": ledger}})
    info = ckpt.restore()  # the newest intact, committed checkpoint; resets the data cursor to it
    progress = ckpt.state["progress"]
    step, epoch0, ledger = progress["step"], progress["epoch"], progress["ledger"]
    if info is not None:
        say(f"[demo] generation {job.generation} ({job.restart_reason}, world size {world}): resumed from "
            f"{info.name} at step {step}, epoch {epoch0}")
    else:
        say(f"[demo] generation {job.generation}: fresh start, world size {world}")

    loader = ElasticDataLoader(data, shards, batch_size=args.batch_size)
    seen = torch.zeros(args.samples, dtype=torch.int32)  # this rank, since the last checkpoint
    loss_fn = nn.CrossEntropyLoss(reduction="sum")

    def checkpoint(epoch: int) -> None:
        nonlocal ledger
        total = seen.clone()
        dist.all_reduce(total)  # every rank's samples since the last checkpoint
        ledger = ledger + total
        seen.zero_()
        ckpt.state["progress"] = {"step": step, "epoch": epoch, "ledger": ledger}
        ckpt.save(step)  # rank 0 persists in the background; every rank commits its data cursor

    t0 = time.time()
    for epoch in range(epoch0, args.epochs):
        loader.set_epoch(epoch)
        total_loss, n = torch.zeros(2), 0
        for batch in even_batches(loader):
            x, y, idx = batch if batch is not None else (torch.empty(0, 32), torch.empty(0, dtype=torch.long),
                                                         torch.empty(0, dtype=torch.long))
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            (loss / args.batch_size).backward()
            opt.step()
            seen[idx] += 1
            total_loss += torch.tensor([loss.item(), len(y)])
            step += 1
            if step == args.alloc_at_step and rank == 1:
                big = torch.ones(args.alloc_mib * 2**20, dtype=torch.uint8)  # a memory-hungry step
                say(f"[demo] rank 1 allocated {big.numel() >> 20} MiB")
                del big
            if step == args.crash_at_step and rank == 1 and job.restart_count == 0:
                # the demo dies once its last checkpoint is committed, so that the recovery it shows
                # resumes from it: a crash that comes before a commit resumes from the one before
                ckpt.wait()
                if args.crash_by_sigkill:
                    os.kill(os.getpid(), signal.SIGKILL)
                os._exit(13)  # a worker dies without warning
            if step % args.ckpt_every == 0:
                checkpoint(epoch)
        dist.all_reduce(total_loss)
        checkpoint(epoch + 1)
        say(f"[demo] epoch {epoch}: mean loss {total_loss[0] / max(total_loss[1], 1):.4f} over "
            f"{int(total_loss[1])} samples, step {step}, {time.time() - t0:.1f} s")

    ckpt.wait()
    with torch.no_grad():
        acc = (model(data.x).argmax(1) == data.y).float().mean().item()
    if rank == 0:
        once = bool((ledger == args.epochs).all())
        print(f"[demo] done: {step} steps, accuracy {acc:.3f}; every sample trained on exactly once per "
              f"epoch: {once} (ledger min {int(ledger.min())}, max {int(ledger.max())}, expected {args.epochs})")
        if not once:
            raise SystemExit("[demo] exactly-once check FAILED")
    shards.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
