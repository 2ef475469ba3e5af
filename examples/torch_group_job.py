"""A small DDP job that runs the same alone (python, torchrun, etrun) and interleaved with
others in one process (`etrun --group`): it takes its process group from
elastictrain_torch.init_process_group() and its randomness from its own torch.Generator.

    etrun --nproc-per-node 2 examples/torch_group_job.py --seed 1
    etrun --nproc-per-node 2 --group examples/torch_group_job.py --seed 1 --io-ms 8 : \
        examples/torch_group_job.py --seed 2 --compute 6

With --shards, each worker takes its batches from the coordinator's exactly-once shards (the
job's dataset is named <job>.train inside a group) and prints which samples it trained on.
With --ckpt DIR it checkpoints its model, optimizer, step and its own generator (rng=gen: the
global generators are shared by a group's jobs), exits 75 when preempted (SIGTERM) and resumes
from DIR; --noise adds input noise drawn from that generator at every step, so a resume that
lost the generator's state would end with other parameters.
"""

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import elastictrain as et
from elastictrain_torch import init_process_group


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--io-ms", type=float, default=2.0, help="simulated storage wait per batch (load stage)")
    ap.add_argument("--compute", type=int, default=1, help="forward/backward passes per step (compute stage)")
    ap.add_argument("--fail-at", type=int, default=-1, help="raise at this step (to test failure isolation)")
    ap.add_argument("--fail-rank", type=int, default=-1, help="only this rank fails (-1: every rank)")
    ap.add_argument("--shards", type=int, default=0, help="train on this many samples leased from the coordinator")
    ap.add_argument("--ckpt", default="", help="checkpoint into (and resume from) this directory")
    ap.add_argument("--ckpt-every", type=int, default=5, help="steps between checkpoints (with --ckpt)")
    ap.add_argument("--noise", type=float, default=0.0, help="input noise from the job's own generator, per step")
    args = ap.parse_args()
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533"), ("RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    torch.set_num_threads(1)
    pg = init_process_group("gloo")
    rank, world = dist.get_rank(pg), dist.get_world_size(pg)
    gen = torch.Generator().manual_seed(args.seed)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 4))
    with torch.no_grad():  # initialized from the job's own generator, not the shared global RNG
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model = DDP(net, process_group=pg)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data_x = torch.randn(4096, 64, generator=gen)
    data_y = torch.randint(0, 4, (4096,), generator=gen)
    seen: list[int] = []
    if args.shards:
        job = et.init()
        shards = job.shards(et.DatasetSpec("train", num_samples=args.shards, shard_size=16, seed=args.seed))
        indices = iter(shards)

    ckpt, start = None, 0
    if args.ckpt:
        from elastictrain_torch import TorchCheckpointer

        # rng=gen: this job's own generator (its noise), not the process's global ones
        ckpt = TorchCheckpointer(args.ckpt, model=net, optimizer=opt, rng=gen, extra_state={"progress": {"step": 0}})
        ckpt.install_preemption_handler()
        if ckpt.restore() is not None:
            start = ckpt.state["progress"]["step"]
            print(f"[group-job seed={args.seed} rank={rank}] resumed at step {start}", flush=True)
    try:
        if not train(args, model, opt, data_x, data_y, rank, world, seen, indices if args.shards else None,
                     gen, ckpt, start):
            return et.PREEMPTED_EXIT_CODE
    finally:
        dist.destroy_process_group()  # inside etrun --group the runner owns the groups: a no-op there
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in net.parameters())).hexdigest()
    print(f"[group-job seed={args.seed} rank={rank}] final-params-sha256: {digest}", flush=True)
    if args.shards:
        shards.close()
        print(f"[group-job seed={args.seed} rank={rank}] samples: {' '.join(map(str, seen))}", flush=True)
    return 0


def train(args, model, opt, data_x, data_y, rank, world, seen, indices, gen, ckpt, start) -> bool:
    """Trains from step ``start``; False if preempted (saved)."""
    for step in range(start, args.steps):
        with et.stage("load"):
            time.sleep(args.io_ms / 1000)
            if args.shards:
                idx = [i for _, i in zip(range(16), indices)]
                seen.extend(idx)
                idx = idx or [0]
            else:
                base = (step * world + rank) * 16 % 4096
                idx = list(range(base, base + 16))
            x, y = data_x[idx], data_y[idx]
            if args.noise:
                x = x + args.noise * torch.randn(x.shape, generator=gen)
        if step == args.fail_at and args.fail_rank in (-1, rank):
            raise RuntimeError(f"injected failure at step {step} on rank {rank}")
        with et.stage("compute"):
            for _ in range(args.compute):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
        with et.stage("sync"):
            opt.step()
            opt.zero_grad()
        if ckpt is not None:
            ckpt.state["progress"]["step"] = step + 1
            if ckpt.preempted(step + 1):
                print(f"[group-job seed={args.seed} rank={rank}] preempted: saved at step {step + 1}", flush=True)
                return False
            if (step + 1) % args.ckpt_every == 0:
                ckpt.save(step + 1)
    if ckpt is not None:
        ckpt.wait()
    return True


if __name__ == "__main__":
    sys.exit(main())
