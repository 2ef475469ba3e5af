"""Simulator speed: wall time and events per second of each policy on Muri's traces 1, 3 and 4.

Runs the ``muri`` preset (the configuration that reproduces the published tables) on
../shared/traces/muri/simulator/{trace1,trace3,trace4}.csv, 64 GPUs. Baselines named for
comparison (not run here: the reference simulator is not part of this repository): it takes
2.5-8 s for SRTF on these traces, 83 s for Muri-L on trace3 and about 2 hours (projected) on
trace1. Prints ``name: value unit``; ``--quick`` runs each policy once
(the default takes the best of 3).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastictrain.sim.run import SimConfig, simulate  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "traces",
                    "muri", "simulator")
POLICIES = ["srtf", "srsf", "tiresias-l", "yarn-cs", "fifo-be", "gandiva-ts", "muri-s", "muri-l"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--traces", default="trace1,trace3,trace4")
    args = ap.parse_args()
    reps = 1 if args.quick else 3
    if not os.path.exists(ROOT):
        sys.exit(f"{ROOT} not found: the benchmark reads the shared Muri traces")
    print(f"# muri preset, n8g8 (64 GPUs); best of {reps}")
    for trace in args.traces.split(","):
        for policy in POLICIES:
            best, events, avg = float("inf"), 0, 0.0
            for _ in range(reps):
                cfg = SimConfig(os.path.join(ROOT, f"{trace}.csv"), os.path.join(ROOT, "n8g8.csv"), [policy],
                                preset="muri")
                t = time.perf_counter()
                (r,) = simulate(cfg, progress=False)
                best = min(best, time.perf_counter() - t)
                events, avg = r.events, statistics.fmean(j.jct for j in r.jobs)
            print(f"sim_{trace}_{policy}_wall: {best:.3f} s")
            print(f"sim_{trace}_{policy}_events_per_s: {events / best:.0f} events/s")
            print(f"sim_{trace}_{policy}_avg_jct: {avg:.0f} s")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
