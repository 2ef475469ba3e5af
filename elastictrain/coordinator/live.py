"""The live backend: the mechanism core's actions applied to real jobs through node daemons.

``start`` makes a new *run* of the job: one task per node of its placement, handed to that
node's daemon once its GPUs are free (:class:`~.nodes.NodeBook`), and announced to the
rendezvous so the run's agents form a fresh round whose generation says why it started
(``ET_RESTART_REASON``: ``start``, ``preempt``, ``requeue``, ``node_lost``, ``migrate``...).
``stop`` withdraws the run's tasks: each daemon sends its ``etrun`` SIGTERM, the workers
checkpoint within the job's grace period and exit with the preempted code, and once every
task has exited the job is *stopped* (waiting again, resumable from its checkpoint).
``restart`` (migrate, regroup, resize) is a stop of the old run and a start of a new one.

:meth:`LiveBackend.on_exit` turns what the daemons report into job transitions: every task of
a run exiting 0 finishes the job; a task exiting with a failure (etrun used up the job's
restarts) fails it with the rendezvous' root cause; a task lost with its node, or exiting with
the preempted code when nobody asked, requeues the job (its other tasks stop).
"""

from __future__ import annotations

from typing import Callable, Optional

import msgspec

from .. import PREEMPTED_EXIT_CODE
from ..clock import Clock
from ..scheduling import Action, ActionKind, ClusterShape, Entry, JobStatus, JobTable
from .events import EventLog
from .nodes import Exit, NodeBook, TaskRec
from .rendezvous import Rendezvous

__all__ = ["JobRecord", "LiveBackend"]


class JobRecord(msgspec.Struct):
    """The durable record of a scheduled job (the table's Entry is its in-memory twin)."""

    id: str
    seq: int
    name: str
    user: str
    priority: int
    gpus: int
    min_gpus: int
    command: list[str]
    workdir: str
    env: dict[str, str]
    module: bool
    steps: Optional[int]
    epochs: Optional[int]
    max_restarts: int
    grace: float
    submit_time: float
    status: str = "queued"
    start_time: Optional[float] = None
    end_time: Optional[float] = None
    attained: float = 0.0
    attained_gpu: float = 0.0
    accrued_at: float = 0.0
    pending: float = 0.0
    pending_since: float = 0.0
    placement: list[tuple[int, int]] = []
    held: list[tuple[int, int]] = []
    group: list[str] = []
    stopping: bool = False
    workers: int = 0
    preemptions: int = 0
    restarts: int = 0
    reason: str = ""
    run: int = 0
    resume_reason: str = "start"  # why the next run starts
    step: int = 0
    step_time: Optional[float] = None
    step_run: int = 0
    iteration_time: Optional[float] = None
    assumed: list[str] = []


class LiveBackend:
    def __init__(self, table: JobTable, nodes: NodeBook, rendezvous: Rendezvous, events: EventLog, clock: Clock,
                 records: dict[str, JobRecord], touched: Callable[[str], None]) -> None:
        self.table, self.nodes, self.rdzv, self.events, self.clock = table, nodes, rendezvous, events, clock
        self.records, self._touched = records, touched
        self._codes: dict = {}
        self.first_generation: dict[str, int] = {}  # job -> the first generation its current run can open

    # ------------------------------------------------------------------ Backend
    def shape(self) -> ClusterShape:
        caps = self.nodes.capacities()
        return ClusterShape(caps, max(1, len(caps)), self.nodes.types())

    def start(self, e: Entry, a: Action) -> None:
        rec = self.records[e.key]
        first = rec.run == 0
        self._launch(rec, a.placement, "start" if first else rec.resume_reason,
                     "start" if first else "resume", group=list(a.group))

    def stop(self, e: Entry, a: Action) -> None:
        rec = self.records[e.key]
        rec.resume_reason = "preempt"
        self._emit("preempt", rec, placement=self._names(a.previous), run=rec.run, reason="decision")
        self._withdraw(rec, "preempted by the scheduler")

    def restart(self, e: Entry, a: Action) -> None:
        rec = self.records[e.key]
        kind = a.kind.value
        before = sum(g for _, g in a.previous)
        self._emit(kind, rec, placement=self._names(a.placement), previous=self._names(a.previous), run=rec.run,
                   workers=a.workers, previous_workers=before)
        self.nodes.unwant(rec.id, rec.run)
        reason = kind  # a resize starts its run as torchrun users know it: scale_up or scale_down
        if a.kind is ActionKind.RESIZE:
            reason = "scale_up" if a.workers > before else "scale_down"
        self._launch(rec, a.placement, reason, None, group=list(a.group))

    # ------------------------------------------------------------------ runs and tasks
    def _launch(self, rec: JobRecord, placement: tuple, reason: str, event: Optional[str], group: list) -> None:
        rec.run += 1
        rec.reason = ""
        self.first_generation[rec.id] = self.rdzv.generation(rec.id) + 1
        for node, g in placement:
            self.nodes.add(TaskRec(rec.id, rec.run, self.nodes.name_of(node), g))
        self.rdzv.expect(rec.id, rec.run, reason, rec.restarts)
        if event is not None:
            self._emit(event, rec, placement=self._names(placement), run=rec.run, reason=reason, group=group,
                       attained_gpu=round(rec.attained_gpu, 3))
        self._touched(rec.id)

    def _withdraw(self, rec: JobRecord, why: str, codes: Optional[dict] = None) -> None:
        """Stop the job's current run; the job is stopped when its last task has exited."""
        left = self.nodes.unwant(rec.id, rec.run)
        self.rdzv.stop(rec.id, why)
        self._touched(rec.id)
        if not left and rec.id in self.table.stopping:
            self._stopped(rec, codes or {})

    def _remaining(self, rec: JobRecord) -> list[TaskRec]:
        return [t for n in self.nodes.by_index for t in n.tasks if t.job == rec.id and t.run == rec.run]

    def _stopped(self, rec: JobRecord, codes: dict) -> None:
        self._codes.pop((rec.id, rec.run), None)
        now = self.clock.now()
        if codes and all(c == 0 for c in codes.values()):
            self._finish(rec, now)  # it finished while being stopped
            return
        self.table.stopped(rec.id, now)
        self._emit("preempted", rec, run=rec.run, codes=codes, resume_reason=rec.resume_reason)

    def _end(self, rec: JobRecord, status: JobStatus) -> None:
        """The job leaves the table: its record keeps the final state."""
        self._codes.pop((rec.id, rec.run), None)
        self.first_generation.pop(rec.id, None)
        e = self.table.end(rec.id, status, self.clock.now())
        rec.status, rec.end_time = e.status.value, e.end_time
        rec.attained, rec.attained_gpu, rec.preemptions = e.attained, e.attained_gpu, e.preemptions
        rec.placement, rec.held, rec.group, rec.stopping = [], [], [], False
        self._touched(rec.id)

    def _finish(self, rec: JobRecord, now: float) -> None:
        self.table.accrue(now)
        self._end(rec, JobStatus.FINISHED)
        self._emit("finish", rec, run=rec.run, jct=round(now - rec.submit_time, 3))
        self.rdzv.forget(rec.id)

    def on_exit(self, x: Exit) -> None:
        """A task ended (or its node was lost); move its job on if its run is over."""
        t = x.task
        rec = self.records.get(t.job)
        if rec is None or t.run != rec.run or rec.id not in self.table:
            return  # an old run, or a job that already ended: its GPUs are free, nothing else
        codes = self._codes.setdefault((rec.id, rec.run), {})  # exit codes of the run's tasks, by node
        codes[t.node] = x.code
        self._touched(rec.id)
        left = [r for r in self._remaining(rec) if r.wanted or r.alive]
        e = self.table.get(rec.id)
        if e.stopping:
            if not left:
                self._stopped(rec, codes)
            return
        if x.lost or x.code in _REQUEUE:
            rec.resume_reason = "node_lost" if x.lost else "requeue"
            self.table.stop(rec.id, self.clock.now())
            self._emit("requeue", rec, run=rec.run, node=t.node, code=x.code, why=x.detail[-300:])
            self._withdraw(rec, "requeued: " + x.detail[-200:], codes)
            return
        if x.code == 0:
            if not left:
                self._finish(rec, self.clock.now())
            return
        out = self.rdzv.outcome(rec.id)
        if out is not None:
            rec.restarts = max(rec.restarts, out[2])
        rec.reason = out[1] if out is not None and out[0] == "failed" and out[1] else \
            f"etrun exited with code {x.code} on node {t.node}: {_tail(x.detail)}"
        self.table.accrue(self.clock.now())
        self._end(rec, JobStatus.FAILED)
        self.nodes.unwant(rec.id)
        self.rdzv.forget(rec.id)
        self._emit("fail", rec, run=rec.run, node=t.node, code=x.code, reason=rec.reason[-1000:])

    def cancel(self, rec: JobRecord) -> None:
        self.nodes.unwant(rec.id)
        self.rdzv.stop(rec.id, "cancelled")
        self.table.accrue(self.clock.now())
        self._end(rec, JobStatus.CANCELLED)
        self._emit("cancel", rec, run=rec.run)
        self.rdzv.forget(rec.id)

    # ------------------------------------------------------------------ helpers
    def _names(self, placement) -> list:
        return [[self.nodes.name_of(n), g] for n, g in placement if n >= 0]

    def _emit(self, event: str, rec: JobRecord, /, **detail) -> None:
        self.events.emit(self.clock.now(), event, rec.id, "", **detail)


#: exit codes of an agent that was stopped rather than failed: the preempted code, killed by a
#: signal (negative), or etrun's 128 + SIGTERM/SIGINT/SIGHUP after forwarding it; None: no code (lost)
_REQUEUE = frozenset({None, PREEMPTED_EXIT_CODE, 128 + 15, 128 + 2, 128 + 1, -15, -2, -1, -9})


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])[-1500:]
