"""``elastictrain simulate``: run one trace through several policies and compare them."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Optional

from ..errors import ConfigError
from ..policies import create
from .cluster import load_cluster
from .engine import SimResult, Simulator
from .traces import load_trace

__all__ = ["SimConfig", "PRESETS", "simulate"]

#: engine settings that reproduce a reference simulator's published numbers
PRESETS = {
    # restart cost paid once per (re)start, jobs at their profiled speed
    "default": {"restart_cost": "muri", "charge": "on_start", "speed_factor": 1.0},
    # the Muri reference simulator: every running job pays its restart cost at every event, and
    # a job alone runs at 1.015x its profiled iteration time
    "muri": {"restart_cost": "muri", "charge": "every_event", "speed_factor": 1.015},
}


@dataclass
class SimConfig:
    trace: str
    cluster: str
    policies: list[str]
    preset: str = "default"
    trace_format: str = "auto"
    interval: Optional[float] = None
    restart_cost: Optional[str] = None
    policy_options: dict = field(default_factory=dict)
    spread_slowdown: float = 1.0
    migration_cost: float = 0.0


def simulate(cfg: SimConfig, progress: bool = True) -> list[SimResult]:
    """Run every policy of ``cfg`` on its trace; returns one result per policy.

    Raises:
        ConfigError: an unknown preset or policy, or a bad trace or cluster file.
    """
    if cfg.preset not in PRESETS:
        raise ConfigError(f"preset {cfg.preset!r} is not one of {', '.join(PRESETS)}")
    engine = dict(PRESETS[cfg.preset])
    if cfg.restart_cost is not None:
        engine["restart_cost"] = cfg.restart_cost if cfg.restart_cost == "muri" else float(cfg.restart_cost)
    jobs = load_trace(cfg.trace, cfg.trace_format)
    cluster = load_cluster(cfg.cluster)
    results = []
    for name in cfg.policies:
        opts = {k: v for k, v in cfg.policy_options.items() if v is not None}
        policy = create(name, only_known=True, **opts)  # each policy takes the options it knows
        bar = None
        if progress:
            try:
                from tqdm import tqdm

                bar = tqdm(total=len(jobs), desc=f"{name:>11}", unit="job", file=sys.stderr, leave=True)
            except ImportError:
                bar = None
        last = [0]

        def tick(done: int) -> None:
            if bar is not None and done != last[0]:
                bar.update(done - last[0])
                last[0] = done

        results.append(Simulator(jobs, cluster, policy, interval=cfg.interval, progress=tick,
                                 spread_slowdown=cfg.spread_slowdown, migration_cost=cfg.migration_cost,
                                 **engine).run())
        if bar is not None:
            bar.close()
    return results
