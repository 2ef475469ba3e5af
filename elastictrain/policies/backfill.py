"""Backfill, as Slurm's ``sched/backfill``: FIFO that lets short jobs past a blocked one.

Jobs start in queue order (arrival order; priorities are the tiers' of :mod:`.tiers`) while they
fit, and a running job is never preempted. The first job that does not fit gets a *reservation*:
the earliest time its gang fits as the running jobs' estimated ends free GPUs, and the GPUs it
would take then. A job behind it starts now only where it leaves that reservation whole: it ends
before the reservation begins, or it fits on GPUs the reservation does not need. With
``reservations=N`` the first N jobs that do not fit get one each, every one planned around those
before it: 1 is EASY backfill (the classic), more is what Slurm does (it reserves for each of the
first ``bf_max_job_test`` jobs it tests; conservative backfill when every job gets one).

An elastic job (``--gpus MIN:MAX``) starts at the most workers that fit now, down to its least
(Slurm's ``--nodes=MIN-MAX``; its estimate scaled up, linearly, to fewer workers than it asked
for, and not shortened by more: a reservation must hold however well it scales), and is reserved
at its least.
With ``grow`` (``--grow``; off by default, as in Slurm), GPUs the queue leaves idle then *grow*
the running elastic jobs, the earliest started first: to the most workers whose GPUs stay free
until the job would end at the size it has (and a restart), so no reservation moves however well
it scales (more workers are taken never to make it slower; how much faster is an estimate, linear
in the workers). A resize restarts the job, so it grows only where that estimate ends it sooner by
at least a tenth of its time left (``GROW_GAIN``), its restart cost counted; one still in its
start-up waits for its first step; one whose work left is not known (live: no
``--steps``/``--epochs``, :attr:`.JobView.work_known`) does not grow, as more workers would not be
known to end it sooner. It never shrinks (nothing is preempted under backfill); a job that arrives
later waits for its end, which growing brought forward. It pays for jobs that scale well; for
jobs that do not, the GPUs they take from later arrivals cost about what they gain (docs/cluster.md
gives the figures), and ``autoscale``, which measures, is the policy to use.

A node's planned maintenance (``nodes drain NAME --at TIME --for SECONDS``: Slurm's ``flags=maint``
reservation) is planned around the same way: nothing starts there that would still run then.

Estimates are the jobs' remaining time (:attr:`.JobView.remaining_time`: on a live cluster what is
left of ``--steps``/``--epochs`` at the measured step time, else the rest of ``--time``; a trace's
durations in the simulator) plus a start's restart cost, at the job's speed on the GPU type it runs on
(:attr:`.JobView.speeds`, on a heterogeneous cluster: a gang spanning types at its slowest one's); a
waiting job's gang must fit for as long as the slowest type it may get would take, and holds its GPUs
for as long as the type it gets takes. Reservations are planned afresh at every
decision, as Slurm's backfill cycle does: a job that runs past its estimate pushes them later, one
that ends early brings them forward. With exact estimates (the simulator) the job at the head of
the queue starts no later than the reservation it got there (a test holds it).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Optional

from ..errors import ConfigError
from .api import ClusterSnapshot, Decision, register
from .placement import Placer

__all__ = ["Backfill"]

_SOON = 1.0  # seconds: when a running job past its estimate is taken to end
GROW_GAIN = 0.1  # a running elastic job grows only where it ends sooner by this fraction of its time left


def _speed(j, where, types: tuple) -> float:
    """``j``'s speed on placement ``where`` (its slowest GPU type's; ``where`` None: the slowest of
    every type), relative to its ``iteration_time``; 1.0 on a cluster of one type."""
    if not j.speeds or not types:
        return 1.0
    kinds = set(types) if where is None else {types[n] for n, _ in where if 0 <= n < len(types)}
    s = min((j.speeds.get(t, 1.0) for t in kinds), default=1.0)
    return s if s > 0 else 1.0


def _need(j, size: int, where, types: tuple, hoped: bool = False) -> float:
    """Seconds ``j`` holds ``size`` GPUs from its start: its remaining time at its size now, on fewer
    workers scaled up as if linearly (data parallel; a job that scales less loses less), on more not
    shortened (how well it scales is not known, and a reservation must hold: more workers are taken
    never to make it slower); ``hoped``: on more, shortened linearly too (what growing is hoped to
    gain); at its speed on ``where`` (None: the slowest GPU type), plus its restart cost."""
    t = j.remaining_time if size == j.num_gpu or (size > j.num_gpu and not hoped) else \
        j.remaining_time * j.num_gpu / size
    if types and j.speeds:
        t = t / _speed(j, where, types)
    return t + j.restart_cost


def _room(free: list) -> int:
    """The GPUs free in all (a node whose running jobs hold more than it offers now, one cordoned
    or lost, counts none: not less than none)."""
    return sum(f for f in free if f > 0)


class _Timeline:
    """Free GPUs per node from now on: ``free[i]`` holds from ``times[i]`` until ``times[i + 1]``
    (the last one for ever)."""

    def __init__(self, now: float, free: list, ends: list) -> None:
        self.times, self.free = [now], [free]
        for t, where in sorted(ends, key=lambda e: e[0]):
            if t > self.times[-1]:
                self.times.append(t)
                self.free.append(list(self.free[-1]))
            step = self.free[-1]
            for n, g in where:
                step[n] += g
        self._prefix: list = [None] * len(self.times)  # k -> (least free over steps 0..k-1, its sum, its max)

    def _cut(self, t: float) -> int:
        """The index of the step that starts at ``t`` (split from the one it falls in)."""
        i = bisect_right(self.times, t) - 1
        if self.times[i] != t:
            i += 1
            self.times.insert(i, t)
            self.free.insert(i, list(self.free[i - 1]))
        return i

    def take(self, where: tuple, start: float, end: float, sign: int = 1) -> None:
        """``where``'s GPUs are held from ``start`` to ``end`` (``sign`` -1: given back then)."""
        i, k = self._cut(start), self._cut(end)
        for step in self.free[i:k]:
            for n, g in where:
                step[n] -= sign * g
        self._prefix = [None] * len(self.times)

    def least(self, i: int, end: float) -> list:
        """Per node, the fewest free GPUs from ``times[i]`` until ``end``."""
        out = list(self.free[i])
        for k in range(i + 1, bisect_left(self.times, end, i + 1)):
            out = [a if a < b else b for a, b in zip(out, self.free[k])]
        return out

    def from_now(self, end: float) -> tuple:
        """:meth:`least` from now (step 0) until ``end``, with its sum and maximum (cached: every
        job of a long queue asks, and the timeline changes only when one starts)."""
        k = max(1, bisect_left(self.times, end))
        got = self._prefix[k - 1]
        if got is None:
            j = k - 1
            while j > 0 and self._prefix[j - 1] is None:
                j -= 1
            out = list(self.free[0]) if j == 0 else list(self._prefix[j - 1][0])
            for m in range(j, k):
                if m:
                    out = [a if a < b else b for a, b in zip(out, self.free[m])]
                self._prefix[m] = (list(out), _room(out), max(out, default=0))
            got = self._prefix[k - 1]
        return got


class Backfill:
    """See the module docstring.

    Args:
        reservations: how many jobs that do not fit get a reservation (1: EASY backfill).
        placement, packlimit: where a gang goes (:mod:`.placement`; not ``count``: a reservation
            is of GPUs on nodes).
    """

    #: the running jobs' remaining time, and the waiting jobs' (the live loop says what it assumes)
    needs = frozenset({"duration"})
    #: a run's first step changes nothing a decision reads (its end estimate is the same from its
    #: ready time as from its first step), so the simulator need not decide again then
    first_step_events = False

    def __init__(self, reservations: int = 1, placement: str = "consolidated", packlimit: float = 0.5,
                 grow: bool = False) -> None:
        if isinstance(reservations, bool) or not isinstance(reservations, int) or not 1 <= reservations <= 1000:
            raise ConfigError(f"reservations must be a whole number from 1 to 1000, not {reservations!r}")
        if placement == "count":
            raise ConfigError("backfill reserves GPUs on nodes: use --placement consolidated, spread or skew, not count")
        if not isinstance(grow, bool):
            raise ConfigError(f"grow must be true or false, not {grow!r}")
        self.reservations, self.placement, self.packlimit = reservations, placement, packlimit
        self.grow = grow
        self.name = "backfill"
        #: the last decision's reservations, in queue order: (job key, start, placement)
        self.reserved: list[tuple] = []
        self._free_now = 0  # GPUs left free by that decision

    @property
    def first_step_events_elastic(self) -> bool:
        """With ``grow``, a running elastic job grows once its first step is done: with elastic jobs,
        a first step is an event to decide at (sim/engine.py)."""
        return self.grow

    def decide(self, s: ClusterSnapshot) -> Decision:
        now, caps, types = s.now, s.gpus_per_node, s.node_types
        free = list(caps)
        run: dict = {}
        ends = []
        for j in s.running:  # running jobs keep their GPUs until their estimated ends
            run[j.job_id] = j.placement
            for n, g in j.placement:
                free[n] -= g
            begins = j.ready_at if j.starting and j.ready_at is not None and j.ready_at > now else now
            left = j.remaining_time / _speed(j, j.placement, types) if types else j.remaining_time
            ends.append((max(begins + left, now + _SOON), j.placement))
        grown = [(j, end) for j, (end, _) in zip(s.running, ends)
                 if j.elastic and not j.starting and j.work_known and j.num_gpu < (j.max_gpu or j.num_gpu)] \
            if self.grow else ()
        line = _Timeline(now, free, ends)
        for n, start, end in s.windows:  # planned maintenance: the node offers nothing then
            if end > now and 0 <= n < len(caps) and caps[n] > 0:
                line.take(((n, caps[n]),), max(start, now), end)
        placer = Placer(caps, s.nodes_per_switch, self.placement, self.packlimit, node_types=s.node_types)
        reserved: list[tuple] = []
        notes = []
        _, free_now, top_now = line.from_now(now)  # (free now bounds every window from now)
        small = self.placement == "consolidated" and not s.node_types  # a gang of one node's GPUs takes one node
        per_node = placer.per_node
        workers: dict = {}
        for j in self._queue(s):
            # an elastic job (--gpus MIN:MAX) starts at the most workers that fit now, down to its
            # least, as Slurm's --nodes=MIN-MAX does; it is reserved at its least
            sizes = range(j.max_gpu or j.num_gpu, (j.min_gpu or j.num_gpu) - 1, -1) if j.elastic else (j.num_gpu,)
            where = None
            for size in sizes:
                if size > free_now or (small and size <= per_node and size > top_now):
                    continue
                need = _need(j, size, None, types)  # (on a slow GPU type it must fit as long as it would take)
                least, total, top = line.from_now(now + need)
                where = placer.reset(least, total, top).place(size, j.skew, (), j.gpu_type) if size <= total else None
                if where is not None:
                    break
            if where is None and len(reserved) >= self.reservations:
                if top_now <= 0:
                    break  # no GPU is free now, and no reservation is left to give: nothing else starts
                continue
            if where is not None:
                run[j.job_id] = where
                if size != j.num_gpu:
                    workers[j.job_id] = size
                if types and j.speeds:  # (it holds the GPUs for as long as the type it got takes)
                    need = _need(j, size, where, types)
                line.take(where, now, now + need)
                _, free_now, top_now = line.from_now(now)
                if reserved:
                    notes.append((j.job_id, {"decision": "backfill", "why": (
                        f"started ahead of job {reserved[0][0]}, whose reservation is in about "
                        f"{reserved[0][1] - now:.0f} s: it ends before then or uses GPUs that reservation does not "
                        "need")}))
                continue
            size = sizes[-1]
            need = _need(j, size, None, types)
            got = self._reserve(line, placer, j, need, size)
            if got is not None:
                if types and j.speeds:
                    need = _need(j, size, got[1], types)
                line.take(got[1], got[0], got[0] + need)
                reserved.append((j.job_id, *got))
        if grown and free_now > 0:
            self._grow(now, types, line, placer, grown, run, workers, notes)
            free_now = line.from_now(now)[1]
        self.reserved, self._free_now = reserved, free_now
        return Decision(run, notes=tuple(notes), workers=workers)

    @staticmethod
    def _grow(now: float, types: tuple, line: _Timeline, placer: Placer, jobs: list, run: dict, workers: dict,
              notes: list) -> None:
        """Grow the running elastic ``jobs`` ((view, estimated end), in the order they run) onto the GPUs
        left free (see the module docstring)."""
        for j, end in jobs:
            free_now = line.from_now(now)[1]
            if free_now <= 0:
                return
            was, left = j.placement, end - now
            # its GPUs at the new size are held until it ends at the old one (and a restart): how much
            # faster more workers make it is an estimate (linear), but they never make it slower
            hold = end + j.restart_cost
            line.take(was, now, end, -1)  # (its own GPUs are its to keep at a new size)
            least, total, top = line.from_now(hold)
            home = was[0][0] if len(was) == 1 and not j.gpu_type else -1  # (its node, if it runs on one)
            got = None
            for size in range(min(j.max_gpu, total), j.num_gpu, -1):
                need = _need(j, size, None, types, hoped=True)
                if need > left * (1.0 - GROW_GAIN):
                    break  # (fewer workers take longer still)
                if home >= 0 and least[home] >= size:
                    where = ((home, size),)  # (where it runs, if its node has room)
                else:
                    where = placer.reset(least, total, top).place(size, j.skew, (), j.gpu_type)
                if where is not None:
                    got = size, where, need
                    break
            if got is None:
                line.take(was, now, end)
                continue
            size, where, need = got
            if types and j.speeds:
                need = _need(j, size, where, types, hoped=True)
            line.take(where, now, hold)
            run[j.job_id], workers[j.job_id] = where, size
            notes.append((j.job_id, {"decision": "grow", "why": (
                f"grown from {j.num_gpu} to {size} workers on GPUs idle until it would end at {j.num_gpu}: it "
                f"should end in about {need:.0f} s instead of {left:.0f} s (its restart counted), and no "
                "reservation moves")}))

    def _queue(self, s: ClusterSnapshot):
        """The waiting jobs, in the order they start and get reservations: submission order."""
        return (j for j in s.jobs if not j.running)

    @staticmethod
    def _reserve(line: _Timeline, placer: Placer, j, need: float, size: int) -> Optional[tuple]:
        """The earliest (start, placement) at which ``j`` fits on ``size`` GPUs for ``need`` seconds:
        a start falls where GPUs free up (a fit between two such times fits at the earlier one too)."""
        free = line.free
        for i, start in enumerate(line.times):
            if not i or _room(free[i]) < size:
                continue  # (now: it did not fit; or too few GPUs free at the window's start alone)
            least = line.least(i, start + need)
            total = _room(least)
            if total >= size:
                where = placer.reset(least, total, max(least)).place(size, j.skew, (), j.gpu_type)
                if where is not None:
                    return start, where
        return None

    # ------------------------------------------------------------------ what status says
    def annotate(self, key) -> dict:
        for jid, start, where in self.reserved:
            if jid == key:
                return {"reservation": f"{sum(g for _, g in where)} GPUs (backfill)"}
        return {}

    def waiting_reason(self, key, now: float) -> Optional[str]:
        """Why ``key`` waits, in the terms of the last decision (None: not known here)."""
        if not self.reserved:
            return None
        head, at, _ = self.reserved[0]
        for jid, start, where in self.reserved:
            if jid == key:
                return (f"reserved (backfill): it starts in about {max(start - now, 0.0):.0f} s, when the running jobs' "
                        f"estimated ends free {sum(g for _, g in where)} GPUs for it; the jobs behind it start first "
                        "only where they end before then or use other GPUs")
        return (f"behind job {head}'s reservation (backfill; it starts in about {max(at - now, 0.0):.0f} s): "
                f"{self._free_now} GPUs are free, and it starts now only where it ends before that reservation "
                "or fits on GPUs it does not need (its estimate: the rest of its --steps/--epochs, or of --time)")


register("backfill", lambda **kw: Backfill(**kw), ("reservations", "placement", "packlimit", "grow"))
