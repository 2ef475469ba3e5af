"""Muri's interleaving executor: 2 to 4 jobs in one process, phase-shifted over resource types.

Each job is a callable (its whole training loop) run in its own thread, with its own
:class:`~.stages.Recorder` and, on GPU, its own CUDA stream (one CUDA context for the process).
The jobs mark their stages with ``et.stage(...)``; every stage passes through the group's
gate, which runs the group in *slots* separated by barriers (Muri section 4):

* ``resources`` lists the stage types, one resource each (default: load, preprocess,
  compute, sync). Job ``i`` sits at slot offset ``o_i`` and in slot ``t`` may only run its
  stage ``(t - o_i) mod k``; offsets are distinct, so at any moment each resource serves at
  most one job's stage.
* A slot ends when every job has finished its stage of that slot (a job that has no such
  stage this iteration - it moved on to a later stage - counts as finished). Then the next
  slot starts for everyone.
* Offsets: given, or from stage profiles (given, or measured by running each job alone for
  ``probe`` iterations first): the rotation with the shortest interleaved iteration, eq. 3
  (:func:`~elastictrain.policies.interleaving.best_ordering`).

Jobs keep their own state: separate threads, recorders, data iterators, checkpoints, and
(for distributed jobs) their own process groups (use ``torch.distributed.new_group``, not the
default group, and an explicit ``torch.Generator``: the global RNG is shared by the process).
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
from .stages import STAGES, Recorder, use_recorder

__all__ = ["InterleaveGroup", "JobResult", "GroupJob", "JobCancelled"]


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
    __slots__ = ("offset", "done", "active", "first", "iterations", "cancelled")

    def __init__(self) -> None:
        self.offset, self.done, self.active, self.first, self.iterations = 0, False, True, None, 0
        self.cancelled: Optional[str] = None


class _Gate:
    """The slot barrier shared by a group's threads."""

    def __init__(self, n: int, resources: Sequence[str], probe: int) -> None:
        self.cond = threading.Condition()
        self.k, self.index = len(resources), {r: i for i, r in enumerate(resources)}
        self.members = [_Member() for _ in range(n)]
        self.slot = 0
        self.probe = probe
        self.solo: Optional[int] = 0 if probe > 0 else None  # probing: only this member runs
        self.on_probed: Optional[Callable[[], None]] = None

    def for_member(self, i: int) -> "_MemberGate":
        return _MemberGate(self, i)

    # -- called with the lock held
    def _advance(self) -> None:
        live = [m for m in self.members if m.active]
        if live and all(m.done for m in live):
            self.slot += 1
            for m in live:
                m.done = False
            self.cond.notify_all()

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
            self.slot = 0
            for m in self.members:
                m.done = False
        self.cond.notify_all()

    def enter(self, i: int, stage: str) -> None:
        j = self.index.get(stage)
        with self.cond:
            me = self.members[i]
            if me.cancelled is not None:
                raise JobCancelled(me.cancelled)
            if me.first is None:
                me.first = stage
            elif stage == me.first:
                me.iterations += 1
                if self.solo == i and me.iterations >= self.probe:
                    self._next_solo()
            if j is None:
                return  # a stage type outside the group's resources is not gated
            while True:
                if self.solo is not None:
                    if self.solo == i:
                        return
                elif not me.done:
                    if (self.slot - me.offset) % self.k == j:
                        return
                    me.done = True  # nothing for this job in this slot: it moved on
                    self._advance()
                    continue
                self.cond.wait()
                if me.cancelled is not None:
                    raise JobCancelled(me.cancelled)

    def cancel(self, i: int, reason: str) -> None:
        """The job raises at its next stage, and leaves the slots now: it may be blocked in a
        collective that can never complete, which must not hold the other jobs' slots."""
        with self.cond:
            self.members[i].cancelled = reason
            self._drop(i)

    def exit(self, i: int, stage: str) -> None:
        if stage not in self.index:
            return
        with self.cond:
            if self.solo is None:
                self.members[i].done = True
                self._advance()

    def leave(self, i: int) -> None:
        with self.cond:
            self._drop(i)

    def _drop(self, i: int) -> None:
        """Take member ``i`` out of the slot schedule (once), with the lock held."""
        if self.members[i].active:
            self.members[i].active = False
            if self.solo == i:
                self._next_solo()
            else:
                self._advance()
        self.cond.notify_all()


class _MemberGate:
    __slots__ = ("gate", "i")

    def __init__(self, gate: _Gate, i: int) -> None:
        self.gate, self.i = gate, i

    def enter(self, stage: str) -> None:
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
    """

    def __init__(self, jobs: Sequence, resources: Sequence[str] = STAGES, offsets: Optional[Sequence[int]] = None,
                 probe: int = 3, cuda_streams: bool = True,
                 agree: Optional[Callable[[tuple], Sequence[int]]] = None) -> None:
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

    def _choose_offsets(self, recorders: list[Recorder]) -> None:
        profs = []
        for job, rec in zip(self.jobs, recorders):
            if job.profile is not None:
                p = job.profile
            else:
                its = rec.iterations[1:] or rec.iterations  # the first one warms up
                p = {s: sum(it.get(s, 0.0) for it in its) / max(1, len(its)) for s in self.resources}
            profs.append(tuple(float(p.get(s, 0.0)) for s in self.resources))
        self.profiles = profs
        if self.offsets is None:
            if len(profs) == 1:
                self.offsets = (0,)
            else:
                t, self.offsets = best_ordering(profs, len(self.resources))
                self.iteration_estimate = t
        if self.agree is not None:
            self.offsets = tuple(self.agree(tuple(self.offsets)))
        for m, o in zip(self.gate.members, self.offsets):
            m.offset = o

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
            self.gate = _Gate(n, self.resources, self.probe)
            for i, reason in self._cancelled.items():
                self.gate.cancel(i, reason)
        recorders = [Recorder() for _ in range(n)]
        results: list[Optional[JobResult]] = [None] * n
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
        use_recorder(rec, self.gate.for_member(i))
        t0 = time.perf_counter()
        stream_ctx = _cuda_stream() if self.cuda_streams else None
        value, error, tb = None, None, ""
        try:
            if stream_ctx is not None:
                with stream_ctx:
                    value = job.fn()
            else:
                value = job.fn()
        except BaseException as exc:  # noqa: BLE001 - a job's failure is that job's result
            error, tb = exc, traceback.format_exc()
        finally:
            use_recorder(None, None)
            self.gate.leave(i)
        if error is None:
            rec.next_iteration()  # the last iteration ended with the job; a failed one did not
        results[i] = JobResult(job.name, error is None, value, error, tb, rec.completed, time.perf_counter() - t0, rec)


def _cuda_stream():
    import sys

    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available():
            return None
        return torch.cuda.stream(torch.cuda.Stream())
    except Exception:  # noqa: BLE001
        return None
