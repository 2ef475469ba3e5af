"""How long the event log and ended jobs' output are kept (``coordinator --retain 90d``).

Without it they are kept forever, as Slurm's accounting database keeps what it has unless told to
purge (``PurgeEventAfter``): each job's output is capped (``LOG_CAP``), but every job that ever ran
keeps its share, and the event log grows by every decision. With ``--retain``, once an hour (and a
minute after the start):

* events older than that are deleted, but never one that a reader still needs: the newest (a
  restarted coordinator numbers its next events after it), nor one after the cursor of the spans
  of GPU time (``gpu_time.py``) or of the notifications not sent yet (``notify.py``);
* the output of jobs that ended longer ago than that is deleted.

What stays: every job's record (``status``, ``history``, ``sacct``-style accounting) and the spans
of GPU time (``history --by user -S``: compact, one row per placement), as Slurm keeps its usage
rollups after purging events. Deleting is done in batches (``BATCH`` events, ``JOBS`` jobs' output
per transaction): a first pass over years of history does not hold the loop up; the next batch
follows at the next tick.

Events are deleted by sequence number below the first one newer than the cutoff (found by
bisection on the primary key: events are numbered in the order they happen), so no index on time
is needed.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Optional

__all__ = ["Retention", "EVERY", "MIN_RETAIN", "MAX_RETAIN"]

log = logging.getLogger("elastictrain.coordinator")
EVERY = 3600.0  # seconds between passes once caught up
FIRST = 60.0  # seconds after the start before the first pass
BATCH = 20_000  # events deleted per transaction
JOBS = 100  # jobs' output deleted per transaction
MIN_RETAIN, MAX_RETAIN = 60.0, 100 * 365 * 86400.0


class Retention:
    """Deletes what ``retain`` seconds made old (see the module docstring); ``due`` says when next."""

    def __init__(self, store, retain: float, now: float) -> None:
        self.store, self.retain = store, retain
        self.due = now + FIRST
        self.events_deleted = self.logs_deleted = 0  # since this process started (GET /metrics)

    def run(self, now: float, keep_from: int, ended_logs: Callable[[float], Iterable[str]],
            forget_logs: Callable[[str], None]) -> int:
        """One pass (one batch of each). ``keep_from``: the oldest event a reader still needs (its
        sequence number); ``ended_logs(cutoff)``: the jobs with output kept that ended before
        ``cutoff``; ``forget_logs(job)``: called for each whose output was deleted. Returns the
        number the events were deleted below (0: none were)."""
        cutoff = now - self.retain
        more = False
        below = self._events_below(cutoff, keep_from)
        upto = 0
        if below is not None:
            lo, end = below
            upto = min(end, lo + BATCH)
            with self.store.transaction() as tx:
                tx.delete_events_below(upto)
            self.events_deleted += upto - lo  # (at most: numbers that were never written are not rows)
            more = upto < end
        jobs = []
        for job in ended_logs(cutoff):
            if len(jobs) == JOBS:
                more = True
                break
            jobs.append(job)
        if jobs:
            with self.store.transaction() as tx:
                for job in jobs:
                    tx.delete_logs(job)
            for job in jobs:
                forget_logs(job)
            self.logs_deleted += len(jobs)
        if upto or jobs:
            log.info("retention (--retain %.0f s): deleted the events before #%d and the output of %d job(s) "
                     "that ended before %.0f", self.retain, upto, len(jobs), cutoff)
        self.due = now + (1.0 if more else EVERY)
        return upto

    def _events_below(self, cutoff: float, keep_from: int) -> Optional[tuple[int, int]]:
        """(the oldest event's number, the first number not to delete), or None: nothing to delete."""
        first = self.store.event_at(0)
        if first is None or first[1] >= cutoff:
            return None
        newest = self.store.newest_event()
        limit = min(keep_from, newest)  # never the newest, nor one a reader still needs
        lo, hi = first[0], limit  # bisect: the first event at or after the cutoff (else limit)
        while lo < hi:
            mid = (lo + hi) // 2
            row = self.store.event_at(mid)
            if row is None or row[0] >= hi:  # none in [mid, hi): below mid is below hi
                hi = mid
            elif row[1] < cutoff:
                lo = row[0] + 1
            else:
                hi = row[0]
        return (first[0], lo) if lo > first[0] else None
