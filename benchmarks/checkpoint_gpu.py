"""Checkpointing a GPU-resident training state: TorchCheckpointer against torch.save and the copy limit.

State: Linear layers (8192 wide) and Adam's moments, fp32, about ``--gib`` GiB on the device.
Measured in one run, medians of ``--reps``:

* ``ckpt_gpu_d2h_limit``: copy every tensor into preallocated pinned host buffers (non-blocking)
  and synchronize: no checkpointer can block training for less;
* ``ckpt_gpu_torch_save_fsync``: ``torch.save`` of the model's and optimizer's state dicts to
  a file, then fsync (the baseline);
* ``ckpt_gpu_save_block``: how long ``TorchCheckpointer.save`` blocks the training loop, and
  ``ckpt_gpu_durable``: from the call until the checkpoint is durable (``wait``);
* ``ckpt_gpu_step_ms_alone`` / ``..._during_persist``: a training step alone and while a
  checkpoint is written in the background;
* ``ckpt_gpu_restore_bit_exact``: the restored parameters' digest equals the saved one.

``--device cpu`` runs the same on the host (a check of the script, not a figure to report).
Prints ``name: value unit``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integrations", "torch"))

import torch  # noqa: E402

from elastictrain_torch import TorchCheckpointer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=2.0, help="GiB of state (parameters and Adam's two moments)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = ap.parse_args()
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no GPU")
    width = 8192 if dev == "cuda" else 1024
    layers = max(1, int(args.gib * 2**30) // 4 // 3 // (width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(256, width, device=dev)

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    def step() -> None:
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    sync()
    tensors = list(model.state_dict().values()) + [t for s in opt.state.values() for t in s.values()
                                                    if torch.is_tensor(t) and t.dim() > 0]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    name = torch.cuda.get_device_name() if dev == "cuda" else "CPU"
    print(f"# state {nbytes / 2**30:.2f} GiB on {name}, {len(tensors)} tensors, {args.reps} reps")
    bufs = [torch.empty(t.shape, dtype=t.dtype, pin_memory=dev == "cuda") for t in tensors]

    def d2h() -> float:
        sync()
        t0 = time.perf_counter()
        for b, t in zip(bufs, tensors):
            b.copy_(t, non_blocking=True)
        sync()
        return time.perf_counter() - t0

    work = tempfile.mkdtemp(dir=args.dir, prefix="et-ckpt-gpu-")

    def torch_save() -> float:
        p = os.path.join(work, "baseline.pt")
        sync()
        t0 = time.perf_counter()
        with open(p, "wb") as f:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())
        dt = time.perf_counter() - t0
        os.remove(p)
        return dt

    def steps_ms(n: int = 20) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync()
        return (time.perf_counter() - t0) / n * 1000

    def digest() -> str:
        h = hashlib.sha256()
        for t in model.state_dict().values():
            h.update(t.detach().cpu().numpy().tobytes())
        return h.hexdigest()

    d2h()
    ck = TorchCheckpointer(os.path.join(work, "ours"), model=model, optimizer=opt, rank=0, world_size=1, keep=2)
    t0 = time.perf_counter()
    ck.save(0)
    first = time.perf_counter() - t0
    ck.wait()
    limits, baseline, blocks, durable, alone, during = [], [], [], [], [], []
    for r in range(1, args.reps + 1):
        limits.append(d2h())
        baseline.append(torch_save())
        alone.append(steps_ms())
        step()
        sync()
        t0 = time.perf_counter()
        ck.save(2 * r - 1)  # blocking time, then durable with nothing else running
        blocks.append(time.perf_counter() - t0)
        ck.wait()
        durable.append(time.perf_counter() - t0)
        step()
        sync()
        ck.save(2 * r)  # training while the checkpoint is written in the background
        during.append(steps_ms(10))
        ck.wait()
    step()
    sync()
    saved = digest()
    ck.save(2 * args.reps + 1)
    ck.wait()
    step()  # move away from the saved state, then restore it
    sync()
    restored = TorchCheckpointer(os.path.join(work, "ours"), model=model, optimizer=opt, rank=0, world_size=1)
    restored.restore()
    sync()
    exact = digest() == saved
    ck.close()
    restored.close()
    shutil.rmtree(work, ignore_errors=True)
    med = statistics.median
    print(f"ckpt_gpu_state: {nbytes / 2**30:.2f} GiB")
    print(f"ckpt_gpu_d2h_limit: {med(limits):.3f} s")
    print(f"ckpt_gpu_d2h_bandwidth: {nbytes / med(limits) / 1e9:.1f} GB/s")
    print(f"ckpt_gpu_torch_save_fsync: {med(baseline):.3f} s")
    print(f"ckpt_gpu_save_block_first: {first:.3f} s")
    print(f"ckpt_gpu_save_block: {med(blocks):.3f} s")
    print(f"ckpt_gpu_save_block_vs_d2h_limit: {med(blocks) / med(limits):.2f} x")
    print(f"ckpt_gpu_save_block_vs_torch_save_fsync: {med(blocks) / med(baseline):.3f} x")
    print(f"ckpt_gpu_durable: {med(durable):.3f} s")
    print(f"ckpt_gpu_durable_vs_torch_save_fsync: {med(durable) / med(baseline):.2f} x")
    print(f"ckpt_gpu_step_ms_alone: {med(alone):.2f} ms")
    print(f"ckpt_gpu_step_ms_during_persist: {med(during):.2f} ms")
    print(f"ckpt_gpu_restore_bit_exact: {int(exact)} bool")


if __name__ == "__main__":
    main()
