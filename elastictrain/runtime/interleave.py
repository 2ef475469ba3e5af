"""Muri's interleaving executor: 2 to 4 jobs in one process, phase-shifted over resource types.

Each job is a callable (its whole training loop) run in its own thread, with its own
:class:`~.stages.Recorder` and, on GPU, its own CUDA stream (one CUDA context for the process).
The jobs mark their stages with ``et.stage(...)``; every stage of a gated type (``resources``,
default load, preprocess, compute, sync: one resource each) passes through the group's gate,
so at any moment each resource serves at most one job's stage. Two schedules:

* **work-conserving** (the default in one process, :class:`_WorkGate`): a stage waits only
  while its resource is busy; when it frees, the waiters take it in the ring order of their
  offsets, after its last user. A ``compute`` stage on CUDA keeps its resource busy until the
  CUDA event recorded at its exit completes (polled with ``query()``, never synchronized), so
  the gate sees the device's work, not the host's launches.
* **slots** (Muri section 4, :class:`_SlotGate`; the default for a distributed group, whose
  ranks must grant resources in the same order): job ``i`` at slot offset ``o_i`` runs only its
  stage ``(t - o_i) mod k`` in slot ``t``, and a slot ends when every job has finished (or
  skipped) its stage of it.

Offsets: given, or from stage profiles (given, or measured by running each job alone for
``probe`` iterations first): the rotation with the shortest interleaved iteration, eq. 3
(:func:`~elastictrain.policies.interleaving.best_ordering`); in one process it is re-derived
from the latest iterations as the group runs (``reorder_every``).

Jobs keep their own state: separate threads, recorders, data iterators, checkpoints, and
(for distributed jobs) their own process groups (use ``torch.distributed.new_group``, not the
default group). The global RNG is shared by the process, so each job's set-up (its code before
its first stage) runs alone, in job order, from the same RNG state (:mod:`.setup_turns`): a job
builds the same data on every rank, as alone; random numbers drawn while the jobs train
concurrently come from the shared generators.
A job that returns or raises leaves the group at once; the others go on, and its exception is
reported as that job's result only.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from ..errors import ConfigError
from ..policies.interleaving import best_ordering
from .setup_turns import SetupTurns
from .stages import STAGES, Recorder, use_recorder

__all__ = ["InterleaveGroup", "JobResult", "GroupJob", "JobCancelled", "auto_host_slots"]


class JobCancelled(Exception):
    """Raised at a job's next stage after :meth:`InterleaveGroup.cancel` (e.g. the same job
    failed on another rank, so its collectives here can never complete)."""


@dataclass
class GroupJob:
    """One member: ``fn()`` runs the job's training loop; ``profile``: its stage seconds (any
    stage type not given is 0), or None to measure it."""

    name: str
    fn: Callable[[], Any]
    profile: Optional[dict] = None


@dataclass
class JobResult:
    name: str
    ok: bool
    value: Any = None
    error: Optional[BaseException] = None
    traceback: str = ""
    iterations: int = 0
    seconds: float = 0.0
    recorder: Optional[Recorder] = field(default=None, repr=False)


class _Member:
    __slots__ = ("offset", "done", "active", "first", "iterations", "cancelled", "held", "entry")

    def __init__(self) -> None:
        self.offset, self.done, self.active, self.first, self.iterations = 0, False, True, None, 0
        self.cancelled: Optional[str] = None
        self.held: Optional[int] = None  # the resource this member holds (work-conserving gate)
        self.entry: Optional[list] = None  # its in-flight entry there


class _Gate:
    """What both schedules share: members, the probing phase (each job alone for ``probe``
    iterations, in turn), cancellation and leaving. Subclasses decide when a stage may start."""

    def __init__(self, n: int, resources: Sequence[str], probe: int) -> None:
        self.cond = threading.Condition()
        self.k, self.index = len(resources), {r: i for i, r in enumerate(resources)}
        self.members = [_Member() for _ in range(n)]
        self.probe = probe
        self.solo: Optional[int] = 0 if probe > 0 else None  # probing: only this member runs
        self.on_probed: Optional[Callable[[], None]] = None
        self.on_iteration: Optional[Callable[[int], None]] = None  # member i began an iteration

    def for_member(self, i: int) -> "_MemberGate":
        return _MemberGate(self, i)

    def set_offsets(self, offsets: Sequence[int]) -> None:
        with self.cond:
            for m, o in zip(self.members, offsets):
                m.offset = o
            self.cond.notify_all()

    def enter(self, i: int, stage: str) -> None:
        j = self.index.get(stage)
        began = False
        with self.cond:
            me = self.members[i]
            if me.cancelled is not None:
                raise JobCancelled(me.cancelled)
            if me.first is None:
                me.first = stage
            elif stage == me.first:
                me.iterations += 1
                began = True
                if self.solo == i and me.iterations >= self.probe:
                    self._next_solo()
            if j is not None:
                while self.solo is not None and self.solo != i:
                    self.cond.wait()
                    if me.cancelled is not None:
                        raise JobCancelled(me.cancelled)
                if self.solo is None:
                    self._acquire(i, me, j)
        if began and self.on_iteration is not None and self.solo is None:
            self.on_iteration(i)

    def _next_solo(self) -> None:
        i = self.solo + 1
        while i < len(self.members) and not self.members[i].active:
            i += 1
        if i < len(self.members):
            self.solo = i
        else:
            self.solo = None
            if self.on_probed is not None:
                self.on_probed()
            self._reset()
        self.cond.notify_all()

    def cancel(self, i: int, reason: str) -> None:
        """The job raises at its next stage, and leaves the schedule now: it may be blocked in a
        collective that can never complete, which must not hold the other jobs back."""
        with self.cond:
            self.members[i].cancelled = reason
            self._drop(i)

    def exit(self, i: int, stage: str) -> None:
        j = self.index.get(stage)
        if j is None:
            return
        event = self._event(j)  # recorded on the job's stream, outside the lock
        with self.cond:
            if self.solo is None:
                self._release(i, self.members[i], j, event)

    def leave(self, i: int) -> None:
        with self.cond:
            self._drop(i)

    def _drop(self, i: int) -> None:
        """Take member ``i`` out of the schedule (once), with the lock held."""
        m = self.members[i]
        if m.active:
            m.active = False
            if self.solo == i:
                self._next_solo()
            else:
                self._left(i, m)
        self.cond.notify_all()

    def _event(self, j: int):
        """The device event that keeps resource ``j`` busy after a stage exits (None: none)."""
        return None

    # -- the schedule (called with the lock held)
    def _reset(self) -> None:
        pass

    def _acquire(self, i: int, me: _Member, j: int) -> None:
        raise NotImplementedError

    def _release(self, i: int, me: _Member, j: int, event) -> None:
        raise NotImplementedError

    def _left(self, i: int, me: _Member) -> None:
        raise NotImplementedError


class _SlotGate(_Gate):
    """Muri's slots, in lockstep: job ``i`` may run only its stage ``(t - o_i) mod k`` in slot
    ``t``; a slot ends when every job has finished (or skipped) its stage of it. The grant order
    depends on nothing but the offsets, so it is the same on every rank of a distributed group."""

    def __init__(self, n: int, resources: Sequence[str], probe: int) -> None:
        super().__init__(n, resources, probe)
        self.slot = 0

    def _advance(self) -> None:
        live = [m for m in self.members if m.active]
        if live and all(m.done for m in live):
            self.slot += 1
            for m in live:
                m.done = False
            self.cond.notify_all()

    def _reset(self) -> None:
        self.slot = 0
        for m in self.members:
            m.done = False

    def _acquire(self, i: int, me: _Member, j: int) -> None:
        while True:
            if not me.done:
                if (self.slot - me.offset) % self.k == j:
                    return
                me.done = True  # nothing for this job in this slot: it moved on
                self._advance()
                continue
            self.cond.wait()
            if me.cancelled is not None:
                raise JobCancelled(me.cancelled)

    def _release(self, i: int, me: _Member, j: int, event) -> None:
        me.done = True
        self._advance()

    def _left(self, i: int, me: _Member) -> None:
        self._advance()


class _WorkGate(_Gate):
    """Work-conserving: a stage waits only while its resource is busy. A host resource (load,
    preprocess, sync) serves ``host_slots`` jobs at a time (default 1); when a slot frees, the
    waiters take it in the ring order of their offsets (eq. 3's ordering), starting after its
    last user, so no member waits more than k - 1 turns.

    A device resource (``compute`` by default) is shared: the device interleaves the jobs'
    kernels, as concurrent CUDA streams do (making it exclusive lost to plain threads, on a GPU
    and in the emulation of ``benchmarks/interleave.py``, because the device idles for every
    hand-over). What the gate bounds there is how far one job runs ahead: a stage is in flight
    from its start until the device work it launched completes (at exit the gate records
    ``device.event()``, a CUDA event on the job's stream, and polls its ``query()``; it never
    synchronizes), and each job may have the same device time in flight: ``device_depth``
    stages of the job with the longest device stage (:meth:`set_device_times`). So a job that
    never reads its loss back cannot fill the device's queue ahead of the others, and a job with
    short stages is not held back behind a heavy job's backlog."""

    POLL = (0.0001, 0.002)  # seconds between polls of a pending device event: first, and at most (doubling)

    def __init__(self, n: int, resources: Sequence[str], probe: int, device=None,
                 device_stages: Sequence[str] = ("compute",), device_depth: int = 2,
                 host_slots: Optional[dict] = None) -> None:
        super().__init__(n, resources, probe)
        self.device = device
        # how many jobs' stages a host resource serves at once (1: exclusive, as in Muri)
        self.slots = [max(1, int((host_slots or {}).get(r, 1))) for r in resources]
        self.device_res = frozenset(self.index[s] for s in device_stages if s in self.index)
        self.depth = device_depth
        self.budget = [device_depth] * n  # stages each member may have in flight on the device
        self.shared = self.device_res if device is not None else frozenset()
        self.inflight: list[list] = [[] for _ in range(self.k)]  # [member, None (in the stage) or its event]
        self.last = [-1] * self.k  # the member that took each resource last
        self.waiting: list[set] = [set() for _ in range(self.k)]
        self.held_back = [0] * n  # stages each member had to wait for (tests, benchmarks)
        self.ring = list(range(n))

    def set_offsets(self, offsets: Sequence[int]) -> None:
        with self.cond:
            self.ring = sorted(range(len(self.members)), key=lambda i: (offsets[i] % self.k, i))
            super().set_offsets(offsets)

    def set_device_times(self, seconds: Sequence[float]) -> None:
        """Each member's device seconds per stage (its profile): the run-ahead bound is the same
        device time for everyone, ``device_depth`` stages of the longest, so a job with short
        stages may have more of them in flight (at most 32) than one with long stages."""
        longest = max(seconds, default=0.0)
        with self.cond:
            for i, t in enumerate(seconds):
                self.budget[i] = self.depth if longest <= 0 or t <= 0 else \
                    max(self.depth, min(32, int(self.depth * longest / t)))
            self.cond.notify_all()

    def _event(self, j: int):
        if self.device is None or j not in self.device_res or self.solo is not None:
            return None
        return self.device.event()

    def _busy(self, i: int, j: int) -> tuple[bool, bool]:
        """(may member ``i`` not start on resource ``j`` now, is that for device work)."""
        fl = self.inflight[j]
        pending = False
        for entry in list(fl):
            ev = entry[1]
            if ev is not None:
                if ev.query():
                    fl.remove(entry)
                    continue
                pending = True
        if j in self.shared:
            return sum(1 for e in fl if e[0] == i) >= self.budget[i], pending
        return len(fl) >= self.slots[j], pending

    def _turn(self, j: int, i: int) -> bool:
        """Is member ``i`` among the waiters for host resource ``j`` that its free slots serve
        next, in ring order after the resource's last user."""
        ring, ws = self.ring, self.waiting[j]
        free = self.slots[j] - len(self.inflight[j])
        start = ring.index(self.last[j]) + 1 if self.last[j] in ring else 0
        for step in range(len(ring)):
            m = ring[(start + step) % len(ring)]
            if m in ws:
                if m == i:
                    return True
                free -= 1
                if free <= 0:
                    return False
        return False

    def _acquire(self, i: int, me: _Member, j: int) -> None:
        ws = self.waiting[j]
        ws.add(i)
        waited = False
        poll = self.POLL[0]
        try:
            while True:
                full, pending = self._busy(i, j)
                if not full and (j in self.shared or self._turn(j, i)):
                    break
                waited = True
                if pending:  # polls back off: a waiter must not take the host's CPU from the jobs
                    self.cond.wait(poll)
                    poll = min(2 * poll, self.POLL[1])
                else:
                    self.cond.wait()
                if me.cancelled is not None:
                    raise JobCancelled(me.cancelled)
        finally:
            ws.discard(i)
        me.entry = [i, None]
        self.inflight[j].append(me.entry)
        self.last[j], me.held = i, j
        if waited:
            self.held_back[i] += 1

    def _release(self, i: int, me: _Member, j: int, event) -> None:
        if me.held != j:
            return  # it entered while the group was still probing
        me.held = None
        if event is not None and not event.query():
            me.entry[1] = event
        else:
            self.inflight[j].remove(me.entry)
        me.entry = None
        self.cond.notify_all()

    def _left(self, i: int, me: _Member) -> None:
        if me.held is not None:
            self.inflight[me.held].remove(me.entry)
            me.held = me.entry = None
        for ws in self.waiting:
            ws.discard(i)


class _MemberGate:
    __slots__ = ("gate", "i", "turns")

    def __init__(self, gate: _Gate, i: int, turns: Optional[SetupTurns] = None) -> None:
        self.gate, self.i, self.turns = gate, i, turns

    def enter(self, stage: str) -> None:
        if self.turns is not None:  # the job's first stage: its set-up is over; train once all are
            self.turns.ready(self.i)
            self.turns = None
        self.gate.enter(self.i, stage)

    def exit(self, stage: str) -> None:
        self.gate.exit(self.i, stage)


class InterleaveGroup:
    """Run ``jobs`` interleaved. Args:
        jobs: 2 to 4 :class:`GroupJob` (or ``(name, fn)`` pairs).
        resources: the gated stage types, one resource each, in iteration order.
        offsets: slot offset per job (distinct); default: from profiles by eq. 3.
        probe: iterations each job runs alone to measure its profile, where none is given.
        cuda_streams: give each job its own CUDA stream when torch sees a GPU.
        agree: called with the chosen offsets, returns the offsets to use; distributed groups
            pass a broadcast from rank 0, so every rank phases each job the same way.
        schedule: ``"work"`` (work-conserving: a stage waits only while its resource is busy),
            ``"slots"`` (Muri's lockstep slots), or ``"auto"``: slots when ``agree`` is given
            (a distributed group: every rank must grant resources in the same order, or two
            jobs' collectives can wait on each other across ranks), else work-conserving.
        device: what keeps a device stage's resource busy after the stage returns: an object
            whose ``event()`` returns something with ``query()`` (default: a CUDA event on the
            job's stream when torch sees a GPU; None on CPU, where a stage ends when it returns).
        device_stages: the stages whose work runs on ``device``.
        device_depth: device stages in flight, counted in stages of the job with the longest one
            (see :class:`_WorkGate`).
        reorder_every: with the work-conserving schedule and no ``agree``, re-derive the order
            from the jobs' latest 20 iterations every this many iterations of the group (0: never),
            so it follows a job whose phase changes.
        isolate_setup: run each job's set-up (its code before its first stage) alone, in job
            order, from the same global RNG state, and start training once all are set up, so
            each job builds the same data on every rank (see :mod:`.setup_turns`).
        host_slots: with the work-conserving schedule, how many jobs' stages each host resource
            serves at once (a mapping from stage type to 1..64; a type not named: 1, exclusive
            as in Muri). ``"auto"`` (the default): ``preprocess`` gets one slot per job while
            the host has a core to spare for each (:func:`auto_host_slots`), so augmentations
            on a many-core GPU host do not queue behind each other; ``load`` and ``sync`` (one
            storage path, one link) stay exclusive.
    """

    def __init__(self, jobs: Sequence, resources: Sequence[str] = STAGES, offsets: Optional[Sequence[int]] = None,
                 probe: int = 3, cuda_streams: bool = True,
                 agree: Optional[Callable[[tuple], Sequence[int]]] = None, schedule: str = "auto",
                 device: Any = "auto", device_stages: Sequence[str] = ("compute",), device_depth: int = 2,
                 reorder_every: int = 50, isolate_setup: bool = True, host_slots: Any = "auto") -> None:
        self.jobs = [j if isinstance(j, GroupJob) else GroupJob(*j) for j in jobs]
        if not 1 <= len(self.jobs) <= 4:
            raise ConfigError(f"an interleaving group has 1 to 4 jobs, got {len(self.jobs)}")
        if len(self.jobs) > len(resources):
            raise ConfigError(f"{len(self.jobs)} jobs need at least as many resource types, got {tuple(resources)}")
        bad = [r for r in resources if r not in STAGES]
        if bad or len(set(resources)) != len(resources):
            raise ConfigError(f"resources must be distinct stage types from {STAGES}, got {tuple(resources)}")
        if offsets is not None and (len(offsets) != len(self.jobs)
                                    or len({o % len(resources) for o in offsets}) != len(self.jobs)):
            raise ConfigError(f"offsets must be one distinct slot per job, got {tuple(offsets)}")
        if schedule not in ("auto", "work", "slots"):
            raise ConfigError(f"schedule must be auto, work or slots, got {schedule!r}")
        if not (isinstance(device_depth, int) and 1 <= device_depth <= 4):
            raise ConfigError(f"device_depth must be an integer in [1, 4], got {device_depth!r}")
        if not (isinstance(reorder_every, int) and 0 <= reorder_every <= 1_000_000):
            raise ConfigError(f"reorder_every must be an integer in [0, 1000000], got {reorder_every!r}")
        bad = [s for s in device_stages if s not in STAGES]
        if bad:
            raise ConfigError(f"device_stages must be stage types from {STAGES}, got {tuple(device_stages)}")
        if host_slots == "auto":
            host_slots = {"preprocess": auto_host_slots(len(self.jobs))}
        elif not isinstance(host_slots, dict) or any(
                k not in STAGES or isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 64
                for k, v in host_slots.items()):
            raise ConfigError(f"host_slots must be 'auto' or a mapping from stage types {STAGES} to an "
                              f"integer in [1, 64], got {host_slots!r}")
        self.host_slots = dict(host_slots)
        self.schedule = ("slots" if agree is not None else "work") if schedule == "auto" else schedule
        self.device, self.device_stages, self.device_depth = device, tuple(device_stages), device_depth
        self.reorder_every = reorder_every if agree is None and offsets is None else 0
        self.resources = tuple(resources)
        self.offsets = tuple(offsets) if offsets is not None else None
        measure = offsets is None and any(j.profile is None for j in self.jobs) and len(self.jobs) > 1
        self.probe = probe if measure else 0
        self.cuda_streams = cuda_streams
        self.agree = agree
        self.gate: Optional[_Gate] = None
        self._lock = threading.Lock()
        self._cancelled: dict[int, str] = {}  # cancelled before the group started
        self.profiles: list[tuple] = []
        self.iteration_estimate: Optional[float] = None  # eq. 3 for the chosen offsets
        self.reorders = 0  # times the order changed while the group ran
        self._recorders: list[Recorder] = []
        self._since = 0  # group iterations since the order was last derived
        self._reordering = threading.Lock()
        self.isolate_setup = isolate_setup
        self._turns: Optional[SetupTurns] = None

    def _profile(self, job: GroupJob, rec: Recorder, window: Optional[int] = None) -> tuple:
        if job.profile is not None and window is None:
            p = job.profile
        else:
            its = rec.iterations[-window:] if window else (rec.iterations[1:] or rec.iterations)  # 1st warms up
            if not its:
                p = job.profile or {}
            else:
                p = {s: sum(it.get(s, 0.0) for it in its) / len(its) for s in self.resources}
        return tuple(float(p.get(s, 0.0)) for s in self.resources)

    def _choose_offsets(self, recorders: list[Recorder]) -> None:
        profs = [self._profile(job, rec) for job, rec in zip(self.jobs, recorders)]
        self.profiles = profs
        if self.offsets is None:
            if len(profs) == 1:
                self.offsets = (0,)
            else:
                t, self.offsets = best_ordering(profs, len(self.resources))
                self.iteration_estimate = t
        if self.agree is not None:
            self.offsets = tuple(self.agree(tuple(self.offsets)))
        self.gate.set_offsets(self.offsets)
        self._device_times(profs)

    def _device_times(self, profs: list[tuple]) -> None:
        if isinstance(self.gate, _WorkGate):
            self.gate.set_device_times([sum(p[k] for k, r in enumerate(self.resources) if r in self.device_stages)
                                        for p in profs])

    def _on_iteration(self, i: int) -> None:
        """Every ``reorder_every`` iterations of the group: the order from the latest profiles."""
        self._since += 1
        if self._since < self.reorder_every or not self._reordering.acquire(blocking=False):
            return
        try:
            self._since = 0
            live = [m.active for m in self.gate.members]
            profs = [self._profile(j, r, window=20) for j, r in zip(self.jobs, self._recorders)]
            if sum(live) < 2:
                return
            t, offsets = best_ordering(profs, len(self.resources))
            self.profiles, self.iteration_estimate = profs, t
            self._device_times(profs)
            if tuple(offsets) != tuple(self.offsets or ()):
                self.offsets = tuple(offsets)
                self.reorders += 1
                self.gate.set_offsets(self.offsets)
        finally:
            self._reordering.release()

    def cancel(self, name: str, reason: str) -> None:
        """Make job ``name`` raise :class:`JobCancelled` at its next stage (it then leaves)."""
        i = [j.name for j in self.jobs].index(name)
        with self._lock:
            if self.gate is None:  # not started yet: applied when it starts
                self._cancelled[i] = reason
                return
        self.gate.cancel(i, reason)

    def run(self, timeout: Optional[float] = None) -> list[JobResult]:
        """Run the group to the end; one result per job, in order.

        Raises:
            TimeoutError: a job was still running after ``timeout`` seconds (the threads are
                daemons and are left behind).
        """
        n = len(self.jobs)
        with self._lock:
            if self.schedule == "slots":
                self.gate = _SlotGate(n, self.resources, self.probe)
            else:
                device = _CudaDevice.create(self.cuda_streams) if self.device == "auto" else self.device
                self.gate = _WorkGate(n, self.resources, self.probe, device, self.device_stages, self.device_depth,
                                      self.host_slots)
            for i, reason in self._cancelled.items():
                self.gate.cancel(i, reason)
        recorders = self._recorders = [Recorder() for _ in range(n)]
        self._turns = SetupTurns(n) if self.isolate_setup and n > 1 else None
        results: list[Optional[JobResult]] = [None] * n
        if self.reorder_every:
            self.gate.on_iteration = self._on_iteration
        self.gate.on_probed = lambda: self._choose_offsets(recorders)
        if self.probe == 0:
            self._choose_offsets(recorders)
        threads = []
        for i, job in enumerate(self.jobs):
            t = threading.Thread(target=self._run_one, args=(i, job, recorders[i], results),
                                 name=f"et-interleave-{job.name}", daemon=True)
            threads.append(t)
        for t in threads:
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise TimeoutError(f"interleaved job thread {t.name} still running after {timeout} s")
        return [r for r in results if r is not None]

    def _run_one(self, i: int, job: GroupJob, rec: Recorder, results: list) -> None:
        turns = self._turns
        use_recorder(rec, _MemberGate(self.gate, i, turns) if turns is not None else self.gate.for_member(i))
        t0 = time.perf_counter()
        stream_ctx = _cuda_stream() if self.cuda_streams else None
        value, error, tb = None, None, ""
        try:
            if turns is not None:
                turns.begin(i)
            if stream_ctx is not None:
                with stream_ctx:
                    value = job.fn()
            else:
                value = job.fn()
        except BaseException as exc:  # noqa: BLE001 - a job's failure is that job's result
            error, tb = exc, traceback.format_exc()
        finally:
            use_recorder(None, None)
            if turns is not None:
                turns.end(i)
            self.gate.leave(i)
        if error is None:
            rec.next_iteration()  # the last iteration ended with the job; a failed one did not
        results[i] = JobResult(job.name, error is None, value, error, tb, rec.completed, time.perf_counter() - t0, rec)


def auto_host_slots(jobs: int) -> int:
    """Stages of a host resource that ``jobs`` jobs may run at once here: one per job while the
    cores this process may use leave one for the jobs' other threads (kernel launches, I/O).

    Not divided by torch's intra-op threads: measured on an H100 host (16 cores, torch's default
    of 16 threads), two realistic numpy augmentations ran at 0.55 of free threads with one slot
    and at 1.02-1.06 with two (docs/gpu.md). A preprocess that uses every core slows down when
    two run at once but loses little against taking turns; ``host_slots={"preprocess": 1}``
    makes it exclusive."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(jobs, cores - 1))


class _CudaDevice:
    """Device work on CUDA: an event recorded on the calling thread's current stream (the job's)."""

    def __init__(self, torch) -> None:
        self.torch = torch

    @classmethod
    def create(cls, wanted: bool) -> Optional["_CudaDevice"]:
        import sys

        torch = sys.modules.get("torch")
        try:
            return cls(torch) if wanted and torch is not None and torch.cuda.is_available() else None
        except Exception:  # noqa: BLE001 - a broken CUDA setup: stages end when they return
            return None

    def event(self):
        ev = self.torch.cuda.Event()
        ev.record()
        return ev


def _cuda_stream():
    import sys

    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available():
            return None
        return torch.cuda.stream(torch.cuda.Stream())
    except Exception:  # noqa: BLE001
        return None
