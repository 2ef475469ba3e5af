"""Gandiva-fair's experiments, run through the event engine with the same policy code.

* :func:`homogeneous`: N users with equal tickets, each with one long job whose GPU count is
  drawn from a trace's size distribution (1, 2, 4 or 8 GPUs), share a cluster. Every user is
  entitled to ``gpus / users`` GPUs; the result is, per job size class, the mean ratio of the
  GPU time its users received to that entitlement (1.0 = exactly fair), in total and per window.
* :func:`heterogeneous`: users whose jobs speed up differently on newer GPUs (Gavel's
  throughput table) share a cluster of several GPU generations, once with a
  heterogeneity-agnostic fair share (``gandiva-fair-notrade``: an equal share of every type)
  and once with Gandiva-fair's second-price trading (``gandiva-fair``), on the same jobs. The
  result is each user's aggregate minibatch rate under both, in total and per window.

:func:`write_report` writes either result as CSV and PNG (and returns the text table).
"""

from __future__ import annotations

import json
import logging
import os
import random
import statistics
from dataclasses import dataclass, field
from typing import Optional

from ..errors import ConfigError
from ..model import JobSpec
from ..policies import create
from .cluster import ClusterSpec, heterogeneous_cluster
from .engine import Simulator
from .traces import load_trace

__all__ = ["FairnessResult", "TradingResult", "homogeneous", "heterogeneous", "write_report",
           "HETERO_CLUSTER", "HETERO_USERS"]


@dataclass(frozen=True)
class FairnessResult:
    share_by_class: dict[int, float]  # GPUs per job -> mean received / entitled
    users_by_class: dict[int, int]
    utilization: float
    policy: str = "gandiva-fair"
    window: float = 3600.0
    #: per window: (start seconds, {class: mean received / entitled in that window})
    timeline: list = field(default_factory=list)
    migrations: int = 0


def homogeneous(trace: str, *, users: int = 70, nodes: int = 6, gpus_per_node: int = 8, hours: float = 24.0,
                quantum: float = 60.0, placement: str = "consolidated", seed: int = 0,
                policy: str = "gandiva-fair", window: float = 3600.0, migration_cost: float = 0.0) -> FairnessResult:
    sizes = [j.num_gpu for j in load_trace(trace) if j.num_gpu in (1, 2, 4, 8) and j.num_gpu <= gpus_per_node]
    rng = random.Random(seed)
    jobs = [JobSpec(i, rng.choice(sizes), 0.0, 1e12, 1.0, user=f"user{i}") for i in range(users)]
    cluster = ClusterSpec(1, nodes, gpus_per_node)
    horizon = hours * 3600
    result = Simulator(jobs, cluster, create(policy, quantum=quantum, placement=placement, only_known=True),
                       until=horizon, window=window, migration_cost=migration_cost).run()
    service = result.extra["service_by_user"]
    fair_rate = cluster.total_gpus / users  # GPUs each user is entitled to

    def by_class(received: dict, seconds: float) -> dict[int, float]:
        out: dict[int, list[float]] = {}
        for j in jobs:
            out.setdefault(j.num_gpu, []).append(received.get(j.user, 0.0) / (fair_rate * seconds))
        return {g: statistics.fmean(v) for g, v in sorted(out.items())}

    timeline = []
    for w in result.extra["timeline"]:
        span = min(window, horizon - w["start"])
        got = {u: sum(per.values()) for u, per in w["gpu_seconds"].items()}
        timeline.append((w["start"], by_class(got, span)))
    counts: dict[int, int] = {}
    for j in jobs:
        counts[j.num_gpu] = counts.get(j.num_gpu, 0) + 1
    return FairnessResult(by_class(service, horizon), dict(sorted(counts.items())),
                          sum(service.values()) / (cluster.total_gpus * horizon), policy, window, timeline,
                          result.extra["migrations"])


#: the slides' heterogeneous cluster: GPU type -> (nodes, GPUs per node): 12 V100, 24 P100, 128 K80
HETERO_CLUSTER = {"v100": (3, 4), "p100": (6, 4), "k80": (16, 8)}
#: four users whose jobs speed up very differently on newer GPUs (Gavel's job types), the
#: largest speedup (user1) to the smallest (user4)
HETERO_USERS = {"user1": "ResNet-50 (batch size 64)", "user2": "LM (batch size 20)",
                "user3": "Transformer (batch size 32)", "user4": "A3C"}


@dataclass(frozen=True)
class TradingResult:
    agnostic: dict[str, float]  # minibatches/s per user, equal share of every GPU type
    traded: dict[str, float]  # minibatches/s per user, with second-price trading
    trades: int
    speedup: dict[str, dict[str, float]] = field(default_factory=dict)  # user -> type -> speed vs k80
    #: per window: (start seconds, {user: rate agnostic}, {user: rate traded})
    timeline: list = field(default_factory=list)
    window: float = 3600.0

    @property
    def gain(self) -> dict[str, float]:
        return {u: self.traded[u] / self.agnostic[u] - 1 for u in self.agnostic}

    @property
    def total_gain(self) -> float:
        """Cluster efficiency: the mean of the users' rates relative to their agnostic rates."""
        return statistics.fmean(self.traded[u] / self.agnostic[u] for u in self.agnostic) - 1


def heterogeneous(throughputs: str, cluster: Optional[dict] = None, users: Optional[dict[str, str]] = None, *,
                  jobs_per_user: int = 40, hours: float = 12.0, quantum: float = 60.0, seed: int = 0,
                  window: float = 3600.0, migration_cost: float = 0.0, warmup: float = 3600.0) -> TradingResult:
    """Each user runs ``jobs_per_user`` long 1-, 2- or 4-GPU jobs of its type (more than its
    share, so GPUs are contended). A job's rate on a GPU type is its single-GPU throughput
    there (Gavel's table) times its GPU count. Rates are measured after ``warmup`` seconds."""
    if not hours * 3600 > warmup:
        raise ConfigError(f"--hours {hours:g}: rates are measured after a {warmup / 3600:g}-hour warm-up, so simulate "
                          "longer than that")
    cluster = dict(cluster or HETERO_CLUSTER)
    users = dict(users or HETERO_USERS)
    from .traces import open_text

    with open_text(throughputs) as f:
        table = json.load(f)
    speed = {u: {t: table[t][str((job, 1))]["null"] for t in cluster} for u, job in users.items()}
    rng = random.Random(seed)
    jobs = []
    for u, job in users.items():
        base = speed[u]["k80"] if "k80" in speed[u] else min(speed[u].values())
        rel = tuple((t, v / base) for t, v in sorted(speed[u].items()))
        for _ in range(jobs_per_user):
            g = rng.choice((1, 2, 4))
            # iteration = one minibatch on each of its g GPUs; the rate is reported per GPU-minibatch
            jobs.append(JobSpec(len(jobs), g, 0.0, 1e12, 1.0 / base, model=job.split(" ")[0], user=u, speeds=rel))
    spec = heterogeneous_cluster(cluster)
    horizon = hours * 3600
    rates, timelines, trades = {}, {}, 0
    for name in ("gandiva-fair-notrade", "gandiva-fair"):
        policy = create(name, quantum=quantum)
        r = Simulator(jobs, spec, policy, until=horizon, window=window, migration_cost=migration_cost).run()
        tl = r.extra["timeline"]
        kept = [w for w in tl if w["start"] >= warmup]
        span = sum(min(window, horizon - w["start"]) for w in kept)
        # iterations of a g-GPU job count g minibatches (one per GPU, data parallel)
        rates[name] = {u: sum(w["iterations_gpu"].get(u, 0.0) for w in kept) / span for u in users}
        timelines[name] = [(w["start"], {u: w["iterations_gpu"].get(u, 0.0) / min(window, horizon - w["start"])
                                         for u in users}) for w in tl]
        if name == "gandiva-fair":
            trades = len(policy.trades)
    timeline = [(a[0], a[1], b[1]) for a, b in zip(timelines["gandiva-fair-notrade"], timelines["gandiva-fair"])]
    rel_speed = {u: {t: v / (speed[u]["k80"] if "k80" in speed[u] else min(speed[u].values()))
                     for t, v in speed[u].items()} for u in users}
    return TradingResult(rates["gandiva-fair-notrade"], rates["gandiva-fair"], trades, rel_speed, timeline, window)


def pyplot():
    """matplotlib's pyplot on the file backend, or None (with a warning) when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logging.getLogger(__name__).warning("matplotlib is not installed: no PNG (pip install matplotlib)")
        return None
    return plt


def write_report(result, out: str) -> list[str]:
    """Write ``fairness_total.csv``, ``fairness_timeline.csv`` and ``fairness.png`` (if
    matplotlib is installed) under ``out``; return the paths written."""
    import csv

    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, "fairness_total.csv"), os.path.join(out, "fairness_timeline.csv")]
    hetero = isinstance(result, TradingResult)
    with open(paths[0], "w", newline="") as f:
        w = csv.writer(f)
        if hetero:
            w.writerow(["user", "rate_agnostic", "rate_traded", "gain"])
            for u in result.agnostic:
                w.writerow([u, f"{result.agnostic[u]:.4f}", f"{result.traded[u]:.4f}", f"{result.gain[u]:.4f}"])
            w.writerow(["mean", "", "", f"{result.total_gain:.4f}"])  # efficiency: mean relative gain
        else:
            w.writerow(["gpus_per_job", "users", "received_over_entitled"])
            for g, share in result.share_by_class.items():
                w.writerow([g, result.users_by_class[g], f"{share:.4f}"])
            w.writerow(["all", sum(result.users_by_class.values()), f"{result.utilization:.4f}"])  # efficiency
    with open(paths[1], "w", newline="") as f:
        w = csv.writer(f)
        if hetero:
            users = list(result.agnostic)
            w.writerow(["window_start_h"] + [f"{u}_agnostic" for u in users] + [f"{u}_traded" for u in users])
            for start, a, b in result.timeline:
                w.writerow([f"{start / 3600:.2f}"] + [f"{a[u]:.4f}" for u in users] + [f"{b[u]:.4f}" for u in users])
        else:
            classes = list(result.share_by_class)
            w.writerow(["window_start_h"] + [f"class_{g}gpu" for g in classes])
            for start, by in result.timeline:
                w.writerow([f"{start / 3600:.2f}"] + [f"{by.get(g, 0.0):.4f}" for g in classes])
    plt = pyplot()
    if plt is None:
        return paths
    fig, ax = plt.subplots(figsize=(7, 4))
    if hetero:
        xs = [s / 3600 for s, _, _ in result.timeline]
        for u in result.agnostic:
            base = result.agnostic[u] or 1.0  # each user's rate relative to its agnostic fair share
            line, = ax.plot(xs, [b[u] / base for _, _, b in result.timeline], label=f"{u} traded")
            ax.plot(xs, [a[u] / base for _, a, _ in result.timeline], linestyle="--", color=line.get_color(),
                    label=f"{u} agnostic")
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
        ax.set_ylabel("rate / rate with the agnostic fair share")
        ax.set_title("per-user minibatch rate: second-price trading vs agnostic fair share")
    else:
        for g in result.share_by_class:
            ax.plot([s / 3600 for s, _ in result.timeline], [by.get(g, 0.0) for _, by in result.timeline],
                    label=f"{g}-GPU users")
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
        ax.set_ylim(0, 1.3)
        ax.set_ylabel("GPU time received / fair share")
        ax.set_title(f"{result.policy}: fair share by job size over time")
    ax.set_xlabel("time (h)")
    return paths + [save_png(plt, fig, ax, out)]


def save_png(plt, fig, ax, out: str) -> str:
    """Finish a report's figure (legend, layout) as ``<out>/fairness.png``; returns its path."""
    ax.legend(fontsize=7)
    fig.tight_layout()
    png = os.path.join(out, "fairness.png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
