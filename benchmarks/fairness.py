"""Gandiva-fair's experiments through the event engine (the same policy code as `simulate`).

Homogeneous (the slides' slide 14): 70 users with equal tickets, one 1/2/4/8-GPU job each
(sizes drawn from the Philly-derived Muri trace1), on 48 GPUs (6 servers of 8). Prints, per job
size class, the GPU time its users received over their fair share, for split stride
(`gandiva-fair`) and the baseline, one global gang-aware stride (`gandiva-fair-global`), with
each one's utilization, migrations and simulator wall time.

Heterogeneous (slide 15): 12 V100, 24 P100 and 128 K80 shared by 4 users with 30-40 jobs
each whose speedups differ (Gavel's throughput table). Baseline: the heterogeneity-agnostic
fair share (`gandiva-fair-notrade`: an equal share of every GPU type) on the same jobs; each
user's minibatch rate with second-price trading (`gandiva-fair`) as a ratio to it. Also the
allocation-level prediction of the same trades (no packing or scheduling effects).

Every figure is a ``name: value unit`` line. ``--quick`` simulates 6 hours (homogeneous) and 3
hours (heterogeneous) instead of 24 and 12.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastictrain.policies.gandiva_fair import entitlements, throughput  # noqa: E402
from elastictrain.sim.fairness import HETERO_CLUSTER, HETERO_USERS, heterogeneous, homogeneous  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(ROOT, "traces", "muri", "trace1.csv.gz")
TABLE = os.path.join(ROOT, "traces", "gavel", "simulation_throughputs.json.gz")


def predicted_gain(speed: dict[str, dict[str, float]]) -> dict[str, float]:
    """The same trades on fractional allocations: what trading alone promises (a user's gain
    does not depend on the scale of its speeds, so the experiment's relative speeds serve)."""
    gpus = {t: n * g for t, (n, g) in HETERO_CLUSTER.items()}
    tickets = dict.fromkeys(speed, 1.0)
    before = throughput(entitlements(tickets, gpus)[0], speed)
    after = throughput(entitlements(tickets, gpus, speed)[0], speed)  # the policy's own trading
    return {u: after[u] / before[u] - 1 for u in speed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    trace = TRACE if os.path.exists(TRACE) else os.path.join(ROOT, "tests", "data", "60_job.csv")
    hours = 6 if args.quick else 24
    print(f"# homogeneous: 70 users, 48 GPUs (6 x 8), {hours} h, sizes from {os.path.basename(trace)}")
    for policy in ("gandiva-fair", "gandiva-fair-global"):
        t0 = time.perf_counter()
        r = homogeneous(trace, hours=hours, policy=policy)
        wall = time.perf_counter() - t0
        tag = "split" if policy == "gandiva-fair" else "global"
        for g, share in r.share_by_class.items():
            print(f"fair_share_{tag}_{g}gpu_users: {share:.3f} ratio")
        print(f"fair_share_{tag}_worst_class_deviation: {max(abs(v - 1) for v in r.share_by_class.values()):.3f} ratio")
        print(f"fair_share_{tag}_utilization: {r.utilization:.3f} ratio")
        print(f"fair_share_{tag}_migrations: {r.migrations} moves")
        print(f"fair_share_{tag}_sim_wall: {wall:.2f} s")
    table = TABLE if os.path.exists(TABLE) else os.path.join(ROOT, "tests", "data", "gavel_throughputs_subset.json")
    hours = 3 if args.quick else 12
    t0 = time.perf_counter()
    h = heterogeneous(table, hours=hours)
    wall = time.perf_counter() - t0
    print(f"# heterogeneous: {HETERO_CLUSTER} (nodes, GPUs each), {hours} h; baseline: the agnostic fair share "
          f"(equal share of every type) on the same jobs; {h.trades} trades")
    pred = predicted_gain(h.speedup)
    for u, job in HETERO_USERS.items():
        print(f"# {u}: {job}, V100/K80 {h.speedup[u]['v100']:.2f}, P100/K80 {h.speedup[u]['p100']:.2f}")
        print(f"trading_{u}_rate_agnostic: {h.agnostic[u]:.2f} minibatches/s")
        print(f"trading_{u}_rate_traded: {h.traded[u]:.2f} minibatches/s")
        print(f"trading_{u}_vs_agnostic: {h.traded[u] / h.agnostic[u]:.3f} ratio")
        print(f"trading_{u}_predicted_vs_agnostic: {1 + pred[u]:.3f} ratio")
    print(f"trading_mean_vs_agnostic: {1 + h.total_gain:.3f} ratio")
    print(f"trading_sim_wall: {wall:.2f} s")


if __name__ == "__main__":
    main()
