"""What a simulation run reports: JCT statistics, makespan, queueing, preemptions, utilization,
Tiresias's small/large x short/long job bins; as JSON, CSV, a text table and PNG plots."""

from __future__ import annotations

import csv
import json
import os
from typing import Sequence

import numpy as np

from .._text import table
from .engine import SimResult

__all__ = ["summarize", "job_bins", "comparison_table", "bins_table", "write_outputs"]

#: Tiresias's job bins: "small" jobs use at most this many GPUs, "short" ones run at most this long
SMALL_GPUS, SHORT_SECONDS = 8, 4 * 3600


def summarize(r: SimResult) -> dict:
    jct = np.array([j.jct for j in r.jobs], dtype=float)
    q = np.array([j.queueing_delay for j in r.jobs], dtype=float)
    busy = 0.0
    for (t0, used), (t1, _) in zip(r.utilization, r.utilization[1:]):
        busy += used * (t1 - t0)
    span = r.makespan - (r.jobs and min(j.submit_time for j in r.jobs) or 0.0)
    return {
        "policy": r.policy, "jobs": len(r.jobs),
        "avg_jct": float(jct.mean()), "median_jct": float(np.median(jct)),
        "p95_jct": float(np.percentile(jct, 95)), "p99_jct": float(np.percentile(jct, 99)),
        "makespan": r.makespan,
        "avg_queueing_delay": float(q.mean()), "avg_pending_time": float(np.mean([j.pending_time for j in r.jobs])),
        "preemptions": int(sum(j.preemptions for j in r.jobs)), "resizes": int(sum(j.resizes for j in r.jobs)),
        "restart_seconds_lost": r.restart_seconds,
        "gpu_utilization": busy / (r.total_gpus * span) if span > 0 else 0.0,
        "events": r.events, "wall_seconds": r.wall_seconds,
    }


def job_bins(r: SimResult) -> dict[str, dict]:
    """Average JCT and count per Tiresias bin (small/large GPUs x short/long duration)."""
    bins: dict[str, list[float]] = {}
    for j in r.jobs:
        key = f"{'small' if j.num_gpu <= SMALL_GPUS else 'large'}-{'short' if j.duration <= SHORT_SECONDS else 'long'}"
        bins.setdefault(key, []).append(j.jct)
    return {k: {"jobs": len(v), "avg_jct": float(np.mean(v))} for k, v in sorted(bins.items())}


def comparison_table(summaries: Sequence[dict]) -> str:
    cols = [("policy", "policy", "{}"), ("avg_jct", "avg JCT (s)", "{:.0f}"), ("median_jct", "median", "{:.0f}"),
            ("p95_jct", "p95", "{:.0f}"), ("p99_jct", "p99", "{:.0f}"), ("makespan", "makespan", "{:.0f}"),
            ("avg_queueing_delay", "queueing", "{:.0f}"), ("preemptions", "preempt", "{}"),
            ("gpu_utilization", "util", "{:.2f}"), ("wall_seconds", "wall (s)", "{:.2f}")]
    if any(s.get("resizes") for s in summaries):  # (elastic jobs: how often their worker counts changed)
        cols.insert(8, ("resizes", "resize", "{}"))
    return table([[h for _, h, _ in cols]] + [[f.format(s[k]) for k, _, f in cols] for s in summaries])


def bins_table(results: Sequence[SimResult]) -> str:
    """Average JCT per Tiresias job bin (small/large GPUs x short/long), one row per policy."""
    names = ["small-short", "small-long", "large-short", "large-long"]
    rows = [["policy"] + [f"{n} (s)" for n in names]]
    for r in results:
        b = job_bins(r)
        rows.append([r.policy] + [f"{b[n]['avg_jct']:.0f} ({b[n]['jobs']})" if n in b else "-" for n in names])
    return table(rows)


def by_priority(results: Sequence[SimResult]) -> list[str]:
    """Per policy and job priority (highest first): jobs, average JCT and queueing delay,
    preemptions; nothing if every job has priority 0."""
    lines = []
    for r in results:
        prios = sorted({j.priority for j in r.jobs}, reverse=True)
        if prios == [0] or not prios:
            continue
        for p in prios:
            js = [j for j in r.jobs if j.priority == p]
            jct, queued = sum(j.jct for j in js) / len(js), sum(j.queueing_delay for j in js) / len(js)
            lines.append(f"{r.policy}: priority {p}: {len(js)} jobs, average JCT {jct:.0f} s, queueing {queued:.0f} s, "
                         f"{sum(j.preemptions for j in js)} preemptions")
    return lines


def write_outputs(results: Sequence[SimResult], out_dir: str) -> list[str]:
    """Write summary.json, summary.csv, jobs_<policy>.csv, jct_cdf.png, utilization.png; return paths."""
    os.makedirs(out_dir, exist_ok=True)
    sums = [summarize(r) for r in results]
    for s, r in zip(sums, results):
        s["bins"] = job_bins(r)
    paths = [os.path.join(out_dir, "summary.json"), os.path.join(out_dir, "summary.csv")]
    with open(paths[0], "w") as f:
        json.dump(sums, f, indent=2)
    with open(paths[1], "w", newline="") as f:
        keys = [k for k in sums[0] if k != "bins"]
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(sums)
    for r in results:
        p = os.path.join(out_dir, f"jobs_{r.policy}.csv")
        with open(p, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["job_id", "num_gpu", "model", "submit_time", "start_time", "end_time", "jct", "duration",
                        "preemptions", "pending_time", "user", "gpu_seconds", "resizes"])
            for j in r.jobs:
                w.writerow([j.job_id, j.num_gpu, j.model, f"{j.submit_time:.3f}", f"{j.start_time:.3f}",
                            f"{j.end_time:.3f}", f"{j.jct:.3f}", f"{j.duration:.3f}", j.preemptions,
                            f"{j.pending_time:.3f}", j.user, f"{j.gpu_seconds:.3f}", j.resizes])
        paths.append(p)
    paths += _plots(results, out_dir)
    return paths


def _plots(results: Sequence[SimResult], out_dir: str) -> list[str]:
    try:
        import matplotlib
        import matplotlib.ticker

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional; the numbers are all in the JSON/CSV
        import logging

        logging.getLogger(__name__).warning("matplotlib is not installed: no PNG plots (pip install matplotlib)")
        return []
    def figure(name: str, xlabel: str, ylabel: str, title: str, draw) -> str:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in results:
            draw(ax, r)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=.3)
        ax.legend()
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    def cdf(ax, r) -> None:
        jct = np.sort([j.jct for j in r.jobs])
        ax.plot(jct, np.arange(1, len(jct) + 1) / len(jct), label=r.policy)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no crowded minor labels

    def util(ax, r) -> None:
        t = np.array([u[0] for u in r.utilization]) / 3600
        ax.step(t, np.array([u[1] for u in r.utilization]) / r.total_gpus, where="post", label=r.policy, alpha=.8)

    out = [figure("jct_cdf.png", "job completion time (s)", "fraction of jobs", "JCT CDF", cdf),
           figure("utilization.png", "time (h)", "GPUs in use (fraction)", "GPU utilization over time", util)]
    return out
