"""Preemption-safe training with TorchCheckpointer: stop on SIGTERM, resume exactly.

    etrun --rdzv-id myjob --log-dir runs/ckpt examples/torch_checkpoint_resume.py --ckpt-dir runs/ckpt/ckpt
    # ... `kill -TERM <etrun pid>`: the worker saves at the next step and exits with code 75 ...
    etrun --rdzv-id myjob --log-dir runs/ckpt examples/torch_checkpoint_resume.py --ckpt-dir runs/ckpt/ckpt

The second run restores model, optimizer, LR scheduler and RNG states and the data cursor
(the coordinator's state lives in the embedded coordinator's file under --log-dir/<rdzv-id>),
and ends with parameters bitwise equal to an uninterrupted run: it prints their SHA-256.
Dropout makes the RNG state matter. One worker: with several, which rank trains on which
shard depends on timing, so only the set of samples (not their grouping) is reproducible.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

import elastictrain as et
from elastictrain_torch import ElasticDataLoader, TorchCheckpointer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--ckpt-dir", default="runs/ckpt/ckpt")
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="slow down, to leave time for a SIGTERM")
    ap.add_argument("--progress-file", default=None, help="write the current step here")
    args = ap.parse_args()

    job = et.init()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.9)
    spec = et.DatasetSpec("train", args.samples, 200, epochs=args.epochs, seed=3)
    shards = job.shards(spec)
    ckpt = TorchCheckpointer(args.ckpt_dir, model=model, optimizer=opt, scheduler=sched, shards=shards, job=job,
                             extra_state={"progress": {"step": 0, "epoch": 0}})
    ckpt.install_preemption_handler()
    info = ckpt.restore()
    step, epoch0 = ckpt.state["progress"]["step"], ckpt.state["progress"]["epoch"]
    print(f"[ckpt-demo] {'resumed from ' + info.name if info else 'fresh start'} at step {step}", flush=True)
    loader = ElasticDataLoader(TensorDataset(x, y), shards, batch_size=args.batch_size)
    model.train()
    for epoch in range(epoch0, args.epochs):
        loader.set_epoch(epoch)
        for xb, yb in loader:
            loss = nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            ckpt.state["progress"] = {"step": step, "epoch": epoch}
            if args.progress_file:  # published atomically: a reader never sees a half-written file
                with open(args.progress_file + ".tmp", "w") as f:
                    f.write(str(step))
                os.replace(args.progress_file + ".tmp", args.progress_file)
            if ckpt.preempted(step):
                print(f"[ckpt-demo] preempted: saved at step {step}, exiting {et.PREEMPTED_EXIT_CODE}", flush=True)
                shards.close(release=False)
                return et.PREEMPTED_EXIT_CODE
            if step % args.ckpt_every == 0:
                ckpt.save(step)
            time.sleep(args.step_sleep)
        ckpt.state["progress"] = {"step": step, "epoch": epoch + 1}
        ckpt.save(step)
    ckpt.wait()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"[ckpt-demo] done at step {step}; final-params-sha256: {digest}", flush=True)
    shards.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
