"""Admission in cluster mode: when a submitted job enters the job table the policy decides on.

A job may be queued long before it may run. It stays outside the table (so no policy sees it,
and nothing needs to change in the policies) while it is on hold (``submit --hold``,
``elastictrain hold``), before its begin time (``submit --begin``), while a job it runs after
has not ended as asked (``--after JOB`` waits for a finish, ``JOB:notok`` for a failure or a
cancellation, ``JOB:any`` for any end; a job array's id stands for all its tasks), while its job
array has ``%N`` tasks admitted, and while its user's admitted jobs leave no room in the user's
quota (quotas.py) or its project's in the project's (projects.py). It is admitted in
priority, then submission order, and the policy sees it arrive. A job whose ``--after JOB`` can
never be met (JOB failed or was cancelled) is cancelled here, saying why.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..model import check_name
from .live import ENDED_NAMES as _ENDED_NAMES
from .live import JobRecord

if TYPE_CHECKING:
    from .scheduler import ClusterScheduler

__all__ = ["Admission"]


class Admission:
    """The jobs not admitted yet (``waiting``, by id) and the rules that let them in."""

    def __init__(self, sched: "ClusterScheduler") -> None:
        self.s = sched
        self.waiting: dict[str, JobRecord] = {}
        self.used: dict[str, list[int]] = {}  # user -> [GPUs, jobs] its admitted jobs count (the last admit())
        self.pused: dict[str, list[int]] = {}  # project -> the same (the last admit(), with project limits)
        self.arrays: dict[str, int] = {}  # job array -> its tasks admitted (the last admit())
        self.borrowers: set[str] = set()  # admitted over their users' quotas (--quota-borrow)

    def dependencies(self, after: list[str]) -> list[str]:
        """``--after`` as "JOB:ok"/"JOB:notok"/"JOB:any", each a known scheduled job that can still satisfy it
        (a job array's id: each of its tasks).

        Raises:
            ConfigError: a bad entry, an unknown job, or one that already ended without finishing.
        """
        records = self.s.records
        out: list[str] = []
        for item in after:
            if item == "singleton":  # Slurm's --dependency=singleton: one job of this name and user at a time
                if item not in out:
                    out.append(item)
                continue
            job, _, kind = item.partition(":")
            check_name("job", job)
            kind = kind or "ok"
            if kind not in ("ok", "any", "notok"):
                raise ConfigError(f"--after {item!r}: write JOB (it must finish first), JOB:any (it must end, "
                                  "however) or JOB:notok (it must fail or be cancelled)")
            dep = records.kept(job)  # (its state: an old one is read packed, not unpacked)
            tasks = [r.id for r in records.peek() if r.array == job] if dep is None else []
            if tasks:  # a job array: every task of it (Slurm's dependency on an array)
                out += [t for t in self.dependencies([f"{t}:{kind}" for t in tasks]) if t not in out]
                continue
            if dep is None:
                raise ConfigError(f"--after {item!r}: no scheduled job {job!r} (`elastictrain status` lists them)")
            if kind == "ok" and dep.status in _ENDED_NAMES and dep.status != "finished":
                raise ConfigError(f"--after {item!r}: job {job} already {dep.status}, so it will never finish; use "
                                  f"{job}:any to wait for it to end however")
            if kind == "notok" and dep.status == "finished":
                raise ConfigError(f"--after {item!r}: job {job} already finished, so it will never fail; use "
                                  f"{job}:any to wait for it to end however")
            if f"{job}:{kind}" not in out:
                out.append(f"{job}:{kind}")
        return out

    def waits_for(self, rec: JobRecord) -> tuple[list[str], str]:
        """The jobs ``rec`` still waits for, and why it never can run ("" while it can)."""
        left = []
        for item in rec.after:
            if item == "singleton":  # every earlier job of its name and user that has not ended
                me, order = _single(rec), _order(rec)
                left += [k for k, r in self._alive() if _order(r) < order and _single(r) == me and k not in left]
                continue
            job, _, kind = item.partition(":")
            dep = self.s.records.kept(job)  # (its state: an old one is read packed, not unpacked)
            status = dep.status if dep is not None else "cancelled"
            ended = status in _ENDED_NAMES
            if ended and (kind == "any" or (status == "finished") == (kind == "ok")):
                continue
            if ended:
                how = f"--after {job}:notok" if kind == "notok" else f"--after {job}"
                return left, (f"job {job}, which it runs after ({how}), {status}, so it never can "
                              f"(Slurm's DependencyNeverSatisfied); submit it again, with --after {job}:any to run "
                              "after an end of any kind")
            left.append(job)
        return left, ""

    def _alive(self):
        """(id, record) of every job not ended: admitted (in the job table) or waiting here."""
        for e in self.s.table.entries():
            yield e.key, e.data["job"]
        yield from self.waiting.items()

    def usage(self) -> dict[str, list[int]]:
        """Each user's admitted jobs (in the job table): [GPUs they count (their --gpus), jobs]."""
        return self._count(lambda e: e.user)

    def project_usage(self) -> dict[str, list[int]]:
        """The same for each project, its sub-projects' jobs included."""
        used: dict[str, list[int]] = {}
        for project, (g, n) in self._count(lambda e: e.data["job"].project).items():
            self.s.projects.count(used, project, g, n)
        return used

    def _count(self, key_of) -> dict[str, list[int]]:
        used: dict[str, list[int]] = {}
        for e in self.s.table.entries():
            k = key_of(e)
            if k and e.key not in self.borrowers:  # (a borrower is over the quota: it does not count against it)
                u = used.setdefault(k, [0, 0])
                u[0] += e.max_gpu
                u[1] += 1
        return used

    def quota_why(self, rec: JobRecord) -> str:
        """Why ``rec`` waits for a quota: its user's, its project's, or both."""
        mine = self.s.quotas.why(rec, self.used)
        theirs = self.s.projects.why(rec, self.pused) if rec.project else ""
        if not theirs:
            return mine
        g, n = self.used.get(rec.user, (0, 0))
        if self.s.quotas.of(rec.user).fits(g, n, rec.gpus):  # only the project's is full
            return theirs
        return f"{mine}; and {theirs[0].lower()}{theirs[1:]}"

    def array_admitted(self) -> dict[str, int]:
        """Each job array's tasks in the job table (admitted, not ended)."""
        out: dict[str, int] = {}
        for e in self.s.table.entries():
            a = e.data["job"].array
            if a:
                out[a] = out.get(a, 0) + 1
        return out

    def admit(self, submitted: tuple = ()) -> None:
        """Admit the waiting jobs that may run now: they enter the job table, where the policy sees
        them arrive. ``submitted``: jobs just submitted (admitted at once, or an event says they
        wait for the quota)."""
        s, quotas = self.s, self.s.quotas
        used = self.usage() if quotas.own or quotas.default.limited else {}  # (no quota anywhere: nothing to count)
        projects = s.projects if s.projects.limited else None
        pused = self.project_usage() if projects is not None else {}
        if self.borrowers:
            self._within_quota(used, projects, pused)
        now = s.clock.now()
        ready = []
        for rec in list(self.waiting.values()):
            left, never = self.waits_for(rec) if rec.after else ((), "")
            if never:  # its dependency can no longer be met: it ends here, saying why
                del self.waiting[rec.id]
                rec.reason = never
                s.backend.cancel(rec)
                s._dirty.add(rec.id)
            elif not rec.hold and not left and rec.begin <= now:
                ready.append(rec)
        arrays = self.array_admitted() if any(r.array_limit for r in self.waiting.values()) else {}
        if any(r.array_limit for r in ready):  # an array's %N: at most N of its tasks admitted at once
            taken, kept = dict(arrays), []
            for rec in ready:
                if rec.array_limit and taken.get(rec.array, 0) >= rec.array_limit:
                    continue
                taken[rec.array] = taken.get(rec.array, 0) + 1
                kept.append(rec)
            ready = kept
        admitted = quotas.admit(ready, used, projects, pused) if ready else []
        if s.cfg.quota_borrow and len(admitted) < len(ready):  # over the quota: admitted anyway, preempted first
            within = {rec.id for rec in admitted}
            for rec in ready:
                rec.borrowing = rec.id not in within
                if rec.borrowing:
                    self.borrowers.add(rec.id)
                    s._emit("borrow", rec.id, "", user=rec.user, quota=quotas.of(rec.user).text())
            admitted = ready
        for rec in admitted:
            del self.waiting[rec.id]
            rec.admitted = True
            s.table.add(s._entry(rec))
            s._dirty.add(rec.id)
            if rec.array:
                arrays[rec.array] = arrays.get(rec.array, 0) + 1
            if rec.id not in submitted:
                s._emit("admitted", rec.id, "", user=rec.user, waited=round(now - rec.submit_time, 1))
        self.used, self.pused, self.arrays = used, pused, arrays
        for rec in ready:  # free to run but for the quota: a job just submitted says so
            if rec.id in submitted and rec.id in self.waiting:
                s._emit("quota_wait", rec.id, "", user=rec.user, why=self.quota_why(rec))

    def _within_quota(self, used: dict[str, list[int]], projects, pused: dict[str, list[int]]) -> None:
        """Borrowing jobs whose user's quota has room now count against it (by priority, then
        submission): they leave the borrowers' tier, and the policy sees their priority again."""
        s = self.s
        records = [s.records[k] for k in list(self.borrowers) if k in s.records]
        for rec in sorted(records, key=lambda r: (-r.priority, r.seq)):
            e = s.table.get(rec.id)
            if e is None or not rec.borrowing:  # ended, or held (it is admitted afresh when released)
                self.borrowers.discard(rec.id)
                rec.borrowing = False
                s._dirty.add(rec.id)
                continue
            if s.quotas.fit(rec, used, projects, pused):
                self.borrowers.discard(rec.id)
                rec.borrowing = False
                e.priority = s.tier_of(rec)
                s.table.touch(rec.id)
                s._dirty.add(rec.id)
                s._emit("within_quota", rec.id, "", user=rec.user)
        self.borrowers &= {k for k in self.borrowers if k in s.records}

    def array_full(self, rec: JobRecord) -> bool:
        return bool(rec.array_limit) and self.arrays.get(rec.array, 0) >= rec.array_limit

    def waiting_on(self, rec: JobRecord) -> tuple[str, list]:
        """What a job not admitted waits for first: hold, begin, dependency, array (its %N) or quota;
        and, for a dependency, the jobs it still waits for."""
        if rec.hold:
            return "hold", []
        if rec.begin > self.s.clock.now():
            return "begin", []
        left = self.waits_for(rec)[0] if rec.after else []
        if left:
            return "dependency", left
        return ("array" if self.array_full(rec) else "quota"), []

    def why(self, rec: JobRecord) -> str:
        """Why a job not admitted waits (squeue's reason)."""
        reason, left = self.waiting_on(rec)
        if reason == "hold":
            return f"on hold: `elastictrain release {rec.id}` lets it run"
        if reason == "begin":
            now = self.s.clock.now()
            when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(rec.begin))
            return f"waiting for its begin time (--begin): {when}, in {rec.begin - now:.0f} s"
        if left:
            what = "finish" if all(f"{j}:ok" in rec.after for j in left) else \
                "fail" if all(f"{j}:notok" in rec.after for j in left) else "end"
            single = f"; singleton: one job named {_single(rec)[1]} of user {rec.user} at a time" \
                if "singleton" in rec.after else ""
            return f"waiting for job{'s' if len(left) > 1 else ''} {', '.join(left)} to {what} (--after{single})"
        if reason == "array":
            return (f"waiting: array {rec.array} runs at most {rec.array_limit} tasks at once (--array ...%"
                    f"{rec.array_limit})")
        return self.quota_why(rec)


def _single(rec: JobRecord) -> tuple[str, str]:
    """What ``--after singleton`` matches: the user and the job's name, an array's task going by its
    array's name (``NAME``, not ``NAME_3``), so an array's tasks run one at a time, as in Slurm."""
    return rec.user, rec.name.rsplit("_", 1)[0] if rec.array else rec.name


def _order(rec: JobRecord) -> tuple[int, int]:
    """Submission order: an array's tasks share their submission, and go by task index."""
    return rec.seq, int(rec.id.rsplit("_", 1)[1]) if rec.array else -1
