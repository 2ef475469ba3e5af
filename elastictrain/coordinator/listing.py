"""Which jobs a listing carries (``GET /v1/cluster``, ``/v1/cluster/jobs``; squeue's habit, which
forgets a job soon after it ends): every job that has not ended, and of the ended ones the N that
ended last, in submission order.

A coordinator keeps every job's record, so a long history makes a listing of them all big, and
the event loop answers no other client (a worker's shard lease, a node's poll) while it is built.
:class:`JobIndex` keeps the jobs not ended and the ended ones apart, each in its order, as records
are added and written, so that the common listing reads the jobs not ended and the N it shows, not
the whole history. A filtered listing (:class:`JobFilter`: squeue's ``-u``/``-t``/``-A``/``-n``,
an array's tasks, a period of submission) reads every record but builds the reply of the jobs it
matches only, and its ``ended`` counts the ended jobs it matches: ``status -u alice`` shows her
last ten, not the last ten of everyone.

A listing comes in pages where it is asked for them (``limit=N``, then ``after=`` the ``next``
job the previous page named: Kubernetes' ``limit``/``continue``), so that a history of 100,000
jobs (``history``, ``status --all``) holds the loop up for one page at a time. The pages are cut
from the same order (submission order; at a restart, the records are loaded in it): a job is
never listed twice, one that ends meanwhile is listed where it stands, and one submitted
meanwhile comes last.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import islice
from operator import attrgetter
from typing import Callable, Iterable, Optional

import msgspec

from .live import ENDED_NAMES, JobRecord
from .records import Cold, JobRecords

__all__ = ["JobIndex", "JobFilter", "LIST_ENDED", "MAX_PAGE", "cut"]

#: ended jobs a listing shows unless it asks for another count (``ended=N``; ``all``: every one)
LIST_ENDED = 1000
#: the most jobs one page may ask for (``limit=N``)
MAX_PAGE = 100_000


class JobFilter(msgspec.Struct, frozen=True):
    """Which jobs a listing carries; each field left empty matches every job: ``array`` (only
    that job array's tasks), ``since``/``until`` (submitted in that period), and ``users``,
    ``states``, ``projects``, ``names`` (any of them)."""

    array: str = ""
    since: Optional[float] = None
    until: Optional[float] = None
    users: frozenset = frozenset()
    states: frozenset = frozenset()
    projects: frozenset = frozenset()
    names: frozenset = frozenset()

    def __bool__(self) -> bool:
        return bool(self.array or self.since is not None or self.until is not None or self.users or self.states
                    or self.projects or self.names)


ALL = JobFilter()
_ID = attrgetter("id")


def cut(items: list, limit: Optional[int], name: Callable = str) -> tuple[list, str]:
    """A page of a listing already past its ``after``: at most ``limit`` of ``items`` (None: all),
    and the ``name`` of the last one taken where more are left, which the next page follows ("")."""
    if limit is not None and len(items) > limit:
        return items[:limit], name(items[limit - 1])
    return items, ""


class JobIndex:
    """The scheduler's records (``records``: :class:`JobRecords`, in submission order, the older
    ended ones packed), split into the jobs not ended, in submission order, and the ended ones, in
    the order their ends were written (:meth:`wrote`; at a restart, by end time). A listing reads
    the packed ones as they are (what it filters on is in them) and hands them on so.

    It also keeps what the ended jobs add up to (:attr:`ended_states`, :meth:`ended_usage`,
    :meth:`ended_project_usage`), so that what the coordinator does every few seconds or at every
    scrape (the users' usage samples, ``/metrics``, the users' and projects' reports) reads the
    jobs not ended (:meth:`open`) and those sums, not the whole history."""

    def __init__(self, records: JobRecords) -> None:
        self.records = records
        self._order: dict[str, int] = {}  # job -> its place in ``records``
        self._open: dict[str, None] = {}
        done = []
        for rec in records.peek():
            self._order[rec.id] = len(self._order)
            if rec.status in ENDED_NAMES:
                done.append(rec)
            else:
                self._open[rec.id] = None
        done.sort(key=self._end_key)
        # ended job -> (its state, its GPU-seconds) as the sums below count it
        self._ended: dict[str, tuple[str, float]] = {}
        self.ended_states: dict[str, int] = {}  # ended jobs by state
        self._gpu_user: dict[str, float] = {}  # the ended jobs' GPU-seconds by user ...
        self._gpu_project: dict[str, float] = {}  # ... and by project
        for rec in done:
            self._count(rec)

    def _end_key(self, rec: JobRecord | Cold) -> tuple:
        return (rec.end_time or 0.0, self._order[rec.id])

    def _count(self, rec: JobRecord | Cold) -> None:
        """``rec`` ended: last in the ended order, and in the sums."""
        self._ended[rec.id] = counted = (rec.status, rec.attained_gpu)
        self._add(rec, counted, 1)

    def _add(self, rec: JobRecord | Cold, counted: tuple[str, float], sign: int) -> None:
        status, gpu = counted
        self.ended_states[status] = self.ended_states.get(status, 0) + sign
        self._gpu_user[rec.user] = self._gpu_user.get(rec.user, 0.0) + sign * gpu
        if rec.project:
            self._gpu_project[rec.project] = self._gpu_project.get(rec.project, 0.0) + sign * gpu

    def added(self, rec: JobRecord) -> None:
        """``rec`` was just added to the records (a submission)."""
        self._order[rec.id] = len(self._order)
        self._open[rec.id] = None

    def wrote(self, recs: Iterable[JobRecord]) -> list[JobRecord]:
        """``recs`` were written as they are now: those that ended move to the ended jobs (those
        that ended together by end time). Returns those."""
        ended = []
        for rec in recs:
            if rec.status in ENDED_NAMES:
                if rec.id in self._open:
                    del self._open[rec.id]
                    ended.append(rec)
                else:
                    counted = self._ended.get(rec.id)
                    if counted is not None and counted != (rec.status, rec.attained_gpu):  # (kept exact)
                        self._add(rec, counted, -1)
                        self._ended[rec.id] = counted = (rec.status, rec.attained_gpu)
                        self._add(rec, counted, 1)
            elif rec.id in self._ended:  # requeued after it ended: not ended any more
                self._add(rec, self._ended.pop(rec.id), -1)
                self._open[rec.id] = None
                self._open = dict.fromkeys(sorted(self._open, key=self._order.__getitem__))  # (rare)
        ended.sort(key=self._end_key)
        for rec in ended:
            self._count(rec)
        return ended

    def open(self) -> list[JobRecord]:
        """The records of the jobs not ended, in submission order (a job that ended since its
        record was last written among them, with its state)."""
        records = self.records
        return [records[i] for i in self._open]

    def last_ended(self, n: int) -> list[str]:
        """The ``n`` jobs that ended last (of those written), in the order they ended."""
        return list(islice(reversed(self._ended), n))[::-1]

    def ended_usage(self) -> Iterable[tuple[str, float]]:
        """(user, GPU-seconds) of the ended jobs, a pair per user."""
        return self._gpu_user.items()

    def ended_project_usage(self) -> dict[str, float]:
        """The ended jobs' GPU-seconds by project."""
        return self._gpu_project

    def pick(self, ended: Optional[int] = LIST_ENDED, match: JobFilter = ALL) -> tuple[list[JobRecord | Cold], int]:
        """The records a listing carries, in submission order: every job not ended and the
        ``ended`` that ended last (None: all), or of those ``match`` matches, the same. Returns
        them, as kept (a packed one :class:`Cold`: ``records.full`` unpacks it), and how many
        ended jobs ``ended`` left out."""
        records = self.records
        if match:
            return self._scan(ended, match)
        if ended is None:
            return list(records.peek()), 0
        omitted = max(0, len(self._ended) - ended)
        # (a job that ended since the last write is still among the open ones: listed, not counted)
        ids = list(self._open) + list(islice(reversed(self._ended), ended))
        ids.sort(key=self._order.__getitem__)
        return [records.kept(i) for i in ids], omitted

    def page(self, recs: list, after: str = "", limit: Optional[int] = None) -> tuple[list, str]:
        """The part of listing ``recs`` (:meth:`pick`'s, in submission order) that follows job
        ``after`` ("": from the start), at most ``limit`` jobs (None: all); and the job the next
        page follows ("" where none is left).

        Raises:
            KeyError: ``after`` is no job here.
        """
        if after:
            order = self._order
            recs = recs[bisect_right(recs, order[after], key=lambda r: order[r.id]):]
        return cut(recs, limit, _ID)

    def _scan(self, ended: Optional[int], m: JobFilter) -> tuple[list[JobRecord | Cold], int]:
        # (one pass per filter given: each narrows the next, which is faster than one pass testing all)
        recs: Iterable[JobRecord | Cold] = self.records.peek()
        if m.array:
            recs = [r for r in recs if r.array == m.array]
        if m.since is not None or m.until is not None:
            lo = m.since if m.since is not None else float("-inf")
            hi = m.until if m.until is not None else float("inf")
            recs = [r for r in recs if lo <= r.submit_time < hi]
        if m.users:
            recs = [r for r in recs if r.user in m.users]
        if m.projects:
            recs = [r for r in recs if r.project in m.projects]
        if m.names:
            recs = [r for r in recs if r.name in m.names]
        if m.states:
            recs = [r for r in recs if r.status in m.states]
        recs = list(recs)
        if ended is None:
            return recs, 0
        # (ended and ranked as pick has them: in the ended order, one that ended since the last write not yet)
        finished = self._ended
        done = {r.id for r in recs if r.id in finished}
        if len(done) <= ended:
            return recs, 0
        keep = set(islice((i for i in reversed(finished) if i in done), ended))
        return [r for r in recs if r.id not in done or r.id in keep], len(done) - ended
