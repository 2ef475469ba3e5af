"""Nodes of the cluster and the tasks placed on them (cluster mode).

A *task* is one run of one job on one node: the ``etrun`` agent that the node's daemon starts
with ``--nproc-per-node <slots>``. The node book gives each task its GPU indices and hands it
to the daemon (*releases* it) only once those GPUs are free of every task still alive there,
wanted or not: a preempted job's workers take seconds to checkpoint and exit, and nothing is
started on their GPUs before they have. So the slots in use on a node, counted from the tasks
released and not yet exited, never exceed the node's slots.

Daemons are the source of truth about processes: each poll reports every task the daemon runs
or saw exit. A daemon that stops polling for ``node_timeout`` seconds is *down*: its tasks count
as exited (lost) and it offers no GPUs. A daemon that registers with a new instance id (it
restarted) has lost its tasks the same way.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable, Optional

import msgspec

from ..errors import ConflictError, NotFoundError
from ..model import check_name
from ..wire import NodeInfo, NodeRegister, Task, TaskState

__all__ = ["TaskRec", "Node", "NodeBook"]

log = logging.getLogger(__name__)


class TaskRec(msgspec.Struct):
    job: str
    run: int
    node: str
    slots: int
    gpus: list[int] = []
    state: str = "pending"  # pending -> released -> running -> exited
    wanted: bool = True
    code: Optional[int] = None
    detail: str = ""
    lost: bool = False  # the node went away with it
    members: list[str] = []  # a group task: the jobs it runs interleaved (``job`` is the group's id)

    @property
    def owners(self) -> list[str]:
        """The jobs whose processes this task runs."""
        return self.members or [self.job]

    @property
    def alive(self) -> bool:
        """Holds its GPUs: handed to the daemon and not reported gone."""
        return self.state in ("released", "running")


class Node(msgspec.Struct):
    name: str
    index: int
    slots: int
    kind: str = "gpu"
    gpu_type: str = ""
    host: str = ""
    instance: str = ""
    state: str = "up"  # up | down | left
    last_seen: float = 0.0
    tasks: list[TaskRec] = []  # every task placed here that has not exited, in placement order
    cordoned_until: float = 0.0  # > 0: cordoned (nothing new is placed here) until then
    cordon_s: float = 0.0  # the length of its last cordon (a new one soon after its end doubles it) ...
    cordon_end: float = 0.0  # ... and when that one ended (or ends)
    cordon_why: str = ""
    cordon_by: str = ""  # admin | straggler | engine (an engine's cordon is lifted when the engine lifts it)
    maint_start: float = 0.0  # > 0: a planned maintenance window (nodes cordon/drain --at): its start...
    maint_end: float = 0.0  # ... its end ...
    maint_drain: bool = False  # ... whether its jobs are requeued at its start ...
    maint_why: str = ""  # ... and why

    def info(self) -> NodeInfo:
        used = sum(t.slots for t in self.tasks if t.alive or (t.state == "pending" and t.wanted))
        jobs = sorted({j for t in self.tasks if t.wanted for j in t.owners})
        return NodeInfo(self.name, self.index, self.slots, used, self.kind, self.gpu_type, self.host, self.state,
                        self.last_seen, jobs, self.cordoned_until, self.cordon_why, self.maint_start, self.maint_end,
                        self.maint_drain)

    def offers(self) -> int:
        """The GPUs the scheduler may place on: none when not up; while cordoned, only those its
        placed tasks hold (they keep running; nothing new comes, and the node drains as they end)."""
        if self.state != "up":
            return 0
        if self.cordoned_until:
            return min(self.slots, sum(t.slots for t in self.tasks if t.wanted))
        return self.slots


@dataclass(frozen=True)
class Exit:
    """A task of a job ended: its exit code (None when the node was lost with it)."""

    task: TaskRec
    code: Optional[int]
    detail: str
    lost: bool


_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(Node)


class NodeBook:
    """Every node ever registered (by name; indices are stable), and their tasks.

    Args:
        emit: ``emit(kind, job, node, **detail)`` records an event (launch, exit, node up/down).
        task_of: ``task_of(job, run, node)`` -> the :class:`~elastictrain.wire.Task` to hand out.
    """

    def __init__(self, rows: list[tuple[str, bytes]], emit: Callable[..., None], node_timeout: float,
                 task_of: Callable[[TaskRec], Task]) -> None:
        self.nodes: dict[str, Node] = {}
        self.by_index: list[Node] = []
        for _, raw in rows:
            n = _DEC.decode(raw)
            self.nodes[n.name] = n
        self.by_index = sorted(self.nodes.values(), key=lambda n: n.index)
        self._emit, self.timeout, self._task_of = emit, node_timeout, task_of
        self.dirty: set[str] = set()
        self._changed: dict[str, asyncio.Event] = {}

    def encode(self, name: str) -> tuple[int, bytes]:
        n = self.nodes[name]
        return n.index, _ENC.encode(n)

    # ------------------------------------------------------------------ capacity
    def capacities(self) -> tuple:
        return tuple(n.offers() for n in self.by_index)

    def types(self) -> tuple:
        """Each node's GPU type where any node names one (jobs may need a type: ``submit
        --gpu-type``), else empty (one kind, unnamed)."""
        return tuple(n.gpu_type or "gpu" for n in self.by_index) if any(n.gpu_type for n in self.by_index) else ()

    def windows(self) -> tuple:
        """The planned maintenance windows, ``((node index, start, end), ...)``: what backfill plans
        around (policies/backfill.py)."""
        return tuple((n.index, n.maint_start, n.maint_end) for n in self.by_index if n.maint_start)

    def ahead(self, now: float) -> tuple:
        """What a forecast runs on: each node's GPUs (a cordoned node's all of them: its cordon is a
        window), and the windows ``(node, start, end, drain)``: planned maintenance, and the cordons in
        force now, which take nothing new while the node's jobs run on (to ``now`` + 30 days at most)."""
        caps = tuple(n.slots if n.state == "up" else 0 for n in self.by_index)
        out = [(n.index, n.maint_start, n.maint_end, n.maint_drain) for n in self.by_index if n.maint_start]
        for n in self.by_index:
            if n.state == "up" and n.cordoned_until:
                end = min(n.cordoned_until, now + 30 * 86_400.0)
                if n.maint_start and n.maint_start < end:  # (a window planned inside it: the cordon runs to it)
                    end = n.maint_start
                if end > now:
                    out.append((n.index, now, end, False))
        return caps, tuple(out)

    def plan_maintenance(self, n: Node, start: float, end: float, drain: bool, why: str) -> None:
        """From ``start`` to ``end`` node ``n`` is cordoned (``drain``: and its jobs requeued), replacing
        any window planned before (:meth:`due_maintenance` says when it begins)."""
        n.maint_start, n.maint_end, n.maint_drain, n.maint_why = start, end, drain, why[:500]
        self._emit("node_maintenance_planned", "", n.name, start=round(start, 3), end=round(end, 3), drain=drain,
                   why=n.maint_why)
        self.dirty.add(n.name)

    def cancel_maintenance(self, n: Node, why: str) -> None:
        if n.maint_start:
            self._unplan(n)
            self._emit("node_maintenance_cancelled", "", n.name, why=why)

    def _unplan(self, n: Node) -> None:
        n.maint_start, n.maint_end, n.maint_drain, n.maint_why = 0.0, 0.0, False, ""
        self.dirty.add(n.name)

    def due_maintenance(self, now: float) -> list[tuple]:
        """The planned maintenance windows that begin by ``now``, as (node, end, drain, why), no longer
        planned: the caller cordons (drains) each node until its end."""
        out = []
        for n in self.by_index:
            if n.maint_start and now >= n.maint_start:
                out.append((n, n.maint_end, n.maint_drain, n.maint_why))
                self._unplan(n)
        return out

    def next_maintenance(self) -> Optional[float]:
        """When the next planned maintenance begins (the loop wakes then), or None."""
        return min((n.maint_start for n in self.by_index if n.maint_start), default=None)

    def name_of(self, index: int) -> str:
        return self.by_index[index].name

    # ------------------------------------------------------------------ daemons
    def register(self, name: str, req: NodeRegister, now: float) -> tuple[Node, list[Exit]]:
        """A daemon (re)registers. A new instance of a known node has lost its old tasks."""
        check_name("node", name)
        if req.kind not in ("gpu", "slot"):
            raise ConflictError(f"node {name}: kind must be gpu or slot, got {req.kind!r}")
        n = self.nodes.get(name)
        exits: list[Exit] = []
        if n is None:
            n = Node(name, len(self.by_index), req.slots, state="new")
            self.nodes[name] = n
            self.by_index.append(n)
        elif n.instance == req.instance:
            if n.slots != req.slots and any(t.alive for t in n.tasks):
                raise ConflictError(f"node {name} has tasks running on {n.slots} slots; it cannot register with "
                                    f"{req.slots} until they end")
        else:  # a new daemon: whatever the old one ran is gone
            exits = self._lose(n, "the node daemon restarted")
        n.slots, n.kind, n.gpu_type, n.host, n.instance = req.slots, req.kind, req.gpu_type, req.host, req.instance
        was = n.state
        n.state, n.last_seen = "up", now
        if was != "up" or exits:
            self._emit("node_up", "", name, slots=n.slots, slot_kind=n.kind, gpu_type=n.gpu_type, host=n.host)
        self.dirty.add(name)
        return n, exits

    def get(self, name: str, instance: str) -> Optional[Node]:
        """The node if ``instance`` is its current daemon (None: it must register again)."""
        n = self.nodes.get(name)
        if n is None or n.instance != instance or n.state != "up":
            return None
        return n

    def report(self, n: Node, states: list[TaskState], now: float) -> list[Exit]:
        """A poll: the daemon's view of its tasks. Returns the tasks that ended."""
        n.last_seen = now
        by_key = {(t.job, t.run): t for t in n.tasks}
        exits = []
        for st in states:
            t = by_key.get((st.job, st.run))
            if t is None:
                continue  # a task this coordinator never placed (or already counted as exited): not wanted
            if st.state == "running" and t.state == "released":
                t.state = "running"
                self.dirty.add(n.name)
            elif st.state == "exited" and t.state != "exited":
                exits.append(self._exited(n, t, st.code, st.detail, lost=False))
        return exits

    def leave(self, n: Node) -> list[Exit]:
        n.state = "left"
        self._emit("node_left", "", n.name)
        self.dirty.add(n.name)
        return self._lose(n, "the node left the cluster")

    # ------------------------------------------------------------------ cordons
    def cordon(self, n: Node, seconds: float, now: float, why: str, double: bool = False, by: str = "admin") -> float:
        """Place nothing new on ``n`` for ``seconds`` (what runs there keeps running). ``double``:
        a node cordoned again within an hour of its last cordon's end gets twice that cordon's
        length (up to an hour), as horovodrun's blacklist does. Returns the length applied."""
        if double and n.cordon_s and now - n.cordon_end < 3600.0:
            seconds = max(seconds, min(3600.0, 2 * n.cordon_s))
        n.cordoned_until = n.cordon_end = max(n.cordoned_until, now + seconds)
        n.cordon_s, n.cordon_why, n.cordon_by = seconds, why[:500], by
        self._emit("node_cordoned", "", n.name, seconds=round(seconds, 3), why=n.cordon_why, by=by)
        log.warning("node %s cordoned for %.0f s: %s", n.name, seconds, why)
        self.dirty.add(n.name)
        return seconds

    def uncordon(self, n: Node, now: float, why: str) -> None:
        if n.cordoned_until:
            n.cordon_end = min(n.cordon_end, now)
            n.cordoned_until, n.cordon_why, n.cordon_by = 0.0, "", ""
            self._emit("node_uncordoned", "", n.name, why=why)
            self.dirty.add(n.name)

    def expire(self, now: float) -> list[Exit]:
        """Nodes silent for longer than the timeout go down, with their tasks; cordons that are
        over are lifted."""
        exits = []
        for n in self.by_index:
            if n.cordoned_until and now >= n.cordoned_until:
                self.uncordon(n, now, "its cordon is over")
            if n.state == "up" and now - n.last_seen > self.timeout:
                n.state = "down"
                self._emit("node_down", "", n.name, silent_for=round(now - n.last_seen, 3))
                log.warning("node %s lost: no poll for %.1f s", n.name, now - n.last_seen)
                self.dirty.add(n.name)
                exits += self._lose(n, f"node {n.name} was lost (no heartbeat for {self.timeout:g} s)")
        return exits

    def _lose(self, n: Node, why: str) -> list[Exit]:
        return [self._exited(n, t, None, why, lost=True) for t in list(n.tasks) if t.state != "exited"]

    def _exited(self, n: Node, t: TaskRec, code: Optional[int], detail: str, lost: bool) -> Exit:
        held = t.alive
        t.state, t.code, t.detail, t.lost = "exited", code, detail[-4000:], lost
        n.tasks.remove(t)
        if held:
            self._emit("exit", t.job, n.name, run=t.run, slots=t.slots, code=code, lost=lost)
        self.dirty.add(n.name)
        self.notify(n.name)
        return Exit(t, code, detail, lost)

    # ------------------------------------------------------------------ placing tasks
    def add(self, t: TaskRec) -> None:
        n = self.nodes[t.node]
        n.tasks.append(t)
        self.dirty.add(n.name)

    def unwant(self, job: str, run: Optional[int] = None) -> list[TaskRec]:
        """The job's tasks (of ``run``, or all) must stop. Returns those still to exit; pending
        ones that never started are dropped at once."""
        left = []
        for n in self.by_index:
            for t in list(n.tasks):
                if t.job == job and (run is None or t.run == run) and t.wanted:
                    t.wanted = False
                    self.dirty.add(n.name)
                    self.notify(n.name)
                    if t.state == "pending":
                        t.state = "exited"
                        n.tasks.remove(t)
                    else:
                        left.append(t)
        return left

    def release(self) -> list[TaskRec]:
        """Hand pending tasks to their daemons where their GPUs are free, and only once every
        task of the job's previous runs has exited (two runs of a job never overlap: the old
        one's workers must finish their checkpoint first; a group task counts as a run of each
        of its members). Returns the tasks released."""
        out = []
        alive_runs: dict = {}
        for n in self.by_index:
            for t in n.tasks:
                if t.alive:
                    for j in t.owners:
                        alive_runs.setdefault(j, set()).add((t.job, t.run))
        for n in self.by_index:
            if n.state != "up":
                continue
            busy = {g for t in n.tasks if t.alive for g in t.gpus}
            free = [g for g in range(n.slots) if g not in busy]
            for t in n.tasks:
                if t.state != "pending" or not t.wanted:
                    continue
                if any(alive_runs.get(j, set()) - {(t.job, t.run)} for j in t.owners):
                    continue  # a previous run of the job (or of a member) is still stopping
                if len(free) < t.slots:
                    break  # keep placement order: the first waiting task gets the next free GPUs
                t.gpus, free = free[:t.slots], free[t.slots:]
                t.state = "released"
                self._emit("launch", t.job, n.name, run=t.run, slots=t.slots, gpus=t.gpus)
                out.append(t)
                self.dirty.add(n.name)
                self.notify(n.name)
        return out

    def run_alive(self, job: str, run: int) -> bool:
        """Whether a task of run ``run`` of ``job`` (a task's job id) is placed, running or exiting."""
        return any(t.job == job and t.run == run and t.state != "exited" for n in self.by_index for t in n.tasks)

    def wanted(self, n: Node) -> list[Task]:
        return [self._task_of(t) for t in n.tasks if t.wanted and t.alive]

    # ------------------------------------------------------------------ long polls
    def notify(self, name: str) -> None:
        ev = self._changed.get(name)
        if ev is not None:
            ev.set()

    async def wait(self, name: str, seconds: float) -> None:
        ev = self._changed.setdefault(name, asyncio.Event())
        ev.clear()
        try:
            await asyncio.wait_for(ev.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    def require(self, name: str) -> Node:
        n = self.nodes.get(name)
        if n is None:
            raise NotFoundError(f"node {name!r} is not registered; start `elastictrain node --name {name}`")
        return n
