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


#: the slides' heterogeneous cluster
HETERO_CLUSTER = {"v100": 12, "p100": 24, "k80": 128}
#: four users whose jobs speed up very differently on newer GPUs (Gavel's job types)
HETERO_USERS = {"user1": "ResNet-50 (batch size 64)", "user2": "Transformer (batch size 16)",
                "user3": "A3C", "user4": "ResNet-18 (batch size 128)"}


@dataclass(frozen=True)
class TradingResult:
    agnostic: dict[str, float]  # rate per user with an equal share of every GPU type
    traded: dict[str, float]  # after second-price trading
    trades: int

    @property
    def gain(self) -> dict[str, float]:
        return {u: self.traded[u] / self.agnostic[u] - 1 for u in self.agnostic}


def heterogeneous(throughputs: str, cluster: dict[str, int] = HETERO_CLUSTER,
                  users: dict[str, str] = HETERO_USERS) -> TradingResult:
    """Fair share of a heterogeneous cluster, without and with Gandiva-fair's trading.

    Every user starts with an equal share of every GPU type (heterogeneity-agnostic fair share);
    then fast GPU time is traded for slow (V100 for K80, P100 for K80, V100 for P100) at second
    prices. Speeds are the isolated steps/s of each user's job type in Gavel's table.
    """
    import json

    from ..policies.gandiva_fair import throughput, trade

    with open(throughputs) as f:
        table = json.load(f)
    speed = {u: {t: table[t][str((job, 1))]["null"] for t in cluster} for u, job in users.items()}
    alloc = {u: {t: n / len(users) for t, n in cluster.items()} for u in users}
    before = throughput(alloc, speed)
    n = 0
    for fast, slow in (("v100", "k80"), ("p100", "k80"), ("v100", "p100")):
        n += len(trade(alloc, speed, fast, slow, unit=0.25))
    return TradingResult(before, throughput(alloc, speed), n)
