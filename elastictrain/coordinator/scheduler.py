"""The live scheduling loop: the coordinator applies a policy to real jobs (cluster mode).

``elastictrain coordinator --policy NAME`` runs this beside the API. Jobs come from
``elastictrain submit``; nodes from ``elastictrain node`` daemons. The loop is the mechanism
core's :class:`~elastictrain.scheduling.Scheduler` on the wall clock with the
:class:`~.live.LiveBackend`: it decides on arrivals, completions, failures, node changes, the
policy's own wake-ups and every ``interval`` seconds, in the coordinator's event loop (no
threads, no locks).

Policy inputs are measured, not declared: attained service while a job holds its GPUs and
trains (from each run's first step report: start-up is not service); iteration time and progress from the steps its workers report (``--steps``/``--epochs``
give the total); skew and stage times from its profiles. What a policy needs and the job has not
measured yet is assumed, once, with an ``assumed`` event saying what.

Everything lives in the coordinator's database and is written before a reply: jobs, nodes and
their tasks, the event log, job output, and the policy's memory (``export_state``). After a
``kill -9`` the coordinator reloads it all; running jobs keep training through the outage and
are re-adopted (their agents' rendezvous rounds are durable too).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import re
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from operator import itemgetter
from types import MappingProxyType
from typing import Optional

import msgspec

from ..errors import BadRequestError, ConfigError, ConflictError, ForbiddenError, NotFoundError, PolicyError
from ..model import MAX_PRIORITY
from ..policies.api import EMPTY, create, options_of
from ..policies.tiers import BORROW_TIER, PriorityTiers
from ..policies.placement import one_type_room, type_matches
from ..policies.shares import account, account_tickets, shares
from ..runtime.stages import STAGES
from ..scheduling import Entry, JobStatus, JobTable, Scheduler
from ..scheduling.api import START
from ..sim.forecast import ForecastJob, forecast
from ..wire import (
    ClusterForecast, ClusterJobInfo, ClusterJobList, ClusterStatus, EventList, ForecastInfo, GpuTimeList, GroupMember,
    JobGpuTime, JobRequeue, JobSubmit, JobUpdate, LogList, MemberResult, NodeCordon, NodeInfo, NodeLeave, NodePoll,
    NodeRegister, NodeSlots, NodeTasks, ProjectInfo, ProjectList, ProjectSet, Series, StepInfo, StepReport, Task,
    UserInfo, UserList, UserQuota, UserTickets,
)
from .access import ADMIN, DEFAULT_ENV_ALLOW, Identity, check_job_command, check_job_env
from .events import EventLog, LogBook
from .listing import ALL, LIST_ENDED, JobFilter, JobIndex
from .live import ENDED_NAMES as _ENDED_NAMES
from .live import JobRecord, LiveBackend
from .metrics import Timings
from .nodes import Exit, NodeBook, TaskRec
from .notify import Notifier, check_types, check_url
from .admission import Admission
from .arrays import parse_array
from .projects import META_KEY as PROJECTS_META
from .projects import ProjectBook
from .quotas import MAX_QUOTA, Quota, QuotaBook
from .quotas import CAPS_KEY as CAPS_META
from .quotas import META_KEY as QUOTAS_META
from .records import JobRecords
from .retention import MAX_RETAIN, MIN_RETAIN, Retention
from .store import LoadedState
from .users import META_KEY as USERS_META
from .users import UserBook

__all__ = ["ClusterConfig", "ClusterScheduler"]

log = logging.getLogger(__name__)
_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(JobRecord)
_FIRST = itemgetter(0)
ASSUMED_ITERATION_TIME = 1.0  # seconds per step until a job reports two steps
ASSUMED_REMAINING = 3600.0  # seconds of work left when a job gives neither --steps nor --epochs
MAX_BEGIN = 366 * 86_400.0  # how far ahead --begin may be (seconds)
FORECAST_BUDGET = 2.0  # seconds of wall time a forecast (status --start) may simulate for
FORECAST_TTL = 5.0  # seconds a forecast answers every request while nothing is decided (one simulation at a time)
FORECAST_SLOW_TTL = 30.0  # the same for a forecast that took half its budget or more, decisions or not
UTIL_POINTS, UTIL_EVERY = 1800, 2.0  # the utilization chart: an hour at one point per 2 s
STEP_POINTS, STEP_JOBS = 600, 2000  # step history points per job, jobs kept
EXTRAPOLATE_MIN = 30.0  # seconds a run's progress is carried past its last step report, at least
PROFILES_KEPT = 1000  # stage profiles kept for reuse, by command (oldest go first)
PROFILES_META = "stage_profiles"
RATE_WINDOW = 10.0  # seconds a job's measured throughput covers (a policy's ``rate_window`` overrides it)


@dataclass(frozen=True)
class ClusterConfig:
    """``policy``: a registered policy name; ``options``: its options (as ``simulate`` takes them)."""

    policy: str
    options: dict = field(default_factory=dict)
    interval: float = 5.0
    node_timeout: float = 15.0
    persist_every: float = 10.0  # seconds between writes of attained service alone
    #: environment variables a submitted job may set (shell patterns; access.DEFAULT_ENV_ALLOW and these)
    job_env_allow: tuple = ()
    #: never preempt a job before its run's first training step (Scheduler.protect_startup)
    protect_startup: bool = True
    #: seconds a run is not preempted for after its start (Scheduler.min_run; Slurm's PreemptExemptTime)
    min_run: float = 0.0
    #: every user's quota unless it has its own (quotas.py): GPUs and jobs its admitted jobs may hold (0: no limit)
    quota_gpus: int = 0
    quota_jobs: int = 0
    #: jobs of a higher priority take GPUs from lower ones; the policy decides within each (policies/tiers.py)
    priority_preemption: bool = False
    #: a job over its user's quota is admitted anyway, on GPUs nobody within a quota needs, and preempted
    #: first (Kueue's borrowing; admission.py)
    quota_borrow: bool = False
    #: the URLs jobs' notifications may go to (shell patterns; none: no notifications; notify.py)
    notify_allow: tuple = ()
    #: seconds the event log and ended jobs' output are kept (0: forever; retention.py)
    retain: float = 0.0

    def __post_init__(self) -> None:
        if not 0.05 <= self.interval <= 3600:
            raise ConfigError(f"--interval must be in [0.05, 3600] seconds, got {self.interval}")
        if not 1.0 <= self.node_timeout <= 3600:
            raise ConfigError(f"--node-timeout must be in [1, 3600] seconds, got {self.node_timeout}")
        for flag, n in (("--quota-gpus", self.quota_gpus), ("--quota-jobs", self.quota_jobs)):
            if not 0 <= n <= MAX_QUOTA:
                raise ConfigError(f"{flag} must be in [0, {MAX_QUOTA}] (0: no limit), got {n}")
        if self.retain != 0 and not MIN_RETAIN <= self.retain <= MAX_RETAIN:
            raise ConfigError(f"--retain must be 0 (keep forever) or {MIN_RETAIN:.0f} s to 100 years (e.g. 90d), got "
                              f"{self.retain} s")


class ClusterScheduler:
    def __init__(self, coordinator, loaded: LoadedState, cfg: ClusterConfig) -> None:
        self.c, self.cfg = coordinator, cfg
        self.store, self.clock = coordinator.store, coordinator.clock
        self.policy = self._make_policy()
        self.users = UserBook(loaded.meta, self.policy)
        self.quotas = QuotaBook(loaded.meta, Quota(cfg.quota_gpus or None, cfg.quota_jobs or None))
        self._hold_after_stop: set[str] = set()  # requeued with --hold: held once their runs stop
        self.projects = ProjectBook(loaded.meta)
        self._share_tickets(self.policy)
        self.admission = Admission(self)  # who enters the job table, and when (admission.py)
        self.events = EventLog(self.store, loaded.last_event, loaded.meta)
        self.timings = Timings()  # GET /metrics' histograms (since this coordinator started)
        self.logs = LogBook(self.store, loaded.log_bytes, clock=self.clock.now)
        self.nodes = NodeBook(loaded.nodes, self._emit, cfg.node_timeout, self._task)
        self.records = JobRecords()  # (the ended jobs' packed: records.py)
        self.table = JobTable()
        self._dirty: set[str] = set()
        self._rates: dict[str, tuple] = {}  # job -> (run, [(time, samples consumed)]): throughput
        # job name -> (GPU type, workers) -> measured seconds per step there (jobs of one name share it)
        self._type_times: dict[str, dict[tuple[str, int], float]] = {}
        self._seq = int(loaded.meta.get("job_seq", "0"))
        # jobs' notifications (submit --notify): from the event log, after its durable cursor
        self.notifier = Notifier(self.store, self.records, self._emit, loaded.meta) if cfg.notify_allow else None
        # what the status page draws (in memory): GPUs in use over time, each job's steps over time
        self._util: deque = deque(maxlen=UTIL_POINTS)
        self._step_hist: dict[str, deque] = {}
        # a job's command (script, arguments, workdir) -> its stage times measured alone (reused)
        self._profiles: dict[str, tuple] = {}
        try:
            for k, v in json.loads(loaded.meta.get(PROFILES_META, "[]")):
                self._profiles[str(k)] = tuple(float(x) for x in v)
        except (ValueError, TypeError):
            log.error("the stored stage profiles are unreadable; jobs are profiled again")
        self._profiles_saved, self._profiles_dirty = len(self._profiles), False
        self._pkeys: dict[str, str] = {}  # job -> its profile key (its command, encoded once)
        self.backend = LiveBackend(self.table, self.nodes, coordinator.rendezvous, self.events, self.clock,
                                   self.records, self._dirty.add)
        now = self.clock.now()
        # (read a page at a time, each one packed as it comes if it ended; put in submission order)
        self.records.load(_DEC.decode(raw) for _, raw in loaded.cluster_jobs)
        self.index = JobIndex(self.records)  # (the listings' view of them)
        self.records.thaw(self.index.last_ended(self.records.keep))
        for rec in self.index.open():
            if not rec.admitted:
                self.admission.waiting[rec.id] = rec
            else:
                self.table.add(self._entry(rec))
                if rec.status == "running" and rec.step_run != rec.run:  # its run has not trained yet
                    self.table.restarting(rec.id)
                if rec.borrowing:
                    self.admission.borrowers.add(rec.id)
                if rec.hold:  # requeued on hold: it leaves the table once its run has stopped
                    self._hold_after_stop.add(rec.id)
                if rec.run:  # agents of this run that (re)join after the restart form its round
                    coordinator.rendezvous.expect(rec.id, rec.run, rec.resume_reason if rec.run > 1 else "start",
                                                  rec.restarts)
        self.backend.recover()
        self.sched = Scheduler(self.policy, self.table, self.backend, self.clock, strict=False,
                               on_error=self._policy_error, protect_startup=cfg.protect_startup,
                               min_run=cfg.min_run)
        previous = loaded.meta.get("policy")
        state = loaded.meta.get("policy_state")
        if previous == cfg.policy and state and hasattr(self.policy, "import_state"):
            try:
                self.policy.import_state(json.loads(state), self._views())
            except (ValueError, TypeError, KeyError) as exc:
                log.error("could not restore the %s policy's memory (%s); it relearns from the jobs", cfg.policy, exc)
        elif previous and previous != cfg.policy:
            self._emit("policy_changed", "", "", previous=previous, policy=cfg.policy)
        self._policy_state = state if previous == cfg.policy else None
        self._state_at = -1  # the decisions (and failures) the policy had made when its memory was last exported
        self._exported: Optional[str] = None  # that export (see _memory)
        self._wake: Optional[asyncio.Event] = None
        self._next_timeout: Optional[float] = None
        self._forecast: Optional[asyncio.Future] = None  # the last forecast (status --start), or the one running
        self._forecast_at = -1  # the scheduler's decisions when it was made
        self._last_persist = now
        self._next_round = now + cfg.interval
        self._next_prune = now + 30.0
        self.retention = Retention(self.store, cfg.retain, now) if cfg.retain else None
        self._node_runs: dict[str, deque] = {}  # node -> the (job, run) of tasks placed on it lately
        for node in self.nodes.by_index:  # a restarted coordinator gives every daemon a fresh timeout
            node.last_seen = now
        with self.store.transaction() as tx:
            tx.put_meta("policy", cfg.policy)
            self.events.write(tx)

    def tier_of(self, rec: JobRecord) -> int:
        """The priority the policy sees for ``rec``: its own; or, with --quota-borrow, BORROW_TIER while
        it runs over its user's quota, and 0 otherwise unless priorities preempt."""
        if rec.borrowing:
            return BORROW_TIER
        return rec.priority if self.cfg.priority_preemption or not self.cfg.quota_borrow else 0

    def _memory(self, again: bool = False) -> Optional[str]:
        """The policy's memory as stored (``export_state``'s JSON; None for a policy without one).
        It changes only when the policy decides, so it is exported and encoded again only after a
        decision (or a failed one) or when asked (``again``): flushes come at every step report."""
        tried = self.sched.decisions + self.sched.failures
        if hasattr(self.policy, "export_state") and (again or tried != self._state_at or self._exported is None):
            self._exported, self._state_at = json.dumps(self.policy.export_state(), sort_keys=True), tried
        return self._exported

    def _views(self) -> list:
        """The policy's views of the table's jobs (what a policy's memory is restored against)."""
        return [e.view(e.key in self.table.starting) for e in self.table.entries()]

    def _make_policy(self):
        """A fresh instance of the configured policy (with tiers under --priority-preemption or
        --quota-borrow)."""
        cfg = self.cfg
        opts = {k: v for k, v in cfg.options.items() if v is not None}
        if "sticky" in (options_of(cfg.policy) or ()):
            opts["sticky"] = True  # a move is a restart here: keep running jobs where they are
        if cfg.priority_preemption or cfg.quota_borrow:  # one instance of the policy per priority tier
            return PriorityTiers(lambda: create(cfg.policy, only_known=True, **opts))
        return create(cfg.policy, only_known=True, **opts)

    async def forecast(self) -> ClusterForecast:
        """When each admitted job is expected to start and end (``squeue --start``): the policy,
        simulated from the cluster as it is (sim/forecast.py), in a worker thread. One runs at a
        time, and its answer serves every request for ``FORECAST_TTL`` seconds while the scheduler
        decides nothing new (callers meanwhile share it): a client asking in a loop costs one
        simulation per TTL, not one per request. A forecast that took half its wall-time budget or
        more serves for ``FORECAST_SLOW_TTL`` seconds, decisions or not (the status page asks every
        2 s while a job waits)."""
        cached, decisions = self._forecast, self.sched.decisions
        if cached is not None and not cached.done():
            return await asyncio.shield(cached)
        if cached is not None and cached.exception() is None:
            last = cached.result()
            ttl = FORECAST_SLOW_TTL if last.wall >= FORECAST_BUDGET / 2 else \
                FORECAST_TTL if decisions == self._forecast_at else 0.0
            if self.clock.now() - last.now < ttl:
                return last
        self._forecast, self._forecast_at = asyncio.ensure_future(self._simulate_forecast()), decisions
        return await asyncio.shield(self._forecast)

    async def _simulate_forecast(self) -> ClusterForecast:
        now = self.clock.now()
        self.table.accrue(now)
        # (a read: the entries as the last round or step report measured them, but a running job's
        # work left counts the steps it has made since its last report, as a round would)
        jobs = [ForecastJob(e.key, e.num_gpu, e.submit_time, e.iteration_time, e.iterations,
                            self._left(e.data["job"], e) if e.running else e.remaining_iterations,
                            e.user, e.priority, e.model, tuple(e.stage_times), tuple(e.speeds.items()),
                            e.attained, e.attained_gpu, e.preemptions, e.restart_cost,
                            tuple(e.placement) if e.running else (), max(0.0, now - e.run_at), e.gpu_type,
                            project=e.data["job"].project,
                            counted=0 if e.key in self.admission.borrowers else e.max_gpu,
                            array=e.data["job"].array, array_limit=e.data["job"].array_limit,
                            min_gpu=e.min_gpu, max_gpu=e.max_gpu, work_known=e.work_known)
                for e in self.table.entries() if not e.stopping]
        later = self._arrivals(now)  # not admitted yet: they arrive at their begin time, or after jobs they wait for
        jobs += later.values()
        policy = self._make_policy()
        self._share_tickets(policy)
        memory = None
        if hasattr(self.policy, "export_state") and hasattr(policy, "import_state"):  # (a copy: JSON, as stored)
            memory = (json.loads(self._memory()), self._views())
        quotas = None
        if not self.cfg.quota_borrow and (self.quotas.own or self.quotas.default.limited or self.projects.limited):
            # (copies: the forecast runs in a thread; with --quota-borrow nobody waits for a quota)
            book, projects = copy.copy(self.quotas), copy.deepcopy(self.projects) if self.projects.limited else None
            book.own = dict(book.own)
            quotas = (book, projects, self.admission.usage(), self.admission.project_usage() if projects else {})
        caps, windows = self.nodes.ahead(now)  # (a cordoned node: its jobs run on, and nothing new comes)
        f = await asyncio.to_thread(forecast, policy, jobs, caps, self.nodes.types(),
                                    budget=FORECAST_BUDGET, min_run=self.cfg.min_run, now=now, memory=memory,
                                    quotas=quotas, windows=windows)
        out = []
        for rec in self.index.open():
            if rec.status in _ENDED_NAMES:
                continue
            start, end = f.start.get(rec.id), f.end.get(rec.id)
            why = f.never.get(rec.id, "")
            if rec.id in later:
                why = "" if start is not None else why or (
                    f"not admitted: {self.admission.why(rec)}; it does not arrive within the forecast")
            elif rec.id in self.admission.waiting:
                why = f"not admitted: {self.admission.why(rec)}"
            elif self.table.get(rec.id) is not None and self.table.get(rec.id).stopping:
                why = "stopping: placed again once its workers have exited"
            out.append(ForecastInfo(rec.id, rec.name, rec.user, rec.status, rec.gpus,
                                    None if start is None else now + start, None if end is None else now + end,
                                    why, self._forecast_assumes(rec) + (self._arrival_assumes(rec, later[rec.id])
                                                                        if rec.id in later else [])))
        if f.stopped:
            log.warning("forecast: the simulation stopped early: %s", f.stopped)
        return ClusterForecast(self.cfg.policy, now, now + f.reached, f.complete, round(f.wall, 3), out, f.stopped)

    def _arrivals(self, now: float) -> dict[str, ForecastJob]:
        """The jobs not admitted yet that a forecast lets arrive: those that wait for their begin time
        (--begin), for jobs to finish or end (--after JOB, JOB:any, singleton) or for a quota (the
        forecast's quotas admit them). Each as the policy would see it once admitted (its measured or
        assumed step time and work left), by id."""
        out = {}
        for rec in sorted(self.admission.waiting.values(), key=lambda r: r.seq):
            if rec.hold:
                continue
            left, never = self.admission.waits_for(rec) if rec.after else ([], "")
            if never or any(f"{j}:notok" in rec.after for j in left):
                continue  # (waits for a failure: not forecast)
            it = rec.iteration_time or (sum(rec.given_stages) if rec.given_stages else ASSUMED_ITERATION_TIME)
            total = self._total_steps(rec)
            if total is None:
                total = rec.step + (rec.time_limit or ASSUMED_REMAINING) / it
            left_steps = max(total - rec.step, 1.0)
            out[rec.id] = ForecastJob(rec.id, rec.workers or rec.gpus, rec.submit_time, it, max(total, 1.0),
                                      left_steps, rec.user, self.tier_of(rec), rec.name, tuple(rec.given_stages),
                                      tuple(self._speeds(rec.name).items()), rec.attained, rec.attained_gpu,
                                      rec.preemptions, gpu_type=rec.gpu_type, begin=rec.begin, after=tuple(left),
                                      project=rec.project, counted=None, array=rec.array,
                                      array_limit=rec.array_limit, min_gpu=rec.min_gpus, max_gpu=rec.gpus)
        return out

    def _arrival_assumes(self, rec: JobRecord, job: ForecastJob) -> list[str]:
        """What a forecast assumes of a job it lets arrive later (``job``: as :meth:`_arrivals` gave it)."""
        out = []
        if job.begin > self.clock.now():
            out.append("it is admitted at its begin time")
        if rec.after:
            out.append("it is admitted once the jobs it runs after end, as this forecast has them")
        if job.begin <= self.clock.now() and not job.after:
            out.append("its quota admits it once the jobs admitted before it end, as this forecast has them")
        if rec.array_limit:
            out.append(f"its array's %{rec.array_limit} admits it then")
        return out

    def _forecast_assumes(self, rec: JobRecord) -> list[str]:
        """What a forecast assumes of ``rec`` (what it did not measure or was not told)."""
        out = []
        if rec.iteration_time is None:
            out.append(f"{ASSUMED_ITERATION_TIME:g} s per step (not measured yet)")
        if self._total_steps(rec) is None:
            out.append("the rest of its --time as its work left" if rec.time_limit else
                       f"{ASSUMED_REMAINING:g} s of work left (no --steps or --epochs)")
        if rec.min_gpus < rec.gpus:
            out.append(f"its step time scales linearly with its workers ({rec.min_gpus}-{rec.gpus}), from the one at "
                       f"{rec.workers or rec.gpus}")
        return out

    # ------------------------------------------------------------------ records and entries
    def _entry(self, rec: JobRecord) -> Entry:
        e = Entry(rec.id, rec.workers or rec.gpus, rec.submit_time, model=rec.name, user=rec.user,
                  min_gpu=rec.min_gpus, max_gpu=rec.gpus, priority=self.tier_of(rec), gpu_type=rec.gpu_type,
                  project=rec.project)
        e.status = JobStatus(rec.status)
        e.attained, e.attained_gpu, e.accrued_at = rec.attained, rec.attained_gpu, rec.accrued_at or rec.submit_time
        e.pending, e.pending_since, e.start_time, e.preemptions = rec.pending, rec.pending_since, rec.start_time, \
            rec.preemptions
        e.placement, e.held, e.group = tuple(map(tuple, rec.placement)), tuple(map(tuple, rec.held)), tuple(rec.group)
        e.running = rec.status == "running" and not rec.stopping
        e.run_at = rec.run_at
        e.stopping = rec.stopping
        e.data["job"] = rec
        self._measure(rec, e)
        return e

    def _sync(self, rec: JobRecord) -> None:
        e = self.table.get(rec.id)
        if e is not None:
            rec.status = e.status.value
            rec.attained, rec.attained_gpu, rec.accrued_at = e.attained, e.attained_gpu, e.accrued_at
            rec.pending, rec.pending_since, rec.start_time = e.pending, e.pending_since, e.start_time
            rec.preemptions, rec.stopping, rec.workers = e.preemptions, e.stopping, e.num_gpu
            rec.placement, rec.held, rec.group = list(e.placement), list(e.held), list(e.group)
            rec.run_at = e.run_at

    def _flush(self, everything: bool = False) -> None:
        """Write every changed record, node, event and log chunk in one transaction."""
        now = self.clock.now()
        if everything:
            self.table.accrue(now)
            self._dirty.update(self.table.running)
            self._dirty.update(self.table.stopping)
            self._last_persist = now
        state = self._memory(everything)
        if not (self._dirty or self.nodes.dirty or self.events.dirty or self.logs.pending
                or state != self._policy_state):
            self.records.settle(())  # (records read since: packed again)
            return
        with self.store.transaction() as tx:
            for key in self._dirty:
                rec = self.records[key]
                self._sync(rec)
                tx.put_cluster_job(rec.id, rec.seq, rec.status, _ENC.encode(rec))
            for name in self.nodes.dirty:
                index, raw = self.nodes.encode(name)
                tx.put_node(name, index, raw)
            self.events.write(tx)
            self.logs.write(tx)
            if state != self._policy_state:
                tx.put_meta("policy_state", state)
            if self._profiles_saved != len(self._profiles) or self._profiles_dirty:
                tx.put_meta(PROFILES_META, json.dumps([[k, list(v)] for k, v in self._profiles.items()]))
                self._profiles_saved, self._profiles_dirty = len(self._profiles), False
            tx.put_meta("job_seq", str(self._seq))
        ended = self.index.wrote(self.records[key] for key in self._dirty)
        for rec in ended:
            self._pkeys.pop(rec.id, None)  # (what is kept per job while it runs goes when it ends)
            self._rates.pop(rec.id, None)
        self.records.settle(ended)  # (the older ended ones packed)
        self._policy_state = state
        self._dirty.clear()
        self.nodes.dirty.clear()

    def _emit(self, event: str, job: str = "", node: str = "", /, **detail) -> None:
        self.events.emit(self.clock.now(), event, job, node, **detail)

    def out_of_memory(self, job: str, req) -> None:
        """An agent of ``job`` chose an out-of-memory plan (``AgentReport``): an ``oom`` event, and
        a doubled memory limit is the least the job's later runs get (a resource plan may not
        bring it back under the limit it ran out at)."""
        plan = {}
        if req.memory_limit:
            plan["memory_limit"] = req.memory_limit
        if req.accumulate:
            plan["accumulate"] = req.accumulate
        rec = self.records.get(job)
        if rec is not None and req.memory_limit > rec.memory_floor:
            rec.memory_floor = req.memory_limit
            rec.memory_limit = max(rec.memory_limit, req.memory_limit)
            self._dirty.add(rec.id)
        self.note("oom", job, agent=req.agent, generation=req.generation, detail=req.detail[:500], **plan)

    def note(self, event: str, job: str, **detail) -> None:
        """An event about a job from elsewhere in the coordinator (a straggler flagged); written now."""
        self._emit(event, job, "", **detail)
        self._flush()

    # ------------------------------------------------------------------ cordons
    def replace_node(self, job: str, node: str, cooldown: float, why: str) -> Optional[str]:
        """A rank of scheduled job ``job`` straggles on ``node``: cordon the node for ``cooldown``
        seconds (doubled when it straggles again within the hour after, up to an hour) and requeue
        the job, which the policy places again without it. Other jobs on the node keep running.
        Returns what was done, or None where ``job`` is not one this scheduler runs."""
        rec = self.records.get(job)
        if rec is None:
            return None
        e = self.table.get(job)
        n = self.nodes.nodes.get(node) if node else None
        if e is None or not e.running:
            return "kept: the job is not running"
        if e.group or rec.grun:
            return "kept: it runs in an interleaving group (its members share the node's GPUs)"
        if n is None:
            return "kept: its etrun agent did not say which node it runs on (ET_NODE_NAME)"
        if all(self.nodes.by_index[i] is not n for i, _ in e.placement if i >= 0):
            return f"kept: the job no longer runs on node {node}"
        need = sum(g for _, g in e.placement)
        room = sum(g for i, g in e.placement if i >= 0 and self.nodes.by_index[i] is not n)
        for m in self.nodes.by_index:  # GPUs elsewhere that no placed task holds
            if m is not n and m.state == "up" and not m.cordoned_until:
                room += max(0, m.slots - sum(t.slots for t in m.tasks if t.wanted))
        if room < need:
            return f"kept: the other nodes have {room} free GPU(s) for its {need} (node {node} not cordoned)"
        secs = self.nodes.cordon(n, cooldown, self.clock.now(), f"a straggler of job {job}: {why}", double=True,
                                 by="straggler")
        self.backend.requeue(rec, "straggler", f"its rank on node {node} straggles ({why})", node=node)
        self._flush()
        self.wake()
        return f"node {node} cordoned for {secs:.0f} s; the job is requeued to run without it"

    def cordon(self, name: str, req: NodeCordon) -> NodeInfo:
        """(admin) Nothing new is placed on node ``name`` for ``req.seconds``; what runs there
        keeps running (``kubectl cordon``), or with ``req.drain`` is requeued: each such job
        checkpoints and resumes on other nodes (``kubectl drain``). 0 seconds lifts a cordon."""
        n = self.nodes.require(name)
        now = self.clock.now()
        if req.drain and not req.seconds:
            raise ConfigError("a drain cordons the node: give it seconds > 0 (how long nothing new goes there)")
        if req.at is not None and req.at > now:  # a maintenance window, from then
            if not req.seconds:
                raise ConfigError("a maintenance window needs its length: give seconds > 0 (--for)")
            why = req.reason or "maintenance planned by an administrator"
            self.nodes.plan_maintenance(n, req.at, req.at + req.seconds, req.drain, why)
            self._flush()
            self.wake()
            return n.info()
        if req.seconds > 0:
            why = req.reason or ("drained" if req.drain else "cordoned") + " by an administrator"
            self.nodes.cordon(n, req.seconds, now, why)
            for job in sorted({j for t in n.tasks if t.wanted for j in t.owners} if req.drain else ()):
                rec, e = self.records.get(job), self.table.get(job)
                if rec is not None and e is not None and e.running:
                    self.backend.requeue(rec, "requeue", f"node {name} was drained ({why})", node=name)
        else:
            self.nodes.uncordon(n, now, req.reason or "uncordoned by an administrator")
            self.nodes.cancel_maintenance(n, req.reason or "uncordoned by an administrator")
        self._flush()
        self.wake()
        return n.info()

    def engine_cordon(self, name: str, cordoned: bool, why: str) -> None:
        """The engine's own administrator cordoned node ``name`` (Slurm's drain, ``kubectl
        cordon``), or lifted it: the same here, until the engine lifts it (a cordon set here by an
        administrator or for a straggler is left as it is)."""
        n = self.nodes.nodes.get(name)
        if n is None:
            return
        if cordoned and not n.cordoned_until:
            self.nodes.cordon(n, 30 * 86_400.0, self.clock.now(), why, by="engine")
            # a run there that has not trained yet may never start (Slurm starts no job on a drained
            # node): it is placed again elsewhere; the runs that train go on
            for t in list(n.tasks):
                rec = self.records.get(t.job) if t.wanted and not t.members else None
                e = self.table.get(t.job) if rec is not None and t.run == rec.run else None
                if e is not None and e.running and t.job in self.table.starting:
                    self.backend.requeue(rec, "requeue", f"node {name} was cordoned ({why}) before its run trained",
                                         node=name)
        elif not cordoned and n.cordoned_until and n.cordon_by == "engine":
            self.nodes.uncordon(n, self.clock.now(), why)
        else:
            return
        self._flush()
        self.wake()

    def _policy_error(self, err: PolicyError) -> None:
        self._emit("policy_error", "", "", error=str(err)[:2000])

    # ------------------------------------------------------------------ measurement
    def _left(self, rec: JobRecord, e: Entry) -> float:
        """Steps ``rec`` has left: of its total as last measured, less those made since its last report."""
        return float(max(e.iterations - rec.step - self._steps_since_report(rec, e), 0.0))

    def _steps_since_report(self, rec: JobRecord, e: Entry) -> float:
        """Steps a training run has made since its last step report, at its measured pace (its
        group's, while grouped): workers report every few steps or at checkpoints, and a policy
        that weighs progress (SRTF, Muri's finish hold) should not see it lag by that much. At
        most the time since the report, capped at three of the job's usual gaps between reports
        (at least 30 s), so a run that stalls is not taken for finishing."""
        if not e.running or e.key in self.table.starting or rec.step_time is None or rec.step_run != rec.run:
            return 0.0
        pace = rec.group_iteration_time if rec.grouped else rec.iteration_time
        if not pace or pace <= 0:
            return 0.0
        hist = self._step_hist.get(rec.id)
        gap = (hist[-1][0] - hist[0][0]) / (len(hist) - 1) if hist is not None and len(hist) > 1 else 0.0
        since = min(self.clock.now() - rec.step_time, max(EXTRAPOLATE_MIN, 3 * gap))
        return max(since, 0.0) / pace

    def _measure(self, rec: JobRecord, e: Entry) -> None:
        """Refresh the entry's policy inputs from what the job reported; log assumptions once."""
        needs = getattr(self.policy, "needs", ())
        reports = self.c.profiles.reports(rec.id)
        comm = [r.comm for r in reports if r.comm is not None]
        e.skew = sum(c.skew for c in comm) / len(comm) if comm else 0.0
        stage = [r.stage for r in reports if r.stage is not None]
        if rec.module:
            e.stage_times = ()  # `etrun --group` runs scripts: a module job is never interleaved
            if "profile" in needs:
                self._assume(rec, "profile", "a --module job runs alone (it is never grouped)")
        elif stage:
            e.stage_times = tuple(sum(s.stages.get(k, 0.0) for s in stage) / len(stage) for k in STAGES)
            key = self._profile_key(rec)
            if not rec.grun and self._profiles.get(key) != e.stage_times:  # measured alone: kept for reuse
                self._profiles.pop(key, None)
                self._profiles[key] = e.stage_times
                self._profiles_dirty = True
                while len(self._profiles) > PROFILES_KEPT:
                    del self._profiles[next(iter(self._profiles))]
        elif rec.given_stages:
            e.stage_times = tuple(rec.given_stages)
        elif not rec.reprofile and self._profile_key(rec) in self._profiles:
            e.stage_times = self._profiles[self._profile_key(rec)]
            if "profile" in needs:
                self._assume(rec, "profile", "the stage profile of an earlier job with the same command "
                                             "(submit --reprofile measures it again)")
        else:
            e.stage_times = ()
            if "profile" in needs:
                self._assume(rec, "profile", f"no stage profile yet: the job runs alone (it is never grouped) "
                                             f"until its first {rec.profile_steps} steps are profiled")
        if rec.iteration_time is not None:
            it = rec.iteration_time
        elif e.stage_times:  # never measured alone (it only ran grouped): its stages one after another
            it = sum(e.stage_times)
        else:
            it = ASSUMED_ITERATION_TIME
            if "duration" in needs:
                self._assume(rec, "iteration_time", f"{it:g} s per step until the job reports its steps")
        total = self._total_steps(rec)
        e.work_known = total is not None
        if total is None and rec.time_limit:  # what is left of its --time (as Slurm's backfill reads it)
            total = rec.step + max(rec.time_limit - _held(e, self.clock.now()), it) / it
            if "duration" in needs:
                self._assume(rec, "remaining", "the rest of its --time limit as its work left (no --steps or "
                             "--epochs)")
        elif total is None:
            total = rec.step + ASSUMED_REMAINING / it
            if "duration" in needs:
                self._assume(rec, "remaining", f"{ASSUMED_REMAINING:g} s of work left (no --steps or --epochs)")
        e.iteration_time, e.iterations = it, float(max(total, 1))
        e.remaining_iterations = self._left(rec, e)
        if list(e.stage_times) != rec.stage_times:
            rec.stage_times = list(e.stage_times)
            self._dirty.add(rec.id)
        if "skew" in needs and not comm:
            self._assume(rec, "skew", "skew 0 until the job reports a comm profile")
        e.rate, e.rate_window = self._rate(rec)
        e.peak_memory = self.c.resources.peak(rec.id)
        speeds = self._speeds(rec.name)
        if {k: round(v, 2) for k, v in speeds.items()} != {k: round(v, 2) for k, v in e.speeds.items()}:
            e.speeds = speeds
            changed = getattr(self.policy, "inputs_changed", None)
            if changed is not None:
                changed()  # Gandiva-fair trades GPU types on these speeds
        self.table.touch(rec.id)

    def _profile_key(self, rec: JobRecord) -> str:
        """Jobs of one command (working directory, script, arguments) share a stage profile."""
        key = self._pkeys.get(rec.id)
        if key is None:
            key = self._pkeys[rec.id] = json.dumps([rec.workdir, *rec.command])
        return key

    def _type_time(self, rec: JobRecord, sample: float, workers: int) -> None:
        """Attribute a step-time sample to the GPU type the job runs on (one type only) at its worker
        count: a step on other workers is another step (a fixed global batch: shorter on more), so
        speeds compare types at one worker count (:meth:`_speeds`)."""
        e = self.table.get(rec.id)
        nodes = self.nodes.by_index
        kinds = {nodes[n].gpu_type or "gpu" for n, _ in (e.placement if e is not None else ()) if 0 <= n < len(nodes)}
        if len(kinds) == 1:
            key = (kinds.pop(), workers)
            times = self._type_times.setdefault(rec.name, {})
            times[key] = sample if key not in times else 0.7 * times[key] + 0.3 * sample
            if len(self._type_times) > 10_000:  # names of long-gone jobs go first
                del self._type_times[next(iter(self._type_times))]

    def _speeds(self, name: str):
        """The measured speed of jobs named ``name`` on each GPU type (the slowest is 1.0), once they
        have run on every type of the cluster at one worker count (the most workers where several
        have); empty until then (the policy assumes 1.0)."""
        kinds = set(self.nodes.types())
        times = self._type_times.get(name, {})
        if len(kinds) < 2 or len(times) < len(kinds):
            return EMPTY
        counts = sorted({w for _, w in times}, reverse=True)
        for w in counts:
            if all((k, w) in times for k in kinds):
                slowest = max(times[k, w] for k in kinds)
                return MappingProxyType({k: slowest / times[k, w] for k in sorted(kinds)})
        return EMPTY

    def _rate(self, rec: JobRecord) -> tuple[float, float]:
        """Samples/s of the job's current run over its latest ``policy.rate_window`` seconds (from
        the shard cursors its workers report), counted from the first samples consumed by a
        generation the run opened (a restart within the run starts the count again); (0, 0) before."""
        if rec.status != "running" or rec.stopping:
            self._rates.pop(rec.id, None)
            return 0.0, 0.0
        gen = self.c.rendezvous.generation(rec.id)
        run, hist = self._rates.get(rec.id, (None, []))
        if run != rec.run or (hist and hist[0][2] != gen):
            hist = []  # a new run, or a restart within the run (a failure): new processes
        self._rates[rec.id] = (rec.run, hist)
        if gen < self.backend.first_generation.get(rec.id, 0) or rec.step_run != rec.run or rec.step_time is None:
            return 0.0, 0.0
        now, got = self.clock.now(), self.c.shards.consumed(rec.id)
        if len(hist) == 1 and got == hist[0][1]:
            hist[0] = (now, got, gen)  # the count starts once the generation consumes its first samples
        elif not hist or now - hist[-1][0] >= 0.5:
            hist.append((now, got, gen))
        span = getattr(self.policy, "rate_window", RATE_WINDOW)
        while len(hist) > 2 and now - hist[1][0] >= span:
            del hist[0]
        t0, c0, _ = hist[0]
        return ((got - c0) / (now - t0), now - t0) if now > t0 else (0.0, 0.0)

    def _total_steps(self, rec: JobRecord) -> Optional[float]:
        if rec.steps is not None:
            return float(rec.steps)
        if rec.epochs is not None and rec.step > 0:
            done = total = 0
            for name in self.c.shards.datasets(rec.id):
                d = self.c.shards.info(rec.id, name)
                done, total = done + d.done, total + d.total
            if done and total:
                return rec.step * total / done
        return None

    def _assume(self, rec: JobRecord, what: str, text: str) -> None:
        if what not in rec.assumed:
            rec.assumed.append(what)
            self._dirty.add(rec.id)
            self._emit("assumed", rec.id, "", input=what, assumed=text, policy=self.cfg.policy)

    def step(self, job: str, req: StepReport) -> StepInfo:
        """A worker's step (any job; for scheduled jobs it feeds the policy)."""
        now = self.clock.now()
        rec = self.records.get(job)
        if rec is None:
            return StepInfo(job, req.step, None)
        if req.generation is not None and req.generation < self.backend.first_generation.get(rec.id, 0):
            return StepInfo(job, rec.step, rec.iteration_time)  # a worker of an older run, still stopping
        if rec.step_time is not None and rec.step_run == rec.run and req.step > rec.step and \
                rec.status == "running" and now > rec.step_time:  # (two reports at one instant: no sample)
            sample = (now - rec.step_time) / (req.step - rec.step)
            if rec.grouped:  # its time in the group: measured from its first step report there
                s0, t0 = rec.group_t0
                if t0 == 0.0:
                    rec.group_t0 = (rec.step, rec.step_time)
                    s0, t0 = rec.group_t0
                rec.group_iteration_time, rec.group_steps = (now - t0) / (req.step - s0), req.step - s0
            else:
                cur = self.table.get(job)
                now_on = cur.num_gpu if cur is not None else rec.workers
                if rec.iteration_time is None or rec.timed_workers != now_on:
                    rec.iteration_time = sample  # (a step on other workers is another step time: start afresh)
                else:
                    rec.iteration_time = 0.7 * rec.iteration_time + 0.3 * sample
                rec.timed_workers = now_on
                self._type_time(rec, sample, now_on)
        if rec.step_run != rec.run and rec.status == "running":
            self._emit("first_step", job, "", run=rec.run, step=req.step)  # this run trains
            e, t0 = self.table.get(job), self.backend.run_started.get(job)
            if e is not None and t0 is not None and now > t0:
                e.restart_cost = now - t0  # its start-up, measured: what a restart costs it (Muri's finish hold)
            if t0 is not None:
                self.timings.ran(rec.resume_reason if rec.run > 1 else "start", now - t0)
            self.table.began(job, now)  # its service counts from here: the start-up before was not service
            self.wake()  # a decision now: starts held back for it may go, its service-based wake-ups resume
        rec.step, rec.step_time, rec.step_run = req.step, now, rec.run
        hist = self._step_hist.get(job)
        if hist is None:
            hist = self._step_hist[job] = deque(maxlen=STEP_POINTS)
            while len(self._step_hist) > STEP_JOBS:  # the oldest job's history goes first
                del self._step_hist[next(iter(self._step_hist))]
        hist.append((now, req.step))
        e = self.table.get(job)
        if e is not None:
            self._measure(rec, e)
        self._dirty.add(job)
        self._flush()
        return StepInfo(job, rec.step, rec.iteration_time)

    # ------------------------------------------------------------------ jobs
    def submit(self, req: JobSubmit, who: Identity = ADMIN) -> ClusterJobInfo:
        """Queue a job. Its user is ``who``'s (an admin may name another, which the event log
        records); its tasks run as that user's UNIX account (an admin's job for a user without an
        account runs as the node daemon's own)."""
        if req.array is not None:
            raise ConfigError("a job array is submitted to POST /v1/cluster/arrays (elastictrain submit --array), "
                              "which answers with every task")
        return self._submit(req, who)[0]

    def submit_array(self, req: JobSubmit, who: Identity = ADMIN) -> ClusterJobList:
        """Queue a job array (arrays.py): one job per task index, ``ID_INDEX``."""
        if req.array is None:
            raise ConfigError("give the array's task indices (array: e.g. 0-7, 1,3,5, 0-15:2, %N for at most N at "
                              "once)")
        return ClusterJobList(self._submit(req, who))

    def _submit(self, req: JobSubmit, who: Identity) -> list[ClusterJobInfo]:
        tasks, limit = parse_array(req.array) if req.array is not None else ([None], 0)
        if who.role == "user":
            if req.user not in ("default", who.name):
                raise ForbiddenError(f"you are user {who.name}; only the admin may submit a job for another user "
                                     f"({req.user}): leave --user out")
            user = who.name
        else:
            user = req.user
        acct = self.c.creds.accounts.get(user)
        if who.role == "user" and acct is None:
            raise ForbiddenError(f"user {user} has no account (it was revoked); ask an admin")
        cap = self.quotas.max_priority(user)
        if who.role == "user" and req.priority > cap and self.cfg.priority_preemption:
            raise ForbiddenError(f"priority {req.priority}: this coordinator preempts by priority "
                                 f"(--priority-preemption), and user {user} may submit up to priority {cap}; submit at "
                                 f"{cap} or below (a lower priority yields to others), or ask an admin (who may submit "
                                 f"higher, or raise yours: `elastictrain users quota {user} --max-priority N`)")
        run_as, allow_root = (acct.unix_user, acct.allow_root) if acct is not None else ("", True)
        check_job_command(list(req.command), req.module)
        check_job_env(dict(req.env), DEFAULT_ENV_ALLOW + tuple(self.cfg.job_env_allow))
        given = _given_stages(req.stage_times)
        if not os.path.isabs(req.workdir):
            raise ConfigError(f"workdir {req.workdir!r} must be an absolute path")
        after = self.admission.dependencies(req.after)
        now = self.clock.now()
        _check_begin(req.begin, now)
        project = self.projects.charge(user, req.project, who.role != "user")
        self._check_size(user, project, req.gpus, req.min_gpus or req.gpus, req.gpu_type or "")
        taken = self.c.members.jobs.keys() | self.records.keys()  # (an etrun job may have taken a name)
        self._seq += 1
        while str(self._seq) in taken or any(f"{self._seq}_{i}" in taken for i in tasks if i is not None):
            self._seq += 1
        base = str(self._seq)
        name = req.name or _default_name(req.command)
        by = {"by": who.name} if who.role != "user" and user != "default" else {}  # the admin acted for a user
        if after:
            by["after"] = ",".join(after)
        if req.hold:
            by["hold"] = True
        if req.begin is not None and req.begin > now:
            by["begin"] = round(req.begin, 3)
        if project:
            by["project"] = project
        if req.gpu_type:
            by["gpu_type"] = req.gpu_type
        notify_url, notify_on = "", []
        if req.notify is not None or req.notify_on:
            if req.notify is None:
                raise ConfigError("--notify-on needs --notify URL: where to post the notifications")
            notify_url, notify_on = check_url(req.notify, self.cfg.notify_allow), check_types(req.notify_on)
            by["notify"] = ",".join(notify_on)
        out = []
        for i in tasks:
            job_id, env = base, dict(req.env)
            if i is not None:  # an array's task: its index in its environment (as SLURM_ARRAY_TASK_ID)
                job_id = f"{base}_{i}"
                env.update(ET_ARRAY_JOB_ID=base, ET_ARRAY_TASK_ID=str(i), ET_ARRAY_TASK_COUNT=str(len(tasks)))
            rec = JobRecord(job_id, self._seq, name if i is None else f"{name}_{i}", user, req.priority, req.gpus,
                            req.min_gpus or req.gpus, list(req.command), req.workdir, env, req.module, req.steps,
                            req.epochs, req.max_restarts, req.grace, now, pending_since=now, accrued_at=now,
                            profile_steps=req.profile_steps, reprofile=req.reprofile, given_stages=given,
                            run_as=run_as, allow_root=allow_root, after=after, hold=req.hold,
                            array=base if i is not None else "", array_limit=limit,
                            time_limit=req.time_limit or 0.0, begin=req.begin if (req.begin or 0.0) > now else 0.0,
                            project=project, gpu_type=req.gpu_type or "", notify_url=notify_url,
                            notify_on=notify_on)
            self.records[job_id] = rec
            self.index.added(rec)
            self.c.members.create_job(job_id, 1, 65536)
            rec.admitted = False
            self.admission.waiting[job_id] = rec
            self._dirty.add(job_id)
            self._emit("submit", job_id, "", name=rec.name, user=user, gpus=req.gpus, min_gpus=rec.min_gpus,
                       steps=req.steps, epochs=req.epochs, command=req.command[:8], run_as=run_as or "-",
                       **by, **({"array": req.array} if i is not None else {}))
            out.append(rec)
        self.admission.admit(submitted=tuple(r.id for r in out))
        self._flush()
        self.wake()
        tasks = self._tasks_by_job()  # (once for an array's tasks)
        return [self.info(rec, tasks) for rec in out]

    def cancel(self, job: str, who: Identity = ADMIN) -> ClusterJobInfo:
        rec = self._rec(job)
        if who.role == "admin" and rec.user not in ("default", "admin"):
            self._emit("cancel_by", job, "", by=who.name, user=rec.user)
        if rec.status in _ENDED_NAMES:
            raise ConflictError(f"job {job} already {rec.status}; nothing to cancel")
        self.admission.waiting.pop(job, None)
        self.backend.cancel(rec)
        self._dirty.add(job)
        self._flush()
        self.wake()
        return self.info(rec)

    def hold(self, job: str, who: Identity = ADMIN) -> ClusterJobInfo:
        """Keep a waiting job from running until :meth:`release` (Slurm's ``scontrol hold``): it
        leaves the policy's view (its attained service is kept for its return)."""
        rec, e = self._open(job, "hold")
        if e is not None and (e.running or e.stopping):
            raise ConflictError(f"job {job} is {'running' if e.running else 'stopping'}; a hold applies to a waiting "
                                "job (as Slurm's): cancel it, or hold it once it waits")
        if e is not None:
            self._unadmit(rec, e)
        if not rec.hold:
            rec.hold = True
            self._emit("hold", job, "", by=who.name)
        self._dirty.add(job)
        self._flush()
        self.wake()
        return self.info(rec)

    def _unadmit(self, rec: JobRecord, e: Entry) -> None:
        """A waiting admitted job goes back to admission (a hold, a later begin time): the policy sees
        it leave; its record keeps its service for its return."""
        now = self.clock.now()
        self.table.accrue(now)
        self._sync(rec)
        self.table.end(rec.id, e.status, now)
        rec.admitted = False
        self.admission.waiting[rec.id] = rec

    def requeue(self, job: str, req: JobRequeue, who: Identity = ADMIN) -> ClusterJobInfo:
        """Stop a running job and queue it again (Slurm's ``scontrol requeue``): its workers checkpoint
        and exit as on a preemption, and the policy places it again, resuming from the checkpoint.
        ``req.hold`` (``scontrol requeuehold``): and hold it once it has stopped, so its GPUs go to
        others until ``release``."""
        rec, e = self._open(job, "requeue (submit it again)")
        if e is None or not (e.running or e.stopping):
            raise ConflictError(f"job {job} is not running; a requeue stops a running job (as Slurm's)"
                                + ("" if req.hold else f": `elastictrain hold {job}` keeps a waiting one"))
        if e.running:
            self.backend.requeue(rec, "requeue", f"requeued by {who.name}" + (" on hold" if req.hold else ""),
                                 by=who.name)
        if req.hold:
            if not rec.hold:
                rec.hold = True
                self._emit("hold", job, "", by=who.name)
            self._hold_after_stop.add(job)
        self._dirty.add(job)
        self._flush()
        self.wake()
        return self.info(rec)

    def _hold_stopped(self) -> None:
        """Jobs requeued on hold whose runs have stopped leave the table (a release lets them back)."""
        for key in list(self._hold_after_stop):
            rec, e = self.records.get(key), self.table.get(key)
            if rec is None or e is None or not rec.hold:
                self._hold_after_stop.discard(key)  # ended, released, or out already
            elif not (e.running or e.stopping):
                self._unadmit(rec, e)
                self._dirty.add(key)
                self._hold_after_stop.discard(key)

    def release(self, job: str, who: Identity = ADMIN) -> ClusterJobInfo:
        """Let a held job run (Slurm's ``scontrol release``)."""
        rec = self._rec(job)
        if not rec.hold:
            raise ConflictError(f"job {job} is not on hold; nothing to release")
        rec.hold = False
        self._emit("release", job, "", by=who.name)
        self._dirty.add(job)
        self.admission.admit()
        self._flush()
        self.wake()
        return self.info(rec)

    def update(self, job: str, req: JobUpdate, who: Identity = ADMIN) -> ClusterJobInfo:
        """Change a job's priority or time limit (Slurm's ``scontrol update``), waiting or running, or a
        waiting job's begin time, size (admitted again at its new size, within the nodes and quotas) or
        GPU type.

        As Slurm's, a user may only lower a time limit (none counts as the highest); a priority it may
        set as at submission: with ``--priority-preemption``, up to its highest (0 unless its quota says
        more: ``users quota --max-priority``), or below its current one.
        The admin may set any. A new priority takes effect at once: admission order, and with
        ``--priority-preemption`` the job's tier (raised, it may preempt lower jobs; lowered, it may be
        preempted). A time limit below what the job has held ends its run at the next round (TIMEOUT)."""
        if req.priority is None and req.time_limit is None and req.begin is None and req.gpus is None and \
                req.gpu_type is None:
            if req.min_gpus is not None:
                raise BadRequestError("min_gpus alone: give the job's size too (--gpus N or MIN:MAX)")
            raise BadRequestError("nothing to change: give a priority (--priority N), a time limit (--time LIMIT), "
                                  "a begin time (--begin TIME), a size (--gpus N) or a GPU type (--gpu-type TYPE)")
        rec, e = self._open(job, "update")
        p, limit, now = req.priority, req.time_limit, self.clock.now()
        for what, given in (("a begin time", req.begin), ("a size", req.gpus), ("a GPU type", req.gpu_type)):
            if given is not None and e is not None and (e.running or e.stopping):
                raise ConflictError(f"job {job} is {'running' if e.running else 'stopping'}; {what} applies to a "
                                    "waiting job (as Slurm's StartTime=, NumNodes= and Gres=)")
        kind = rec.gpu_type if req.gpu_type is None else req.gpu_type
        if req.gpus is not None or req.gpu_type is not None:
            self._check_size(rec.user, rec.project, rec.gpus if req.gpus is None else req.gpus,
                             (rec.min_gpus if req.gpus is None else req.min_gpus or req.gpus), kind)
        _check_begin(req.begin, now, BadRequestError)
        if who.role != "admin":
            cap = self.quotas.max_priority(rec.user)
            if p is not None and p > max(rec.priority, cap if self.cfg.priority_preemption else MAX_PRIORITY):
                raise ForbiddenError(f"priority {p}: a user may lower its job's priority (now {rec.priority}) or set "
                                     f"it at {cap} or below (user {rec.user}'s highest); only the admin may raise it "
                                     "above that (this coordinator preempts by priority: --priority-preemption)")
            if limit is not None and rec.time_limit and not 0 < limit <= rec.time_limit:
                raise ForbiddenError(f"time limit {_limit_text(limit)}: a user may only lower its job's time limit "
                                     f"(now {rec.time_limit:.0f} s), as in Slurm; ask an admin to raise it")
        changed = {}
        if p is not None and p != rec.priority:
            changed["priority"] = f"{rec.priority} -> {p}"
            rec.priority = p
            if e is not None:
                e.priority = self.tier_of(rec)
                self.table.touch(job)  # (its policy view: with tiers it moves to the tier of p)
        if limit is not None and limit != rec.time_limit:
            changed["time_limit"] = f"{_limit_text(rec.time_limit)} -> {_limit_text(limit)}"
            rec.time_limit = limit
        size = None if req.gpus is None else (req.min_gpus or req.gpus, req.gpus)
        if size is not None and size != (rec.min_gpus, rec.gpus):
            changed["gpus"] = f"{_size_text(rec.min_gpus, rec.gpus)} -> {_size_text(*size)}"
            if e is not None:  # admitted: admitted again at its new size (quotas count it anew)
                self._unadmit(rec, e)
                e = None
            rec.min_gpus, rec.gpus = size
            rec.workers = 0  # (its next run starts at the new size)
        if kind != rec.gpu_type:
            changed["gpu_type"] = f"{rec.gpu_type or 'any'} -> {kind or 'any'}"
            if e is not None:  # admitted: admitted again, so the policy learns it anew (one that homes jobs by type)
                self._unadmit(rec, e)
                e = None
            rec.gpu_type = kind
        begin = None if req.begin is None else (req.begin if req.begin > now else 0.0)
        if begin is not None and begin != rec.begin:
            changed["begin"] = f"{_begin_text(rec.begin)} -> {_begin_text(begin)}"
            rec.begin = begin
            if begin and e is not None:  # admitted but waiting: out of the policy's view until then (as a hold)
                self._unadmit(rec, e)
        if changed:
            self._emit("update", job, "", by=who.name, **changed)
            self._dirty.add(job)
            if self.admission.waiting:
                self.admission.admit()
            self._flush()
            self.wake()
        return self.info(rec)

    def _held_back_why(self, kept: str) -> str:
        """Why a start waits for running job ``kept`` (Scheduler.held_back), as "until ..." ends."""
        until = self.sched.kept_until.get(kept)
        if until is None:
            return f"job {kept} has trained its first step (a job is not preempted before it trains)"
        return (f"job {kept} has run {self.cfg.min_run:.0f} s, in {max(0.0, until - self.clock.now()):.0f} s (a run "
                "is not preempted before: --preempt-exempt)")

    def _check_size(self, user: str, project: str, gpus: int, min_gpus: int, gpu_type: str = "") -> None:
        """A job of ``gpus`` (at least ``min_gpus``) workers, on GPUs of ``gpu_type`` ("" any), could
        ever run here: the nodes have them, and neither its project's quota nor its user's is smaller
        (with --quota-borrow it may borrow).

        Raises:
            ConfigError: it never could, with the fix.
        """
        if min_gpus > gpus:
            raise ConfigError(f"min_gpus ({min_gpus}) must be <= gpus ({gpus})")
        nodes = self.nodes.by_index
        known = sum(n.slots for n in nodes)
        if nodes and min_gpus > known:
            raise ConfigError(f"the job needs {min_gpus} GPUs but the cluster's nodes have {known} in all; lower "
                              "--gpus, or add nodes first")
        if gpu_type and nodes:  # (with no node yet, it waits for the nodes to register)
            mine = one_type_room(gpu_type, tuple(n.gpu_type for n in nodes), tuple(n.slots for n in nodes))
            if mine is None:  # (not [a100|h100], which is all of it on one of them)
                mine = sum(n.slots for n in nodes if type_matches(gpu_type, n.gpu_type))
            kinds = ", ".join(sorted({n.gpu_type for n in nodes if n.gpu_type})) or "none: the nodes name no type"
            if not mine:
                raise ConfigError(f"no node has GPU type {gpu_type!r} (the nodes' types: {kinds}); give one of them "
                                  "or some of its words to --gpu-type (e.g. a100 for 'NVIDIA A100-SXM4-80GB'), or "
                                  "leave it out to run anywhere")
            if min_gpus > mine:
                raise ConfigError(f"the job needs {min_gpus} GPUs of type {gpu_type} but the nodes have {mine} of it; "
                                  "lower --gpus, or add nodes of that type first")
        if self.cfg.quota_borrow:
            return
        for name in self.projects.chain(project):  # (its project's quota, and each parent's)
            pq = self.projects.projects[name].quota if name in self.projects.projects else None
            if pq is not None and pq.gpus is not None and gpus > pq.gpus:
                under = f" (project {project} is under it)" if name != project else ""
                raise ConfigError(f"the job asks for {gpus} GPUs (--gpus) but project {name}'s quota is {pq.gpus}"
                                  f"{under}: it could never be admitted; lower --gpus to {pq.gpus} or less, or ask an "
                                  f"admin to raise it (`elastictrain projects set {name} --gpus {gpus}`)")
        quota = self.quotas.of(user)
        if quota.gpus is not None and gpus > quota.gpus:
            raise ConfigError(f"the job asks for {gpus} GPUs (--gpus) but user {user}'s quota is {quota.gpus}: "
                              f"it could never be admitted; lower --gpus to {quota.gpus} or less, or ask an admin to "
                              f"raise the quota (`elastictrain users quota {user} --gpus {gpus}`)")

    def _open(self, job: str, verb: str) -> tuple[JobRecord, Optional[Entry]]:
        """A job that has not ended, to ``verb`` (a 409 if it has), and its entry (None: not admitted)."""
        rec = self._rec(job)
        if rec.status in _ENDED_NAMES:
            raise ConflictError(f"job {job} already {rec.status}; nothing to {verb}")
        return rec, self.table.get(job)

    def _rec(self, job: str) -> JobRecord:
        rec = self.records.get(job)
        if rec is None:
            raise NotFoundError(f"no scheduled job {job!r}; `elastictrain status` lists them")
        return rec

    def job(self, job: str) -> ClusterJobInfo:
        return self.info(self._rec(job))

    def jobs(self, ended: Optional[int] = LIST_ENDED, match: JobFilter = ALL, after: str = "",
             limit: Optional[int] = None) -> ClusterJobList:
        """The jobs :meth:`listing` picks."""
        return ClusterJobList(*self.listing(ended, match, after, limit))

    def listing(self, ended: Optional[int] = LIST_ENDED, match: JobFilter = ALL, after: str = "",
                limit: Optional[int] = None) -> tuple[list[ClusterJobInfo], int, str]:
        """The jobs a listing carries (:meth:`JobIndex.pick`: those not ended and the ``ended`` that
        ended last, of those ``match`` matches), how many ended jobs it left out, and the job its
        next page follows ("": none; :meth:`JobIndex.page`: the page after job ``after``, of at most
        ``limit`` jobs).

        Raises:
            ConfigError: ``after`` is no job here.
        """
        recs, omitted = self.index.pick(ended, match)
        try:
            recs, more = self.index.page(recs, after, limit)
        except KeyError:
            raise ConfigError(f"query parameter 'after': no job {after!r} here; a page follows the job the "
                              "previous page named as its 'next' (leave 'after' out for the first page)") from None
        tasks, full = self._tasks_by_job(), self.records.full
        return [self.info(full(r), tasks) for r in recs], omitted, more

    def _tasks_by_job(self) -> dict[str, list[tuple[int, TaskRec]]]:
        """Every node's tasks by job, each with its place in the nodes' order (:meth:`info`)."""
        out: dict[str, list] = {}
        i = 0
        for n in self.nodes.by_index:
            for t in n.tasks:
                out.setdefault(t.job, []).append((i, t))
                i += 1
        return out

    def info(self, rec: JobRecord, tasks_of: Optional[dict] = None) -> ClusterJobInfo:
        """``rec`` as the API shows it (``tasks_of``: :meth:`_tasks_by_job`, when the caller built
        it once for several jobs)."""
        e = self.table.get(rec.id)
        if e is not None and (e.running or e.stopping):  # its service up to now (once for all the jobs listed)
            now = self.clock.now()
            if e.accrued_at < now:
                self.table.accrue(now)
        self._sync(rec)
        where = []
        if tasks_of is None:
            tasks_of = self._tasks_by_job()
        mine = [x for x in tasks_of.get(rec.id, ()) if x[1].run == rec.run or rec.grun == rec.id]
        if rec.grun and rec.grun != rec.id:
            mine = sorted(mine + tasks_of.get(rec.grun, []), key=_FIRST)
        tasks = {t.node: t for _, t in mine}
        for node, g in rec.placement:
            name = self.nodes.name_of(node)
            t = tasks.get(name)
            where.append(NodeSlots(name, g, list(t.gpus) if t is not None else []))
        note = getattr(self.policy, "annotate", None)
        info = {k: str(v) for k, v in (note(rec.id) if note is not None and e is not None else {}).items()}
        if e is not None and e.speeds:
            info["speeds"] = ",".join(f"{k}={v:.2f}" for k, v in e.speeds.items())
        if rec.borrowing:
            info["quota"] = "borrowing (over its user's quota: preempted first, --quota-borrow)"
        if rec.time_limit:
            used = _held(e, self.clock.now()) if e is not None else None
            info["time_limit"] = f"{rec.time_limit:.0f} s" + (f" ({used:.0f} s used)" if used is not None else "")
        if rec.begin > self.clock.now() and rec.status not in _ENDED_NAMES:
            info["begin"] = _begin_text(rec.begin)
        if rec.notify_url:  # (the host only: a webhook's path is its secret)
            info["notify"] = f"{','.join(rec.notify_on)} to {urllib.parse.urlsplit(rec.notify_url).hostname}"
        if rec.memory_limit:
            info["memory_limit"] = f"{rec.memory_limit / 2**20:.0f} MiB per worker (from its next start)"
        if rec.group_members:  # its current (or last) interleaving group, measured against the model
            info["group"] = "+".join(rec.group_members)
            if rec.group_iteration_time is not None:
                info["group_iteration_time"] = f"{rec.group_iteration_time:.4f}"
                info["group_steps"] = str(rec.group_steps)
            if rec.group_predicted is not None:
                info["group_predicted"] = f"{rec.group_predicted:.4f}"
        reason = rec.reason
        if not reason and rec.id in self.sched.refused:
            reason = f"placed, but {self.sched.refused[rec.id]}; it is placed again at the next decision"
        elif not reason and rec.id in self.sched.deferred:
            reason = "placed; waiting for GPUs that stopping jobs still hold"
        elif not reason and rec.id in self.sched.held_back:
            reason = f"placed; waiting until {self._held_back_why(self.sched.held_back[rec.id])}"
        elif not reason and rec.id in self.admission.waiting:
            reason = self.admission.why(rec)
        elif not reason and rec.status in ("queued", "preempted"):
            reason = self._why_waiting(rec)
        return ClusterJobInfo(rec.id, rec.name, rec.user, rec.priority, rec.status, rec.gpus, rec.min_gpus,
                              rec.command, rec.workdir, rec.submit_time, rec.start_time, rec.end_time, rec.attained,
                              rec.attained_gpu, where, rec.preemptions, rec.restarts, rec.max_restarts, reason,
                              rec.step, rec.steps, rec.epochs, rec.iteration_time, rec.run, rec.stopping, info,
                              rec.workers, round(e.rate, 3) if e is not None and e.rate > 0 else None,
                              list(rec.stage_times), rec.exit_code, dict(rec.runs_by_reason), rec.project,
                              rec.gpu_type)

    def _why_waiting(self, rec: JobRecord) -> str:
        """Why a queued or preempted job is not running, as far as the nodes tell (squeue's REASON)."""
        up = [n for n in self.nodes.by_index if n.state == "up"]
        unit = "slots" if up and all(n.kind == "slot" for n in up) else "GPUs"
        need = rec.min_gpus or rec.gpus
        if rec.gpu_type and up:  # only its type's nodes serve it
            mine = [n for n in up if type_matches(rec.gpu_type, n.gpu_type)]
            if not mine:
                return (f"needs GPU type {rec.gpu_type}: no node of that type is up (types up: "
                        f"{', '.join(sorted({n.gpu_type or '-' for n in up}))}); it starts when one registers")
            up, unit = mine, f"{rec.gpu_type} {unit}"
        if not up:
            return (f"no node is up to run it: start `elastictrain node` on a machine with {unit} (or, with an "
                    "engine, check that it offers nodes); it starts when one registers")
        total = sum(n.slots for n in up)
        if need > total:
            return (f"needs {need} {unit}; the nodes up offer {total} in all: add nodes, or cancel it and submit "
                    "it again with fewer (--gpus)")
        free = [0 if n.cordoned_until else n.slots - n.info().used for n in up]  # a cordoned node takes none
        cordoned = [n.name for n in up if n.cordoned_until]
        hint = (f" (cordoned, taking nothing new: {', '.join(cordoned)}; `elastictrain nodes uncordon NAME` lifts "
                "it)") if cordoned else ""
        policy = self.cfg.policy
        if rec.borrowing:
            return (f"borrowing: over user {rec.user}'s quota ({self.quotas.of(rec.user).text()}), it runs only on "
                    f"GPUs the jobs within their quotas leave ({sum(free)} of {total} {unit} free now{hint}), and is "
                    "preempted first (--quota-borrow); it counts against the quota once the user's other jobs leave "
                    "room")
        said = getattr(self.policy, "waiting_reason", None)  # the policy's own account (backfill's reservations)
        why = said(rec.id, self.clock.now()) if said is not None else None
        if why:
            return why + hint
        if sum(free) < need:
            above = sum(e.num_gpu for e in self.table.running.values()
                        if e.priority > rec.priority) if self.cfg.priority_preemption else 0
            return (f"waiting for {need} {unit}: {sum(free)} of {total} free{hint}; " + (
                f"jobs of a priority above its {rec.priority} hold {above} (--priority-preemption), and " if above
                else "") + f"policy {policy} runs other jobs first")
        if need <= max(n.slots for n in up) and max(free) < need:
            return (f"{sum(free)} of {total} {unit} are free, but no node has {need} free together (at most "
                    f"{max(free)}){hint}; it waits for a node to free up")
        return (f"{sum(free)} of {total} {unit} are free; policy {policy} has not placed it (it keeps them for "
                "other jobs, or it is placed at its next decision)")

    def status(self, ended: Optional[int] = LIST_ENDED, match: JobFilter = ALL, after: str = "",
               limit: Optional[int] = None) -> ClusterStatus:
        """The policy, the nodes, and the jobs :meth:`listing` picks."""
        jobs, omitted, more = self.listing(ended, match, after, limit)
        return ClusterStatus(self.cfg.policy, self.clock.now(), [n.info() for n in self.nodes.by_index], jobs,
                             self.sched.decisions, self.sched.failures, omitted, more)

    def utilization(self) -> Series:
        pts = list(self._util)
        return Series("utilization", [p[0] for p in pts], {"used": [float(p[1]) for p in pts],
                                                           "total": [float(p[2]) for p in pts]})

    def step_history(self, job: str) -> Series:
        self._rec(job)
        pts = list(self._step_hist.get(job, ()))
        return Series(job, [p[0] for p in pts], {"step": [float(p[1]) for p in pts]})

    # ------------------------------------------------------------------ users
    def _usage(self):
        """(user, GPU-seconds) pairs that add up to each user's service, ended jobs' included (the
        ended ones' as the index sums them: this runs every few seconds, whatever the history)."""
        yield from self.index.ended_usage()
        get = self.table.get
        for rec in self.index.open():
            e = get(rec.id)
            yield rec.user, e.attained_gpu if e is not None else rec.attained_gpu

    def _share_tickets(self, policy) -> None:
        """Hand ``policy`` (one that shares GPU time by tickets) the users' and the projects' tickets."""
        if hasattr(policy, "set_tickets"):
            policy.set_tickets(dict(self.users.tickets), self.projects.tickets(), self.projects.parents(),
                               self.projects.member_shares())

    def _accounts(self, projects: dict[str, float]) -> dict[str, int]:
        """Each fair-share account's jobs not ended (policies/shares.py: a user, or a project with
        tickets (``projects``) and its member)."""
        out: dict[str, int] = {}
        parents = self.projects.parents()
        for rec in self.index.open():
            if rec.status not in _ENDED_NAMES:
                a = account(rec.user, rec.project, projects, parents)
                out[a] = out.get(a, 0) + 1
        return out

    def set_user(self, user: str, req: UserTickets) -> UserList:
        stored = self.users.set(user, req.tickets)
        self._emit("tickets", "", "", user=user, tickets=req.tickets, policy=self.cfg.policy)
        with self.store.transaction() as tx:
            tx.put_meta(USERS_META, stored)
            self.events.write(tx)
        self.wake()
        return self.user_list(600.0)

    def set_quota(self, user: str, req: UserQuota) -> UserList:
        """(admin) ``user``'s own quota, or back to the default (``req.default``)."""
        if req.default and (req.gpus is not None or req.jobs is not None or req.max_priority is not None):
            raise ConfigError("give --default alone (it drops the user's own quota and highest priority), or "
                              "--gpus/--jobs/--max-priority to set one")
        stored = caps = None
        if req.default or req.gpus is not None or req.jobs is not None or req.max_priority is None:
            stored = self.quotas.set(user, None if req.default else Quota(req.gpus, req.jobs))
        if req.default or req.max_priority is not None:  # (the highest priority alone leaves the limits)
            caps = self.quotas.set_cap(user, req.max_priority)
        q = self.quotas.of(user)
        self._emit("quota", "", "", user=user, gpus=q.gpus if q.gpus is not None else "-",
                   jobs=q.jobs if q.jobs is not None else "-", own=user in self.quotas.own,
                   max_priority=self.quotas.max_priority(user))
        with self.store.transaction() as tx:
            if stored is not None:
                tx.put_meta(QUOTAS_META, stored)
            if caps is not None:
                tx.put_meta(CAPS_META, caps)
            self.events.write(tx)
        self.admission.admit()
        self._flush()
        self.wake()
        return self.user_list(600.0)

    def user_list(self, window: float) -> UserList:
        projects = self.projects.tickets()
        active = self._accounts(projects)
        running: dict[str, int] = {}
        for e in self.table.running.values():
            running[e.user] = running.get(e.user, 0) + e.num_gpu
        self.table.accrue(self.clock.now())
        out = self.users.report(self.clock.now(), window, self._usage, active, running, projects,
                                self.projects.parents(), self.projects.member_shares())
        fair = getattr(self.policy, "fairshare", None)  # multifactor's, per account: sshare's columns
        if fair is not None:
            got = fair()
            out = msgspec.structs.replace(out, users=[
                msgspec.structs.replace(u, usage=got[u.user][1], fairshare=got[u.user][2]) if u.user in got else u
                for u in out.users])
        if not (self.quotas.own or self.quotas.default.limited or self.quotas.caps):
            return out
        used = self.admission.usage()
        queued: dict[str, int] = {}
        for rec in self.admission.waiting.values():
            queued[rec.user] = queued.get(rec.user, 0) + 1
        listed = {u.user for u in out.users}
        rows = list(out.users) + [UserInfo(u, self.users.tickets.get(u, self.users.default), u in self.users.tickets,
                                           0.0, 0.0, 0.0, 0, 0)
                                  for u in sorted((set(self.quotas.own) | set(self.quotas.caps)) - listed)]
        rows = [msgspec.structs.replace(u, quota_gpus=q.gpus, quota_jobs=q.jobs, quota_own=u.user in self.quotas.own,
                                        max_priority=self.quotas.max_priority(u.user),
                                        admitted_gpus=used.get(u.user, (0, 0))[0],
                                        waiting_for_quota=queued.get(u.user, 0))
                for u in rows for q in (self.quotas.of(u.user),)]
        return msgspec.structs.replace(out, users=rows)

    def set_project(self, name: str, req: ProjectSet) -> ProjectList:
        """(admin) Create, change or remove project ``name`` (projects.py)."""
        if req.remove:
            if req.gpus is not None or req.jobs is not None or req.users is not None or req.tickets is not None \
                    or req.parent is not None or req.shares is not None:
                raise ConfigError("give --remove alone (it drops the project), or --gpus/--jobs/--users/--tickets/"
                                  "--parent to set it")
            if name not in self.projects.projects:
                raise NotFoundError(f"no project {name!r}; `elastictrain projects list` shows them")
            stored = self.projects.remove(name)
            self._emit("project", "", "", project=name, removed=True)
        else:
            old = self.projects.projects.get(name)
            keep = (req.tickets is not None or req.parent is not None) and req.gpus is None and req.jobs is None
            quota = old.quota if old is not None and keep else Quota(req.gpus, req.jobs)  # (--tickets alone: kept)
            stored = self.projects.set(name, quota, req.users, req.tickets, req.parent, req.shares)
            p = self.projects.projects[name]
            self._emit("project", "", "", project=name, gpus=p.quota.gpus if p.quota.gpus is not None else "-",
                       jobs=p.quota.jobs if p.quota.jobs is not None else "-", users=",".join(p.users[:64]),
                       tickets=p.tickets, parent=p.parent, **({"shares": dict(p.shares[:64])} if p.shares else {}))
        self._share_tickets(self.policy)  # (its members' jobs count against the project's account, or their own)
        with self.store.transaction() as tx:
            tx.put_meta(PROJECTS_META, stored)
            self.events.write(tx)
        self.admission.admit()
        self._flush()
        self.wake()
        return self.project_list()

    def project_list(self) -> ProjectList:
        used = self.admission.project_usage()
        queued: dict[str, int] = {}
        for rec in self.admission.waiting.values():
            if rec.project:
                queued[rec.project] = queued.get(rec.project, 0) + 1
        self.table.accrue(self.clock.now())
        gpu_s = dict(self.index.ended_project_usage())
        for rec in self.index.open():
            if rec.project:
                e = self.table.get(rec.id)
                gpu_s[rec.project] = gpu_s.get(rec.project, 0.0) + (e.attained_gpu if e is not None else
                                                                    rec.attained_gpu)
        tickets = self.projects.tickets()
        active = self._accounts(tickets)
        entitled = shares(account_tickets(active, self.users.tickets, self.users.default, tickets,
                                          self.projects.parents(), self.projects.member_shares()))[1]
        # (a parent's figures include its sub-projects')
        queued, gpu_s, entitled = (self.projects.rollup(d) for d in (queued, gpu_s, entitled))
        return ProjectList([ProjectInfo(n, p.quota.gpus, p.quota.jobs, list(p.users), *used.get(n, (0, 0)),
                                        queued.get(n, 0), round(gpu_s.get(n, 0.0) / 3600, 6), p.tickets,
                                        entitled.get(n, 0.0), p.parent, dict(p.shares))
                            for n, p in self.projects.projects.items()])

    def job_logs(self, job: str, after: int) -> LogList:
        rec = self._rec(job)
        return self.logs.list(job, after, rec.status in _ENDED_NAMES)

    def event_list(self, after: int, job: Optional[str]) -> EventList:
        return self.events.list(after, job)

    def gpu_time(self, since: Optional[float], until: Optional[float]) -> GpuTimeList:
        """Each job's GPU-seconds within ``[since, until)`` (gpu_time.py); ``until`` at most now."""
        now = self.clock.now()
        per = self.events.gpu_time.within(since, until, now)
        return GpuTimeList(now, since, now if until is None else min(until, now),
                           [JobGpuTime(job, a, s) for job, (a, s) in sorted(per.items())])

    # ------------------------------------------------------------------ nodes
    def _task(self, t: TaskRec) -> Task:
        nnodes = sum(1 for n in self.nodes.by_index for x in n.tasks if x.job == t.job and x.run == t.run)
        if t.members:  # a group task: one `etrun --group` over the members' scripts
            recs = [self.records[m] for m in t.members]
            members = [GroupMember(r.id, r.run, r.resume_reason, r.command, r.workdir, r.env) for r in recs]
            env: dict = {}
            for r in recs:
                env.update(r.env)
            return Task(t.job, t.run, t.slots, list(t.gpus), nnodes, [], recs[0].workdir, env,
                        min(r.max_restarts for r in recs), max(r.grace for r in recs), False, members,
                        token=self.c.creds.worker_token(t.job, t.run, list(t.members)), run_as=recs[0].run_as,
                        allow_root=all(r.allow_root for r in recs))
        rec = self.records[t.job]
        env = rec.env
        e = self.table.get(rec.id)
        if e is not None and not e.stage_times and not rec.module and "profile" in getattr(self.policy, "needs", ()):
            env = {**env, "ET_PROFILE_STEPS": str(rec.profile_steps)}  # profile it at its first start
        return Task(t.job, t.run, t.slots, list(t.gpus), nnodes, rec.command, rec.workdir, env, rec.max_restarts,
                    rec.grace, rec.module, memory_limit=rec.memory_limit,
                    token=self.c.creds.worker_token(t.job, t.run, [t.job]), run_as=rec.run_as,
                    allow_root=rec.allow_root)

    def profile_arrived(self, job: str) -> None:
        """A worker sent a stage profile: a grouping policy may group the job now."""
        rec = self.records.get(job)
        e = self.table.get(job)
        if rec is not None and e is not None:
            before = e.stage_times
            self._measure(rec, e)
            if e.stage_times != before:
                self._emit("profiled", job, "", stages=dict(zip(STAGES, (round(x, 5) for x in e.stage_times))))
                self._flush()
                self.wake()

    def member_result(self, job: str, req: MemberResult) -> ClusterJobInfo:
        """A job in a group task reports its own outcome; the rest of the group goes on."""
        rec = self._rec(job)
        if self.backend.member_result(rec, req.run, req.status, req.detail):
            self._flush()
            self.wake()
        return self.info(rec)

    def node_register(self, name: str, req: NodeRegister) -> NodeInfo:
        n, exits = self.nodes.register(name, req, self.clock.now())
        self._exits(exits)
        self._flush()
        self.wake()
        return n.info()

    async def node_poll(self, name: str, req: NodePoll) -> NodeTasks:
        n = self.nodes.get(name, req.instance)
        if n is None:
            return NodeTasks("register")
        now = self.clock.now()
        # a node's output is taken only for runs placed on it (now, or recently: the last lines
        # of a task may come a poll after its exit): a node credential cannot write another job's log
        recent = self._node_runs.setdefault(name, deque(maxlen=256))
        recent.extend((t.job, t.run) for t in n.tasks if (t.job, t.run) not in recent)
        exits = self.nodes.report(n, req.tasks, now)
        for chunk in req.logs:
            if (chunk.job, chunk.run) not in recent:
                continue
            self.logs.add(chunk.job, name, chunk.run, chunk.data)
            if chunk.job not in self.records:  # a group task's output: each member's lines go to it too
                for job, data in _split_group_log(chunk.data).items():
                    if job in self.records:
                        self.logs.add(job, name, self.records[job].run, data)
        if exits:
            self._exits(exits)
            self.wake()
        self._flush()
        tasks = self.nodes.wanted(n)
        have = {(t.job, t.run) for t in req.tasks if t.state == "running"}
        if req.wait > 0 and not exits and have == {(t.job, t.run) for t in tasks}:
            await self.nodes.wait(name, req.wait)
            n = self.nodes.get(name, req.instance)
            if n is None:
                return NodeTasks("register")
            tasks = self.nodes.wanted(n)
        return NodeTasks("run", tasks)

    def node_leave(self, name: str, req: NodeLeave) -> NodeInfo:
        n = self.nodes.require(name)
        if n.instance != req.instance:
            raise ConflictError(f"node {name} is served by another daemon now; only it may leave")
        self._exits(self.nodes.leave(n))
        self._flush()
        self.wake()
        return n.info()

    def _exits(self, exits: list[Exit]) -> None:
        for x in exits:
            self.backend.on_exit(x)
        if exits:
            self.nodes.release()

    # ------------------------------------------------------------------ the loop
    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def tick(self) -> None:
        """One decision now (also what the loop runs)."""
        now = self.clock.now()
        self._exits(self.nodes.expire(now))
        for n, end, drain, why in self.nodes.due_maintenance(now):  # a window begins: cordon (drain) it to its end
            if end > now:
                self.cordon(n.name, NodeCordon(min(end - now, 30 * 86_400.0), f"maintenance: {why}"[:256], drain))
        self.table.accrue(now)
        self._next_timeout = None  # when the next running job reaches its --time (the loop wakes then)
        for e in [e for e in self.table.running.values() if e.data["job"].time_limit]:  # Slurm's --time
            held = _held(e, now)
            left = e.data["job"].time_limit - held
            if left <= 0:
                self.backend.timeout(e.data["job"], held)
            elif self._next_timeout is None or now + left < self._next_timeout:
                self._next_timeout = now + left
        for e in self.table.running.values():
            self._measure(e.data["job"], e)
        self.users.sample(now, self._usage)
        if not self._util or now - self._util[-1][0] >= UTIL_EVERY:
            used = sum(t.slots for n in self.nodes.by_index if n.state == "up" for t in n.tasks if t.alive)
            self._util.append((now, used, sum(n.slots for n in self.nodes.by_index if n.state == "up")))
        if self.admission.waiting or self.admission.borrowers:  # jobs that ended may have made room in quotas
            self.admission.admit()
        if self._hold_after_stop:
            self._hold_stopped()
        if len(self.table):
            t0 = time.perf_counter()
            actions = self.sched.tick()
            self.timings.decision.observe(time.perf_counter() - t0)
            for a in actions:
                e = self.table.get(a.key) if a.kind is START else None
                if e is not None and e.running and e.run_at == now:  # (started: not deferred nor refused)
                    rec = e.data["job"]
                    self.timings.wait.observe(now - e.pending_since, "start" if rec.run == 1 else "resume")
            for key in self.sched.deferred:
                self._emit("deferred", key, "", why="its GPUs are still held by stopping jobs")
            for key, why in self.sched.refused.items():
                self._emit("deferred", key, "", why=why)
            for key, kept in self.sched.held_back.items():
                self._emit("deferred", key, "", why=f"its GPUs go to it once {self._held_back_why(kept)}")
            for key, detail in self.sched.notes:
                self._emit("plan", str(key), "", policy=self.cfg.policy, **detail)
            self.sched.notes = ()
            for key, limit in self.sched.limits.items():
                rec = self.records.get(key)
                if rec is None:
                    continue
                limit = max(int(limit), rec.memory_floor)  # never below what the job last needed
                if rec.memory_limit != limit:
                    rec.memory_limit = limit
                    self._dirty.add(rec.id)
        self.nodes.release()
        if now >= self._next_prune:  # the worker credentials of runs that ended
            self._next_prune = now + 30.0
            self.c.creds.prune_workers(self.nodes.run_alive)
        if self.retention is not None and now >= self.retention.due:
            self._retire(now)
        self._flush(everything=now - self._last_persist >= self.cfg.persist_every)

    def _retire(self, now: float) -> None:
        """--retain: delete the events and ended jobs' output it made old (retention.py). (The spans'
        cursor is durable as it moves: they fold in the transaction that writes the events.)"""
        keep_from = self.events.gpu_time.cursor + 1
        if self.notifier is not None:
            keep_from = min(keep_from, self.notifier.needs_from())

        def ended(cutoff: float):
            for job in self.logs.jobs():
                rec = self.records.kept(job)  # (an old one packed: read, not unpacked)
                if rec is None:  # a group's own output: once it has printed nothing for that long
                    if self.logs.heard(job) < cutoff:
                        yield job
                elif rec.status in _ENDED_NAMES and rec.end_time is not None and rec.end_time < cutoff:
                    yield job

        below = self.retention.run(now, keep_from, ended, self.logs.forget)
        if below:
            self.events.forget_below(below)

    async def run(self) -> None:
        self._wake = asyncio.Event()
        self._wake.set()
        if self.notifier is not None:
            notes = asyncio.ensure_future(self.notifier.run(self.clock.now, self._flush))
            try:
                await self._run()
            finally:
                notes.cancel()
        else:
            await self._run()

    async def _run(self) -> None:
        while True:
            now = self.clock.now()
            due = [self._next_round, now + 1.0]  # at least every second: node liveness
            if self.sched.wakeup is not None:
                due.append(self.sched.wakeup)
            if self._next_timeout is not None:
                due.append(self._next_timeout)
            maint = self.nodes.next_maintenance()
            if maint is not None:  # a planned maintenance window: cordoned then
                due.append(maint)
            begins = [r.begin for r in self.admission.waiting.values() if r.begin > now]
            if begins:  # a job's --begin: admitted then
                due.append(min(begins))
            timeout = max(0.0, min(due) - now)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            now = self.clock.now()
            if now >= self._next_round:
                self._next_round = now + self.cfg.interval
            try:
                self.tick()
            except Exception:  # a bug must not stop scheduling; it is logged in full
                log.exception("scheduling tick failed")
                await asyncio.sleep(0.5)

    def close(self) -> None:
        self._flush(everything=True)


_MEMBER_LINE = re.compile(rb"^(?:\[[^\]\n]{0,64}\]:)?\[([A-Za-z0-9][A-Za-z0-9._-]{0,127})\] ")


def _check_begin(begin: Optional[float], now: float, error: type = ConfigError) -> None:
    """Raises: ``error`` (a 400): a ``--begin`` more than 366 days ahead."""
    if begin is not None and begin > now + MAX_BEGIN:
        raise error(f"--begin is {(begin - now) / 86_400:.0f} days from now; it may be at most 366 days ahead "
                          "(give a nearer time, or submit later)")


def _begin_text(begin: float) -> str:
    """A begin time for an event: local, to the second, or "now" (none)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(begin)) if begin else "now"


def _size_text(lo: int, hi: int) -> str:
    return str(hi) if lo == hi else f"{lo}:{hi}"


def _limit_text(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds else "none"


def _held(e: Entry, now: float) -> float:
    """Seconds the job has held GPUs in all its runs (start-up and stopping included, waiting not)."""
    if e.start_time is None:
        return 0.0
    waiting = e.pending + (now - e.pending_since if not (e.running or e.stopping) else 0.0)
    return max(0.0, now - e.submit_time - waiting)


def _split_group_log(data: bytes) -> dict[str, bytes]:
    """A group task's output by member: ``etrun --group`` starts each job's lines with ``[<id>] ``."""
    out: dict[str, list] = {}
    for line in data.splitlines(keepends=True):
        m = _MEMBER_LINE.match(line)
        if m is not None:
            out.setdefault(m.group(1).decode(), []).append(line)
    return {k: b"".join(v) for k, v in out.items()}


def _given_stages(stages: Optional[dict]) -> list[float]:
    """A submitted stage profile in :data:`STAGES` order; unknown stage names are refused."""
    if not stages:
        return []
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        raise ConfigError(f"stage_times names unknown stages {unknown}; the stages are {', '.join(STAGES)}")
    out = [float(stages.get(k, 0.0)) for k in STAGES]
    if not any(out):
        raise ConfigError("stage_times must give some stage a time above 0")
    return out


def _default_name(command: list[str]) -> str:
    base = os.path.basename(command[0]) or "job"
    if base.endswith(".py"):
        base = base[:-3]
    clean = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in base).lstrip("._-")[:64]
    return clean or "job"

