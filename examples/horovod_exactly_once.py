"""Elastic Horovod with elastictrain's exactly-once data and durable commits:

    etrun --nproc-per-node 2 --max-restarts 3 examples/horovod_exactly_once.py
    # kill -9 one worker: the survivor keeps its process (hvd.elastic.run), both ranks go on from
    # the last committed checkpoint, and every sample is still trained on exactly once per epoch

``elastictrain_torch.horovod.State`` is the ``hvd.elastic.State``: its commit is a checkpoint with
the data cursor. The checkpoint holds a ledger of how often each sample was trained on; at the
end rank 0 checks that every sample was trained on exactly once per epoch, and every rank prints
a digest of its parameters (they must be equal). ``--events FILE`` appends
``time rank generation pid step`` per step.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import horovod.torch as hvd
import torch
import torch.nn as nn
from torch.utils.data import Dataset

import elastictrain as et
from elastictrain_torch import ElasticDataLoader, TorchCheckpointer
from elastictrain_torch import horovod as et_hvd


class Synthetic(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 32, generator=g)
        self.y = (self.x[:, :4].sum(1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--commit-every", type=int, default=10)
    ap.add_argument("--ckpt-dir", default="checkpoints")
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--events", default=None)
    args = ap.parse_args()

    hvd.init()
    job = et.init()
    torch.manual_seed(0)
    data = Synthetic(args.samples)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    shards = job.shards(et.DatasetSpec("train", args.samples, 256, epochs=args.epochs, seed=1))
    ckpt = TorchCheckpointer(args.ckpt_dir, model=model, optimizer=opt, shards=shards, job=job,
                             extra_state={"progress": {"step": 0, "epoch": 0,
                                                       "ledger": torch.zeros(args.samples, dtype=torch.int32)}})
    state = et_hvd.State(ckpt, model, opt)
    comm = et_hvd.HorovodCommProfiler(opt, model)  # Horovod's allreduce times, in our comm profile
    loader = ElasticDataLoader(data, shards, batch_size=args.batch_size)
    events = open(args.events, "a", buffering=1) if args.events else None
    loss_fn = nn.CrossEntropyLoss(reduction="sum")

    @hvd.elastic.run
    def train(state) -> int:
        progress = ckpt.state["progress"]
        step, epoch0, ledger = progress["step"], progress["epoch"], progress["ledger"]
        seen = torch.zeros(args.samples, dtype=torch.int32)  # this rank, since the last commit

        def commit(epoch: int) -> None:
            nonlocal ledger
            ledger = ledger + hvd.allreduce(seen, op=hvd.Sum, name="ledger")
            seen.zero_()
            ckpt.state["progress"] = {"step": step, "epoch": epoch, "ledger": ledger}
            state.commit(step)

        for epoch in range(epoch0, args.epochs):
            loader.set_epoch(epoch)
            for batch in et_hvd.even_batches(loader):
                x, y, idx = batch if batch is not None else (torch.empty(0, 32), torch.empty(0, dtype=torch.long),
                                                             torch.empty(0, dtype=torch.long))
                opt.zero_grad()
                (loss_fn(model(x), y) / args.batch_size).backward()
                opt.step()
                seen[idx] += 1
                step += 1
                if events is not None:
                    events.write(f"{time.time():.6f} {hvd.rank()} {job.generation} {os.getpid()} {step}\n")
                if step % args.commit_every == 0:
                    commit(epoch)
                time.sleep(args.step_sleep)
            commit(epoch + 1)
        ckpt.wait()
        if hvd.rank() == 0:
            once = bool((ledger == args.epochs).all())
            print(f"[hvd] done at step {step}; every sample trained on exactly once per epoch: {once} "
                  f"(ledger min {int(ledger.min())}, max {int(ledger.max())})", flush=True)
        return step

    step = train(state)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
    print(f"[hvd] rank {hvd.rank()} pid {os.getpid()} params {digest} (step {step})", flush=True)
    p = comm.profile()
    print(f"[hvd] rank {hvd.rank()} comm: {p.iterations} iterations, {p.collectives_per_iteration:.1f} allreduces and "
          f"{p.bytes_per_iteration:.0f} bytes per iteration, {p.seconds_per_iteration * 1e3:.3f} ms", flush=True)
    shards.close()


if __name__ == "__main__":
    main()
