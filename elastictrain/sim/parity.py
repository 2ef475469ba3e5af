"""Parity of the simulator with a live cluster: the same decisions, in the same order.

A live run's event log and a simulation of its exported trace (``elastictrain trace export``)
are both reduced to *decisions*: a job starts (or resumes), is preempted, or is restarted in
place (a regroup, migration or resize), each with the interleaving group it runs in and its time
in seconds after the first submission. Jobs are named by their index in the trace (their
submission order), which is how the export numbers them.

:func:`compare` holds the two to each other, job by job: the same decisions in the same order,
each within ``tolerance`` seconds of its counterpart. It returns None when they agree, else a
description of the first decision (in time) where they diverge.

On a live cluster a move that does not fit beside a job still stopping is carried out as a stop
and, once the GPUs are free, a start (the simulator's stops are instantaneous, so it never
defers); the coordinator logs a ``deferred`` event for it at the decision. :func:`normalize`
folds such a preempt-then-start of one job (within ``tolerance``) into the restart it stands
for, so that both sides describe the same decision. Only a preemption the log marks deferred
is folded: a real preemption followed by a quick resume (a few seconds, once the node daemons
fork workers from a kept zygote) stays a preemption and a start, on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

__all__ = ["Step", "live_decisions", "sim_decisions", "normalize", "compare"]

_RESTARTS = ("regroup", "migrate", "resize")
_LIVE = {"start": "start", "resume": "start", "preempt": "preempt", "regroup": "regroup", "migrate": "migrate",
         "resize": "resize", "finish": "finish"}


@dataclass(frozen=True)
class Step:
    time: float  # seconds after the first submission
    kind: str  # start | preempt | regroup | migrate | resize | finish
    job: int  # the job's index in the trace (its submission order)
    group: tuple = ()  # the sorted indices of the group it runs in (() alone)
    deferred: bool = False  # a preemption that is the stop of a deferred move (live only)

    def __str__(self) -> str:
        grp = f" in group {list(self.group)}" if self.group else ""
        return f"t={self.time:.1f} s: {self.kind} job {self.job}{grp}"


def live_decisions(events: Iterable, jobs: Iterable) -> list[Step]:
    """``events``: the coordinator's event log; ``jobs``: its ``ClusterJobInfo`` records (their
    submit times give the indices and the time origin, as the export does)."""
    order = sorted(jobs, key=lambda j: (j.submit_time, j.id))
    index = {j.id: i for i, j in enumerate(order)}
    t0 = order[0].submit_time if order else 0.0
    events = list(events)
    deferred = [(e.job, e.time) for e in events if e.kind == "deferred"]  # logged right after the decision
    out = []
    for e in events:  # (each member's start or regroup names its group: `group` events add nothing)
        kind = _LIVE.get(e.kind)
        if kind is None or e.job not in index:
            continue
        grp = e.detail.get("group") or ()
        members = tuple(sorted(index[m] for m in grp if m in index)) if len(grp) > 1 else ()
        moved = kind == "preempt" and any(j == e.job and 0.0 <= t - e.time <= 1.0 for j, t in deferred)
        out.append(Step(round(e.time - t0, 3), kind, index[e.job], members, moved))
    return out


def sim_decisions(log: Iterable[tuple]) -> list[Step]:
    """``log``: what :class:`~elastictrain.sim.engine.Simulator` appended to its ``decisions``."""
    return [Step(round(t, 3), kind, int(job), tuple(sorted(group)) if len(group) > 1 else ())
            for t, kind, job, group in log]


def normalize(steps: list[Step], tolerance: float) -> list[Step]:
    """Fold a job's preempt followed within ``tolerance`` by its start (a deferred move) into
    one restart; drop finishes (they are outcomes, not decisions)."""
    out: list[Step] = []
    pending: dict[int, int] = {}  # job -> index in out of its latest preempt
    for s in steps:
        if s.kind == "finish":
            continue
        i = pending.pop(s.job, None)
        if s.kind == "start" and i is not None and s.time - out[i].time <= tolerance:
            prev = out[i]
            out[i] = Step(prev.time, "regroup" if s.group or _group_before(out[:i], s.job) else "migrate", s.job,
                          s.group)
            continue
        if s.kind == "preempt" and s.deferred:
            pending[s.job] = len(out)
        out.append(s)
    return out


def _group_before(steps: list[Step], job: int) -> bool:
    for s in reversed(steps):
        if s.job == job:
            return bool(s.group)
    return False


def compare(live: list[Step], sim: list[Step], tolerance: float) -> Optional[str]:
    """None when, for every job, the live and simulated decisions are the same kinds with the
    same groups in the same order, each within ``tolerance`` seconds; else the first divergence
    (the earliest decision, on either side, that has no counterpart)."""
    live, sim = normalize(live, tolerance), normalize(sim, tolerance)
    by_job: dict[int, tuple[list, list]] = {}
    for s in live:
        by_job.setdefault(s.job, ([], []))[0].append(s)
    for s in sim:
        by_job.setdefault(s.job, ([], []))[1].append(s)
    first: Optional[tuple[float, str]] = None
    for job, (a, b) in sorted(by_job.items()):
        for k in range(max(len(a), len(b))):
            x = a[k] if k < len(a) else None
            y = b[k] if k < len(b) else None
            same = x is not None and y is not None and (x.kind, x.group) == (_kind(y, x), y.group) \
                and abs(x.time - y.time) <= tolerance
            if not same:
                t = min(s.time for s in (x, y) if s is not None)
                why = (f"job {job}, its decision #{k + 1}: live {x or 'none'}; simulated {y or 'none'} "
                       f"(tolerance {tolerance:g} s)")
                if first is None or t < first[0]:
                    first = (t, why)
                break
    return None if first is None else first[1]


def _kind(sim: Step, live: Step) -> str:
    """A restart's kind as the live side names it (a regroup and a migration of a grouped job
    are one decision: the group restarts elsewhere)."""
    if sim.kind in _RESTARTS and live.kind in _RESTARTS and sim.group == live.group:
        return live.kind
    return sim.kind
