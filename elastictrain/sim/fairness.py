"""Fair-share experiments for ticket-based policies (Gandiva-fair's homogeneous experiment).

``homogeneous(...)``: N users with equal tickets, each with one long job whose GPU count is
drawn from a trace's size distribution (1, 2, 4 or 8 GPUs), share a cluster for ``hours``.
Every user is entitled to ``gpus / users`` GPUs; the result is, per job size class, the mean
ratio of the GPU-seconds its users received to that entitlement (1.0 = exactly fair).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from ..model import JobSpec
from ..policies import create
from .cluster import ClusterSpec
from .engine import Simulator
from .traces import load_trace

__all__ = ["FairnessResult", "homogeneous"]


@dataclass(frozen=True)
class FairnessResult:
    share_by_class: dict[int, float]  # GPUs per job -> mean received / entitled
    users_by_class: dict[int, int]
    utilization: float


def homogeneous(trace: str, *, users: int = 70, nodes: int = 6, gpus_per_node: int = 8, hours: float = 24.0,
                quantum: float = 60.0, placement: str = "consolidated", seed: int = 0,
                policy: str = "gandiva-fair") -> FairnessResult:
    sizes = [j.num_gpu for j in load_trace(trace) if j.num_gpu in (1, 2, 4, 8)]
    rng = random.Random(seed)
    jobs = [JobSpec(i, rng.choice(sizes), 0.0, 1e12, 1.0, user=f"user{i}") for i in range(users)]
    cluster = ClusterSpec(1, nodes, gpus_per_node)
    horizon = hours * 3600
    result = Simulator(jobs, cluster, create(policy, quantum=quantum, placement=placement, only_known=True),
                       until=horizon).run()
    service = result.extra["service_by_user"]
    entitled = cluster.total_gpus / users * horizon
    by_class: dict[int, list[float]] = {}
    for j in jobs:
        by_class.setdefault(j.num_gpu, []).append(service.get(j.user, 0.0) / entitled)
    return FairnessResult({g: statistics.fmean(v) for g, v in sorted(by_class.items())},
                          {g: len(v) for g, v in sorted(by_class.items())},
                          sum(service.values()) / (cluster.total_gpus * horizon))
