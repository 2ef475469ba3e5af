"""Gandiva-fair's homogeneous experiment: 70 users with equal tickets, one 1/2/4/8-GPU job each
(sizes drawn from the Philly-derived Muri trace1), on 48 GPUs for 24 simulated hours.

Prints, per job size class, the GPU time its users received over their fair share (the slides
report "each user obtains close to their fair share"), as ``name: value unit`` lines. Then the
heterogeneous case: 12 V100, 24 P100, 128 K80 shared by 4 users, each user's rate with an equal
share of every GPU type and after second-price trading.
``--quick`` simulates 6 hours.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastictrain.sim.fairness import HETERO_CLUSTER, HETERO_USERS, heterogeneous, homogeneous  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(ROOT, "..", "shared", "traces", "muri", "simulator", "trace1.csv")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    trace = TRACE if os.path.exists(TRACE) else os.path.join(ROOT, "tests", "data", "60_job.csv")
    for placement in ("consolidated", "count"):
        r = homogeneous(trace, hours=6 if args.quick else 24, placement=placement)
        print(f"# {placement} placement; users per class {r.users_by_class}; sizes from {os.path.basename(trace)}")
        for g, share in r.share_by_class.items():
            print(f"fair_share_{placement}_{g}gpu_users: {share:.3f} ratio")
        print(f"fair_share_{placement}_utilization: {r.utilization:.3f} ratio")
    table = os.path.join(ROOT, "..", "shared", "traces", "gavel", "simulation_throughputs.json")
    if os.path.exists(table):
        h = heterogeneous(table)
        print(f"# heterogeneous: {HETERO_CLUSTER}; users {HETERO_USERS}; baseline: an equal share of every "
              f"GPU type (heterogeneity-agnostic); {h.trades} trades")
        for u in h.agnostic:
            print(f"trading_{u}_rate_agnostic: {h.agnostic[u]:.1f} steps/s")
            print(f"trading_{u}_rate_traded: {h.traded[u]:.1f} steps/s")
            print(f"trading_{u}_gain: {h.gain[u] * 100:.1f} %")


if __name__ == "__main__":
    main()
