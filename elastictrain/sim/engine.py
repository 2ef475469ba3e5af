"""The discrete-event simulator: jobs arrive, a policy decides, jobs run, get preempted, finish.

Events are arrivals, completions, the policy's own wake-ups (e.g. a Tiresias demotion) and,
optionally, a fixed scheduling interval (Muri and Gavel use 6-minute rounds). At each event
the engine advances every running job, hands the policy a :class:`ClusterSnapshot`, and
applies the :class:`Decision`: placed jobs that were waiting start, running jobs that were
not placed are preempted. It is deterministic: no randomness, ties broken by job id.

Restart cost (``restart_cost``): seconds a job loses when it (re)starts, per model and GPU
count (the Muri table) or a constant. ``charge``:

* ``on_start``: paid once after each start or resume (checkpoint restore + warm-up);
* ``every_event``: paid by every running job at every event, as the Muri reference simulator
  does (its published tables were produced that way, so reproducing them needs it).

``speed_factor`` multiplies every iteration time (Muri's simulator runs a job alone at
1.015x its profiled iteration time). ``spread_slowdown``: a skew-sensitive job (model skew
above ``skew_sensitive``, e.g. VGG) placed across several nodes runs that many times slower
(Tiresias's consolidation argument); 1.0 disables it.

Heterogeneous clusters (``ClusterSpec.node_types``): a job runs at its speed on the GPU type
of its placement (``JobSpec.speeds``; a gang spanning types runs at the slowest member's).
``migration_cost``: seconds a running job loses when a decision moves it to another placement
(Gandiva-fair's migration). ``window``: also record, per user and window of that many seconds,
the iterations done (also weighted by GPU count: data-parallel minibatches) and the GPU-seconds
received per GPU type (``extra["timeline"]``), for fairness over time.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from ..errors import ConfigError
from ..model import JobSpec
from ..policies.api import ClusterSnapshot, JobState, Policy
from .cluster import ClusterSpec
from .traces import SKEW

__all__ = ["Simulator", "SimResult", "JobRecord", "MURI_RESTART_COST"]

#: seconds a job loses on (re)start, by GPU count and model (Muri's profiled table); 10 otherwise
MURI_RESTART_COST = {
    1: {"vgg16": 7, "vgg19": 7, "resnet18": 4, "shufflenet_v2_x1_0": 4, "bert": 10, "gpt2": 10, "a2c": 38, "dqn": 5},
    2: {"vgg16": 7, "vgg19": 7, "resnet18": 5, "shufflenet_v2_x1_0": 4, "bert": 10, "gpt2": 10, "a2c": 39, "dqn": 5},
    4: {"vgg16": 8, "vgg19": 8, "resnet18": 5, "shufflenet_v2_x1_0": 5, "bert": 10, "gpt2": 10, "a2c": 39, "dqn": 6},
    8: {"vgg16": 9, "vgg19": 9, "resnet18": 7, "shufflenet_v2_x1_0": 5, "bert": 10, "gpt2": 10, "a2c": 46, "dqn": 6},
    16: {"vgg16": 9, "vgg19": 10, "resnet18": 7, "shufflenet_v2_x1_0": 7, "bert": 10, "gpt2": 10, "a2c": 46,
         "dqn": 8},
    32: {"vgg16": 10, "vgg19": 10, "resnet18": 7, "shufflenet_v2_x1_0": 8, "bert": 10, "gpt2": 10, "a2c": 46,
         "dqn": 8},
}


@dataclass(frozen=True)
class JobRecord:
    job_id: int
    num_gpu: int
    model: str
    submit_time: float
    start_time: float
    end_time: float
    duration: float  # at full speed
    preemptions: int
    pending_time: float  # total time waiting
    user: str = ""
    gpu_seconds: float = 0.0  # service received (wall time running x GPUs)

    @property
    def jct(self) -> float:
        return self.end_time - self.submit_time

    @property
    def queueing_delay(self) -> float:
        return self.start_time - self.submit_time


@dataclass
class SimResult:
    policy: str
    jobs: list[JobRecord]
    makespan: float
    events: int
    utilization: list[tuple[float, int]]  # (time, GPUs in use) after each event
    total_gpus: int
    restart_seconds: float  # time lost to restart costs
    wall_seconds: float = 0.0
    extra: dict = field(default_factory=dict)


class Simulator:
    def __init__(self, jobs: list[JobSpec], cluster: ClusterSpec, policy: Policy, *,
                 restart_cost: Union[str, float, Callable[[JobState], float]] = 0.0,
                 charge: str = "on_start", speed_factor: float = 1.0, interval: Optional[float] = None,
                 spread_slowdown: float = 1.0, skew_sensitive: float = 0.5, until: Optional[float] = None,
                 progress: Optional[Callable[[int], None]] = None, migration_cost: float = 0.0,
                 window: Optional[float] = None) -> None:
        if charge not in ("on_start", "every_event"):
            raise ConfigError(f"charge must be on_start or every_event, got {charge!r}")
        too_big = [j.job_id for j in jobs if j.num_gpu > cluster.total_gpus]
        if too_big:
            raise ConfigError(f"job(s) {too_big[:5]} need more GPUs than the cluster's {cluster.total_gpus}")
        self.specs = sorted(jobs, key=lambda j: (j.submit_time, j.job_id))
        self.cluster, self.policy, self.charge = cluster, policy, charge
        self.factor, self.interval, self.progress = speed_factor, interval, progress
        if spread_slowdown < 1.0:
            raise ConfigError(f"spread_slowdown must be >= 1, got {spread_slowdown}")
        self.spread_slowdown, self.skew_sensitive = spread_slowdown, skew_sensitive
        self.until = until  # stop the simulation at this time (jobs may be unfinished)
        if migration_cost < 0 or (window is not None and window <= 0):
            raise ConfigError("migration_cost must be >= 0 and window > 0")
        self.migration_cost, self.window = float(migration_cost), window
        if restart_cost == "muri":
            self.cost = lambda j: MURI_RESTART_COST.get(j.num_gpu, {}).get(j.model, 10.0)
        elif callable(restart_cost):
            self.cost = restart_cost
        else:
            c = float(restart_cost)
            self.cost = lambda j: c

    def _groups(self, decision, run: dict, by_id: dict) -> dict[int, tuple]:
        """Validate the decision's interleaving groups; job id -> its group's ids."""
        out: dict[int, tuple] = {}
        for grp in decision.groups:
            grp = tuple(grp)
            where = run.get(grp[0]) if grp else None
            if (len(grp) < 2 or where is None or any(run.get(m) != where for m in grp)
                    or len({by_id[m].num_gpu for m in grp}) != 1 or any(m in out for m in grp)):
                raise ConfigError(f"policy {self.policy.name}: group {grp} must be 2+ placed jobs of one GPU "
                                  "count on one placement, each in one group")
            for m in grp:
                out[m] = grp
        return out

    def run(self) -> SimResult:
        t_wall = time.perf_counter()
        specs, n = self.specs, len(self.specs)
        gpus = self.cluster.capacities
        types = self.cluster.node_types
        timeline: dict = {}  # window index -> {"iterations": {user: n}, "gpu_seconds": {user: {type: s}}}
        migrations = 0
        every = self.charge == "every_event"
        runnable: list[JobState] = []
        running: list[JobState] = []
        owed: dict[int, float] = {}  # on_start: restart seconds still to pay
        done: list[JobRecord] = []
        util: list[tuple[float, int]] = []
        now, idx, events, lost = 0.0, 0, 0, 0.0
        wakeup: Optional[float] = None
        next_round = self.interval if self.interval else math.inf
        used = 0
        by_id: dict[int, JobState] = {}
        arrived: list[JobState] = []
        ended: list[int] = []
        group_of: dict[int, tuple] = {}  # job id -> the ids of its interleaving group (2+ jobs)
        charge: dict[int, float] = {}  # placed job id -> restart seconds it pays (its group's, if grouped)
        while idx < n or runnable:
            # ---- the next event
            t_arr = specs[idx].submit_time if idx < n else math.inf
            t_end = math.inf
            for j in running:
                t = (now + j.remaining_iterations * j.iteration_time * j.slowdown
                     + (0.0 if every else owed.get(j.job_id, 0.0)))
                if t < t_end:
                    t_end = t
            t = min(t_arr, t_end, wakeup if wakeup is not None else math.inf, next_round)
            if self.until is not None and t > self.until:
                t = self.until
            if t == math.inf:
                raise ConfigError(f"simulation stalled at t={now:.0f} s with {len(runnable)} waiting job(s) that "
                                  f"the policy {self.policy.name} never starts")
            # ---- advance running jobs to t
            dt = t - now
            finished = []
            for j in running:
                if every:
                    end = now + j.remaining_iterations * j.iteration_time * j.slowdown
                    if end <= t + 1e-9:
                        finished.append(j)
                        work = dt
                    else:
                        c = charge[j.job_id]
                        work = dt - c if dt > c else 0.0
                        lost += dt - work
                else:
                    o = owed.get(j.job_id, 0.0)
                    pay = min(o, dt)
                    if pay:
                        owed[j.job_id] = o - pay
                        lost += pay
                    work = dt - pay
                its = work / (j.iteration_time * j.slowdown)
                j.remaining_iterations -= its
                if self.window is not None and dt > 0:
                    self._record(timeline, now, t, j, its, types)
                j.attained += dt
                j.attained_gpu += dt * j.num_gpu
                if not every and j.remaining_iterations <= 1e-9 * max(1.0, j.iterations):
                    finished.append(j)
            now = t
            if wakeup is not None and wakeup <= now:
                wakeup = None
            if next_round <= now:
                next_round = now + self.interval
            for j in finished:
                j.running = False
                running.remove(j)
                runnable.remove(j)
                del by_id[j.job_id]
                ended.append(j.job_id)
                owed.pop(j.job_id, None)
                spec = j.extra["spec"]
                done.append(JobRecord(j.job_id, j.num_gpu, j.model, j.submit_time, j.start_time, now,
                                      spec.duration, j.preemptions, j.extra["pending"], j.user,
                                      j.attained_gpu))
            while idx < n and specs[idx].submit_time <= now:
                s = specs[idx]
                j = JobState(s.job_id, s.num_gpu, s.submit_time, s.model, s.iteration_time * self.factor,
                             s.iterations, s.stage_times, s.user, SKEW.get(s.model, 0.0))
                j.speeds = dict(s.speeds)
                j.extra["spec"], j.extra["pending"] = s, 0.0
                runnable.append(j)
                by_id[j.job_id] = j
                j.restart_cost = self.cost(j)
                arrived.append(j)
                idx += 1
            # ---- decide and apply
            if runnable:
                events += 1
                decision = self.policy.decide(ClusterSnapshot(now, tuple(runnable), gpus,
                                                              self.cluster.nodes_per_switch, tuple(arrived),
                                                              tuple(ended), tuple(running), types))
                arrived.clear()
                ended.clear()
                run = decision.run
                wakeup = decision.wakeup
                for j in running:
                    if j.job_id not in run:
                        j.running = False
                        j.preemptions += 1
                        j.placement = ()
                        j.pending_since = now
                running = [j for j in running if j.running]
                before = group_of
                group_of = self._groups(decision, run, by_id)
                charge = {jid: sum(by_id[m].restart_cost for m in group_of[jid]) if jid in group_of
                          else by_id[jid].restart_cost for jid in run}
                slow = decision.slowdown
                for jid, where in run.items():
                    j = by_id[jid]
                    moved = j.running and j.placement != where and sorted(j.placement) != sorted(where)
                    j.placement = where
                    j.slowdown = slow.get(jid) or (self.spread_slowdown if self.spread_slowdown > 1.0
                                                   and len(where) > 1 and j.skew > self.skew_sensitive else 1.0)
                    if types and j.speeds:
                        j.slowdown /= min(j.speeds.get(types[node], 1.0) for node, _ in where)
                    if moved:
                        migrations += 1
                        if not every and self.migration_cost:
                            owed[jid] = owed.get(jid, 0.0) + self.migration_cost
                    if not j.running:
                        j.running = True
                        j.extra["pending"] += now - j.pending_since
                        running.append(j)
                        if j.start_time is None:
                            j.start_time = now
                        if not every:
                            owed[jid] = charge[jid]
                    elif not every and before.get(jid) != group_of.get(jid):
                        owed[jid] = charge[jid]  # regrouped: the group restarts
                used = sum(j.num_gpu for j in running if group_of.get(j.job_id, (j.job_id,))[0] == j.job_id)
                if used > self.cluster.total_gpus:
                    raise ConfigError(f"policy {self.policy.name} placed {used} GPUs on a cluster of "
                                      f"{self.cluster.total_gpus}")
            elif finished:
                used = 0
            util.append((now, used))
            if self.progress is not None:
                self.progress(len(done))
            if self.until is not None and now >= self.until:
                break
        done.sort(key=lambda r: r.job_id)
        service: dict[str, float] = {}  # GPU-seconds received per user, finished jobs or not
        for r in done:
            service[r.user] = service.get(r.user, 0.0) + r.gpu_seconds
        for j in runnable:
            service[j.user] = service.get(j.user, 0.0) + j.attained_gpu
        return SimResult(self.policy.name, done, now, events, util, self.cluster.total_gpus, lost,
                         time.perf_counter() - t_wall, {"service_by_user": service,
                                                         "unfinished": len(runnable), "migrations": migrations,
                                                         "timeline": [timeline[k] for k in sorted(timeline)]})

    def _record(self, timeline: dict, a: float, b: float, j: JobState, its: float, types: tuple) -> None:
        """Spread a job's progress over [a, b) across the windows it spans (evenly in time)."""
        w = self.window
        gpu_type: dict = {}
        for node, n in j.placement:
            t = types[node] if types else "gpu"
            gpu_type[t] = gpu_type.get(t, 0) + n
        k, span = int(a // w), b - a
        while k * w < b:
            lo, hi = max(a, k * w), min(b, (k + 1) * w)
            if hi > lo:
                frac = (hi - lo) / span
                rec = timeline.setdefault(k, {"start": k * w, "iterations": {}, "iterations_gpu": {},
                                              "gpu_seconds": {}})
                rec["iterations"][j.user] = rec["iterations"].get(j.user, 0.0) + its * frac
                rec["iterations_gpu"][j.user] = rec["iterations_gpu"].get(j.user, 0.0) + its * frac * j.num_gpu
                per = rec["gpu_seconds"].setdefault(j.user, {})
                for t, n in gpu_type.items():
                    per[t] = per.get(t, 0.0) + n * (hi - lo)
            k += 1
