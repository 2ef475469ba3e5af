"""Workers' stage and communication profiles, kept per job and worker (the latest report wins).

Workers send a :class:`~elastictrain.wire.ProfileReport` after their warm-up window
(``elastictrain profile`` runs, or ``Job.report_profile``); policies read them back (Muri
groups jobs by stage profile, placement compares the comm skew with PACKLIMIT). Reports are
validated here, so a policy never sees a negative time or an unknown stage type, and each is
written to the store before the reply.
"""

from __future__ import annotations

import math
from typing import Optional

import msgspec

from ..clock import Clock
from ..errors import BadRequestError
from ..runtime.stages import STAGES as STAGE_TYPES
from ..wire import ProfileList, ProfileReport
from .membership import Membership
from .store import ProfileRow, Store

__all__ = ["ProfileBook", "STAGE_TYPES"]

_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(ProfileReport)


def _check(value: float, what: str, upper: Optional[float] = None) -> None:
    if not math.isfinite(value) or value < 0 or (upper is not None and value > upper):
        bound = f" and <= {upper}" if upper is not None else ""
        raise BadRequestError(f"{what} must be a finite number >= 0{bound}, got {value!r}")


def validate(report: ProfileReport) -> int:
    """Check a report; return its worker.

    Raises:
        BadRequestError: nothing in it, workers disagree, or a field is out of range.
    """
    st, cm = report.stage, report.comm
    if st is None and cm is None:
        raise BadRequestError("a profile report needs a 'stage' or a 'comm' profile (or both)")
    if st is not None and cm is not None and st.worker != cm.worker:
        raise BadRequestError(f"stage profile is for worker {st.worker} but comm profile for worker {cm.worker}; "
                              "send one report per worker")
    worker = st.worker if st is not None else cm.worker
    if not 0 <= worker < 65536:
        raise BadRequestError(f"worker must be in [0, 65536), got {worker}")
    if st is not None:
        if st.iterations < 1 or st.warmup < 0:
            raise BadRequestError(f"stage profile needs iterations >= 1 and warmup >= 0, got "
                                  f"{st.iterations} and {st.warmup}")
        _check(st.iteration_seconds, "stage iteration_seconds")
        unknown = sorted(set(st.stages) - set(STAGE_TYPES))
        if unknown:
            raise BadRequestError(f"unknown stage type(s) {unknown}; use {', '.join(STAGE_TYPES)}")
        for name, sec in st.stages.items():
            _check(sec, f"stage seconds of {name!r}")
    if cm is not None:
        if cm.iterations < 0 or cm.tensor_count < 0 or cm.total_bytes < 0 or cm.largest_bytes < 0:
            raise BadRequestError("comm profile counts (iterations, tensor_count, total_bytes, largest_bytes) "
                                  "must be >= 0")
        if cm.largest_bytes > cm.total_bytes:
            raise BadRequestError(f"comm largest_bytes {cm.largest_bytes} exceeds total_bytes {cm.total_bytes}")
        for name in ("collectives_per_iteration", "bytes_per_iteration", "seconds_per_collective",
                     "seconds_per_iteration"):
            _check(getattr(cm, name), f"comm {name}")
        _check(cm.skew, "comm skew", 1.0)
        if any(n < 0 for n in cm.size_histogram.values()):
            raise BadRequestError("comm size_histogram counts must be >= 0")
    return worker


class ProfileBook:
    """The latest profile report of each worker of each job, durable in the store."""

    def __init__(self, store: Store, members: Membership, clock: Clock, rows: list[ProfileRow]) -> None:
        self._store, self._members, self._clock = store, members, clock
        self._by_job: dict[str, dict[int, ProfileReport]] = {}
        for r in rows:
            self._by_job.setdefault(r.job, {})[r.worker] = _DEC.decode(r.report)

    def put(self, job: str, report: ProfileReport) -> ProfileList:
        self._members.get(job)  # 404 for an unknown job
        worker = validate(report)
        with self._store.transaction() as tx:
            tx.put_profile(ProfileRow(job, worker, _ENC.encode(report), self._clock.now()))
        self._by_job.setdefault(job, {})[worker] = report
        return self.list(job)

    def reports(self, job: str) -> list[ProfileReport]:
        """The job's latest reports, one per worker (none for an unknown job)."""
        reports = self._by_job.get(job, {})
        return [reports[w] for w in sorted(reports)]

    def list(self, job: str) -> ProfileList:
        self._members.get(job)
        reports = self._by_job.get(job, {})
        return ProfileList(job, [reports[w] for w in sorted(reports)])
