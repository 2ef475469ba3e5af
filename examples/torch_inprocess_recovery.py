"""In-process recovery: when a worker dies, the survivors keep their process.

    etrun --nproc-per-node 2 --max-restarts 20 examples/torch_inprocess_recovery.py
    # kill -9 one worker: etrun starts a warm replacement for it alone; the other worker keeps its
    # process, model and optimizer, joins the new process group and goes on from the last checkpoint

The training function is wrapped by ``elastic.run(ckpt)`` (Horovod Elastic's ``hvd.elastic.run``
is the model) and builds its DDP wrapper from the group it is given, since every recovery gives
it a new one. The checkpoint holds a ledger of how often each sample was trained on; at the end
rank 0 checks that every sample was trained on exactly once per epoch, and every rank prints a
digest of its parameters (they must be equal).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset

import elastictrain as et
from elastictrain_torch import ElasticDataLoader, TorchCheckpointer, elastic, even_batches


class Synthetic(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 32, generator=g)
        self.y = (self.x[:, :4].sum(1) > 0).long() + 2 * (self.x[:, 4] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--ckpt-dir", default="checkpoints")
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (to give a harness time)")
    ap.add_argument("--events", default=None, help="append 'time rank generation pid step' per step here")
    args = ap.parse_args()

    job = et.init()
    torch.manual_seed(0)
    data = Synthetic(args.samples)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    shards = job.shards(et.DatasetSpec("train", args.samples, 256, epochs=args.epochs, seed=1))
    ledger = torch.zeros(args.samples, dtype=torch.int32)  # committed training passes per sample
    ckpt = TorchCheckpointer(args.ckpt_dir, model=model, optimizer=opt, shards=shards, job=job,
                             extra_state={"progress": {"step": 0, "epoch": 0, "ledger": ledger}})
    loader = ElasticDataLoader(data, shards, batch_size=args.batch_size)
    events = open(args.events, "a", buffering=1) if args.events else None

    @elastic.run(ckpt)
    def train(group) -> int:
        ddp = DDP(model, process_group=group)  # a new group after every recovery: wrap again
        progress = ckpt.state["progress"]
        step, epoch0, ledger = progress["step"], progress["epoch"], progress["ledger"]
        print(f"[inproc] rank {job.rank} pid {os.getpid()} generation {job.generation} ({job.restart_reason}) "
              f"at step {step}", flush=True)
        seen = torch.zeros(args.samples, dtype=torch.int32)  # this rank, since the last checkpoint
        loss_fn = nn.CrossEntropyLoss(reduction="sum")

        def checkpoint(epoch: int) -> None:
            nonlocal ledger
            total = seen.clone()
            dist.all_reduce(total, group=group)
            ledger = ledger + total
            seen.zero_()
            ckpt.state["progress"] = {"step": step, "epoch": epoch, "ledger": ledger}
            ckpt.save(step)

        for epoch in range(epoch0, args.epochs):
            loader.set_epoch(epoch)
            for batch in even_batches(loader, group):
                x, y, idx = batch if batch is not None else (torch.empty(0, 32), torch.empty(0, dtype=torch.long),
                                                             torch.empty(0, dtype=torch.long))
                loss = loss_fn(ddp(x), y)
                opt.zero_grad()
                (loss / args.batch_size).backward()
                opt.step()
                seen[idx] += 1
                step += 1
                if events is not None:
                    events.write(f"{time.time():.6f} {job.rank} {job.generation} {os.getpid()} {step}\n")
                if step % args.ckpt_every == 0:
                    checkpoint(epoch)
                time.sleep(args.step_sleep)
            checkpoint(epoch + 1)
        ckpt.wait()
        if job.rank == 0:
            once = bool((ledger == args.epochs).all())
            print(f"[inproc] done at step {step}; every sample trained on exactly once per epoch: {once} "
                  f"(ledger min {int(ledger.min())}, max {int(ledger.max())})", flush=True)
        return step

    step = train()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"[inproc] rank {job.rank} pid {os.getpid()} final-params-sha256: {digest} (step {step})", flush=True)
    shards.close()


if __name__ == "__main__":
    main()
