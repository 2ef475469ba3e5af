"""The simulated cluster behind the mechanism core: progress, restart costs, slowdowns, migrations.

It implements :class:`~elastictrain.scheduling.api.Backend` for the discrete-event engine. A
job advances at ``1 / (iteration_time x slowdown)`` iterations per second of work; time it owes
(a restart, a migration) is paid before it does work. Stops are instantaneous: ``stop`` tells
the table at once that the job's workers are gone.

Completion is decided by the event loop, not by comparing accumulated floats: the engine's next
event is the earliest of the arrivals, the policy's wake-up, the round and the jobs' completion
times; when it is a completion, the jobs whose completion time it is finish then. (At a large
simulated time, 8.5e6 s say, representable times are 1.9e-9 s apart, and a job due less than
that ahead would otherwise never finish: no time step could hold its last work.)

Restart cost (``cost``, seconds per (re)start) and ``charge``:

* ``on_start``: paid once after each start or resume, and again when the job's interleaving
  group changes or its size changes (the group restarts);
* ``every_event``: paid by every running job at every event, as the Muri reference simulator
  does (its published tables were produced that way).

With ``on_start``, the restart cost is the run's start-up: the job is *starting*
(``JobTable.starting``) until it has paid it, gains no attained service meanwhile, and is not
preempted (``Scheduler.protect_startup``), as a live job before its first training step.
``every_event`` has no start-up: its jobs never count as starting.

A job's slowdown is the policy's (a Muri group's interleaved iteration over the job's own), or
``spread_slowdown`` for a skew-sensitive job spread over several nodes, divided by its speed on
the slowest GPU type it spans. An elastic job run at another size has its ``iteration_time``
there (``JobSpec.scaling(workers)`` times the trace's: Amdahl's law with its ``serial`` fraction;
linear without one), as a live job's is measured at the size it runs: what policies read of its
remaining time (``JobView.remaining_time``) is at its size now. An elastic job's measured rate
(``JobView.rate``, what autoscaling reads) is its iterations per second (``1 / (iteration_time x
slowdown)``), measured over its run since its first step (:meth:`measure`). ``migration_cost``:
seconds a running job loses when it moves.
"""

from __future__ import annotations

from typing import Callable, Optional

from ..clock import ManualClock
from ..scheduling import Action, ClusterShape, Entry, JobTable
from ..scheduling.api import MIGRATE, RESIZE, START

__all__ = ["SimBackend"]


class SimBackend:
    def __init__(self, shape: ClusterShape, table: JobTable, clock: ManualClock, *, every: bool,
                 spread_slowdown: float = 1.0, skew_sensitive: float = 0.5, migration_cost: float = 0.0,
                 window: Optional[float] = None) -> None:
        self._shape, self.table, self.clock, self.every = shape, table, clock, every
        self.spread_slowdown, self.skew_sensitive = spread_slowdown, skew_sensitive
        self.migration_cost, self.window = migration_cost, window
        self.free_moves = not migration_cost  # a migration keeps the run training (Scheduler.act: moved())
        self.refuses = None  # while nodes are cordoned: the check of a placement (Scheduler.act), as live
        self._cordoned: frozenset = frozenset()
        self.owed: dict = {}  # on_start: restart seconds still to pay
        self.charge: dict = {}  # placed job -> restart seconds it pays (its group's, if grouped)
        self.lost = 0.0  # seconds lost to restarts and migrations
        self.migrations = 0
        self._due: tuple = (float("inf"), [])  # the next completion: its time and the jobs due then
        self.runs: Optional[dict] = None  # a dict: job -> when its current run trains from (the engine's outages)
        self.timeline: dict = {}  # window index -> per-user iterations and GPU-seconds
        # a plain start's slowdown is the policy's alone (no spread slowdown, one GPU type)
        self._plain = spread_slowdown <= 1.0 and not shape.node_types
        table.track_startup = not every  # every_event: no start-up, no job is ever starting

    # ------------------------------------------------------------------ Backend
    def shape(self) -> ClusterShape:
        return self._shape

    def set_capacities(self, gpus_per_node: tuple) -> None:
        """The GPUs each node offers from now on (a node lost offers 0: the engine's outages)."""
        shape = self._shape
        self._shape = ClusterShape(gpus_per_node, shape.nodes_per_switch, shape.node_types, shape.windows)

    def cordon(self, nodes) -> None:
        """From now on ``nodes`` are cordoned: a placement there is refused to a job that holds no
        GPUs there (the live backend's ``refuses``: it waits, or a move becomes a stop)."""
        self._cordoned = frozenset(nodes)
        self.refuses = self._refuses if self._cordoned else None

    def _refuses(self, a: Action) -> str:
        cordoned = self._cordoned
        for n, _ in a.placement:
            if n in cordoned and all(m != n for m, _ in a.previous):
                return f"node {n} is cordoned and takes no new job"
        return ""

    def start(self, e: Entry, a: Action) -> None:
        if self._plain and not a.group and e.num_gpu == e.data["gpus"]:  # _placed's common case, inline:
            self.charge[e.key] = c = e.restart_cost  # the call cost gandiva-ts 4% (a dozen starts a decision)
            e.slowdown = a.slowdown or 1.0
        else:
            self._placed(e, a)
            c = self.charge[e.key]
        if not self.every:
            self._starting(e, c)
        else:  # (trains at once: its rate is measured from now)
            e.data["began"] = self.clock.t
        if self.runs is not None:
            self.runs[e.key] = self.clock.t + (0.0 if self.every else c)

    def resume(self, e: Entry, where: tuple, run_age: float = 0.0) -> None:
        """``e`` arrives running at ``where``, past its start-up, its run begun ``run_age`` seconds ago
        (as it runs elsewhere: a forecast's running job). It is placed and charged as a start
        would be (its slowdown there, its restart cost for a later restart), and trains from now."""
        now = self.clock.t
        self.table.start(e.key, where, (), now)
        self._placed(e, Action(START, e.key, where, (), e.num_gpu))
        self.owed[e.key] = 0.0
        self._trains(e, now)
        e.run_at = now - run_age
        if self.runs is not None:
            self.runs[e.key] = now

    #: stops complete at once: the mechanism core preempts with JobTable.preempt_now (stop and
    #: stopped in one step) and does not call :meth:`stop`
    instant_stop = True

    def stop(self, e: Entry, a: Action) -> None:
        self.table.stopped(e.key, self.clock.now())

    def restart(self, e: Entry, a: Action) -> None:
        if a.kind is RESIZE:
            e.data["resizes"] = e.data.get("resizes", 0) + 1
        self._placed(e, a)
        if a.moved:
            self.migrations += 1
            if not self.every and self.migration_cost:
                self.owed[e.key] = self.owed.get(e.key, 0.0) + self.migration_cost
        if not self.every:  # (a regroup or a resize restarts the group, or the job: its full charge)
            self._starting(e, self.charge[e.key] if a.kind is not MIGRATE else self.owed.get(e.key, 0.0))
        else:
            e.data["began"] = self.clock.t
        if self.runs is not None:  # (a restart resumes from the checkpoint it takes first)
            self.runs[e.key] = self.clock.t + (0.0 if self.every else self.owed.get(e.key, 0.0))

    def _starting(self, e: Entry, owed: float) -> None:
        """``e``'s run pays ``owed`` seconds of start-up before its first step (none: it trains now)."""
        now = self.clock.t
        self.owed[e.key] = owed
        if owed:
            e.ready_at = now + owed  # (policies see when its first step is due: JobView.ready_at)
        else:
            self._trains(e, now)

    def _trains(self, e: Entry, t: float) -> None:
        """``e``'s run trains from ``t``: its start-up is over (the table counts service from then),
        and its rate is measured from then (:meth:`measure`)."""
        self.table.began(e.key, t)
        e.data["began"] = t

    def moved(self, e: Entry, a: Action) -> None:
        """A migration that costs nothing (``free_moves``): the run goes on training where it
        moved (the table did not make it starting again; a run still in its start-up stays so)."""
        self.migrations += 1
        # _placed's common case, inline (alone before and after, so its charge is unchanged): a call
        # to _placed here costs SRTF 4% on 50,000 jobs, which migrates ~8 jobs per decision
        if self._plain and not a.group and e.num_gpu == e.data["gpus"]:
            e.slowdown = a.slowdown or 1.0
            return
        self._placed(e, a)

    def _placed(self, e: Entry, a: Action) -> None:
        size0 = e.data["gpus"]
        if self._plain and not a.group and e.num_gpu == size0:  # the common case: the policy's slowdown alone
            self.charge[e.key] = e.restart_cost
            e.slowdown = a.slowdown or 1.0
            return
        entries = self.table
        self.charge[e.key] = (sum(entries.get(m).restart_cost for m in a.group) if a.group else e.restart_cost)
        where = a.placement
        e.slowdown = a.slowdown or (self.spread_slowdown if self.spread_slowdown > 1.0 and len(where) > 1
                                    and e.skew > self.skew_sensitive else 1.0)
        types = self._shape.node_types
        if types and e.speeds:
            e.slowdown /= min(e.speeds.get(types[node], 1.0) for node, _ in where)
        if e.num_gpu != size0:  # an elastic job at another size: its iteration at that size, as a live one's is
            e.iteration_time = e.data["it0"] * e.data["spec"].scaling(e.num_gpu)  # measured (Amdahl's law)
            e.data["gpus"] = e.num_gpu

    # ------------------------------------------------------------------ progress
    def next_end(self, now: float) -> float:
        """When the next running job would finish if nothing changed (those jobs are *due*:
        :meth:`advance` to that time finishes them, see the module docstring)."""
        best = float("inf")
        due: list = []
        every, get = self.every, self.owed.get
        for e in self.table.running.values():
            t = now + e.remaining_iterations * e.iteration_time * e.slowdown + (0.0 if every else get(e.key, 0.0))
            if t < best:
                best, due = t, [e]
            elif t == best:
                due.append(e)
        self._due = (best, due)
        return best

    def advance(self, now: float, t: float) -> list[Entry]:
        """Run every running job from ``now`` to ``t``; returns those that finished. Also adds
        their attained service up to ``t``, as :meth:`JobTable.accrue` does, in the same pass."""
        dt = t - now
        finished = []
        every, owed = self.every, self.owed
        lost = self.lost
        window = self.window
        worked = False
        table = self.table
        for e in table.running.values():
            da = t - e.accrued_at
            e.accrued_at = t
            if every:
                e.attained += da
                e.attained_gpu += da * e.num_gpu
                end = now + e.remaining_iterations * e.iteration_time * e.slowdown
                if end <= t + 1e-9:
                    finished.append(e)
                    work = dt
                else:
                    c = self.charge[e.key]
                    work = dt - c if dt > c else 0.0
                    lost += dt - work
            else:
                o = owed.get(e.key, 0.0)
                if o:  # a restart cost still owed is paid first: start-up, not service
                    pay = o if o < dt else dt
                    owed[e.key] = o - pay
                    lost += pay
                    work = dt - pay
                    da -= pay
                    if pay == o:
                        self._trains(e, t)
                else:
                    work = dt
                if da > 0:
                    e.attained += da
                    e.attained_gpu += da * e.num_gpu
            its = work / (e.iteration_time * e.slowdown)
            e.remaining_iterations -= its
            if its > 0:
                worked = True
            if window is not None and dt > 0:
                self._record(now, t, e, its)
            if not every and e.remaining_iterations <= 1e-9 * (e.iterations if e.iterations > 1.0 else 1.0):
                finished.append(e)
        self.worked = worked  # whether any job did work in this step (the thrashing watchdog)
        self.lost = lost
        if t == self._due[0]:
            # completion is decided by the event, not by float residue: the jobs whose completion
            # time is this event finish now, even when (at large times) a last fraction of an
            # iteration did not fit in a representable time step
            for e in self._due[1]:
                if e not in finished:
                    e.remaining_iterations = 0.0
                    finished.append(e)
        return finished

    def measure(self, now: float) -> None:
        """Give every running elastic job that trains its rate (iterations per second, as a live
        job's shard cursors would show) and how long it has trained in this run."""
        table, starting = self.table, self.table.starting
        for e in table.running.values():
            if e.min_gpu != e.max_gpu and e.key not in starting:
                e.rate = 1.0 / (e.iteration_time * e.slowdown)
                e.rate_window = now - e.data.get("began", e.run_at)
                table.touch(e.key)

    def forget(self, key) -> None:
        self.owed.pop(key, None)

    def _record(self, a: float, b: float, j: Entry, its: float) -> None:
        """Spread a job's progress over [a, b) across the windows it spans (evenly in time)."""
        w, types, timeline = self.window, self._shape.node_types, self.timeline
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


RestartCost = Callable[[Entry], float]
