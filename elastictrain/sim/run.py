"""``elastictrain simulate``: run one trace through several policies and compare them."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Optional

from ..coordinator.quotas import Quota
from ..errors import ConfigError
from ..policies import create
from ..policies.tiers import PriorityTiers
from .cluster import load_cluster
from .engine import SimResult, Simulator, check_outages
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
    protect_startup: bool = True  # a job is not preempted before its first step (its restart cost paid)
    min_run: float = 0.0  # seconds a run is not preempted for after its start (Slurm's PreemptExemptTime)
    outages: tuple = ()  # (node, start, end): a node lost from start to end seconds (Simulator's outages)
    checkpoint_every: Optional[float] = None  # seconds of training between checkpoints (work an outage loses)
    priority_preemption: bool = False  # each policy once per job priority, highest first (policies/tiers.py)
    quota_gpus: int = 0  # every user's admitted jobs count at most this many GPUs (0: no limit; coordinator/quotas.py)
    quota_jobs: int = 0  # every user's admitted jobs, at most (0: no limit)
    maintenance: tuple = ()  # (node, start, end): outages the policies know of ahead (Simulator's planned)
    cordons: tuple = ()  # (node, start, end): the node takes nothing new, its jobs run on (Simulator's cordons)


def simulate(cfg: SimConfig, progress: bool = True, parallel: int = 1) -> list[SimResult]:
    """Run every policy of ``cfg`` on its trace; returns one result per policy, in order.

    Every policy and option is checked before the first simulation starts. ``parallel``: run
    up to that many policies at once, in separate processes. ``progress``: a bar per policy
    on stderr, simulated hours against the trace's last arrival.

    Raises:
        ConfigError: an unknown preset or policy, a bad option, or a bad trace or cluster file.
    """
    if cfg.preset not in PRESETS:
        raise ConfigError(f"--preset {cfg.preset!r} is not one of {', '.join(PRESETS)}")
    if not 1 <= parallel <= 64:
        raise ConfigError(f"--parallel must be in [1, 64], got {parallel}")
    engine = dict(PRESETS[cfg.preset])
    try:
        engine["quota"] = Quota(cfg.quota_gpus or None, cfg.quota_jobs or None)
    except ConfigError as exc:
        raise ConfigError(f"--quota-gpus/--quota-jobs: {exc}") from None
    if cfg.restart_cost is not None:
        try:
            engine["restart_cost"] = cfg.restart_cost if cfg.restart_cost == "muri" else float(cfg.restart_cost)
        except ValueError:
            raise ConfigError(f"--restart-cost {cfg.restart_cost!r}: use 'muri' or a number of seconds") from None
    opts = {k: v for k, v in cfg.policy_options.items() if v is not None}
    # every name and option is checked before anything runs
    checked = [create(name, only_known=True, **opts) for name in cfg.policies]
    jobs = load_trace(cfg.trace, cfg.trace_format)
    cluster = load_cluster(cfg.cluster)
    check_outages((*cfg.outages, *cfg.maintenance), cluster.nodes)
    check_outages(cfg.cordons, cluster.nodes, "cordon")
    horizon = max(j.submit_time for j in jobs)
    if progress:  # a policy whose decisions grow with the simulated span says so before a long run
        span = horizon - min(j.submit_time for j in jobs)
        for policy in checked:
            hint = getattr(policy, "replay_hint", None)
            note = hint(span) if hint is not None else None
            if note:
                print(f"note: {note}", file=sys.stderr)
    bars = _Bars(cfg.policies, horizon, len(jobs)) if progress else None
    try:
        if parallel == 1 or len(cfg.policies) == 1:
            results = []
            for i, name in enumerate(cfg.policies):
                tick = bars.callback(i) if bars else None
                results.append(_run_one(name, opts, jobs, cluster, cfg, engine, tick))
                if bars:
                    bars.update(i, len(results[-1].jobs), results[-1].makespan)
            return results
        return _run_parallel(cfg, opts, jobs, cluster, engine, parallel, bars)
    finally:
        if bars is not None:
            bars.close()


def _run_one(name, opts, jobs, cluster, cfg: SimConfig, engine: dict, tick=None) -> SimResult:
    if cfg.priority_preemption:
        policy = PriorityTiers(lambda: create(name, only_known=True, **opts))
    else:
        policy = create(name, only_known=True, **opts)  # each policy takes the options it knows
    return Simulator(jobs, cluster, policy, interval=cfg.interval, progress=tick, spread_slowdown=cfg.spread_slowdown,
                     migration_cost=cfg.migration_cost, protect_startup=cfg.protect_startup, outages=cfg.outages,
                     checkpoint_every=cfg.checkpoint_every, min_run=cfg.min_run, planned=cfg.maintenance,
                     cordons=cfg.cordons, **engine).run()


def _run_parallel(cfg, opts, jobs, cluster, engine, parallel: int, bars) -> list[SimResult]:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    manager = ctx.Manager() if bars else None
    queue = manager.Queue() if manager else None
    try:
        with ProcessPoolExecutor(max_workers=min(parallel, len(cfg.policies)), mp_context=ctx) as pool:
            futures = [pool.submit(_run_child, i, name, opts, jobs, cluster, cfg, engine, queue)
                       for i, name in enumerate(cfg.policies)]
            while bars is not None and not all(f.done() for f in futures):
                bars.drain(queue, timeout=0.2)
            results = [f.result() for f in futures]
            if bars is not None:
                bars.drain(queue, timeout=0.0)
            return results
    finally:
        if manager is not None:
            manager.shutdown()


def _run_child(i, name, opts, jobs, cluster, cfg, engine, queue) -> SimResult:
    tick = None
    if queue is not None:
        last = [0.0]

        def tick(done: int, now: float) -> None:
            t = time.monotonic()
            if t - last[0] >= 0.2:
                last[0] = t
                queue.put((i, done, now))
    result = _run_one(name, opts, jobs, cluster, cfg, engine, tick)
    if queue is not None:
        queue.put((i, len(result.jobs), result.makespan))
    return result


class _Bars:
    """One tqdm bar per policy: simulated hours (against the last arrival) and jobs done."""

    def __init__(self, names: list[str], horizon: float, jobs: int) -> None:
        try:
            from tqdm import tqdm
        except ImportError:  # progress is optional
            self.bars = []
            return
        total = max(horizon / 3600.0, 1e-9)
        self.jobs = jobs
        self.bars = [tqdm(total=round(total, 2), desc=f"{n:>11}", unit="h", file=sys.stderr, position=i, leave=True,
                          bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} simulated h{postfix} "
                          "[{elapsed}]", postfix=f"0/{jobs} jobs") for i, n in enumerate(names)]

    def update(self, i: int, done: int, now: float) -> None:
        if self.bars:
            bar = self.bars[i]
            bar.n = round(now / 3600.0, 2)
            if bar.n > bar.total:  # jobs still run after the last arrival: the bar's end moves with them
                bar.total = bar.n
            bar.set_postfix_str(f"{done}/{self.jobs} jobs", refresh=False)
            bar.refresh()

    def callback(self, i: int):
        last = [0.0]

        def tick(done: int, now: float) -> None:
            t = time.monotonic()
            if t - last[0] >= 0.1:
                last[0] = t
                self.update(i, done, now)
        return tick

    def drain(self, queue, timeout: float) -> None:
        import queue as q

        try:
            item = queue.get(timeout=timeout) if timeout else queue.get_nowait()
            while True:
                self.update(*item)
                item = queue.get_nowait()
        except q.Empty:
            pass

    def close(self) -> None:
        for bar in self.bars:
            bar.close()
