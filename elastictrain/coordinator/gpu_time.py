"""GPU time per job within any period, kept as the event log is written (``history --by -S/-E``).

Each run's GPUs over time are spans (:mod:`elastictrain.usage`: from its ``start``/``resume`` or,
for *service*, from its first step, to the event that ends it). The event log folds every event it
writes into them in the same transaction (:meth:`GpuTime.fold`), and the store keeps them in its
``gpu_time`` table: a closed span as ``(job, service, from, to, GPUs)``, an open one with no end
(and, for service, a run placed whose first step has not come yet with no start either). A period's
GPU time then reads the spans that overlap it and the open ones (:meth:`GpuTime.within`), not the
whole log, as Slurm's ``sreport`` reads its rollups rather than every job record.

A database whose log was written before the table existed (or by a coordinator that did not fold)
is caught up once, when the coordinator starts: the events after the ``gpu_time_seq`` cursor are
folded then, a page at a time.
"""

from __future__ import annotations

import json
import math
from typing import Iterable, Optional

from ..usage import SPAN_KINDS, SpanFolder
from .store import EventRow, Store

__all__ = ["GpuTime", "CURSOR_META"]

CURSOR_META = "gpu_time_seq"  # the last event folded into the spans
_PAGE = 10_000  # events read at a time when catching up


class GpuTime:
    """Spans of GPU time, allocated (``service`` 0) and service (1), kept in ``store``."""

    def __init__(self, store: Store, meta: dict, last_event: int) -> None:
        self.store = store
        self.folders = (SpanFolder(service=False), SpanFolder(service=True))
        for job, service, t0, _, gpus, run in store.read_gpu_time(open_only=True):
            folder = self.folders[1 if service else 0]
            if t0 is None:
                folder.placed[job] = (run, gpus)
            else:
                folder.held[job] = (t0, gpus)
        self.cursor = int(meta.get(CURSOR_META, "0") or 0)
        while self.cursor < last_event:  # a log written before the spans were kept: once
            rows = store.read_events(self.cursor, _PAGE)
            if not rows:
                break
            with store.transaction() as tx:
                self.fold(tx, rows)

    def fold(self, tx, rows: Iterable[EventRow]) -> None:
        """Fold the events ``rows`` (in log order) into the spans, written with ``tx``: the spans they
        close, and each job's open span as it stands after them."""
        last = None
        changed: set = set()  # (job, service) whose open span changed
        for r in rows:
            last = r.seq
            if r.kind not in SPAN_KINDS or not r.job:
                continue
            detail = json.loads(r.detail) if r.detail else {}
            job = r.job
            for service, folder in enumerate(self.folders):
                if job in folder.held or job in folder.placed:
                    changed.add((job, service))
                closed = folder.fold(r.time, r.kind, job, detail)
                if closed is not None:
                    tx.add_gpu_span(job, service, closed[1], closed[2], closed[3], None)
                if job in folder.held or job in folder.placed:
                    changed.add((job, service))
        for job, service in changed:
            folder = self.folders[service]
            tx.clear_open_gpu_spans(job, service)
            if job in folder.held:
                t0, g = folder.held[job]
                tx.add_gpu_span(job, service, t0, None, g, None)
            elif job in folder.placed:
                run, g = folder.placed[job]
                tx.add_gpu_span(job, service, None, None, g, run)
        if last is not None and last > self.cursor:
            self.cursor = last
            tx.put_meta(CURSOR_META, str(last))

    def within(self, since: Optional[float], until: Optional[float], now: float) -> dict[str, list[float]]:
        """Job -> [allocated, service] GPU-seconds that fell within ``[since, until)`` (None: from the
        first event; to ``now``); a span still open ends at ``now``."""
        lo = -math.inf if since is None else since
        hi = now if until is None else min(until, now)
        out: dict[str, list[float]] = {}
        if hi <= lo:
            return out
        for job, service, t0, t1, gpus, _ in self.store.read_gpu_time(since, hi):
            if t0 is None:
                continue  # (placed, not training yet)
            overlap = min(now if t1 is None else t1, hi) - max(t0, lo)
            if overlap > 0:
                out.setdefault(job, [0.0, 0.0])[1 if service else 0] += overlap * gpus
        return out
