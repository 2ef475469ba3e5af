"""Muri grouping speed and quality: 100, 1,000 and 10,000 queued one-GPU jobs, 4 resource types.

Jobs come from 24 model profiles (4 stage times each: storage IO, CPU preprocessing, GPU
compute, network sync; drawn once from a fixed seed), as queued jobs that train the same model
share a profile. Two measurements per size:

* ``grouping_<n>_decide``: a whole Muri-S decision on a cluster with a quarter of the GPUs the
  queue asks for, so every job is a candidate and the rounds build groups of up to 4;
* ``grouping_<n>_pairs``: one matching round (pairs) by the typed matcher, and its total
  interleaving efficiency against the exact maximum-weight matching (Blossom) of the same
  graph, computed by rustworkx (Rust) and networkx (pure Python) where they are installed and
  the size is within reach (networkx to 400 jobs, 200 with ``--quick``; rustworkx to 1,000).

Prints ``name: value unit``; ``--quick`` stops at 1,000 jobs and does one repetition.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastictrain.policies.api import ClusterSnapshot, JobView  # noqa: E402
from elastictrain.policies.grouping import assign, match_types  # noqa: E402
from elastictrain.policies.muri import Muri  # noqa: E402

MODELS = 24


def profiles(seed: int = 0) -> list[tuple]:
    rng = random.Random(seed)
    out = []
    for _ in range(MODELS):
        heavy = rng.randrange(4)  # each model leans on one resource
        t = [rng.uniform(0.02, 0.25) for _ in range(4)]
        t[heavy] = rng.uniform(0.3, 0.9)
        out.append(tuple(round(x, 4) for x in t))
    return out


def queue(n: int, seed: int = 1) -> list[JobView]:
    rng = random.Random(seed)
    profs = profiles()
    jobs = []
    for i in range(n):
        p = profs[rng.randrange(MODELS)]
        iters = rng.randint(100, 100000)
        j = JobView(i, 1, 0.0, "m", sum(p), iters, iters, stage_times=p)
        jobs.append(j)
    return jobs


def decide_time(n: int, reps: int) -> tuple[float, int, float]:
    jobs = queue(n)
    gpus = max(8, n // 4)
    nodes = (gpus + 7) // 8
    best, groups, size = float("inf"), 0, 0.0
    for _ in range(reps):
        policy = Muri(known_duration=True)
        snap = ClusterSnapshot(0.0, tuple(jobs), (8,) * nodes, nodes, tuple(jobs), (), ())
        t = time.perf_counter()
        d = policy.decide(snap)
        best = min(best, time.perf_counter() - t)
        groups = len(d.groups)
        members = sum(len(g) for g in d.groups)
        size = members / max(1, groups)
    return best, groups, size


def typed_pairs(jobs: list[JobView], policy: Muri) -> tuple[float, float]:
    types = [(policy._pid(j),) for j in jobs]
    t = time.perf_counter()
    counts: dict = {}
    for x in types:
        counts[x] = counts.get(x, 0) + 1
    plan = match_types(counts, policy._weight)
    pairs = assign(types, plan)
    dt = time.perf_counter() - t
    return dt, sum(policy._weight(types[a], types[b]) for a, b in pairs)


def exact_pairs(jobs: list[JobView], policy: Muri, lib: str) -> tuple[float, float]:
    types = [(policy._pid(j),) for j in jobs]
    edges = [(a, b, policy._weight(types[a], types[b])) for a in range(len(jobs)) for b in range(a + 1, len(jobs))]
    t = time.perf_counter()
    if lib == "rustworkx":
        import rustworkx as rx

        g = rx.PyGraph()
        g.add_nodes_from(range(len(jobs)))
        g.add_edges_from([(a, b, int(w * 1e9)) for a, b, w in edges])
        match = rx.max_weight_matching(g, weight_fn=lambda w: w)
    else:
        import networkx as nx

        g = nx.Graph()
        g.add_weighted_edges_from(edges)
        match = nx.max_weight_matching(g)
    dt = time.perf_counter() - t
    return dt, sum(policy._weight(types[a], types[b]) for a, b in match)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    reps = 1 if args.quick else 3
    sizes = [100, 1000] if args.quick else [100, 1000, 10000]
    libs = []
    for lib, limit in (("rustworkx", 1000), ("networkx", 200 if args.quick else 400)):
        try:
            __import__(lib)
            libs.append((lib, limit))
        except ImportError:
            print(f"# {lib} not installed: no exact baseline from it")
    print(f"# {MODELS} model profiles, 4 resource types, one-GPU jobs; best of {reps}")
    for n in sizes:
        dt, groups, size = decide_time(n, reps)
        print(f"grouping_{n}_decide: {dt:.3f} s")
        print(f"grouping_{n}_groups: {groups} groups")
        print(f"grouping_{n}_mean_group_size: {size:.2f} jobs")
        policy = Muri(known_duration=True)
        jobs = queue(n)
        best = min((typed_pairs(jobs, policy) for _ in range(reps)), key=lambda r: r[0])
        print(f"grouping_{n}_pairs_typed: {best[0]:.4f} s")
        print(f"grouping_{n}_pairs_typed_efficiency: {best[1]:.3f} sum")
        for lib, limit in libs:
            m = min(n, limit)
            sub = jobs[:m]
            ours = typed_pairs(sub, policy)
            exact = exact_pairs(sub, policy, lib)
            print(f"grouping_{m}_pairs_exact_{lib}: {exact[0]:.3f} s")
            print(f"grouping_{m}_pairs_vs_exact_{lib}: {ours[1] / exact[1]:.4f} x")
            print(f"grouping_{m}_pairs_speedup_vs_{lib}: {exact[0] / max(ours[0], 1e-9):.0f} x")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
