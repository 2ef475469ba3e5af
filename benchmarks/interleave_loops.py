"""Interleaving training loops written as users write them, on one real GPU: the executor
against free threads and time-sharing, in one process (one CUDA context).

Job kinds, each bottlenecked on a different resource:

* ``io``: ``load`` waits on storage (a sleep), ``compute`` a small conv net forward and backward;
* ``cpu``: ``preprocess`` is numpy augmentation, ``compute`` a small MLP;
* ``gpu``: ``compute`` is a 4-layer transformer encoder in bf16 (GPU-bound).

The loops do not synchronize the GPU except through ``loss.item()`` (every ``--item-every``
iterations). Each job's rate is normalized by its rate alone; the script prints, as
``name: value unit``, each mode's sum and the executor over free threads
(``loops_<jobs>_item<N>_executor_vs_free``). ``--host-slots`` sets the executor's
``host_slots`` for ``preprocess`` (default ``auto``). Needs CUDA.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import elastictrain as et  # noqa: E402
from elastictrain.runtime.interleave import GroupJob, InterleaveGroup, auto_host_slots  # noqa: E402
from interleave import counting_loop, timed  # noqa: E402  (benchmarks/interleave.py: job threads, timed rates)

KINDS = ("io", "cpu", "gpu")


class Job:
    def __init__(self, kind: str, io_ms: float, item_every: int) -> None:
        self.kind, self.io_s, self.item_every = kind, io_ms / 1000, item_every
        g = torch.Generator().manual_seed(1)
        nn = torch.nn
        if kind == "io":
            self.model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1),
                                       nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).cuda()
            self.x = torch.randn(64, 3, 64, 64, generator=g)
        elif kind == "cpu":
            self.model = nn.Sequential(nn.Linear(4096, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
            self.raw = np.random.default_rng(1).random((256, 4096), dtype=np.float32)
        else:
            layer = nn.TransformerEncoderLayer(2048, 16, 8192, batch_first=True)
            self.model = nn.TransformerEncoder(layer, 4).cuda()
            self.x = torch.randn(16, 1024, 2048, generator=g).cuda()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)

    def step(self, it: int) -> None:
        with et.stage("load"):
            if self.kind == "io":
                time.sleep(self.io_s)
                xb = self.x.cuda(non_blocking=True)
            elif self.kind == "gpu":
                xb = self.x
        if self.kind == "cpu":
            with et.stage("preprocess"):
                a = self.raw
                for _ in range(6):
                    a = np.sqrt(np.abs(np.tanh(a * 1.01 + 0.1)) + 1e-3)
                xb = torch.from_numpy(a).cuda()
        with et.stage("compute"):
            if self.kind == "gpu":
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = self.model(xb).float().pow(2).mean()
            else:
                loss = self.model(xb).pow(2).mean()
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            if it % self.item_every == 0:
                loss.item()

    def loop(self, stop: threading.Event, counts: list, i: int, gate=None, stream: bool = False):
        return counting_loop(self.step, torch.cuda.synchronize, stop, counts, i, gate, stream)


class TimeShare:
    """Whole iterations take turns; a turn ends when the job's GPU work has drained."""

    def __init__(self, n: int) -> None:
        self.cond, self.turn, self.n = threading.Condition(), 0, n

    def member(self, i: int):
        ts = self

        class M:
            def enter(self, stage):
                if stage == "load":
                    with ts.cond:
                        ts.cond.wait_for(lambda: ts.turn == i)

            def exit(self, stage):
                if stage == "compute":
                    torch.cuda.current_stream().synchronize()
                    with ts.cond:
                        ts.turn = (ts.turn + 1) % ts.n
                        ts.cond.notify_all()
        return M()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", default="io,cpu,gpu", help=f"comma-separated kinds from {', '.join(KINDS)}")
    ap.add_argument("--item-every", type=int, default=1, help="read the loss back every N iterations")
    ap.add_argument("--seconds", type=float, default=4.0, help="seconds per mode")
    ap.add_argument("--io-ms", type=float, default=15.0, help="the io job's storage wait")
    ap.add_argument("--host-slots", default="auto", help="the executor's preprocess slots: auto or 1..64")
    args = ap.parse_args()
    kinds = args.jobs.split(",")
    if not 2 <= len(kinds) <= 3 or any(k not in KINDS for k in kinds):
        ap.error(f"--jobs: 2 or 3 kinds from {', '.join(KINDS)}")
    if not 1 <= args.item_every <= 10_000 or not 0.5 <= args.seconds <= 60 or not 0 <= args.io_ms <= 1000:
        ap.error("--item-every in [1, 10000], --seconds in [0.5, 60], --io-ms in [0, 1000]")
    if args.host_slots == "auto":
        slots = "auto"
    elif args.host_slots.isdigit() and 1 <= int(args.host_slots) <= 64:
        slots = {"preprocess": int(args.host_slots)}
    else:
        ap.error("--host-slots: auto or an integer in [1, 64]")
    if not torch.cuda.is_available():
        sys.exit("interleave_loops.py needs a GPU (torch sees none); benchmarks/interleave.py emulates one on CPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    jobs = [Job(k, args.io_ms, args.item_every) for k in kinds]
    for j in jobs:  # warm up (cuDNN autotuning, the allocator)
        for it in range(5):
            j.step(it)
    torch.cuda.synchronize()
    tag = f"loops_{'_'.join(kinds)}_item{args.item_every}"
    print(f"# device: {torch.cuda.get_device_name()}; {args.seconds:.1f} s per mode")
    n_slots = auto_host_slots(len(jobs)) if slots == "auto" else slots["preprocess"]
    print(f"{tag}_executor_preprocess_slots: {n_slots} slots")
    solo = []
    for j in jobs:
        stop, counts = threading.Event(), [0]
        solo.append(timed([j.loop(stop, counts, 0, stream=True)], args.seconds, stop, counts)[0])
        print(f"{tag}_alone_{j.kind}: {1000 / solo[-1]:.2f} ms/iteration")
    sums = {}
    for mode in ("free", "timeshare", "executor"):
        stop, counts = threading.Event(), [0] * len(jobs)
        if mode == "free":
            rates = timed([j.loop(stop, counts, i, stream=True) for i, j in enumerate(jobs)], args.seconds, stop, counts)
        elif mode == "timeshare":
            ts = TimeShare(len(jobs))
            rates = timed([j.loop(stop, counts, i, ts.member(i)) for i, j in enumerate(jobs)], args.seconds, stop, counts)
        else:
            group = InterleaveGroup([GroupJob(f"{j.kind}{i}", j.loop(stop, counts, i)) for i, j in enumerate(jobs)],
                                    resources=("load", "preprocess", "compute"), host_slots=slots)
            out: dict = {}
            runner = threading.Thread(target=lambda: out.setdefault("r", group.run(timeout=300)), daemon=True)
            rates = timed([runner.start], args.seconds, stop, counts)
            runner.join(120)
            for r in out.get("r", []):
                if not r.ok:
                    sys.exit(f"job {r.name} failed:\n{r.traceback}")
        norm = [r / s for r, s in zip(rates, solo)]
        sums[mode] = sum(norm)
        print(f"{tag}_{mode}_sum: {sums[mode]:.3f} x")
        print(f"{tag}_{mode}_min_member: {min(norm):.3f} x")
    print(f"{tag}_executor_vs_free: {sums['executor'] / sums['free']:.3f} x")


if __name__ == "__main__":
    main()
