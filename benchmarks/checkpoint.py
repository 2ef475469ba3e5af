"""Checkpoint speed for a ~1 GiB training state (a model plus its Adam state, float32).

Measured in one run, on the same state and disk:
  * limit: a plain copy of every tensor into preallocated host memory (what blocking costs at best);
  * torch.save to a file, with and without fsync (the baseline);
  * ours (TorchCheckpointer): blocking time of save() on the first call (buffer allocation
    included) and in the steady state, and the time until durable (save + wait: written,
    fsynced, renamed, manifest written).
Prints ``name: value unit`` lines and ratios; ``--quick`` uses a 256 MiB state and fewer repeats.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from elastictrain_torch import TorchCheckpointer  # noqa: E402


def build(total_bytes: int):
    """Linear layers whose params + Adam's two moments add up to about ``total_bytes``."""
    params = total_bytes // 4 // 3
    width = 4096
    layers = max(1, params // (width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt


def train_step(model, opt) -> None:
    model(torch.randn(2, 4096)).sum().backward()
    opt.step()
    opt.zero_grad()


def state_bytes(model, opt) -> int:
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    state_bytes += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                       if torch.is_tensor(t))
    return state_bytes


_LIMIT_BUFS: list = []


def copy_limit(model, opt, reps: int) -> float:
    tensors = list(model.state_dict().values()) + [t for s in opt.state.values() for t in s.values()
                                                   if torch.is_tensor(t)]
    if not _LIMIT_BUFS:  # allocated and faulted in once, as a reused buffer would be
        _LIMIT_BUFS.extend(torch.empty_like(t) for t in tensors)
        for b, t in zip(_LIMIT_BUFS, tensors):
            b.copy_(t)
    bufs = _LIMIT_BUFS
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for b, t in zip(bufs, tensors):
            b.copy_(t)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_save(model, opt, path: str, fsync: bool, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        times.append(time.perf_counter() - t0)
        os.remove(path)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = ap.parse_args()
    size = (256 << 20) if args.quick else (1 << 30)
    reps = 2 if args.quick else 5
    work = tempfile.mkdtemp(prefix="et-ckpt-bench-", dir=args.dir)
    try:
        model, opt = build(size)
        # as in a training script: the checkpointer is made before training starts (it faults its
        # host buffer in right away), and the first save comes after some steps
        ck = TorchCheckpointer(os.path.join(work, "ours"), model=model, optimizer=opt, rank=0, world_size=1,
                               keep=2)
        train_step(model, opt)
        os.sync()
        t0 = time.perf_counter()
        ck.save(0)
        first_block = time.perf_counter() - t0
        ck.close()
        nbytes = state_bytes(model, opt)
        print(f"# state: {nbytes / 2**30:.2f} GiB (model + Adam), dir {work}, {reps} repeats, interleaved, "
              f"os.sync() before each timed operation, torch {torch.__version__}, {torch.get_num_threads()} threads")
        limits, ts_nofsync, ts_fsync, blocks, durables = [], [], [], [], []
        for step in range(1, reps + 1):  # interleaved, so that every method meets the same disk weather
            train_step(model, opt)  # the limit is measured in the same conditions as our save below
            os.sync()
            limits.append(copy_limit(model, opt, 1))
            os.sync()
            ts_nofsync.append(torch_save(model, opt, os.path.join(work, "ts.pt"), False, 1))
            os.sync()
            ts_fsync.append(torch_save(model, opt, os.path.join(work, "ts.pt"), True, 1))
            train_step(model, opt)
            os.sync()
            t0 = time.perf_counter()
            ck.save(step)
            blocks.append(time.perf_counter() - t0)
            ck.wait()
            durables.append(time.perf_counter() - t0)
            ck.close()  # the next save comes later: the clean-up of old checkpoints is over
        b2b = []
        for step in range(reps + 1, 2 * reps + 1):  # back to back: right after the previous is durable
            t0 = time.perf_counter()
            ck.save(step)
            b2b.append(time.perf_counter() - t0)
            ck.wait()
        ck.close()
        t0 = time.perf_counter()  # the worst case: built and saved at once (buffer fault-in included)
        cold = TorchCheckpointer(os.path.join(work, "cold"), model=model, optimizer=opt, rank=0, world_size=1)
        cold.save(0)
        first_cold = time.perf_counter() - t0
        cold.close()
        limit, ts_nofsync, ts_fsync = (statistics.median(x) for x in (limits, ts_nofsync, ts_fsync))
        block, durable = statistics.median(blocks), statistics.median(durables)
        print(f"copy_limit: {limit:.3f} s")
        print(f"torch_save_nofsync: {ts_nofsync:.3f} s")
        print(f"torch_save_fsync: {ts_fsync:.3f} s")
        print(f"save_block_first: {first_block:.3f} s")
        print(f"save_block_first_no_warmup: {first_cold:.3f} s")
        print(f"save_block_median: {block:.3f} s")
        print(f"save_block_back_to_back_median: {statistics.median(b2b):.3f} s")
        print(f"save_durable_median: {durable:.3f} s")
        print(f"save_block_vs_copy_limit: {block / limit:.2f} ratio")
        print(f"save_block_vs_torch_save_fsync: {block / ts_fsync:.2f} ratio")
        print(f"save_durable_vs_torch_save_fsync: {durable / ts_fsync:.2f} ratio")
        print(f"save_throughput_durable: {nbytes / durable / 2**30:.2f} GiB/s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
