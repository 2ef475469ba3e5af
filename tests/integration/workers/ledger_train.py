"""A data-parallel "training" job over gloo whose model is a ledger: counts[epoch, index].

Every step, each rank takes up to BATCH samples from its shard iterator; the ranks
all-gather them (the gradient all-reduce of a real job) and every replica adds them to its
counts. Every CKPT_EVERY steps rank 0 persists the counts atomically, then every rank
commits its part of the data cursor. On start, rank 0 restores the newest committed
checkpoint (model from disk, data cursor at the coordinator). Exactly-once holds iff the
final committed checkpoint has every count equal to 1.
"""

import os
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

import elastictrain as et

N = int(os.environ["LEDGER_SAMPLES"])
EPOCHS = int(os.environ.get("LEDGER_EPOCHS", 2))
SHARD = int(os.environ.get("LEDGER_SHARD", 1000))
BATCH = int(os.environ.get("LEDGER_BATCH", 250))
CKPT_EVERY = int(os.environ.get("LEDGER_CKPT_EVERY", 10))
STEP_SLEEP = float(os.environ.get("LEDGER_STEP_SLEEP", 0.005))
TAPER = int(os.environ.get("LEDGER_TAPER", 0))
CKPT_DIR = os.environ["LEDGER_DIR"]


def save(counts: np.ndarray, step: int, name: str) -> None:
    tmp = os.path.join(CKPT_DIR, f".{name}.tmp")
    with open(tmp, "wb") as f:
        np.save(f, counts)
        np.save(f, np.array([step]))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(CKPT_DIR, f"{name}.npy"))
    dfd = os.open(CKPT_DIR, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)


def load(name: str):
    with open(os.path.join(CKPT_DIR, f"{name}.npy"), "rb") as f:
        return np.load(f), int(np.load(f)[0])


def main() -> int:
    job = et.init()
    rank, world = job.rank, job.world_size
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    spec = et.DatasetSpec("train", N, SHARD, epochs=EPOCHS, seed=7, lease_ttl=20, taper=TAPER)
    obj = [None]
    if rank == 0:
        job.register_dataset(spec)
        latest = job.latest_commit("train")
        job.restore("train", latest)
        obj = [latest]
    dist.broadcast_object_list(obj, src=0)
    latest = obj[0]
    counts, step = load(latest) if latest else (np.zeros((EPOCHS, N), dtype=np.int16), 0)
    shards = job.shards(spec, register=False, report_interval=0.5)
    samples = shards.samples()
    buf = torch.full((BATCH, 2), -1, dtype=torch.int64)
    gathered = [torch.empty_like(buf) for _ in range(world)]
    print(f"rank {rank}/{world} gen {job.generation} from {latest} at step {step}", flush=True)
    while True:
        buf.fill_(-1)
        n = 0
        for e, i in samples:
            buf[n, 0], buf[n, 1] = e, i
            n += 1
            if n == BATCH:
                break
        dist.all_gather(gathered, buf)
        allb = torch.cat(gathered)
        allb = allb[allb[:, 0] >= 0].numpy()
        if len(allb) == 0:
            break
        np.add.at(counts, (allb[:, 0], allb[:, 1]), 1)
        step += 1
        if step % CKPT_EVERY == 0:
            checkpoint(job, shards, counts, step, f"g{job.generation}-s{step}")
        time.sleep(STEP_SLEEP)
    checkpoint(job, shards, counts, step, "final")
    shards.close()
    dist.destroy_process_group()
    return 0


def checkpoint(job, shards, counts, step, name):
    part = shards.cursor(step)  # the data cursor at exactly this step
    if job.rank == 0:
        save(counts, step, name)  # durable before rank 0's part, so a complete commit implies it
    shards.commit(name, step, job.world_size, part)


if __name__ == "__main__":
    sys.exit(main())
