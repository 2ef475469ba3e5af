"""When each job will start and end: the live policy, simulated from the cluster as it is now.

Slurm's ``squeue --start`` for ``elastictrain status --start``. The coordinator hands over what
its own policy decides on: every admitted job with its GPUs, service, progress, measured (or
assumed) step time and work left, the running ones where they run; the nodes as they are (a node
down or drained offers nothing); and a fresh instance of its policy carrying the running one's
memory (``export_state``, its jobs renamed to the simulation's ids) and the users' tickets. The
simulator's engine runs that policy from now on, on the coordinator's clock, until every job
ended, ``horizon`` seconds passed or ``budget`` seconds of wall time were spent; each job's first
start and its end are read off the decisions. The jobs submitted but not admitted yet because of
a begin time (``--begin``) or jobs they run after (``--after``) arrive in it then: at their begin
time, once those jobs finished in it (``ForecastJob.begin``, ``after``); with quotas, a job that
waits for its user's or project's quota is admitted when the jobs admitted before it leave room,
by the coordinator's own rule; a task of a job array held back by its ``%N`` is admitted when one
of its array's admitted tasks ends (``ForecastJob.array``, ``array_limit``). No other job arrives.
An elastic job (``min_gpu``..``max_gpu``) may be started, grown or shrunk in it as the policy
decides (backfill starting it on what is free and growing it onto GPUs left idle, autoscale
resizing it), its step time scaling linearly with its workers from the one measured at its size
now (the simulator's elastic jobs).

It is a forecast, not a promise: jobs submitted later, failures, a job's real work left (where it
gave no ``--steps``/``--epochs``, the coordinator assumes, and says so) and measured speeds that
change all move it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from ..model import JobSpec
from ..policies.api import Policy
from .cluster import ClusterSpec
from .engine import QuotaState, Simulator

__all__ = ["ForecastJob", "Forecast", "forecast"]


@dataclass(frozen=True)
class ForecastJob:
    """One job as the live table has it (times on the coordinator's clock)."""

    key: str
    gpus: int
    submit_time: float
    iteration_time: float  # seconds per step at full speed
    iterations: float  # steps in all
    remaining: float  # steps left
    user: str = ""
    priority: int = 0
    model: str = ""
    stage_times: tuple = ()
    speeds: tuple = ()
    attained: float = 0.0
    attained_gpu: float = 0.0
    preemptions: int = 0
    restart_cost: float = 0.0
    placement: tuple = ()  # where it runs now (empty: it waits)
    run_age: float = 0.0  # seconds since its run started (what a minimum run before preemption counts)
    gpu_type: str = ""  # the GPU type it needs ("" any)
    begin: float = 0.0  # (not admitted yet) the time it may arrive from, on the jobs' clock (0: now)
    after: tuple = ()  # (not admitted yet) the keys of the jobs it arrives after, once they finished
    project: str = ""  # the project its quota counts against
    counted: Optional[int] = 0  # (with quotas) admitted: the GPUs it counts (0: none); None: it waits for them
    array: str = ""  # the job array it is a task of ("" none)
    array_limit: int = 0  # its array's %N: tasks admitted at once, at most (0: no limit)
    min_gpu: int = 0  # elastic (``submit --gpus MIN:MAX``): the fewest workers it runs on (0: ``gpus``)
    max_gpu: int = 0  # and the most (0: ``gpus``); ``gpus`` is its size now (running) or next
    work_known: bool = True  # False: ``remaining`` is assumed (no --steps/--epochs: JobView.work_known)


@dataclass
class Forecast:
    start: dict = field(default_factory=dict)  # key -> seconds from now to its first start (0: runs now)
    end: dict = field(default_factory=dict)  # key -> seconds from now to its end
    never: dict = field(default_factory=dict)  # key -> why it cannot run on the nodes up now
    reached: float = 0.0  # seconds from now the simulation covered
    complete: bool = False  # every job ended within it
    wall: float = 0.0
    stopped: str = ""  # why the simulation stopped early, if it failed (what it got so far stands)


class _OutOfTime(Exception):
    pass


def forecast(policy: Policy, jobs: list[ForecastJob], gpus_per_node: tuple, node_types: tuple = (), *,
             horizon: float = 30 * 86_400.0, budget: float = 2.0, min_run: float = 0.0, now: float = 0.0,
             memory: Optional[tuple] = None, quotas: Optional[tuple] = None, windows: tuple = ()) -> Forecast:
    """Run ``policy`` on ``jobs`` over nodes offering ``gpus_per_node`` (0: down or drained) from
    ``now`` (the jobs' clock: the simulation runs on it, so times the policy remembers hold); see
    the module docstring. ``memory``: (``export_state()`` of the live policy, the live jobs' views),
    imported into ``policy`` with the simulation's job ids. ``quotas``: (QuotaBook, ProjectBook or
    None, users' usage, projects' usage) as the coordinator counts them: a job not admitted
    (``counted`` None) is admitted when they leave it room (the engine's ``QuotaState``). ``windows``:
    the nodes' planned maintenance, ``((node, start, end), ...)`` on the jobs' clock: the node offers
    nothing then, and its jobs there move (the engine's planned outages); ``(node, start, end,
    False)``: a cordon, which takes nothing new while its jobs run on (the engine's cordons)."""
    t0 = time.perf_counter()
    out = Forecast()
    nodes = len(gpus_per_node)
    if not jobs:
        out.complete = True
        return out
    if not nodes or not any(gpus_per_node):
        for j in jobs:
            out.never[j.key] = "no node offers GPUs now"
        return out
    # (a node down or drained offers 0 GPUs, as it does to the live policy)
    cluster = ClusterSpec(1, nodes, max(gpus_per_node), tuple(node_types), tuple(gpus_per_node))
    specs, prior, keys = [], {}, []
    free = list(gpus_per_node)
    for i, j in enumerate(jobs):  # (in the table's order: arrival order is what FIFO-like policies keep)
        where = tuple(j.placement)
        if where and all(0 <= n < nodes and free[n] >= g for n, g in where):
            for n, g in where:
                free[n] -= g
        else:  # on a node gone, or sharing its GPUs (an interleaving group's member): placed afresh
            where = ()
        lo, hi = min(j.min_gpu or j.gpus, j.gpus), max(j.max_gpu, j.gpus)
        specs.append(JobSpec(i, j.gpus, max(now, j.begin), max(j.iterations, j.remaining, 1e-9),
                             max(j.iteration_time, 1e-9),
                             j.model, tuple(j.stage_times), j.user, tuple(j.speeds), gpu_type=j.gpu_type,
                             project=j.project, **({"min_gpu": lo, "max_gpu": hi} if lo < hi else {})))
        prior[i] = {"attained": j.attained, "attained_gpu": j.attained_gpu, "preemptions": j.preemptions,
                    "remaining": max(j.remaining, 1e-9), "restart_cost": j.restart_cost, "placement": where,
                    "run_age": j.run_age, "priority": j.priority, "work_known": j.work_known}
        keys.append(j.key)
    index = {key: i for i, key in enumerate(keys)}
    after = {}
    for i, j in enumerate(jobs):
        if j.after:  # (one it waits for that the forecast does not hold never finishes in it: it never arrives)
            after[i] = {index.get(k, -1) for k in j.after}
    if memory is not None:
        state, views = memory
        policy.import_state(state, views, rename={key: i for i, key in enumerate(keys)})
    log: list = []

    def tick(_done: int, t: float) -> None:
        if time.perf_counter() - t0 > budget:
            raise _OutOfTime(t)

    state = None
    if quotas is not None:
        book, projects, used, pused = quotas
        state = QuotaState(book, projects, used, pused,
                           {i: j.counted for i, j in enumerate(jobs) if j.counted is not None},
                           {i: j.project for i, j in enumerate(jobs) if j.project})
    # an array's %N: a task not admitted yet waits until one of its array's admitted tasks ends
    arrays = {i: (j.array, j.array_limit, j.counted is not None) for i, j in enumerate(jobs)
              if j.array and j.array_limit}
    planned, cordons = [], []
    for n, a, b, *drain in windows:
        if 0 <= n < nodes and b > max(a, now):
            (planned if not drain or drain[0] else cordons).append((n, max(a, now), b))
    sim = Simulator(specs, cluster, policy, decisions=log, until=now + horizon, progress=tick, prior=prior,
                    min_run=min_run, after=after, quota=state, arrays=arrays, planned=planned,
                    cordons=cordons)
    try:
        res = sim.run()
        out.reached, out.complete = max(res.makespan - now, 0.0), not res.extra["unfinished"]
        for job_id, why in res.extra["rejected"]:
            out.never[keys[job_id]] = why
    except _OutOfTime as stop:
        out.reached = max(stop.args[0] - now, 0.0)
    except Exception as exc:  # (a policy that fails, or a simulation that stalls: what it got so far)
        out.reached = log[-1][0] - now if log else 0.0
        out.stopped = f"{type(exc).__name__}: {exc}"[:500]
    for i, j in enumerate(jobs):
        if prior[i]["placement"]:
            out.start[j.key] = 0.0
    for t, kind, job_id, _ in log:
        key = keys[job_id]
        if kind == "start" and key not in out.start:
            out.start[key] = t - now
        elif kind == "finish":
            out.end[key] = t - now
    out.wall = time.perf_counter() - t0
    return out


def when(seconds: Optional[float]) -> str:
    """``in 1h 20m``-style text for a time from now."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return "now"
    s = int(round(seconds))
    d, s = divmod(s, 86_400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{d}d" if d else "", f"{h}h" if h else "", f"{m}m" if m and not d else "",
             f"{s}s" if s and not (d or h) else ""]
    return "in " + " ".join(p for p in parts if p)
