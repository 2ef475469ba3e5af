"""The discrete-event simulator: jobs arrive, a policy decides, jobs run, get preempted, finish.

Events are arrivals, completions, the policy's own wake-ups (e.g. a Tiresias demotion) and,
optionally, a fixed scheduling interval (Muri and Gavel use 6-minute rounds). At each event
the engine advances every running job and runs one step of the mechanism core
(:class:`~elastictrain.scheduling.Scheduler`: snapshot, decide, plan, act) on a simulated clock
and the simulated backend (:mod:`.backend`), the same core the coordinator runs on real jobs.
It is deterministic: no randomness, ties broken by job id.

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
``planned``: outages known ahead (maintenance windows, ``simulate --maintenance``): the same, and
the policy sees them from the start (``ClusterSnapshot.windows``: backfill plans around them).
``cordons``: ``(node, start, end)`` windows known ahead in which a node takes nothing new but its
running jobs run on (``nodes cordon NAME --at``, ``simulate --cordon``): the node offers only the
GPUs its running jobs hold, as a live cordoned node does, so it empties as they end; the policy
sees them as it sees ``planned``.
``outages``: ``(node, start, end)`` seconds in which a node is lost (``end`` may be ``inf``): at
``start`` the jobs with GPUs on it are preempted (their progress kept, as from a checkpoint; the
restart cost is paid when they start again) and the node offers 0 GPUs, as a live coordinator
shows a lost node, until ``end``. With ``checkpoint_every`` (seconds of training between a run's
checkpoints), such a job loses the work since its last checkpoint, as a live one does. A job
bigger than what the nodes lost for good leave can never run again: it is set aside
(``extra["rejected"]``, with the reason), whether it waits then or arrives later.
``migration_cost``: seconds a running job loses when a decision moves it to another placement
(Gandiva-fair's migration). ``window``: also record, per user and window of that many seconds,
the iterations done (also weighted by GPU count: data-parallel minibatches) and the GPU-seconds
received per GPU type (``extra["timeline"]``), for fairness over time. ``quota``: every user's
jobs wait outside the policy's view until that user's admitted jobs fit it, as under the
coordinator's ``--quota-gpus``/``--quota-jobs`` (the same rule, ``coordinator/quotas.py``: by
priority, then arrival; a job counts its GPUs from admission to its end); their wait counts as
queueing. A job bigger than the quota is set aside, with the reason. A :class:`QuotaState`
instead: each user's and project's quotas as a live coordinator has them, and the jobs admitted
already (a forecast's). ``after``: job id -> the
jobs it runs after (Slurm's ``--dependency=afterok``): it arrives at its submit time or when
the last of them finished, whichever is later (never, if one never does). ``arrays``: job id ->
(array, N, admitted): at most N of an array's jobs are past this point at once (Slurm's
``--array 0-15%N``); the others wait, in arrival order, until one of them ends (``admitted``: a
job the live coordinator admitted already, which never waits here).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Optional, Sequence, Union

from ..clock import ManualClock
from ..coordinator.quotas import Quota, QuotaBook
from ..errors import ConfigError
from ..model import JobSpec
from ..policies.api import EMPTY, Policy
from ..policies.placement import one_type_room, type_matches
from ..scheduling import ClusterShape, Entry, JobStatus, JobTable, Scheduler
from ..scheduling.api import START
from .backend import SimBackend
from .cluster import ClusterSpec
from .traces import SKEW

__all__ = ["Simulator", "SimResult", "JobRecord", "MURI_RESTART_COST", "SimulationStalled", "STALL_LIMIT",
           "THRASH_LIMIT", "check_outages"]

#: events in a row that make no progress (no arrival, no completion, time advanced < 1 us) before
#: the engine gives up with :class:`SimulationStalled`
STALL_LIMIT = 100_000
#: events in a row in which time advanced but no job did any work (nothing arrived or finished)
#: before the engine stops: the jobs spend every slice restarting (thrashing)
THRASH_LIMIT = 10_000


class SimulationStalled(ConfigError):
    """The event loop stopped making progress; the message names the time and the jobs involved."""

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
    priority: int = 0
    resizes: int = 0  # times an elastic job's worker count changed (each a restart)

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


def _typed_room(cluster: ClusterSpec, want: str, one_type: bool) -> int:
    """The most GPUs a job needing GPU type ``want`` may get (``one_type``: a policy that runs a
    gang on one GPU type: the largest matching type's)."""
    one = one_type_room(want, tuple(cluster.node_types), cluster.capacities)  # [a100|h100]: all of it on one
    if one is not None:
        return one
    per = [g for t, g in cluster.gpus_by_type.items() if type_matches(want, t)] if cluster.node_types else []
    return (max(per, default=0) if one_type else sum(per))


class Simulator:
    def __init__(self, jobs: list[JobSpec], cluster: ClusterSpec, policy: Policy, *,
                 restart_cost: Union[str, float, Callable[[Entry], float]] = 0.0,
                 charge: str = "on_start", speed_factor: float = 1.0, interval: Optional[float] = None,
                 spread_slowdown: float = 1.0, skew_sensitive: float = 0.5, until: Optional[float] = None,
                 progress: Optional[Callable[[int, float], None]] = None, migration_cost: float = 0.0,
                 window: Optional[float] = None, decisions: Optional[list] = None,
                 protect_startup: bool = True, outages: Sequence[tuple] = (),
                 checkpoint_every: Optional[float] = None, min_run: float = 0.0,
                 prior: Optional[dict] = None, quota: Union[Quota, "QuotaState", None] = None,
                 after: Optional[dict] = None, arrays: Optional[dict] = None, planned: Sequence[tuple] = (),
                 cordons: Sequence[tuple] = ()) -> None:
        if charge not in ("on_start", "every_event"):
            raise ConfigError(f"charge must be on_start or every_event, got {charge!r}")
        if interval is not None and not (interval >= 1e-3 and math.isfinite(interval)):
            raise ConfigError(f"interval must be a finite number of seconds >= 0.001, got {interval!r}")
        # jobs that can never run are set aside with the reason (the rest is simulated)
        self.rejected: list[tuple] = []
        limit, why = cluster.total_gpus, f"the cluster has {cluster.total_gpus} GPUs"
        if getattr(policy, "single_type", False) and cluster.node_types:
            limit = max(cluster.gpus_by_type.values())
            why = f"the policy runs a gang on one GPU type, and the largest type has {limit} GPUs"
        fits = []
        self.quota = quota if isinstance(quota, Quota) and quota.limited else None  # (the one quota of simulate)
        # what the quota gate admits by (a forecast's QuotaState: the coordinator refused the jobs too big)
        self.state = quota if isinstance(quota, QuotaState) else \
            QuotaState(QuotaBook({}, self.quota)) if self.quota is not None else None
        for j in jobs:
            if j.num_gpu > limit:
                self.rejected.append((j.job_id, f"needs {j.num_gpu} GPUs but {why}"))
            elif j.gpu_type and j.num_gpu > _typed_room(cluster, j.gpu_type, getattr(policy, "single_type", False)):
                has = _typed_room(cluster, j.gpu_type, False)  # (in all: the message's figure)
                self.rejected.append((j.job_id, f"needs {j.num_gpu} GPUs of type {j.gpu_type} but the cluster has "
                                      f"{has} (types: "
                                      f"{', '.join(cluster.gpus_by_type) if cluster.node_types else 'none named'})"))
            elif self.quota is not None and self.quota.gpus is not None and j.num_gpu > self.quota.gpus:
                self.rejected.append((j.job_id, f"needs {j.num_gpu} GPUs but a user's quota is {self.quota.gpus}"))
            else:
                fits.append(j)
        self.specs = sorted(fits, key=lambda j: (j.submit_time, j.job_id))
        self.cluster, self.policy, self.charge = cluster, policy, charge
        self.factor, self.interval, self.progress = speed_factor, interval, progress
        if spread_slowdown < 1.0:
            raise ConfigError(f"spread_slowdown must be >= 1, got {spread_slowdown}")
        self.spread_slowdown, self.skew_sensitive = spread_slowdown, skew_sensitive
        self.until = until  # stop the simulation at this time (jobs may be unfinished)
        if migration_cost < 0 or (window is not None and window <= 0):
            raise ConfigError("migration_cost must be >= 0 and window > 0")
        self.migration_cost, self.window = float(migration_cost), window
        self.decisions = decisions  # if a list: (time, action kind or "finish", job id, group) appended
        # planned ones are outages the policy knows of from the start (ClusterSnapshot.windows: maintenance)
        self.planned = check_outages(planned, cluster.nodes)
        self.outages = check_outages((*outages, *self.planned), cluster.nodes)
        self.cordons = check_outages(cordons, cluster.nodes, "cordon")
        if checkpoint_every is not None and not (checkpoint_every > 0 and math.isfinite(checkpoint_every)):
            raise ConfigError(f"checkpoint_every must be a number of seconds > 0, got {checkpoint_every!r}")
        self.checkpoint_every = checkpoint_every
        self.protect_startup, self.min_run = protect_startup, min_run
        # job id -> its state when the simulation starts (a forecast from a live cluster, sim/forecast.py):
        # attained, attained_gpu, preemptions, remaining (iterations), restart_cost, placement (running), and
        # run_age (seconds its run has run: what min_run counts), priority (any int: the tier a policy sees)
        self.prior = prior or {}
        self.after = {k: frozenset(v) for k, v in (after or {}).items() if v}  # job id -> the ids it runs after
        self.arrays = dict(arrays or {})  # job id -> (array, most at once, admitted already)
        if restart_cost == "muri":
            self.cost = lambda j: MURI_RESTART_COST.get(j.num_gpu, {}).get(j.model, 10.0)
        elif callable(restart_cost):
            self.cost = restart_cost
        else:
            c = float(restart_cost)
            self.cost = lambda j: c

    def _entry(self, s: JobSpec) -> Entry:
        e = Entry(s.job_id, s.num_gpu, s.submit_time, model=s.model, iteration_time=s.iteration_time * self.factor,
                  iterations=s.iterations, stage_times=s.stage_times, user=s.user, skew=SKEW.get(s.model, 0.0),
                  speeds=MappingProxyType(dict(s.speeds)) if s.speeds else EMPTY, priority=s.priority,
                  gpu_type=s.gpu_type, project=s.project, min_gpu=s.min_gpu, max_gpu=s.max_gpu)
        # its iteration time at its size at submission, and the size its iteration_time is for (SimBackend)
        e.data["spec"], e.data["it0"], e.data["gpus"] = s, e.iteration_time, s.num_gpu
        e.restart_cost = self.cost(e)
        return e

    def run(self) -> SimResult:
        t_wall = time.perf_counter()
        specs, n = self.specs, len(self.specs)
        cluster = self.cluster
        table = JobTable()
        clock = ManualClock(0.0)
        shape = ClusterShape(cluster.capacities, cluster.nodes_per_switch, cluster.node_types,
                             tuple(sorted((*self.planned, *self.cordons))))
        backend = SimBackend(shape, table, clock, every=self.charge == "every_event",
                             spread_slowdown=self.spread_slowdown, skew_sensitive=self.skew_sensitive,
                             migration_cost=self.migration_cost, window=self.window)
        sched = Scheduler(self.policy, table, backend, clock, strict=True, protect_startup=self.protect_startup,
                          min_run=self.min_run)
        elastic = any(s.min_gpu or s.max_gpu for s in specs)  # (their rates are measured for the policy)
        first_step_events = getattr(self.policy, "first_step_events", True) or \
            (elastic and getattr(self.policy, "first_step_events_elastic", False))  # (backfill grows them then)
        done: list[JobRecord] = []
        util: list[tuple[float, int]] = []
        now, idx, events = 0.0, 0, 0
        wakeup: Optional[float] = None
        inf = math.inf
        interval, until, log, progress = self.interval, self.until, self.decisions, self.progress
        next_round = interval if interval else inf
        advance, next_end, tick, running = backend.advance, backend.next_end, sched.tick, table.running
        used = 0
        # node outages: (time, 1 down / 0 back, node), backs first at one time; cordons: 3 begins / 2 ends
        changes = sorted([(a, 1, node) for node, a, _ in self.outages]
                         + [(b, 0, node) for node, _, b in self.outages if b != inf]
                         + [(a, 3, node) for node, a, _ in self.cordons]
                         + [(b, 2, node) for node, _, b in self.cordons if b != inf])
        oi, t_out = 0, changes[0][0] if changes else inf
        full = cluster.capacities
        caps, outage_preemptions, lost_work = list(full), 0, 0.0
        forever = {node for node, _, end in self.outages if end == inf}
        gone: set = set()  # nodes lost for good, so far
        down: set = set()  # nodes lost now
        cordoned: set = set()  # nodes cordoned now: they offer only what their running jobs hold
        rejected, room, why = list(self.rejected), inf, ""  # room: the largest gang that can still ever run
        every_ckpt = self.checkpoint_every
        if changes and every_ckpt:
            backend.runs = {}
        gate = _QuotaGate(self.state) if self.state is not None else None

        def admit(spec: JobSpec) -> None:
            e = table.add(self._entry(spec))
            if spec.job_id in self.prior:
                self._resume(e, self.prior[spec.job_id], table, backend)
        after = self.after
        parked: dict = {}  # job id -> (its spec, the jobs it still waits to finish): arrived, not admitted
        waiting_on: dict = {}  # job id -> the parked jobs that wait for it
        ended_ids: set = set()  # (with after) the jobs that finished
        arrays = _ArrayGate(self.arrays) if self.arrays else None
        stalled = 0  # events in a row without progress (the watchdog)
        idle, idle_from = 0, 0.0  # events in a row in which time advanced but no work was done
        while idx < n or len(table):
            # ---- the next event
            t_arr = specs[idx].submit_time if idx < n else inf
            t = min(t_arr, next_end(now), wakeup if wakeup is not None else inf, next_round, t_out)
            if until is not None and t > until:
                t = until
            if t == inf:
                raise ConfigError(f"simulation stalled at t={now:.0f} s with {len(table)} waiting job(s) that "
                                  f"the policy {self.policy.name} never starts" + (
                                      f" (node(s) {', '.join(map(str, sorted(gone)))} lost for good: {sum(caps)} "
                                      f"GPUs left, and these jobs need up to {max(e.num_gpu for e in table.entries())})"
                                      if gone else ""))
            # ---- advance running jobs to t
            finished = advance(now, t)  # (it also accrues the running jobs' service)
            if table.stopping:
                table.accrue(t)
            moved_on = t - now >= 1e-6
            now = clock.t = t
            if wakeup is not None and wakeup <= now:
                wakeup = None
            if next_round <= now:
                next_round = now + interval
            released = []  # parked jobs whose last dependency finished now
            for e in finished:
                if arrays is not None:
                    released += arrays.leave(e.key)  # the array's next tasks take its place
                if after:
                    ended_ids.add(e.key)
                    for k in waiting_on.pop(e.key, ()):
                        spec, deps = parked[k]
                        deps.discard(e.key)
                        if not deps:
                            del parked[k]
                            released.append(spec)
                if log is not None:
                    log.append((now, "finish", e.key, ()))
                table.end(e.key, JobStatus.FINISHED, now)
                backend.forget(e.key)
                done.append(JobRecord(e.key, e.num_gpu, e.model, e.submit_time, e.start_time, now,
                                      e.data["spec"].duration, e.preemptions, e.pending, e.user, e.attained_gpu,
                                      e.priority, e.data.get("resizes", 0)))
            reshaped = t_out <= now
            if reshaped:  # a node is lost, or back
                while oi < len(changes) and changes[oi][0] <= now:
                    _, kind, node = changes[oi]
                    oi += 1
                    if kind >= 2:  # a cordon begins (its GPUs are counted below) or ends
                        (cordoned.add if kind == 3 else cordoned.discard)(node)
                        if kind == 2 and node not in down:
                            caps[node] = full[node]
                        backend.cordon(cordoned)
                        continue
                    caps[node] = 0 if kind else full[node]
                    if not kind:
                        down.discard(node)
                        continue
                    down.add(node)
                    if node in forever:
                        gone.add(node)
                    for e in [e for e in running.values() if any(m == node for m, _ in e.placement)]:
                        if every_ckpt:
                            lost_work += self._lose_since_checkpoint(e, now - backend.runs.get(e.key, now))
                        table.preempt_now(e.key, now)
                        outage_preemptions += 1
                        if log is not None:
                            log.append((now, "preempt", e.key, ()))
                t_out = changes[oi][0] if oi < len(changes) else inf
                if gone:  # a job too big for what is left can never run: set aside, with the reason
                    room, why = self._room(gone)
                    for e in [e for e in table.entries() if e.num_gpu > room and not e.running]:
                        table.end(e.key, JobStatus.CANCELLED, now)
                        backend.forget(e.key)
                        rejected.append((e.key, f"needs {e.num_gpu} GPUs but {why}"))
            arrivals = idx
            while idx < n and specs[idx].submit_time <= now or released:
                if idx < n and specs[idx].submit_time <= now:
                    spec = specs[idx]
                    idx += 1
                    if after and spec.job_id in after:
                        deps = set(after[spec.job_id] - ended_ids)
                        if deps:  # it waits for them to finish (--after), outside the policy's view
                            parked[spec.job_id] = (spec, deps)
                            for d in deps:
                                waiting_on.setdefault(d, []).append(spec.job_id)
                            continue
                else:  # (released by a finish in this event)
                    spec = released.pop(0)
                if spec.num_gpu > room:
                    rejected.append((spec.job_id, f"needs {spec.num_gpu} GPUs but {why}"))
                    continue
                if arrays is not None and arrays.arrive(spec):  # it waits for one of its array's to end
                    continue
                if gate is not None and gate.arrive(spec):  # it waits for its user's quota (admitted below)
                    continue
                admit(spec)
            if gate is not None and (finished or idx > arrivals or reshaped):
                for e in finished:
                    gate.leave(e)
                if gone:
                    for spec in gate.set_aside(room):
                        rejected.append((spec.job_id, f"needs {spec.num_gpu} GPUs but {why}"))
                for spec in gate.admit():
                    admit(spec)
            if finished or idx > arrivals or backend.worked or not running:
                idle = 0
            else:
                if idle == 0:
                    idle_from = now
                idle += 1
                if idle >= THRASH_LIMIT:
                    raise SimulationStalled(self._thrash_report(idle_from, now, table))
            if finished or idx > arrivals or moved_on:
                stalled = 0
            else:
                stalled += 1
                if stalled >= STALL_LIMIT:
                    raise SimulationStalled(self._stall_report(now, table, backend, wakeup))
            if cordoned and self._cordon_caps(cordoned, down, caps, full, running) or reshaped:
                backend.set_capacities(tuple(caps))  # (nodes lost, back, cordoned; a cordoned node emptying)
            # ---- decide and apply
            if len(table):
                events += 1
                if elastic:
                    backend.measure(now)
                actions = tick()
                if log is not None:
                    refused = sched.refused  # (a start refused on a cordoned node waits; a move refused stops)
                    log += [(now, a.kind.value if a.key not in refused else "preempt", a.key, tuple(a.group))
                            for a in actions if a.key not in refused or a.kind is not START]
                wakeup = sched.wakeup
                # a run's first step is an event, as live: decide again then; for a policy that
                # says a first step is no reason to decide (first_step_events False: every shipped
                # one but autoscale), only while protection keeps a job the decision left out (then
                # any first step may free the GPUs a held-back start waits for)
                waiting_for = table.starting if first_step_events or sched.kept else ()
                if waiting_for:
                    owed = backend.owed
                    began = now + min(owed.get(k, 0.0) for k in waiting_for)
                    if began > now:
                        wakeup = began if wakeup is None else min(wakeup, began)
                if wakeup is not None and wakeup <= now:  # a wake-up is always in the future
                    wakeup = math.nextafter(now, inf)
                if actions or finished or reshaped:  # else the running set is unchanged
                    used = 0
                    for e in running.values():
                        if not e.group or e.group[0] == e.key:  # (a group's followers share its GPUs)
                            used += e.num_gpu
            elif finished or reshaped:
                used = 0
            util.append((now, used))
            if progress is not None:
                progress(len(done), now)
            if until is not None and now >= until:
                break
        done.sort(key=lambda r: r.job_id)
        service: dict[str, float] = {}  # GPU-seconds received per user, finished jobs or not
        for r in done:
            service[r.user] = service.get(r.user, 0.0) + r.gpu_seconds
        for e in table.entries():
            service[e.user] = service.get(e.user, 0.0) + e.attained_gpu
        timeline = backend.timeline
        return SimResult(self.policy.name, done, now, events, util, cluster.total_gpus, backend.lost,
                         time.perf_counter() - t_wall, {"service_by_user": service,
                                                         "unfinished": len(table) + len(parked)
                                                         + (arrays.held() if arrays is not None else 0),
                                                         "migrations": backend.migrations,
                                                         "timeline": [timeline[k] for k in sorted(timeline)],
                                                         "rejected": rejected,
                                                         "outage_preemptions": outage_preemptions,
                                                         "outage_lost_seconds": lost_work})

    @staticmethod
    def _cordon_caps(cordoned: set, down: set, caps: list, full: tuple, running: dict) -> bool:
        """Each cordoned node offers the GPUs its running jobs hold (a group's once); whether
        ``caps`` changed."""
        held = dict.fromkeys(cordoned, 0)
        for e in running.values():
            if not e.group or e.group[0] == e.key:
                for m, g in e.placement:
                    if m in held:
                        held[m] += g
        changed = False
        for node, h in held.items():
            c = 0 if node in down else min(full[node], h)
            if caps[node] != c:
                caps[node], changed = c, True
        return changed

    def _room(self, gone: set) -> tuple:
        """The largest gang the cluster can still run with nodes ``gone`` lost for good (on a policy
        that runs a gang on one GPU type: the largest type's GPUs left), and why, in words."""
        cluster = self.cluster
        types = cluster.node_types if getattr(self.policy, "single_type", False) and cluster.node_types else \
            ("",) * cluster.nodes
        left: dict = {}
        for node, (t, g) in enumerate(zip(types, cluster.capacities)):
            if node not in gone:
                left[t] = left.get(t, 0) + g
        room = max(left.values(), default=0)
        lost = ", ".join(map(str, sorted(gone)))
        return room, (f"node(s) {lost} are lost for good and the nodes left have {room}"
                      + (" of one GPU type" if types[0] else ""))

    @staticmethod
    def _resume(e: Entry, p: dict, table: JobTable, backend: SimBackend) -> None:
        """A job arrives as it is elsewhere (``prior``): its service, progress and restart cost, and
        running where it runs (past its start-up) if it has a placement."""
        e.attained, e.attained_gpu = p.get("attained", 0.0), p.get("attained_gpu", 0.0)
        e.preemptions = p.get("preemptions", 0)
        e.remaining_iterations = p.get("remaining", e.remaining_iterations)
        e.restart_cost = p.get("restart_cost", e.restart_cost)
        e.priority = p.get("priority", e.priority)
        e.work_known = p.get("work_known", True)
        table.touch(e.key)  # (its view was made as it arrived)
        where = p.get("placement")
        if where:
            backend.resume(e, tuple(where), p.get("run_age", 0.0))

    def _lose_since_checkpoint(self, e: Entry, trained: float) -> float:
        """A job lost with its node goes back to its last checkpoint (one every ``checkpoint_every``
        seconds of its run's training): returns the seconds of work lost."""
        if trained <= 0:
            return 0.0
        lost = trained % self.checkpoint_every
        its = min(lost / (e.iteration_time * e.slowdown), e.iterations - e.remaining_iterations)
        e.remaining_iterations += its
        return lost

    def _thrash_report(self, since: float, now: float, table) -> str:
        costs = sorted({round(e.restart_cost, 3) for e in table.entries()})
        return (f"simulation makes no progress: from t={since:.0f} s to t={now:.0f} s, {THRASH_LIMIT} events in a "
                f"row advanced time but no job did any work under policy {self.policy.name}, with {len(table)} job(s) "
                f"waiting or running. The jobs spend every slice restarting: the restart cost per start "
                f"({', '.join(f'{c:g}' for c in costs)} s) is at least the time a job runs between preemptions. "
                "Raise the policy's quantum or interval (--quantum, --interval), or lower --restart-cost")

    def _stall_report(self, now: float, table, backend, wakeup) -> str:
        due = backend.next_end(now)
        near = ", ".join(f"job {e.key} ({e.remaining_iterations:.3g} iterations left)" for e in backend._due[1][:5])
        return (f"simulation stalled at t={now!r} s: {STALL_LIMIT} events in a row made no progress (no arrival, no "
                f"completion, time advanced < 1 us) under policy {self.policy.name}; next completion at {due!r} "
                f"({near or 'no running job'}), wake-up {wakeup!r}, {len(table)} job(s) waiting or running. "
                "Report it with the trace: it is an engine or policy bug")


def check_outages(outages: Sequence[tuple], nodes: int, what: str = "outage") -> tuple:
    """``(node, start, end)`` triples, checked: a node of the cluster, 0 <= start < end (end may be
    inf: never back), and one node's outages apart.

    Raises:
        ConfigError: naming the outage and the fix.
    """
    out = []
    for o in outages:
        try:
            node, start, end = o
            ok = isinstance(node, int) and not isinstance(node, bool) and 0 <= node < nodes
            start, end = float(start), float(end)
        except (TypeError, ValueError):
            raise ConfigError(f"{what} {o!r}: give (node, start, end) with start and end in seconds") from None
        if not ok:
            raise ConfigError(f"{what} {o!r}: node must be a node index from 0 to {nodes - 1}")
        if not (0.0 <= start < end and math.isfinite(start)) or math.isnan(end):
            raise ConfigError(f"{what} {o!r}: need 0 <= start < end seconds (end may be inf: the node never comes "
                              "back)")
        out.append((node, start, end))
    out.sort()
    for (n1, _, e1), (n2, s2, _) in zip(out, out[1:]):
        if n1 == n2 and s2 < e1:
            raise ConfigError(f"{what}s of node {n1} overlap (one ends at {e1:g} s, the next starts at {s2:g} s): "
                              "merge them")
    return tuple(out)


@dataclass
class _Held:
    """A job waiting for its user's quota, as coordinator/quotas.py's admission reads one."""

    user: str
    gpus: int
    priority: int
    seq: int
    spec: JobSpec
    project: str = ""


@dataclass
class QuotaState:
    """Quotas as a live coordinator has them (``Simulator(quota=)`` for a forecast): each user's
    (``book``, a QuotaBook) and each project's (``projects``, a ProjectBook, or None); what the jobs
    admitted already count (``used``/``pused``: user or project -> [GPUs, jobs]); those jobs
    (``admitted``: job id -> the GPUs it counts in ``used``, 0 for a borrower, which counts
    nothing), which arrive without waiting; and each job's project (``project_of``)."""

    book: QuotaBook
    projects: Optional[object] = None
    used: dict = field(default_factory=dict)
    pused: dict = field(default_factory=dict)
    admitted: dict = field(default_factory=dict)
    project_of: dict = field(default_factory=dict)


class _ArrayGate:
    """Job arrays' ``%N`` (``Simulator(arrays=)``: job id -> (array, N, admitted already)): at most N
    of an array's jobs past this gate at once; the others wait, in arrival order, for one to end."""

    def __init__(self, arrays: dict) -> None:
        self.arrays = arrays
        self.inflight: dict = {}  # array -> its jobs past the gate that have not ended
        self.queue: dict = {}  # array -> the specs waiting, in arrival order
        self.through: set = set()  # the jobs past the gate

    def arrive(self, spec: JobSpec) -> bool:
        """True: ``spec`` waits here (False: it goes on; a job of no array, or one past already)."""
        got = self.arrays.get(spec.job_id)
        if got is None or spec.job_id in self.through:
            return False
        a, most, admitted = got
        if not admitted and self.inflight.get(a, 0) >= most:
            self.queue.setdefault(a, []).append(spec)
            return True
        self._pass(a, spec)
        return False

    def leave(self, key) -> list[JobSpec]:
        """Job ``key`` ended: the specs of its array that go on now."""
        if key not in self.through:
            return []
        a, most, _ = self.arrays[key]
        self.inflight[a] -= 1
        out, waiting = [], self.queue.get(a)
        while waiting and self.inflight[a] < most:
            out.append(waiting.pop(0))
            self._pass(a, out[-1])
        return out

    def held(self) -> int:
        return sum(map(len, self.queue.values()))

    def _pass(self, a, spec: JobSpec) -> None:
        self.inflight[a] = self.inflight.get(a, 0) + 1
        self.through.add(spec.job_id)


class _QuotaGate:
    """Every user's quota (``Simulator(quota=)``), and its project's: arrivals wait here until the
    admitted jobs leave them room, admitted by the coordinator's own rule (``QuotaBook.admit``)."""

    def __init__(self, state: QuotaState) -> None:
        self.s = state
        self.book, self.projects = state.book, state.projects
        self.used = {k: list(v) for k, v in state.used.items()}
        self.pused = {k: list(v) for k, v in state.pused.items()}
        self.counted = {k: g for k, g in state.admitted.items() if g}  # job -> GPUs it counts (until its end)
        self.waiting: list[_Held] = []
        self._seq = 0

    def arrive(self, spec: JobSpec) -> bool:
        """True: ``spec`` waits here (False: admitted already, it goes on)."""
        if spec.job_id in self.s.admitted:
            return False
        self.waiting.append(_Held(spec.user, spec.num_gpu, spec.priority, self._seq, spec,
                                  self.s.project_of.get(spec.job_id, "")))
        self._seq += 1
        return True

    def leave(self, e: Entry) -> None:
        g = self.counted.pop(e.key, 0)
        if not g:
            return
        if e.user in self.used:
            u = self.used[e.user]
            u[0] -= g
            u[1] -= 1
        project = self.s.project_of.get(e.key, "")
        if project and self.projects is not None:
            self.projects.count(self.pused, project, -g, -1)  # (its parents' too)

    def admit(self) -> list[JobSpec]:
        """The waiting jobs admitted now."""
        if not self.waiting:
            return []
        admitted = self.book.admit(self.waiting, self.used, self.projects, self.pused)
        self.counted.update((h.spec.job_id, h.gpus) for h in admitted)
        if not admitted:
            return []
        taken = {id(h) for h in admitted}
        self.waiting = [h for h in self.waiting if id(h) not in taken]
        return [h.spec for h in admitted]  # (by priority, then arrival: as the coordinator admits)

    def set_aside(self, room: int) -> list[JobSpec]:
        """The waiting jobs bigger than ``room`` (what nodes lost for good leave), taken out."""
        out = [h.spec for h in self.waiting if h.gpus > room]
        if out:
            self.waiting = [h for h in self.waiting if h.gpus <= room]
        return out
