"""An elastic Horovod script (``hvd.elastic.run``), unmodified, to run under etrun:

    etrun --nproc-per-node 2 --max-restarts 3 examples/horovod_elastic.py --steps 200
    # kill -9 one worker: the other keeps its process (Horovod's in-process recovery), rolls back
    # to its last commit and goes on with a replacement that etrun starts for the dead one

etrun serves the rendezvous Horovod's elastic mode calls: after a failure each survivor asks for
its place in the next generation (``rank_and_size``), which the agent answers from the generation
the coordinator formed. ``--events FILE`` appends ``time rank size pid step`` per step.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import horovod.torch as hvd
import torch
import torch.nn as nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--commit-every", type=int, default=5)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--events", default=None)
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02),
                                   named_parameters=model.named_parameters())
    w = torch.arange(16, dtype=torch.float32) / 16
    events = open(args.events, "a", buffering=1) if args.events else None

    @hvd.elastic.run
    def train(state) -> None:
        while state.step < args.steps:
            g = torch.Generator().manual_seed(state.step * 1000 + hvd.rank())
            x = torch.randn(args.batch_size, 16, generator=g)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), (x @ w).unsqueeze(1)).backward()
            opt.step()
            state.step += 1
            if events:
                events.write(f"{time.time():.6f} {hvd.rank()} {hvd.size()} {os.getpid()} {state.step}\n")
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if state.step % args.commit_every == 0:
                state.commit()

    state = hvd.elastic.TorchState(model, opt, step=0)
    train(state)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
    print(f"rank {hvd.rank()} of {hvd.size()} pid {os.getpid()} step {state.step} params {digest}", flush=True)


if __name__ == "__main__":
    main()
