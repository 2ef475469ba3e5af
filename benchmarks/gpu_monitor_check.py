"""The resource monitor on a real GPU: what a worker's samples hold while it trains.

Runs matrix products on the GPU for ``--seconds`` and takes one of the monitor's samples
(:meth:`ResourceMonitor.sample`, what every worker reports and ``elastictrain status --job``
shows) every half second: GPU utilization, memory used and total, power (pynvml) and torch's peak
allocated memory. Prints ``name: value unit`` (the medians of the samples taken under load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from elastictrain.runtime.monitor import ResourceMonitor  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch sees no GPU")
    mon = ResourceMonitor(None, "gpu-check", 0, period=3600.0)  # no client: samples are read here only
    idle = mon.sample()
    print(f"# {torch.cuda.get_device_name()}; idle sample: {idle}")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    samples = []
    end = time.monotonic() + args.seconds
    next_sample = time.monotonic() + 0.5
    while time.monotonic() < end:
        for _ in range(20):
            a = (a @ b).clamp_(-1, 1)
        torch.cuda.synchronize()
        if time.monotonic() >= next_sample:
            samples.append(mon.sample())
            next_sample += 0.5
    s = samples[-1]
    print(f"# last sample under load: {s}")
    print(f"gpu_monitor_gpu_absent: {int(bool(s.gpu_absent))} bool")
    med = statistics.median
    for field, unit, scale in (("gpu_util", "%", 1), ("gpu_mem_used", "GiB", 2**30), ("gpu_mem_total", "GiB", 2**30),
                               ("gpu_power_w", "W", 1), ("torch_peak_bytes", "GiB", 2**30)):
        vals = [getattr(x, field) for x in samples if getattr(x, field) is not None]
        print(f"gpu_monitor_{field}: {med(vals) / scale:.2f} {unit}" if vals else f"gpu_monitor_{field}: nan {unit}")
    print(f"gpu_monitor_samples: {len(samples)} samples")


if __name__ == "__main__":
    main()
