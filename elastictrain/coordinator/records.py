"""The scheduler's job records (job id -> record, in submission order), the ended ones packed.

A coordinator keeps every job's record, and a decoded record is about 2.3 KB of small objects
(69 fields: strings, floats, lists), which a long history of ended jobs multiplies: 100,000 jobs
would be 230 MB of them, every one walked by the garbage collector's full passes. :class:`JobRecords`
keeps the jobs not ended, and the :data:`HOT_ENDED` that ended last (what the common listing
shows), as records; every other ended job is a :class:`Cold` one: the fields a listing filters and
the index sums (user, project, name, state, array, times, GPU-seconds) and the rest packed as
msgpack values without their names (about 500 bytes in all, none of it tracked by the collector).

Reading a cold record by id (:meth:`JobRecords.get`: ``status JOB``, a notification, a change)
unpacks it and keeps it unpacked until the next :meth:`JobRecords.settle`, so a change to it is
never lost; :meth:`JobRecords.kept` and :meth:`JobRecords.peek` read one as kept, without
unpacking (a dependency's state, a job's owner, retention; what a listing filters), and
:meth:`JobRecords.full` unpacks one for reading only (what a listing's page shows).
Slurm drops a job from slurmctld's memory ``MinJobAge`` after it ends and answers ``sacct`` from
its database; these records stay in memory, packed, so every listing and lookup still answers
from memory without a query.
"""

from __future__ import annotations

from sys import intern
from typing import Iterable, Optional, Tuple, Union

import msgspec

from .live import ENDED_NAMES, JobRecord, submission_order

__all__ = ["Cold", "HOT_ENDED", "JobRecords"]

#: ended jobs kept unpacked, those that ended last (the 1000 a default listing shows among them)
HOT_ENDED = 1000


class Cold(msgspec.Struct, frozen=True, gc=False):
    """An ended job's record, packed: what listings filter on and the index sums, and the rest."""

    id: str
    seq: int
    user: str
    project: str
    name: str
    status: str
    array: str
    submit_time: float
    end_time: Optional[float]
    attained_gpu: float
    packed: bytes  # every field's value, in JobRecord's order (:func:`_pack`)


_ENC = msgspec.msgpack.Encoder()
# (the values as a typed tuple: a placement's pairs come back as tuples, as the record's decoder makes them)
_DEC = msgspec.msgpack.Decoder(Tuple[tuple(f.type for f in msgspec.structs.fields(JobRecord))])  # type: ignore
_astuple = msgspec.structs.astuple


def _pack(rec: JobRecord) -> Cold:
    # (a user, project, state or array is one string however many records name it: a decoded record has its own)
    return Cold(rec.id, rec.seq, intern(rec.user), intern(rec.project), rec.name, intern(rec.status),
                intern(rec.array), rec.submit_time, rec.end_time, rec.attained_gpu, _ENC.encode(_astuple(rec)))


def _unpack(cold: Cold) -> JobRecord:
    return JobRecord(*_DEC.decode(cold.packed))


class JobRecords:
    """Job id -> record, in the order added (submission order), ended jobs' records packed
    (module docstring). ``len``, ``in``, :meth:`keys`, :meth:`get` and ``[]`` are a dict's."""

    def __init__(self, keep: Optional[int] = None) -> None:
        self._d: dict[str, Union[JobRecord, Cold]] = {}
        self.keep = HOT_ENDED if keep is None else keep  # ended jobs kept unpacked
        self._hot: dict[str, None] = {}  # the ended jobs kept unpacked, in the order they ended
        self._warm: set[str] = set()  # cold ones unpacked since the last settle
        self._cold = 0  # how many are packed

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, job: object) -> bool:
        return job in self._d

    def keys(self):
        return self._d.keys()

    def __setitem__(self, job: str, rec: JobRecord) -> None:
        self._d[job] = rec

    def get(self, job: str, default=None) -> Optional[JobRecord]:
        """The record of ``job`` (unpacked, and kept so until the next :meth:`settle`)."""
        rec = self._d.get(job)
        if type(rec) is Cold:
            rec = self._d[job] = _unpack(rec)
            self._warm.add(job)
            self._cold -= 1
        return default if rec is None else rec

    def __getitem__(self, job: str) -> JobRecord:
        rec = self.get(job)
        if rec is None:
            raise KeyError(job)
        return rec

    def kept(self, job: str, default=None) -> Union[JobRecord, Cold, None]:
        """The record of ``job`` as kept (a :class:`Cold` one where it is packed), for reading what
        a cold one has (its user, state, end time...) without unpacking it."""
        return self._d.get(job, default)

    def peek(self) -> Iterable[Union[JobRecord, Cold]]:
        """Every record, in order, as kept: a :class:`Cold` one where it is packed (it has what a
        listing filters on; :meth:`full` gives the rest). For reading only."""
        return self._d.values()

    def full(self, rec: Union[JobRecord, Cold]) -> JobRecord:
        """``rec`` (from :meth:`peek`) unpacked, for reading: a cold record's copy, not kept."""
        return _unpack(rec) if type(rec) is Cold else rec  # type: ignore[arg-type]

    def packed(self) -> int:
        """How many records are packed."""
        return self._cold

    def settle(self, ended: Iterable[JobRecord]) -> None:
        """Pack what may be packed, right after a write (every change is written): ``ended``
        (records written just as they ended, in the order they ended) join the unpacked last ones,
        those beyond :attr:`keep` of them are packed, and so are the cold ones :meth:`get` unpacked
        meanwhile (a change to them written)."""
        hot, d = self._hot, self._d
        for rec in ended:
            hot.pop(rec.id, None)  # (one requeued and ended again is last again)
            hot[rec.id] = None
        while len(hot) > self.keep:
            job = next(iter(hot))
            del hot[job]
            self._warm.add(job)
        if self._warm:
            for job in self._warm:
                rec = d.get(job)
                if type(rec) is JobRecord and job not in hot and rec.status in ENDED_NAMES:
                    d[job] = _pack(rec)
                    self._cold += 1
            self._warm = set()

    def load(self, recs: Iterable[JobRecord]) -> None:
        """At a start: ``recs`` (as stored), every ended one packed as it comes, put in submission
        order (then :meth:`thaw` the last ones to end, which the index knows)."""
        kept = [_pack(rec) if rec.status in ENDED_NAMES else rec for rec in recs]
        kept.sort(key=submission_order)
        self._d = {rec.id: rec for rec in kept}  # (a record read twice, rewritten meanwhile: the later one)
        self._cold = sum(1 for rec in self._d.values() if type(rec) is Cold)

    def thaw(self, ended: Iterable[str]) -> None:
        """Unpack ``ended``, the :data:`HOT_ENDED` jobs that ended last, in the order they ended."""
        d, hot = self._d, self._hot
        for job in ended:
            rec = d[job]
            if type(rec) is Cold:
                d[job] = _unpack(rec)
                self._cold -= 1
            hot[job] = None
