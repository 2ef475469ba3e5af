"""An in-process engine adapter, connected to the live scheduler through the node protocol.

The bridge does for an engine's nodes what a node daemon does for its one node: it registers
them (a node the engine says is down leaves, with its tasks: they are requeued; one its
administrator drained or cordoned is cordoned here: its tasks go on, nothing new is placed), polls
the scheduler for the tasks placed on them, and reports their states and output. What is
engine-neutral lives here, once: the tasks of one run (one per node) become one engine *run*,
launched once every task of the run is released; a run no longer wanted is withdrawn (SIGTERM:
its workers checkpoint and exit 75) and killed after its grace period; what the engine reports
becomes the task exits the live backend already understands. The engine's own events map to the
same exits: a run the engine requeued by itself (its own preemption, an admin's requeue) is
killed there and requeued here from its checkpoint (never two copies at once); a run cancelled
outside the coordinator cancels its job; a run whose node failed is requeued.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Optional

from ..errors import ElasticTrainError
from ..wire import LogChunk, NodeLeave, NodePoll, NodeRegister, Task, TaskState
from .api import ACTIVE, ENDED, REQUEUED, EngineAdapter, RunLaunch, RunState, warn_if_no_gpus

__all__ = ["EngineBridge"]

log = logging.getLogger(__name__)

KILL_AFTER = 15.0  # seconds past a run's grace before it is killed (as the node daemons do)
_PREEMPTED = 75
_LOG_CHUNK = 256 * 1024


@dataclass
class _Run:
    handle: str
    nodes: list
    grace: float = 30.0
    stop_at: Optional[float] = None
    killed: bool = False
    result: Optional[tuple] = None  # (code, detail): ended, to be reported
    out_pos: int = 0


class EngineBridge:
    """Drive ``adapter`` for ``sched`` (a :class:`~elastictrain.coordinator.scheduler.ClusterScheduler`).

    ``instance``: the node instance the bridge registers under; it is stable, so that after a
    coordinator restart the nodes keep their tasks and the runs still in the engine are adopted.
    """

    def __init__(self, adapter: EngineAdapter, sched, *, poll_interval: float = 1.0,
                 instance: Optional[str] = None) -> None:
        self.adapter, self.sched, self.poll_interval = adapter, sched, poll_interval
        self.instance = instance or f"{adapter.name}-engine"
        self.runs: dict[tuple[str, int], _Run] = {}
        self.registered: dict[str, int] = {}  # node -> GPUs it is registered with
        self.errors = 0
        self._nodes_at = -1e9  # when the engine's nodes were last read
        self._no_gpus = False  # no node had a GPU at the last look (said once)

    async def run(self) -> None:
        while True:
            try:
                await self.step()
                self.errors = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the engine may be down a while: log, back off, go on
                self.errors += 1
                (log.error if isinstance(exc, ElasticTrainError) else log.exception)(
                    "%s engine step failed (%s); trying again", self.adapter.name, exc)
                await asyncio.sleep(min(30.0, self.poll_interval * 2 ** min(self.errors, 5)))
                continue
            await self._pause()

    async def _pause(self) -> None:
        """Until the next step: a decision that changes a node's tasks wakes the bridge at once;
        while a run is stopping, the engine is asked again every quarter second (its exit is what
        the next run on its GPUs waits for); else every ``poll_interval``."""
        stopping = any(r.stop_at is not None and r.result is None for r in self.runs.values())
        timeout = min(0.25, self.poll_interval) if stopping else self.poll_interval
        waits = [asyncio.ensure_future(self.sched.nodes.wait(n, timeout)) for n in self.registered]
        if not waits:
            await asyncio.sleep(timeout)
            return
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in pending:
            w.cancel()

    # ------------------------------------------------------------------ one step
    async def step(self) -> None:
        if time.monotonic() - self._nodes_at >= self.poll_interval:  # not on every quick step while a run stops
            await self._sync_nodes()
            self._nodes_at = time.monotonic()
        await self._sync_runs()
        wanted = await self._poll_nodes()
        now = time.monotonic()
        for key, tasks in wanted.items():
            if key in self.runs or len(tasks) < next(iter(tasks.values())).nnodes:
                continue  # launched already, or not every node's task is released yet
            order = sorted(tasks, key=lambda n: self.sched.nodes.nodes[n].index)
            rec = self.sched.records.get(key[0])  # (none for an interleaving group's run)
            launch = RunLaunch(key[0], key[1], tuple(order), tuple(tasks[n] for n in order),
                               rec.project if rec is not None else "")
            handle = await self.adapter.launch(launch)
            self.runs[key] = _Run(handle, list(order), grace=launch.tasks[0].grace)
            log.info("job %s run %d launched as %s %s on %s", key[0], key[1], self.adapter.name, handle,
                     ",".join(order))
        for key, r in self.runs.items():
            if key in wanted or r.result is not None:
                continue
            if r.stop_at is None:  # no longer placed: its workers checkpoint and exit 75
                r.stop_at = now
                log.info("job %s run %d: withdrawing %s %s", key[0], key[1], self.adapter.name, r.handle)
                await self.adapter.withdraw(r.handle)
            elif not r.killed and now - r.stop_at > r.grace + KILL_AFTER:
                log.warning("job %s run %d did not stop %.0f s after SIGTERM; killing %s", key[0], key[1],
                            r.grace + KILL_AFTER, r.handle)
                r.killed = True
                await self.adapter.kill(r.handle)

    async def _sync_nodes(self) -> None:
        nodes = await self.adapter.nodes()
        a = self.adapter
        self._no_gpus = warn_if_no_gpus(nodes, a.cpus_per_worker, a.name, a.gpus_from, self._no_gpus)
        for n in nodes:
            book = self.sched.nodes.nodes.get(n.name)
            if n.up and n.gpus > 0:
                if self.registered.get(n.name) != n.gpus or book is None or book.state != "up" or \
                        book.instance != self.instance or book.gpu_type != n.gpu_type:
                    self.sched.node_register(n.name, NodeRegister(n.gpus, self.instance, n.kind, n.gpu_type, n.name))
                    self.registered[n.name] = n.gpus
                # an admin's drain or cordon in the engine: its runs go on, nothing new goes there
                self.sched.engine_cordon(n.name, n.cordoned, f"{self.adapter.name} says the node is "
                                         f"{n.state or 'cordoned'}" if n.cordoned else f"{self.adapter.name} lifted it")
            elif n.name in self.registered or (book is not None and book.state == "up" and
                                               book.instance == self.instance):
                log.warning("%s node %s is %s: leaving, its runs are requeued", self.adapter.name, n.name,
                            n.state or "down")
                self.registered.pop(n.name, None)
                self.sched.node_leave(n.name, NodeLeave(self.instance))
                for key, r in list(self.runs.items()):
                    if n.name in r.nodes:  # its tasks were lost with the node: the run is gone
                        await self.adapter.kill(r.handle)
                        del self.runs[key]

    async def _sync_runs(self) -> None:
        handles = {r.handle: key for key, r in self.runs.items()}
        states = {(s.job, s.run): s for s in await self.adapter.runs(handles)}
        for key, s in states.items():
            if key not in self.runs and s.state == ACTIVE:  # still in the engine: adopted
                log.info("adopting %s %s (job %s run %d) from the engine", self.adapter.name, s.handle, *key)
                self.runs[key] = r = _Run(s.handle, list(s.nodes))
                r.out_pos = self.sched.logs.kept(*key)  # the output shipped before the restart is not shipped again
        for key, r in self.runs.items():
            if r.result is not None:
                continue
            s = states.get(key)
            if s is None:
                r.result = (None, f"{self.adapter.name} no longer knows {r.handle}")
            elif s.state == REQUEUED:
                await self.adapter.kill(s.handle)  # a copy we did not start must not run beside the next run
                r.result = (_PREEMPTED, f"requeued by {self.adapter.name} itself ({s.detail}); resumes from its "
                                        "checkpoint as a new run")
            elif s.state == ENDED:
                if s.cancelled and r.stop_at is None:
                    self._cancelled_outside(key, s)
                code = _PREEMPTED if s.lost else s.code
                r.result = (code, s.detail)

    def _cancelled_outside(self, key: tuple, s: RunState) -> None:
        job = key[0]
        rec = self.sched.records.get(job)
        if rec is None or rec.run != key[1] or rec.status in ("finished", "failed", "cancelled"):
            return
        log.warning("job %s: %s %s was cancelled outside the coordinator; cancelling the job", job,
                    self.adapter.name, s.handle)
        try:
            self.sched.cancel(job)
        except ElasticTrainError as exc:
            log.error("could not cancel job %s: %s", job, exc)

    async def _poll_nodes(self) -> dict[tuple, dict[str, Task]]:
        wanted: dict[tuple, dict[str, Task]] = {}
        reported: set = set()
        shipped: set = set()
        for name in list(self.registered):
            states, logs = [], []
            for key, r in self.runs.items():
                if name not in r.nodes:
                    continue
                if r.result is None:
                    states.append(TaskState(key[0], key[1], "running"))
                else:
                    code, detail = r.result
                    states.append(TaskState(key[0], key[1], "exited",
                                            None if code is None else max(-255, min(255, code)), detail[-60000:]))
                    reported.add(key)
                if key not in shipped:
                    shipped.add(key)
                    chunk = self._output(key, r)
                    if chunk:
                        logs.append(LogChunk(key[0], key[1], chunk))
            reply = await self.sched.node_poll(name, NodePoll(self.instance, states, logs[:64], 0.0))
            if reply.action == "register":
                self.registered.pop(name, None)
                continue
            for t in reply.tasks:
                wanted.setdefault((t.job, t.run), {})[name] = t
        for key in reported:
            self.runs.pop(key, None)
        return wanted

    def _output(self, key: tuple, r: _Run) -> bytes:
        path = self.adapter.output(r.handle)
        if not path:
            return b""
        try:
            with open(path, "rb") as f:
                f.seek(r.out_pos)
                data = f.read(_LOG_CHUNK)
        except OSError:
            return b""
        r.out_pos += len(data)
        return data
