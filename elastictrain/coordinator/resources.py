"""Every worker's resource use, as its monitor reports it: the latest sample and a short history
per worker, in memory (a restarted coordinator starts empty; the workers keep reporting).

The list shows the workers of the job's current generation only: a rank that has not reported
since the generation changed (a worker of an old run, a rank gone after a shrink) is left out
until it reports again, rather than shown with its old figures as if current."""

from __future__ import annotations

from collections import deque
from operator import attrgetter

from ..errors import BadRequestError
from ..wire import ResourceList, ResourceReport, ResourceSample, WorkerResources
from .membership import Membership

__all__ = ["ResourceBook", "HISTORY"]

HISTORY = 120  # samples kept per worker (10 minutes at the default 5 s period)
_MAX_WORKERS = 4096  # per job: a report from more distinct workers than this is refused
_T = attrgetter("t")  # a sample's time: what a worker's history is ordered by


class ResourceBook:
    def __init__(self, members: Membership) -> None:
        self._m = members
        self._jobs: dict[str, dict[int, deque[ResourceSample]]] = {}
        self._peak: dict[str, float] = {}  # job -> the largest RSS any worker of it reported
        self._gen: dict[str, dict[int, int]] = {}  # job -> worker -> the generation of its last report

    def put(self, job: str, req: ResourceReport) -> None:
        row = self._m.get(job)  # NotFoundError for an unknown job
        workers = self._jobs.setdefault(job, {})
        if req.worker not in workers and len(workers) >= _MAX_WORKERS:
            raise BadRequestError(f"job {job!r} already has resource reports from {_MAX_WORKERS} workers")
        hist = workers.setdefault(req.worker, deque(maxlen=HISTORY))
        new = sorted(req.samples, key=_T)
        if hist and new and new[0].t < hist[-1].t:  # an older batch came after a newer one (its send was slow)
            merged = sorted([*hist, *new], key=_T)[-HISTORY:]
            hist.clear()
            hist.extend(merged)
        else:
            hist.extend(new)
        self._gen.setdefault(job, {})[req.worker] = row.generation
        top = max((s.rss_bytes for s in req.samples), default=0.0)
        if top > self._peak.get(job, 0.0):
            self._peak[job] = top

    def peak(self, job: str) -> float:
        """The largest resident memory (bytes) one worker of ``job`` has reported (0: none yet)."""
        return self._peak.get(job, 0.0)

    def list(self, job: str) -> ResourceList:
        now = self._m.get(job).generation
        workers, gen = self._jobs.get(job, {}), self._gen.get(job, {})
        return ResourceList(job, [WorkerResources(w, h[-1], len(h)) for w, h in sorted(workers.items())
                                  if h and gen.get(w) == now])

    def history(self, job: str, worker: int) -> list[ResourceSample]:
        return list(self._jobs.get(job, {}).get(worker, ()))
