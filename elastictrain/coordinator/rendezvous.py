"""Rendezvous of ``etrun`` agents into generations, and the job's life cycle.

Agents *join* a round, then *poll*. A round closes when ``max_nodes`` agents have joined,
or when every live agent has joined, at least ``min_nodes`` are present and the round has
been open for ``last_call`` seconds (a chance for agents starting together to make one
generation rather than two): the coordinator opens the next
generation (see :class:`Membership`), assigns node ranks (agents keep their previous order,
new agents go last) and hands every agent its :class:`Assignment`, with a fresh
``MASTER_PORT`` picked by the node-rank-0 agent, so no worker ever talks to a stale store.

While a generation runs, polls are heartbeats. The coordinator asks every agent to
*restart* (stop its workers and join again) when a worker failed (reason ``failure``,
counted against ``max_restarts``), an agent was lost (``scale_down``) or a new agent waits
to join (``scale_up``); the last two are not counted as restarts.

Rounds are durable: every change of a job's round (a join, a formed generation, a report, a
lost agent) is written to the store before the reply, and a restarted coordinator loads them
with every agent's clock reset, so agents that keep polling through an outage keep running
their generation (polls themselves, being heartbeats, are not written).

In cluster mode the scheduler starts each placement of a job as a new *run*
(:meth:`expect`): agents say which run they were started for, and an agent of an older run is
told to exit, so a stopped placement can never join its successor's round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from sys import intern
from typing import Optional

import msgspec

from ..clock import Clock
from ..errors import ConfigError
from ..wire import AgentAction, AgentJoin, AgentPoll, AgentReport, Assignment
from .membership import Membership
from .store import Store

__all__ = ["Rendezvous"]

log = logging.getLogger(__name__)


@dataclass
class _Agent:
    join: AgentJoin
    last_seen: float
    waiting: bool = True  # joined the next round
    done: bool = False


@dataclass
class _JobRdzv:
    min_nodes: int
    max_nodes: int
    max_restarts: int
    agents: dict[str, _Agent] = field(default_factory=dict)
    members: list[str] = field(default_factory=list)  # node-rank order of the current generation
    assignment: dict[str, Assignment] = field(default_factory=dict)
    restart_reason: Optional[str] = None  # set while the running generation must restart
    restarts: int = 0
    status: str = "running"  # running | succeeded | failed
    detail: str = ""
    prev_world: int = 0
    round_started: Optional[float] = None  # when the first agent joined the open round
    run: int = 0  # cluster mode: the scheduler's run this round belongs to
    accumulate: int = 1  # gradient accumulation of the job's generations (the OOM plan raises it)
    excluded: dict = field(default_factory=dict)  # agent -> until when it may not join (a straggler's node)
    cooldowns: dict = field(default_factory=dict)  # agent -> its last cooldown (each exclusion doubles it)
    ended: bool = False  # cluster mode: the job ended; a tombstone that refuses every later join (as stored)


@dataclass
class _Expect:
    """What the scheduler announced for a job's next round (cluster mode)."""

    run: int
    reason: str
    restarts: int


_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(_JobRdzv)
_TOMBSTONE = "job {} already {}; a stale run starts no new generation"


def _tombstone(job: str, why: str) -> str:
    """What an agent of an ended job is told (and the stored tombstone's detail)."""
    return _TOMBSTONE.format(job, why)


def _why(detail: str) -> str:
    """The ``why`` of a stored tombstone's detail (it says "ended" where it is not of this form)."""
    head, _, rest = detail.partition(" already ")
    why, sep, _ = rest.partition("; a stale run")
    return intern(why) if head.startswith("job ") and sep and why else "ended"


class Rendezvous:
    def __init__(self, membership: Membership, clock: Clock, store: Optional[Store] = None,
                 rows: Optional[list[tuple[str, bytes]]] = None) -> None:
        self._m = membership
        self._clock = clock
        self._store = store
        self._jobs: dict[str, _JobRdzv] = {}
        # ended jobs (cluster mode) -> why: a tombstone each, which refuses every later join (kept
        # apart from the rounds, and small: a long history has one per job)
        self._ended: dict[str, str] = {}
        self._expect: dict[str, _Expect] = {}
        self._changed: dict[str, asyncio.Event] = {}  # wakes the long polls of a job
        now = clock.now()
        for job, raw in rows or ():
            try:
                j = _DEC.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error("job %s: its rendezvous record is unreadable (%s); its agents will join again", job, exc)
                continue
            for a in j.agents.values():  # a restarted coordinator gives every agent a fresh timeout
                a.last_seen = now
            if j.ended:
                self._ended[job] = _why(j.detail)
                continue
            if j.round_started is not None:
                j.round_started = now
            self._jobs[job] = j
        # jobs that ran before this coordinator started but whose round is not on disk (a database
        # from before rounds were kept): their next generation says why it formed
        self._restarted = {name for name, row in membership.jobs.items()
                           if row.generation > 0 and name not in self._jobs and name not in self._ended}

    def _save(self, job: str, j: _JobRdzv) -> None:
        if self._store is not None:
            with self._store.transaction() as tx:
                tx.put_rdzv(job, _ENC.encode(j))
        self._notify(job)

    def _notify(self, job: str) -> None:
        ev = self._changed.pop(job, None)
        if ev is not None:
            ev.set()

    async def long_poll(self, job: str, req: AgentPoll) -> AgentAction:
        """:meth:`poll`, but an agent whose generation runs on waits up to ``req.wait`` seconds
        for a change of its job (a failure, a node leaving or joining, the job ending) and learns
        of it in the same moment, rather than at its next poll."""
        action = self.poll(job, req)
        deadline = time.monotonic() + req.wait
        while action.action == "run" and req.generation and time.monotonic() < deadline:
            ev = self._changed.setdefault(job, asyncio.Event())
            try:
                # at least once a second: the poll also notices agents that went silent
                await asyncio.wait_for(ev.wait(), max(0.0, min(1.0, deadline - time.monotonic())))
            except asyncio.TimeoutError:
                pass
            action = self.poll(job, req)  # also refreshes the agent's last_seen
        return action

    # ------------------------------------------------------------------ cluster mode hooks
    def expect(self, job: str, run: int, reason: str, restarts: int) -> None:
        """The scheduler starts run ``run`` of ``job``: its agents form a fresh round whose first
        generation says ``reason`` (e.g. ``preempt``) and starts with ``restarts`` failures used."""
        self._expect[job] = _Expect(run, reason, restarts)
        j = self._jobs.get(job)
        if j is not None and j.run < run and j.status == "running":
            j.status, j.detail = "preempted", "superseded by a new placement"
            self._notify(job)
            self._save(job, j)

    def stop(self, job: str, detail: str) -> None:
        """The scheduler stops the job's current run: agents still polling are told to exit
        (preempted); those the node daemons already stopped report it themselves."""
        j = self._jobs.get(job)
        if j is not None and j.status == "running":
            j.status, j.detail = "preempted", detail
            self._save(job, j)

    def outcome(self, job: str) -> Optional[tuple[str, str, int]]:
        """``(status, detail, restarts used)`` of the job's current round, or None."""
        j = self._jobs.get(job)
        return None if j is None else (j.status, j.detail, j.restarts)

    def generation(self, job: str) -> int:
        """The job's current membership generation (0 before its first)."""
        row = self._m.jobs.get(job)
        return row.generation if row is not None else 0

    def forget(self, job: str, why: str = "ended") -> None:
        """The scheduler's job ended (finished, failed, cancelled): its round is dropped and a
        durable tombstone stays, so that a stale agent (a node frozen while the job ended
        elsewhere) can never open another generation of it."""
        self._jobs.pop(job, None)
        self._ended[job] = why
        self._save(job, _JobRdzv(1, 1, 0, status="preempted", ended=True, detail=_tombstone(job, why)))
        self._expect.pop(job, None)

    def shape(self, job: str) -> Optional[tuple[str, str, int, int, int]]:
        """``(status, detail, min nodes, max nodes, nodes in the generation)``, or None for a job
        no agent joined."""
        j = self._jobs.get(job)
        if j is None:
            return None
        return j.status, j.detail, j.min_nodes, j.max_nodes, len(j.members)

    def others_polling(self, job: str, agent: str, within: float) -> bool:
        """Whether an agent of ``job`` other than ``agent`` was heard from in the last ``within``
        seconds (a hosting agent keeps serving until the others are gone)."""
        j = self._jobs.get(job)
        if j is None:
            return False
        now = self._clock.now()
        return any(name != agent and now - a.last_seen < within for name, a in list(j.agents.items()))

    # ------------------------------------------------------------------ agents
    def join(self, job: str, req: AgentJoin) -> AgentAction:
        if not 1 <= req.nproc <= 65536 or not 1 <= req.min_nodes <= req.max_nodes <= 65536:
            raise ConfigError(f"agent {req.agent}: need 1 <= nproc <= 65536 and 1 <= min_nodes <= max_nodes <= 65536, "
                              f"got nproc={req.nproc}, nodes {req.min_nodes}:{req.max_nodes}")
        if not 0 <= req.max_restarts <= 100_000 or not 0.1 <= req.agent_timeout <= 86_400 or \
                not 0 <= req.last_call <= 3600 or not 0 <= req.port <= 65535 or not -1 <= req.node_rank < 65536:
            raise ConfigError(f"agent {req.agent}: max_restarts must be in [0, 100000], agent_timeout in [0.1, 86400] s, "
                              "last_call in [0, 3600] s, port in [0, 65535] and node_rank in [-1, 65535]")
        why = self._ended.get(job)
        if why is not None:
            log.warning("job %s: agent %s (run %d) tried to join after the job ended; told to exit", job, req.agent,
                        req.run)
            return AgentAction("exit", status="preempted", detail=_tombstone(job, why))
        exp = self._expect.get(job)
        if req.run and exp is not None and req.run < exp.run:
            return AgentAction("exit", status="preempted", detail=f"run {req.run} was superseded by run {exp.run}")
        self._m.create_job(job, min(65536, req.min_nodes * req.nproc), min(65536, req.max_nodes * req.nproc))
        j = self._jobs.get(job)
        if j is None or j.status != "running" or (req.run and req.run > j.run):
            j = self._jobs[job] = _JobRdzv(req.min_nodes, req.max_nodes, req.max_restarts, run=req.run)
            if exp is not None and req.run == exp.run:
                j.restart_reason, j.restarts = exp.reason, exp.restarts
            elif job in self._restarted:
                j.restart_reason = "coordinator_restart"
            self._restarted.discard(job)
        elif (req.min_nodes, req.max_nodes) != (j.min_nodes, j.max_nodes):
            raise ConfigError(f"agent {req.agent} asks for {req.min_nodes}:{req.max_nodes} nodes but job "
                              f"{job!r} runs with {j.min_nodes}:{j.max_nodes}; give every agent the same --nnodes")
        now = self._clock.now()
        a = j.agents.get(req.agent)
        if a is None:
            a = j.agents[req.agent] = _Agent(req, now)
        a.join, a.last_seen, a.waiting, a.done = req, now, True, False
        if req.grow and req.agent in j.members and j.restart_reason is None:
            j.restart_reason = "scale_up"
            log.info("job %s: agent %s asks to grow to %d local workers", job, req.agent, req.nproc)
        elif j.members and req.agent not in j.members and j.restart_reason is None and \
                len(j.members) < j.max_nodes and not self._barred(j, req.agent, now):
            j.restart_reason = "scale_up"
            log.info("job %s: agent %s waits to join; generation restarts to grow", job, req.agent)
        action = self._poll(job, j, req.agent, 0)
        self._save(job, j)
        return action

    def poll(self, job: str, req: AgentPoll) -> AgentAction:
        j = self._jobs.get(job)
        if j is None or req.agent not in j.agents:
            return AgentAction("restart", detail="unknown agent (coordinator restarted?): join again")
        j.agents[req.agent].last_seen = self._clock.now()
        return self._poll(job, j, req.agent, req.generation)

    def report(self, job: str, req: AgentReport) -> AgentAction:
        j = self._jobs.get(job)
        if req.event == "leaving":  # a node drained or reclaimed: the others re-form without it
            return self._leave(job, j, req)
        if j is None or req.agent not in j.agents:
            return AgentAction("restart", detail="unknown agent (coordinator restarted?): join again")
        a = j.agents[req.agent]
        a.last_seen = self._clock.now()
        current = self._m.get(job).generation
        if req.event not in ("failed", "succeeded", "preempted"):
            raise ConfigError(f"event must be failed, succeeded, preempted or leaving, not {req.event!r}")
        if req.generation != current or req.agent not in j.members:
            return self._poll(job, j, req.agent, req.generation)  # a late report of an old generation
        if req.event == "succeeded":
            a.done = True
            if all(j.agents[m].done for m in j.members):
                j.status = "succeeded"
        elif req.event == "preempted":
            j.status, j.detail = "preempted", req.detail
        elif j.restart_reason is None:
            if req.event == "failed" and req.accumulate > j.accumulate:
                log.warning("job %s: out of GPU memory on agent %s: the next generations accumulate %d "
                            "micro-batches per step (was %d)", job, req.agent, req.accumulate, j.accumulate)
                j.accumulate = req.accumulate
            if j.restarts >= j.max_restarts:
                j.status = "failed"
                j.detail = f"worker failure with no restarts left ({j.restarts}/{j.max_restarts}): {req.detail}"
            else:
                j.restarts += 1
                j.restart_reason = "failure"
                log.warning("job %s: agent %s reports a worker failure (%s); restart %d/%d", job, req.agent,
                            req.detail, j.restarts, j.max_restarts)
        action = self._poll(job, j, req.agent, req.generation)
        self._save(job, j)
        return action

    def _leave(self, job: str, j: Optional[_JobRdzv], req: AgentReport) -> AgentAction:
        """An agent leaves on purpose (SIGTERM: a drain, a spot reclaim). Its generation restarts
        smaller (``scale_down``, not counted as a restart); if nobody is left, the job was
        preempted as a whole."""
        if j is None or req.agent not in j.agents:
            return AgentAction("exit", status="left")
        del j.agents[req.agent]
        if j.status == "running" and req.agent in j.members:
            if not any(m in j.agents for m in j.members):
                j.status, j.detail = "preempted", f"every node left ({req.detail})"
            elif j.restart_reason is None:
                j.restart_reason = "scale_down"
                log.info("job %s: agent %s leaves (%s); the others re-form without it", job, req.agent, req.detail)
        self._save(job, j)
        return AgentAction("exit", status="left")

    def _poll(self, job: str, j: _JobRdzv, agent: str, generation: int) -> AgentAction:
        self._expire(job, j)
        if j.status != "running":
            return AgentAction("exit", status=j.status, detail=j.detail)
        a = j.agents[agent]
        current = self._m.get(job).generation
        if not a.waiting:
            # generation 0: the agent was waiting and has not seen its assignment yet
            if agent in j.members and generation in (0, current) and j.restart_reason is None:
                return AgentAction("run", j.assignment[agent])
            return AgentAction("restart", detail=j.restart_reason or "generation changed")
        # a waiting agent: can the round close? (a straggler's node sits out its cooldown)
        now = self._clock.now()
        if self._barred(j, agent, now):
            return AgentAction("wait", detail=f"excluded as a straggler for {j.excluded[agent] - now:.0f} s more")
        live = [x for x in j.agents.values() if not x.done and not self._barred(j, x.join.agent, now)]
        waiting = [x for x in live if x.waiting]
        if j.round_started is None:
            j.round_started = self._clock.now()
        last_call = max(x.join.last_call for x in waiting)
        everyone = len(waiting) == len(live) and len(waiting) >= j.min_nodes
        if len(waiting) >= j.max_nodes or (everyone and self._clock.now() - j.round_started >= last_call):
            self._form(job, j, waiting[:j.max_nodes])
            self._save(job, j)
        if not a.waiting and agent in j.assignment:
            return AgentAction("run", j.assignment[agent])
        return AgentAction("wait", detail=f"{len(waiting)}/{max(j.min_nodes, len(live))} agents ready")

    @staticmethod
    def _barred(j: _JobRdzv, agent: str, now: float) -> bool:
        until = j.excluded.get(agent)
        return until is not None and now < until

    def exclude(self, job: str, agent: str, cooldown: float, why: str) -> str:
        """Take a straggler's node out of the job for ``cooldown`` seconds (doubled at each new
        exclusion of the same node, up to an hour, as horovodrun's blacklist does): the
        generation restarts without it (reason ``straggler``), a spare agent taking its place.
        Refused where the job could not run without it (``--nnodes`` MIN). Returns what was done."""
        j = self._jobs.get(job)
        now = self._clock.now()
        if j is None or j.status != "running" or agent not in j.members:
            return "kept: its node is not in the running generation"
        others = [x for name, x in j.agents.items() if name != agent and not x.done
                  and not self._barred(j, name, now)]
        if len(others) < j.min_nodes:
            return f"kept: without its node the job has {len(others)} node(s), below its minimum of {j.min_nodes}"
        cd = min(3600.0, 2 * j.cooldowns[agent]) if agent in j.cooldowns else cooldown
        j.excluded[agent], j.cooldowns[agent] = now + cd, cd
        if j.restart_reason is None:
            j.restart_reason = "straggler"
        log.warning("job %s: agent %s excluded for %.0f s (%s)", job, agent, cd, why)
        self._save(job, j)
        return f"excluded for {cd:.0f} s"

    def agent_of(self, job: str, rank: int) -> str:
        """The agent whose workers hold global ``rank`` in the current generation ("" if none)."""
        j = self._jobs.get(job)
        if j is None:
            return ""
        for name in j.members:
            a, agent = j.assignment.get(name), j.agents.get(name)
            if a is not None and agent is not None and a.rank_offset <= rank < a.rank_offset + agent.join.nproc:
                return name
        return ""

    def node_of(self, job: str, agent: str) -> str:
        """The cluster node ``agent`` said it runs on (``AgentJoin.node``; "" if none)."""
        j = self._jobs.get(job)
        a = j.agents.get(agent) if j is not None and agent else None
        return a.join.node if a is not None else ""

    def _expire(self, job: str, j: _JobRdzv) -> None:
        now = self._clock.now()
        for name, until in list(j.excluded.items()):
            if now >= until:  # its cooldown is over: it may join again (a waiting one grows the job)
                del j.excluded[name]
                a = j.agents.get(name)
                if a is not None and a.waiting and j.members and name not in j.members and \
                        j.restart_reason is None and len(j.members) < j.max_nodes and j.status == "running":
                    j.restart_reason = "scale_up"
                self._save(job, j)
        for name, a in list(j.agents.items()):
            if not a.done and now - a.last_seen > a.join.agent_timeout:
                log.warning("job %s: agent %s lost (no poll for %.1f s)", job, name, now - a.last_seen)
                del j.agents[name]
                if name in j.members and j.restart_reason is None and j.status == "running":
                    j.restart_reason = "scale_down"
                self._save(job, j)

    def _form(self, job: str, j: _JobRdzv, agents: list[_Agent]) -> None:
        order = {name: i for i, name in enumerate(j.members)}
        fixed = sorted((a for a in agents if a.join.node_rank >= 0), key=lambda a: a.join.node_rank)
        free = sorted((a for a in agents if a.join.node_rank < 0),
                      key=lambda a: (order.get(a.join.agent, len(order)), a.join.agent))
        ranked = fixed + free
        world = sum(a.join.nproc for a in ranked)
        prev_members = set(j.members)
        reason = j.restart_reason or "start"
        if reason == "start" and prev_members:
            reason = "failure"
        cur = self._m.get(job).generation
        row = self._m.open_generation(job, cur, world, reason)
        head = ranked[0].join
        j.members = [a.join.agent for a in ranked]
        j.assignment.clear()
        offset = 0
        workers = [f"{a.join.host}:{p}" for a in ranked for p in a.join.worker_ports] \
            if all(len(a.join.worker_ports) == a.join.nproc for a in ranked) else []
        for node_rank, a in enumerate(ranked):
            j.assignment[a.join.agent] = Assignment(row.generation, node_rank, len(ranked), offset, world,
                                                    head.host, head.port, j.restarts, reason, j.prev_world,
                                                    workers, j.accumulate, head.horovod_port)
            offset += a.join.nproc
            a.waiting = False
        j.prev_world = world
        j.restart_reason = None
        j.round_started = None
        log.info("job %s: generation %d formed with %d agent(s), world size %d (%s)", job, row.generation,
                 len(ranked), world, reason)
