"""The job table: stable records keyed by job key, and the snapshots each policy decides on.

:class:`Entry` is the mechanism's mutable bookkeeping of one job; policies never see it. They
see :class:`~elastictrain.policies.api.JobView`, a frozen copy the table rebuilds whenever the
entry changes (running jobs: at every snapshot, since their attained service grows). Keys may
be strings (the coordinator's job ids) or ints (trace job ids); one table holds one kind.

**Service is training time.** A job's run starts *starting* (its workers launch, import, restore
their checkpoint) and trains from its first step on. Attained service (``attained``,
``attained_gpu``) counts only the time after that first step: a start that takes longer than a
queue's threshold must not demote a job that has not trained yet. The live backend ends a run's
start-up at the first step a worker reports (:meth:`JobTable.began`); the simulator at the end
of the restart cost the run pays first. Starting jobs are listed in ``JobTable.starting``.

Each policy reads the table through its own :class:`Feed`, which remembers what arrived and
ended since that policy's previous snapshot. A feed created on a table that already holds jobs
starts with every runnable job as arrived, so a policy rebuilt after a coordinator restart
learns them all again.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Optional

from msgspec.structs import replace as _replace

from ..errors import ConfigError
from ..policies.api import EMPTY, ClusterSnapshot, JobsInOrder, JobView
from .api import ClusterShape, JobStatus

__all__ = ["Entry", "JobTable", "Feed"]

# (plain names for the transitions' hot paths: an Enum member looked up on its class costs ten
# times a global on Python 3.11, see scheduling/api.py)
_QUEUED, _RUNNING, _PREEMPTED = JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.PREEMPTED


class Entry:
    """One job's record. Times are seconds on the scheduler's clock."""

    __slots__ = ("key", "num_gpu", "min_gpu", "max_gpu", "submit_time", "model", "user", "priority",
                 "iteration_time", "iterations", "remaining_iterations", "attained", "attained_gpu", "running",
                 "stopping", "placement", "held", "start_time", "end_time", "pending_since", "pending",
                 "preemptions", "stage_times", "skew", "speeds", "restart_cost", "group", "status", "accrued_at",
                 "seq", "slowdown", "rate", "rate_window", "peak_memory", "ready_at", "run_at", "data", "gpu_type",
                 "project", "work_known")

    def __init__(self, key, num_gpu: int, submit_time: float, *, model: str = "", iteration_time: float = 1.0,
                 iterations: float = 1.0, stage_times: tuple = (), user: str = "", skew: float = 0.0,
                 speeds=EMPTY, restart_cost: float = 0.0, min_gpu: int = 0, max_gpu: int = 0,
                 priority: int = 0, gpu_type: str = "", project: str = "") -> None:
        if not isinstance(num_gpu, int) or num_gpu < 1:
            raise ConfigError(f"job {key!r}: num_gpu must be an integer >= 1, got {num_gpu!r}")
        self.key, self.num_gpu, self.submit_time = key, num_gpu, submit_time
        self.min_gpu, self.max_gpu = min_gpu or num_gpu, max_gpu or num_gpu
        if not 1 <= self.min_gpu <= self.max_gpu:
            raise ConfigError(f"job {key!r}: need 1 <= min_gpu <= max_gpu, got {self.min_gpu}..{self.max_gpu}")
        self.model, self.user, self.priority = model, user, priority
        self.iteration_time, self.iterations = iteration_time, iterations
        self.remaining_iterations = float(iterations)
        self.attained = 0.0
        self.attained_gpu = 0.0
        self.running = False
        self.stopping = False
        self.placement: tuple = ()
        self.held: tuple = ()  # GPUs a stopping job still holds
        self.start_time: Optional[float] = None
        self.end_time: Optional[float] = None
        self.pending_since = submit_time
        self.pending = 0.0  # total time waiting (before the first start and between runs)
        self.preemptions = 0
        self.stage_times, self.skew, self.speeds = stage_times, skew, speeds
        self.restart_cost = restart_cost
        self.group: tuple = ()
        self.status = _QUEUED
        self.accrued_at = 0.0
        self.seq = -1
        self.slowdown = 1.0  # > 1 while the job runs slower than alone at full speed (group, placement)
        self.rate, self.rate_window = 0.0, 0.0  # measured samples/s of the current run (live jobs)
        self.peak_memory = 0.0  # the largest resident memory a worker of it reported (live jobs)
        self.ready_at: Optional[float] = None  # while starting: when the backend expects its first step (None: unknown)
        self.run_at = 0.0  # when its current (or last) run was started (Scheduler's min_run counts from it)
        self.data: dict = {}  # the backend's own per-job state
        self.gpu_type = gpu_type  # the GPU type it must run on ("" any)
        self.project = project  # the project it is charged to ("" none)
        self.work_known = True  # False: its remaining_iterations are assumed (JobView.work_known)

    def view(self, starting: bool = False) -> JobView:
        """Its policy view; ``starting``: its run has not trained yet (``JobTable.starting``)."""
        return JobView(self.key, self.num_gpu, self.submit_time, self.model, self.iteration_time, self.iterations,
                       self.remaining_iterations, self.attained, self.attained_gpu, self.running, self.placement,
                       self.start_time, self.pending_since, self.preemptions, self.stage_times, self.user, self.skew,
                       self.speeds, self.restart_cost, self.min_gpu, self.max_gpu, self.priority, self.rate,
                       self.rate_window, self.peak_memory, starting, self.ready_at if starting else None,
                       self.gpu_type, self.project, self.work_known)

    def __repr__(self) -> str:
        return f"Entry({self.key!r}, gpus={self.num_gpu}, {self.status.value}{', stopping' if self.stopping else ''})"


class JobTable:
    """Every job that has not ended, with the transitions the mechanism makes.

    ``running`` (start order) holds placed jobs; ``stopping`` those told to stop whose workers
    have not exited yet (they keep holding their GPUs, and are not runnable).
    """

    def __init__(self) -> None:
        self._entries: dict = {}
        self._views: dict = {}  # runnable jobs (stopping ones filtered at snapshot), arrival order
        self.running: dict = {}
        self.stopping: dict = {}
        self.starting: set = set()  # running (or stopping) jobs whose run has not trained its first step yet
        self.track_startup = True  # False: a backend whose runs train at once (none is ever starting)
        self._dirty: set = set()
        self._feeds: list[Feed] = []
        self._seq = 0

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries

    def get(self, key) -> Optional[Entry]:
        return self._entries.get(key)

    def entries(self) -> Iterable[Entry]:
        return self._entries.values()

    def subscribe(self) -> "Feed":
        feed = Feed(self)
        self._feeds.append(feed)
        return feed

    # ------------------------------------------------------------------ transitions
    def add(self, e: Entry) -> Entry:
        """A job arrives (or, on a restart, is loaded as it was: running, stopping or waiting).

        Raises:
            ConfigError: a job with this key is already in the table.
        """
        if e.key in self._entries:
            raise ConfigError(f"job {e.key!r} is already known; job keys are unique")
        e.seq = self._seq
        self._seq += 1
        self._entries[e.key] = e
        self._views[e.key] = e.view()
        if e.running:
            self.running[e.key] = e
        elif e.stopping:
            self.stopping[e.key] = e
        for f in self._feeds:
            f.arrived.append(e.key)
        return e

    def touch(self, key) -> None:
        """The entry changed (e.g. a new measurement): rebuild its view at the next snapshot.
        (Between snapshots a running job's service and progress change by themselves; any other
        field changed outside the table's own transitions needs this call.)"""
        self._dirty.add(key)

    def start(self, key, placement: tuple, group: tuple, now: float, workers: int = 0) -> Entry:
        e = self._entries[key]
        e.running, e.placement, e.group = True, placement, group
        if workers:
            e.num_gpu = workers
        e.pending += now - e.pending_since
        if e.start_time is None:
            e.start_time = now
        e.accrued_at = e.run_at = now
        e.status = _RUNNING
        self.running[key] = e
        if self.track_startup:
            self.starting.add(key)
        self._dirty.add(key)
        return e

    def began(self, key, now: float) -> None:
        """The job's run trained its first step: its service counts from ``now`` (the time
        since its start was start-up, not service)."""
        if key in self.starting:
            self.starting.discard(key)
            e = self._entries.get(key)
            if e is not None:
                self._dirty.add(key)
                if e.accrued_at < now:
                    e.accrued_at = now

    def restarting(self, key) -> None:
        """The job's run has not trained yet (a coordinator reloading a run with no step report)."""
        e = self._entries.get(key)
        if e is not None and (e.running or e.stopping):
            self.starting.add(key)
            self._dirty.add(key)

    def stop(self, key, now: float) -> Entry:
        """A decision preempts a running job: it stops running; its GPUs stay held until
        :meth:`stopped`."""
        e = self.running.pop(key)
        e.running, e.stopping = False, True
        e.held, e.placement, e.group = e.placement, (), ()
        e.preemptions += 1
        e.pending_since = now
        self.stopping[key] = e
        self._dirty.add(key)
        return e

    def stopped(self, key, now: float) -> Entry:
        """A stopping job's workers have exited: its GPUs are free and it may be placed again."""
        e = self.stopping.pop(key)
        self._accrue_one(e, now)
        self.starting.discard(key)
        e.stopping, e.held = False, ()
        e.status = _PREEMPTED
        self._dirty.add(key)
        return e

    def preempt_now(self, key, now: float) -> Entry:
        """:meth:`stop` and :meth:`stopped` at once, for a backend whose stops complete at once
        (the simulator's): the same state, in one step."""
        e = self.running.pop(key)
        dt = now - e.accrued_at
        if key in self.starting:  # stopped before its first step: no service
            self.starting.discard(key)
            dt = 0.0
        if dt > 0:
            where = e.placement
            g = sum(n for _, n in where) if where else e.num_gpu
            e.attained += dt
            e.attained_gpu += dt * g
        e.accrued_at = now
        e.running = e.stopping = False
        e.held = e.placement = e.group = ()
        e.preemptions += 1
        e.pending_since = now
        e.status = _PREEMPTED
        self._dirty.add(key)
        return e

    def move(self, key, placement: tuple, group: tuple, workers: int, restarts: bool = True) -> Entry:
        """A running job changes placement, group or size (it keeps running). ``restarts``: its run
        starts over (it is starting again until its first step); False for a move that keeps the
        run training (the simulator's cost-free migrations): it stays as starting as it was."""
        e = self._entries[key]
        e.placement, e.group, e.num_gpu = placement, group, workers
        if restarts and self.track_startup:
            self.starting.add(key)
        self._dirty.add(key)
        return e

    def end(self, key, status: JobStatus, now: float) -> Entry:
        """The job finished, failed or was cancelled: it leaves the table."""
        e = self._entries.pop(key)
        self.running.pop(key, None)
        self.stopping.pop(key, None)
        self.starting.discard(key)
        del self._views[key]
        self._dirty.discard(key)
        e.running = e.stopping = False
        e.status, e.end_time = status, now
        for f in self._feeds:
            f.ended.append(key)
        return e

    def accrue(self, now: float) -> None:
        """Add attained service (seconds and GPU-seconds) to every job holding GPUs, up to ``now``."""
        starting = self.starting
        for key, e in self.running.items():
            dt = now - e.accrued_at
            if key not in starting:
                e.attained += dt
                e.attained_gpu += dt * e.num_gpu
            e.accrued_at = now
        for e in self.stopping.values():
            self._accrue_one(e, now)

    def _accrue_one(self, e: Entry, now: float) -> None:
        dt = now - e.accrued_at
        if dt > 0 and e.key not in self.starting:
            g = sum(n for _, n in e.held) if e.held else e.num_gpu
            e.attained += dt
            e.attained_gpu += dt * g
        e.accrued_at = now

    def held_per_node(self, nodes: int) -> list[int]:
        """GPUs each node's stopping jobs still hold."""
        out = [0] * nodes
        for e in self.stopping.values():
            for node, g in e.held:
                if 0 <= node < nodes:
                    out[node] += g
        return out

    def _refresh(self) -> None:
        views, entries, dirty = self._views, self._entries, self._dirty
        for key in dirty:
            e = entries.get(key)
            if e is not None:
                views[key] = e.view(key in self.starting)
        for key, e in self.running.items():  # their service and progress grew: 3 fields change
            if key not in dirty:
                views[key] = _replace(views[key], attained=e.attained, attained_gpu=e.attained_gpu,
                                      remaining_iterations=e.remaining_iterations)
        dirty.clear()


class Feed:
    """One policy's reading of a table: snapshots, and what arrived and ended in between."""

    def __init__(self, table: JobTable) -> None:
        self._t = table
        self.arrived: list = list(table._views)  # replay: a new policy learns every known job
        self.ended: list = []

    def snapshot(self, now: float, shape: ClusterShape) -> ClusterSnapshot:
        """The runnable jobs and the nodes' GPUs. Jobs being stopped are left out (they cannot be
        placed until their workers exit), but their GPUs count as free: they will be in a moment,
        and a start placed on them is deferred until then (:meth:`Scheduler.act`), rather than the
        policy preempting someone else to make room meanwhile."""
        t = self._t
        t._refresh()
        views = t._views
        if t.stopping:  # the live case only
            views = {k: v for k, v in views.items() if k not in t.stopping}
        arrived = tuple(views[k] for k in self.arrived if k in views)
        return ClusterSnapshot(now, JobsInOrder(views), shape.gpus_per_node, shape.nodes_per_switch, arrived,
                               tuple(self.ended), tuple(map(views.__getitem__, t.running)), shape.node_types,
                               MappingProxyType(views), shape.windows)

    def consumed(self) -> None:
        """The policy decided on the last snapshot: forget the changes it has seen."""
        self.arrived.clear()
        self.ended.clear()
