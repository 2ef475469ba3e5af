"""Overhead of stage spans and of the DDP communication-profiling hook, as a share of step time.

* ``stage_span_cost``: one ``with et.stage(...)`` span, measured over many empty spans;
  ``stage_overhead_10ms_step``: four spans (load, preprocess, compute, sync) as a percentage of
  a 10 ms step (the target is under 1%).
* ``stage_overhead_real_step``: a ~10 ms torch step with and without its four spans (median of
  many steps; noisier, as it includes the machine's jitter).
* ``comm_hook_overhead``: a DDP step (gloo, one process on loopback) with DDP's default
  all-reduce against our profiling hook (baseline: DDP's own hook, same run).
* ``resource_monitor_sample_cost``: one sample of the worker's resource monitor (psutil: CPU,
  memory, I/O, children); ``resource_monitor_overhead_default``: that cost per default 5 s
  period as a share of the time; ``resource_monitor_overhead_real_step``: a short torch step
  with the monitor sampling every 50 ms (100x the default rate) against without (same run).

Prints ``name: value unit``; ``--quick`` measures fewer steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import elastictrain as et  # noqa: E402
from elastictrain.runtime.stages import Recorder, use_recorder  # noqa: E402


def span_cost(n: int) -> float:
    use_recorder(Recorder(max_iterations=1000))
    names = ("load", "preprocess", "compute", "sync")
    t = time.perf_counter()
    for i in range(n):
        with et.stage(names[i & 3]):
            pass
    dt = time.perf_counter() - t
    use_recorder(None)
    return dt / n


def real_step(steps: int) -> tuple[float, float]:
    a = torch.randn(320, 320)
    reps = 1
    t = time.perf_counter()
    x = a
    for _ in range(20):
        x = torch.tanh(x @ a)
    reps = max(1, round(20 * 0.010 / (time.perf_counter() - t)))

    def step(spans: bool):
        if spans:
            with et.stage("load"):
                pass
            with et.stage("preprocess"):
                pass
            with et.stage("compute"):
                x = a
                for _ in range(reps):
                    x = torch.tanh(x @ a)
            with et.stage("sync"):
                pass
        else:
            x = a
            for _ in range(reps):
                x = torch.tanh(x @ a)

    use_recorder(Recorder(max_iterations=1000))
    plain, spans = [], []
    for i in range(steps):  # interleave the two kinds so drift hits both
        for kind, out in ((False, plain), (True, spans)):
            t = time.perf_counter()
            step(kind)
            out.append(time.perf_counter() - t)
    use_recorder(None)
    return statistics.median(plain), statistics.median(spans)


def comm_hook(steps: int) -> tuple[float, float]:
    from elastictrain_torch import CommProfiler

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("ET_BENCH_PORT", "29533"), RANK="0",
                      WORLD_SIZE="1")
    dist.init_process_group("gloo")
    try:
        def make(profiled: bool):
            torch.manual_seed(0)
            model = DDP(torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)))
            if profiled:
                CommProfiler(model)
            return model, torch.optim.SGD(model.parameters(), lr=0.01)

        runs = {k: make(k) for k in (False, True)}
        x = torch.randn(64, 512)
        times = {False: [], True: []}
        for i in range(steps):
            for k, (model, opt) in runs.items():
                t = time.perf_counter()
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
                times[k].append(time.perf_counter() - t)
        return statistics.median(times[False][5:]), statistics.median(times[True][5:])
    finally:
        dist.destroy_process_group()


def monitor_costs(steps: int) -> tuple[float, float, float]:
    from elastictrain.runtime.monitor import ResourceMonitor

    mon = ResourceMonitor(None, "bench", 0, period=3600.0, batch=1024)  # sampled by hand here
    n = 200
    t = time.perf_counter()
    for i in range(n):
        mon.step(i)
        mon.sample()
    cost = (time.perf_counter() - t) / n
    mon._stop.set()
    a = torch.randn(256, 256)

    def step_median(k: int) -> float:
        times = []
        for _ in range(k):
            t0 = time.perf_counter()
            x = a
            for _ in range(12):
                x = torch.tanh(x @ a)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    plain = step_median(steps)
    fast = ResourceMonitor(None, "bench", 0, period=0.05, batch=1024)  # never sends: batch not reached
    monitored = step_median(steps)
    fast._stop.set()
    return cost, plain, monitored


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cost = span_cost(50_000 if args.quick else 500_000)
    print(f"stage_span_cost: {cost * 1e6:.2f} us")
    print(f"stage_overhead_10ms_step: {100 * 4 * cost / 0.010:.3f} %")
    plain, spans = real_step(60 if args.quick else 400)
    print(f"stage_real_step_plain: {plain * 1e3:.3f} ms")
    print(f"stage_real_step_spans: {spans * 1e3:.3f} ms")
    print(f"stage_overhead_real_step: {100 * (spans / plain - 1):.3f} %")
    base, prof = comm_hook(40 if args.quick else 300)
    print(f"comm_step_ddp_default_hook: {base * 1e3:.3f} ms")
    print(f"comm_step_profiling_hook: {prof * 1e3:.3f} ms")
    print(f"comm_hook_overhead: {100 * (prof / base - 1):.3f} %")
    cost, plain, monitored = monitor_costs(100 if args.quick else 800)
    print(f"resource_monitor_sample_cost: {cost * 1e3:.3f} ms")
    print(f"resource_monitor_overhead_default: {100 * cost / 5.0:.4f} %")
    print(f"resource_monitor_step_plain: {plain * 1e3:.3f} ms")
    print(f"resource_monitor_step_sampled_every_50ms: {monitored * 1e3:.3f} ms")
    print(f"resource_monitor_overhead_real_step: {100 * (monitored / plain - 1):.3f} %")


if __name__ == "__main__":
    main()
