"""The live backend: the mechanism core's actions applied to real jobs through node daemons.

``start`` makes a new *run* of the job: one task per node of its placement, handed to that
node's daemon once its GPUs are free (:class:`~.nodes.NodeBook`), and announced to the
rendezvous so the run's agents form a fresh round whose generation says why it started
(``ET_RESTART_REASON``: ``start``, ``preempt``, ``requeue``, ``node_lost``, ``migrate``...).
``stop`` withdraws the run's tasks: each daemon sends its ``etrun`` SIGTERM, the workers
checkpoint within the job's grace period and exit with the preempted code, and once every
task has exited the job is *stopped* (waiting again, resumable from its checkpoint).
``restart`` (migrate, regroup, resize) is a stop of the old run and a start of a new one.

An interleaving group (Muri) runs as one *group task* per node: one ``etrun --group`` process
per rank that runs every member's script, each under the member's own id (its datasets,
checkpoints, generations and steps stay its own). Each member starts a run of its own as usual;
once every member of the group has, the group task is made (its id ``g.<leader>.<run>``, a
rendezvous of its own) and each member's record points at it (``grun``). A member's stop,
move or regroup withdraws the whole group task (the others are moved by the same decision);
a member that finishes or fails inside the group reports it itself (:meth:`member_result`) and
the others train on; when the group task exits, each member still in it moves on as a job of its
own would.

:meth:`LiveBackend.on_exit` turns what the daemons report into job transitions: every task of
a run exiting 0 finishes the job; a task exiting with a failure (etrun used up the job's
restarts) fails it with the rendezvous' root cause; a task lost with its node, or exiting with
the preempted code when nobody asked, requeues the job (its other tasks stop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import msgspec

from .. import PREEMPTED_EXIT_CODE
from ..clock import Clock
from ..scheduling import ENDED, Action, ActionKind, ClusterShape, Entry, JobStatus, JobTable
from ..policies.interleaving import best_ordering
from .events import EventLog
from .nodes import Exit, NodeBook, TaskRec
from .rendezvous import Rendezvous

if TYPE_CHECKING:
    from .records import JobRecords

__all__ = ["JobRecord", "LiveBackend", "FORMING", "submission_order"]

FORMING = "forming"  # JobRecord.grun of a member whose group task waits for the other members


ENDED_NAMES = frozenset(s.value for s in ENDED)  # JobRecord.status of a job that ended


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
    timed_workers: int = 0  # the worker count iteration_time was measured on (a resize measures anew)
    assumed: list[str] = []
    profile_steps: int = 20
    reprofile: bool = False
    given_stages: list[float] = []  # the stage profile given at submission (used until one is measured)
    stage_times: list[float] = []  # the stage times the policy last saw
    grun: str = ""  # the group task this job's run is part of ("forming": waiting for the others)
    group_t0: tuple[int, float] = (0, 0.0)  # (step, time) of the first step report in the group run
    group_iteration_time: Optional[float] = None  # measured seconds per step in its group
    group_steps: int = 0  # the steps that measurement covers
    group_predicted: Optional[float] = None  # the interleaving model's (eq. 3) for that group
    group_members: list[str] = []  # the group it was measured in
    memory_limit: int = 0  # bytes per worker a resource plan set for its next runs (0: none)
    memory_floor: int = 0  # the limit etrun doubled to after the job ran out of memory (plans stay above)
    run_as: str = ""  # the UNIX account its tasks run as ("": the node daemon's own)
    allow_root: bool = False  # an admin let it run as root
    exit_code: Optional[int] = None  # of the run that ended it (0: finished; None: running, or cancelled)
    runs_by_reason: dict[str, int] = {}  # runs after its first, by why each started (preempt, node_lost ...)
    admitted: bool = True  # in the job table the policy decides on (False: on hold, or waiting for jobs or quota)
    after: list[str] = []  # jobs it waits for, as "JOB:ok" (finished) or "JOB:any" (ended)
    hold: bool = False  # on hold until released (not admitted meanwhile)
    array: str = ""  # the array it is a task of (its id: the array's, "_", its index)
    array_limit: int = 0  # tasks of its array admitted at once, at most (0: no limit)
    time_limit: float = 0.0  # seconds it may hold GPUs in all its runs (0: no limit)
    run_at: float = 0.0  # when its current (or last) run was started (--preempt-exempt counts from it)
    begin: float = 0.0  # the time it may start from (--begin; 0: at once)
    borrowing: bool = False  # admitted over its user's quota (--quota-borrow): preempted first
    project: str = ""  # the project whose quota it counts against ("": none)
    gpu_type: str = ""  # the GPU type it must run on ("": any; policies/placement.py's type_matches)
    notify_url: str = ""  # where its notifications go ("": none; coordinator/notify.py) ...
    notify_on: list[str] = []  # ... and of what (begin, end, fail, requeue, all)

    @property
    def grouped(self) -> bool:
        """Its run is part of a group task that exists (not one still forming)."""
        return bool(self.grun) and self.grun != FORMING


def submission_order(rec: JobRecord) -> tuple[int, int]:
    """A record's place in submission order: its submission's number, then (the tasks of one array
    share it) its task index."""
    return rec.seq, int(rec.id.rpartition("_")[2]) if rec.array else 0


class LiveBackend:
    def __init__(self, table: JobTable, nodes: NodeBook, rendezvous: Rendezvous, events: EventLog, clock: Clock,
                 records: JobRecords, touched: Callable[[str], None]) -> None:
        self.table, self.nodes, self.rdzv, self.events, self.clock = table, nodes, rendezvous, events, clock
        self.records, self._touched = records, touched
        self._codes: dict = {}
        self.first_generation: dict[str, int] = {}  # job -> the first generation its current run can open
        self.run_started: dict[str, float] = {}  # job -> when its current run was launched (its start-up's start)

    # ------------------------------------------------------------------ Backend
    def shape(self) -> ClusterShape:
        caps = self.nodes.capacities()
        return ClusterShape(caps, max(1, len(caps)), self.nodes.types(), self.nodes.windows())

    def refuses(self, a: Action) -> str:
        """Why ``a`` may not place its job where it says: a cordoned node where the job holds no
        GPUs yet (a decision may move a job off such a node and give its GPUs to another: the
        node offers only the GPUs its placed tasks hold, for those tasks)."""
        before = {n for n, _ in a.previous}
        nodes = self.nodes.by_index
        for n, _ in a.placement:
            node = nodes[n] if 0 <= n < len(nodes) else None
            if node is not None and node.cordoned_until and n not in before:
                return f"node {node.name} is cordoned ({node.cordon_why or 'no reason given'}) and takes no new job"
        return ""

    def start(self, e: Entry, a: Action) -> None:
        rec = self.records[e.key]
        first = rec.run == 0
        self._launch(rec, a.placement, "start" if first else rec.resume_reason,
                     "start" if first else "resume", group=list(a.group))

    def stop(self, e: Entry, a: Action) -> None:
        rec = self.records[e.key]
        rec.resume_reason = "preempt"
        self._emit("preempt", rec, placement=self._names(a.previous), run=rec.run, reason="decision")
        self._leave_group(rec)
        self._withdraw(rec, "preempted by the scheduler")

    def restart(self, e: Entry, a: Action) -> None:
        rec = self.records[e.key]
        kind = a.kind.value
        before = sum(g for _, g in a.previous)
        self._emit(kind, rec, placement=self._names(a.placement), previous=self._names(a.previous), run=rec.run,
                   workers=a.workers, previous_workers=before, group=list(a.group))
        self._leave_group(rec)
        self.nodes.unwant(rec.id, rec.run)
        reason = kind  # a resize starts its run as torchrun users know it: scale_up or scale_down
        if a.kind is ActionKind.RESIZE:
            reason = "scale_up" if a.workers > before else "scale_down"
        self._launch(rec, a.placement, reason, None, group=list(a.group))

    # ------------------------------------------------------------------ runs and tasks
    def _launch(self, rec: JobRecord, placement: tuple, reason: str, event: Optional[str], group: list) -> None:
        rec.run += 1
        rec.reason = ""
        rec.resume_reason = reason
        if rec.run > 1:
            rec.runs_by_reason = {**rec.runs_by_reason, reason: rec.runs_by_reason.get(reason, 0) + 1}
        self.first_generation[rec.id] = self.rdzv.generation(rec.id) + 1
        self.run_started[rec.id] = self.clock.now()
        if len(group) > 1:
            rec.grun = FORMING
            self._form_group(tuple(group), placement)
        else:
            for node, g in placement:
                self.nodes.add(TaskRec(rec.id, rec.run, self.nodes.name_of(node), g))
            self.rdzv.expect(rec.id, rec.run, reason, rec.restarts)
        if event is not None:
            self._emit(event, rec, placement=self._names(placement), run=rec.run, reason=reason, group=group,
                       attained_gpu=round(rec.attained_gpu, 3))
        self._touched(rec.id)

    # ------------------------------------------------------------------ interleaving groups
    def recover(self) -> None:
        """After a coordinator restart: the rounds of the group tasks that still run, and groups
        whose members had all started before the restart but whose task was not made."""
        for t in [t for n in self.nodes.by_index for t in n.tasks if t.members]:
            self.rdzv.expect(t.job, t.run, "start", 0)  # its agents (re)join the group's own round
        for e in list(self.table.entries()):
            if e.group and e.group[0] == e.key and self.records[e.key].grun == FORMING:
                self._form_group(tuple(e.group), e.placement)

    def _form_group(self, group: tuple, placement: tuple) -> None:
        """Make the group task once every member has started its run in this group."""
        recs = [self.records.get(m) for m in group]
        for r in recs:
            e = self.table.get(r.id) if r is not None else None
            if r is None or r.grun != FORMING or e is None or not e.running or tuple(e.group) != group:
                return  # a member is not there yet (deferred): the group forms when it starts
        leader = recs[0]
        gid = f"g.{leader.id}.{leader.run}"  # (its agents' first join creates it at the rendezvous)
        for node, g in placement:
            self.nodes.add(TaskRec(gid, 1, self.nodes.name_of(node), g, members=list(group)))
        self.rdzv.expect(gid, 1, "start", 0)
        predicted = self.predict(group)
        for r in recs:
            r.grun, r.group_predicted = gid, predicted
            r.group_t0, r.group_iteration_time, r.group_steps, r.group_members = (0, 0.0), None, 0, list(group)
            self._touched(r.id)
        self.events.emit(self.clock.now(), "group", "", "", task=gid, jobs=list(group),
                         placement=self._names(placement), predicted=round(predicted, 4) if predicted else None)

    def _leave_group(self, rec: JobRecord) -> None:
        """The job's run ends by decision: its group task (if any) is withdrawn whole. (Until that
        task has exited, it counts among the job's remaining tasks: see :meth:`_remaining`.)"""
        gid, grouped, rec.grun = rec.grun, rec.grouped, ""
        if grouped and self.nodes.unwant(gid, 1):
            self.rdzv.stop(gid, "regrouped by the scheduler")

    def member_result(self, rec: JobRecord, run: int, status: str, detail: str) -> bool:
        """A grouped job's own outcome, from its process; False when it is not for the job's
        current group run (an old run, or a job already ended)."""
        if run != rec.run or not rec.grouped or rec.id not in self.table:
            return False
        now = self.clock.now()
        if status == "finished":
            self._finish(rec, now)
        elif rec.restarts < rec.max_restarts:  # as etrun would: run it again from its checkpoint
            rec.restarts += 1
            self._emit("member_failed", rec, run=rec.run, group=rec.grun, restarts=rec.restarts,
                       reason=detail[-1000:])
            gid = rec.grun
            running = (self.records[k] for k in self.table.running)
            group = sorted((m for m in running if m.grun == gid), key=submission_order)
            for m in group:  # the group stops (every member checkpoints); all wait to be placed
                m.resume_reason = "failure" if m is rec else "regroup"
                self.table.stop(m.id, now)
                self._leave_group(m)
                self._touched(m.id)
        else:
            rec.reason = f"failed inside its group {rec.grun}: {detail[-1500:]}"
            self._fail(rec, group=rec.grun)
        return True

    def _group_exit(self, x: Exit) -> None:
        """A group task ended; once all of it has, each member still in it moves on."""
        t = x.task
        codes = self._codes.setdefault((t.job, t.run), {})
        codes[t.node] = x.code
        left = [r for n in self.nodes.by_index for r in n.tasks if r.job == t.job and r.run == t.run
                and (r.wanted or r.alive)]
        bad = x.lost or x.code != 0
        if left:
            if bad:  # one node's part is gone: the rest of the group cannot go on
                self.nodes.unwant(t.job, t.run)
                self.rdzv.stop(t.job, "a node's part of the group ended: " + x.detail[-200:])
            return
        self._codes.pop((t.job, t.run), None)
        self.rdzv.forget(t.job)
        for m in t.members:
            rec = self.records.get(m)
            if rec is None or rec.id not in self.table:
                continue  # it ended inside the group (finished, failed, cancelled)
            e = self.table.get(rec.id)
            if rec.grun != t.job:  # it left the group by decision
                if e.stopping and not self._remaining(rec):
                    self._stopped(rec, codes)  # its stop waited for the group's exit
                continue
            rec.grun = ""
            self._touched(rec.id)
            if e.stopping:
                self._stopped(rec, codes)
            elif all(c == 0 for c in codes.values()) and not x.lost:
                self._finish(rec, self.clock.now())
            elif x.lost or all(c in _REQUEUE or c == 0 for c in codes.values()):
                rec.resume_reason = "node_lost" if x.lost else "requeue"
                self.table.stop(rec.id, self.clock.now())
                self._emit("requeue", rec, run=rec.run, node=t.node, code=x.code, why=x.detail[-300:])
                self._stopped(rec, {})
            else:
                out = self.rdzv.outcome(t.job)
                rec.reason = f"its group {t.job} failed (etrun exited with code {x.code} on node {t.node}): " \
                    f"{_tail(x.detail)}" if out is None or not out[1] else out[1]
                self._fail(rec, node=t.node, code=x.code, group=t.job)

    def requeue(self, rec: JobRecord, reason: str, why: str, **detail) -> None:
        """Stop the job's run on the coordinator's own account, not a decision's (a straggler's node
        was cordoned): it waits, and the policy places it again; its next run starts with ``reason``."""
        rec.resume_reason = reason
        self.table.stop(rec.id, self.clock.now())
        self._emit("requeue", rec, run=rec.run, why=why[-300:], **detail)
        self._leave_group(rec)
        self._withdraw(rec, "requeued: " + why[-200:])

    def _withdraw(self, rec: JobRecord, why: str, codes: Optional[dict] = None) -> None:
        """Stop the job's current run; the job is stopped when its last task has exited (its
        own, or the group task it left)."""
        left = self.nodes.unwant(rec.id, rec.run)
        self.rdzv.stop(rec.id, why)
        self._touched(rec.id)
        if not left and not self._remaining(rec) and rec.id in self.table.stopping:
            self._stopped(rec, codes or {})

    def _remaining(self, rec: JobRecord) -> list[TaskRec]:
        """The tasks of the job's current run still there, or of a group task it left and that
        has not exited yet (its processes still hold the job's checkpoint)."""
        return [t for n in self.nodes.by_index for t in n.tasks
                if (t.job == rec.id and t.run == rec.run) or (t.members and rec.id in t.members and t.job != rec.grun)]

    def _stopped(self, rec: JobRecord, codes: dict) -> None:
        self._codes.pop((rec.id, rec.run), None)
        now = self.clock.now()
        if codes and all(c == 0 for c in codes.values()):
            self._finish(rec, now)  # it finished while being stopped
            return
        self.table.stopped(rec.id, now)
        self._emit("preempted", rec, run=rec.run, codes=codes, resume_reason=rec.resume_reason)

    def _end(self, rec: JobRecord, status: JobStatus) -> None:
        """The job leaves the table: its record keeps the final state. A member ending inside a
        running group task leaves the others there: they run on in it as a smaller group (alone
        when one is left), with nothing restarted."""
        self._codes.pop((rec.id, rec.run), None)
        e = self.table.get(rec.id)
        if e is None:  # never admitted (held, waiting for other jobs or its quota): it ends as it waited
            rec.status, rec.end_time = status.value, self.clock.now()
            self._touched(rec.id)
            return
        if e is not None and e.group and rec.grouped:
            rest = tuple(m for m in e.group if m != rec.id)
            for m in rest:
                other = self.table.get(m)
                if other is not None and other.running and tuple(other.group) == tuple(e.group):
                    self.table.move(m, other.placement, rest if len(rest) > 1 else (), other.num_gpu)
        self.first_generation.pop(rec.id, None)
        self.run_started.pop(rec.id, None)
        out = self.rdzv.outcome(rec.id)
        if out is not None:  # the worker-failure restarts etrun made in its last run
            rec.restarts = max(rec.restarts, out[2])
        e = self.table.end(rec.id, status, self.clock.now())
        rec.status, rec.end_time = e.status.value, e.end_time
        rec.attained, rec.attained_gpu, rec.preemptions = e.attained, e.attained_gpu, e.preemptions
        rec.placement, rec.held, rec.group, rec.stopping = [], [], [], False
        self._touched(rec.id)

    def _finish(self, rec: JobRecord, now: float) -> None:
        self.table.accrue(now)
        rec.exit_code = 0
        self._end(rec, JobStatus.FINISHED)
        self._emit("finish", rec, run=rec.run, jct=round(now - rec.submit_time, 3))
        self.rdzv.forget(rec.id)

    def on_exit(self, x: Exit) -> None:
        """A task ended (or its node was lost); move its job on if its run is over."""
        t = x.task
        if t.members:
            self._group_exit(x)
            return
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
        self._fail(rec, node=t.node, code=x.code)

    def _fail(self, rec: JobRecord, **detail) -> None:
        """The job failed (``rec.reason`` says why): it ends, with whatever of it is left."""
        self.table.accrue(self.clock.now())
        rec.exit_code = detail.get("code", 1)
        self._end(rec, JobStatus.FAILED)
        self.nodes.unwant(rec.id)
        self.rdzv.forget(rec.id)
        self._emit("fail", rec, run=rec.run, reason=rec.reason[-1000:], **detail)

    def cancel(self, rec: JobRecord) -> None:
        """(A job inside a group task is cancelled there by its own process, which polls.)"""
        self._stop_and_end(rec, JobStatus.CANCELLED, "cancel", "cancelled")

    def timeout(self, rec: JobRecord, held: float) -> None:
        """The job held its GPUs for its whole ``--time``: its run is stopped (the workers get
        SIGTERM and its grace to checkpoint, as on a preemption) and it fails with reason TIMEOUT."""
        rec.reason = (f"TIMEOUT: it held its GPUs {held:.0f} s, its --time limit is {rec.time_limit:.0f} s; its "
                      "last checkpoint is kept: submit it again (with a longer --time) to go on from there")
        rec.exit_code = None
        self._stop_and_end(rec, JobStatus.FAILED, "timeout", "timeout", held=round(held, 1),
                           time_limit=rec.time_limit)

    def _stop_and_end(self, rec: JobRecord, status: JobStatus, event: str, why: str, **detail) -> None:
        """The job ends now; its workers are told to stop (they checkpoint, as when preempted)."""
        self.nodes.unwant(rec.id)
        self.rdzv.stop(rec.id, why)
        self.table.accrue(self.clock.now())
        self._end(rec, status)
        self._emit(event, rec, run=rec.run, **detail)
        self.rdzv.forget(rec.id)

    def predict(self, group) -> Optional[float]:
        """The interleaving model's iteration time (eq. 3, best slot ordering) of ``group``."""
        entries = [self.table.get(m) for m in group]
        profiles = [e.stage_times if e is not None else () for e in entries]
        if not all(profiles):
            return None
        return best_ordering(profiles, max(len(p) for p in profiles))[0]

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
