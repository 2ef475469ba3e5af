"""Simulator speed: wall time per policy on the shipped traces and on synthetic traces 10x larger.

1. The shipped Muri traces (trace1, trace3, trace4; ``muri`` preset, 64 GPUs): wall time and
   events per second of each policy. Baseline named for comparison (not run here: the reference
   simulator is not part of this repository): it takes 2.5-8 s for SRTF on these traces, 83 s for
   Muri-L on trace3 and about 2 hours (projected) on trace1.
2. Synthetic Philly-like traces (``elastictrain trace synth``: jobs resampled from the
   Philly-derived Muri traces, Poisson arrivals at 0.9 offered load on 64 GPUs) of 10,000 and
   50,000 jobs (``--quick``: 2,000 and 10,000): ``sim_synth<N>_<policy>_wall`` and the fitted
   growth exponent between the two sizes, ``sim_scaling_<policy>_exponent`` (1 = linear).
   Targets on this machine at 50,000 jobs: SRTF, SRSF, FIFO, Tiresias-L/G <= 10 s; Muri-S/L and
   Gandiva-fair <= 60 s. A run is stopped after ``--limit`` seconds and printed as ``timeout``.
   Gandiva-fair is timed twice: exact (a decision every 60-s quantum while a job waits: millions
   of decisions on a trace spanning years; on the larger trace stopped after ``--exact-limit``
   s, 120 by default, twice its target) and ``--stretch 64`` (after the one-quantum decision at
   an arrival or an end, quanta of 64 until the next one), with its mean JCT over the exact
   run's where both finish (``..._avg_jct_vs_exact``): the stretched slices are coarser, so
   results move. Backfill and multifactor (a timeline of reservations planned at every decision)
   are timed without a target of their own.

Prints ``name: value unit``.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from elastictrain.sim.run import SimConfig, simulate  # noqa: E402
from elastictrain.sim.synth import synthesize, write_native  # noqa: E402

TRACES = os.path.join(ROOT, "traces", "muri")
SHIPPED_POLICIES = ["srtf", "srsf", "tiresias-l", "yarn-cs", "fifo-be", "backfill", "multifactor", "gandiva-ts",
                    "muri-s", "muri-l"]
# (label, policy, options): gandiva-fair also with --stretch 64 (64-quantum slices while nothing
# arrives or ends), whose mean JCT is compared with the exact run's where both finish
SYNTH_POLICIES = [(p, p, {}) for p in ("srtf", "srsf", "fifo", "backfill", "multifactor", "tiresias-l", "tiresias-g",
                                       "muri-s", "muri-l", "gandiva-fair")] + [("gandiva-fair-stretch64", "gandiva-fair", {"stretch": 64})]
OPTIONS = {"distribution": os.path.join(ROOT, "traces", "tiresias", "yarn-gput1000.csv")}


def _timed(args) -> tuple:
    trace, cluster, policy, preset, extra = args
    t = time.perf_counter()
    (r,) = simulate(SimConfig(trace, cluster, [policy], preset=preset, policy_options={**OPTIONS, **extra}),
                    progress=False)
    return time.perf_counter() - t, r.events, statistics.fmean(j.jct for j in r.jobs) if r.jobs else 0.0


def run_limited(trace: str, cluster: str, policy: str, preset: str, limit: float, extra: dict | None = None):
    """(wall, events, mean JCT) of one simulation in a child process, or None past ``limit`` s."""
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        res = pool.apply_async(_timed, ((trace, cluster, policy, preset, extra or {}),))
        try:
            return res.get(limit)
        except mp.TimeoutError:
            pool.terminate()
            return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--traces", default="trace1,trace3,trace4", help="shipped traces to time ('' for none)")
    ap.add_argument("--policies", default=None,
                    help="only these (comma-separated labels, e.g. tiresias-g,gandiva-fair-stretch64; default all)")
    ap.add_argument("--limit", type=float, default=None, help="seconds before a run counts as a timeout "
                    "(default 120 with --quick, else 600)")
    ap.add_argument("--exact-limit", type=float, default=120.0,
                    help="the same for exact gandiva-fair on the larger trace (default 120 s: twice its target; it "
                    "needs millions of decisions there)")
    args = ap.parse_args()
    reps = 1 if args.quick else 3
    limit = args.limit or (120.0 if args.quick else 600.0)
    print(f"# shipped traces, muri preset, n8g8 (64 GPUs); best of {reps}")
    only = set(args.policies.split(",")) if args.policies else None
    for trace in filter(None, args.traces.split(",")):
        path = os.path.join(TRACES, f"{trace}.csv.gz")
        for policy in SHIPPED_POLICIES:
            if only is not None and policy not in only:
                continue
            best = None
            for _ in range(reps):
                r = run_limited(path, os.path.join(TRACES, "n8g8.csv"), policy, "muri", limit)
                if r is not None and (best is None or r[0] < best[0]):
                    best = r
            if best is None:
                print(f"sim_{trace}_{policy}_wall: timeout (> {limit:.0f} s)")
                continue
            print(f"sim_{trace}_{policy}_wall: {best[0]:.3f} s")
            print(f"sim_{trace}_{policy}_events_per_s: {best[1] / best[0]:.0f} events/s")
            print(f"sim_{trace}_{policy}_avg_jct: {best[2]:.0f} s")
            sys.stdout.flush()
    sizes = (2_000, 10_000) if args.quick else (10_000, 50_000)
    with tempfile.TemporaryDirectory(prefix="et-synth-") as tmp:
        paths = {}
        for n in sizes:
            paths[n] = write_native(synthesize(n, seed=1, gpus=64, load=0.9), os.path.join(tmp, f"synth{n}.csv.gz"))
        print(f"# synthetic Philly-like traces ({' and '.join(f'{n:,}' for n in sizes)} jobs, load 0.9 on 64 GPUs, "
              "seed 1), default preset, one run each")
        jcts: dict = {}
        for label, policy, extra in SYNTH_POLICIES:
            if only is not None and label not in only:
                continue
            walls = {}
            for n in sizes:
                cap = min(limit, args.exact_limit) if label == "gandiva-fair" and n == sizes[-1] else limit
                r = run_limited(paths[n], "n8g8", policy, "default", cap, extra)
                if r is None:
                    print(f"sim_synth{n // 1000}k_{label}_wall: timeout (> {cap:.0f} s)")
                    continue
                walls[n], jcts[label, n] = r[0], r[2]
                print(f"sim_synth{n // 1000}k_{label}_wall: {r[0]:.2f} s")
                print(f"sim_synth{n // 1000}k_{label}_events: {r[1]} events")
                print(f"sim_synth{n // 1000}k_{label}_avg_jct: {r[2]:.0f} s")
                if extra and (policy, n) in jcts:
                    print(f"sim_synth{n // 1000}k_{label}_avg_jct_vs_exact: {r[2] / jcts[policy, n]:.3f} x")
                sys.stdout.flush()
            policy = label
            if len(walls) == 2:
                a, b = sizes
                print(f"sim_scaling_{policy}_exponent: {math.log(walls[b] / walls[a]) / math.log(b / a):.2f}")
            else:
                print(f"sim_scaling_{policy}_exponent: nan (a run timed out)")


if __name__ == "__main__":
    main()
