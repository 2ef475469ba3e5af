"""A plain Horovod PyTorch training script (nothing of elastictrain in it), to run under etrun:

    etrun --nproc-per-node 2 examples/horovod_train.py --steps 50

etrun gives each worker the environment horovodrun would (HOROVOD_RANK, HOROVOD_SIZE, ...,
HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT) and serves the gloo rendezvous. At the end every rank prints a
digest of its parameters; they must be equal.
"""

from __future__ import annotations

import argparse
import hashlib

import horovod.torch as hvd
import torch
import torch.nn as nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(1234 + hvd.rank())  # different initial weights: the broadcast must fix them
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    g = torch.Generator().manual_seed(hvd.rank())
    w = torch.arange(16, dtype=torch.float32) / 16
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 16, generator=g)
        y = (x @ w).unsqueeze(1)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if step % 10 == 0:
            mean = hvd.allreduce(loss.detach(), name="loss").item()  # a collective: every rank calls it
            if hvd.rank() == 0:
                print(f"step {step} loss {mean:.4f}", flush=True)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
    print(f"rank {hvd.rank()} of {hvd.size()} (local {hvd.local_rank()} of {hvd.local_size()}) params {digest}",
          flush=True)


if __name__ == "__main__":
    main()
