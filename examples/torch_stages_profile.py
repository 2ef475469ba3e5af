"""A DDP training loop annotated with et.stage, with the communication profiler attached.

Run it alone (one process, gloo on loopback) or under etrun; profile it with

    elastictrain profile -n 20 -- python examples/torch_stages_profile.py
    elastictrain profile -n 20 -- etrun --nproc-per-node 2 examples/torch_stages_profile.py
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import elastictrain as et
from elastictrain_torch import CommProfiler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--io-ms", type=float, default=2.0, help="simulated storage read per batch")
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    gen = torch.Generator().manual_seed(dist.get_rank())
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)))
    prof = CommProfiler(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        for _ in range(args.steps):
            with et.stage("load"):
                time.sleep(args.io_ms / 1000)
                x, y = torch.randn(64, 256, generator=gen), torch.randint(0, 10, (64,), generator=gen)
            with et.stage("preprocess"):
                x = (x - x.mean()) / (x.std() + 1e-6)
            with et.stage("compute"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
            with et.stage("sync"):
                opt.step()
                opt.zero_grad()
        if dist.get_rank() == 0:
            c = prof.profile()
            print(f"{c.bytes_per_iteration / 1e6:.3f} MB and {c.collectives_per_iteration:.1f} collectives per step")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
