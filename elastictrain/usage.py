"""GPU time from the coordinator's event log: each run's GPUs over time, and their sum within a
window of time (Slurm's ``sreport``, which counts the usage that falls within its period, whatever
the jobs' submit times).

A run holds its placement's GPUs from its ``start``/``resume`` to the event that ends it
(``preempted``, ``finish``, ``requeue``, ``fail``, ``cancel``); a ``resize``, ``migrate`` or
``regroup`` (a restart of the run elsewhere, at another size or in another group) ends one span and
begins another with the new placement. *Allocated* time counts from the start; *service*
(``service=True``) from the run's first training step (its ``first_step`` event), as the
coordinator's own GPU-hours (``attained_gpu``) count it: a run's start-up is not service.
"""

from __future__ import annotations

from typing import Iterable, Optional

__all__ = ["all_events", "gpu_spans", "within", "SpanFolder", "SPAN_KINDS"]

_STARTS = ("start", "resume")
_RESTARTS = ("resize", "migrate", "regroup")  # (their event names the run they end: the next one starts)
_RUN_ENDS = ("preempted", "finish", "requeue", "fail", "cancel")


def all_events(client) -> list:
    """The coordinator's whole event log, page by page (``client``: a CoordinatorClient)."""
    events, after = [], 0
    while True:
        page = client.events(after)
        events.extend(page.events)
        if not page.events or page.next <= after:
            return events
        after = page.next


class SpanFolder:
    """Folds event records, one at a time and in log order, into spans of GPUs (see the module
    docstring; ``service``: from each run's first step). What it holds between events is each job's
    open span (``held``: job -> (since, GPUs)) and, for service, each run placed whose first step has
    not come yet (``placed``: job -> (run, GPUs)): the coordinator keeps both in its store
    (:mod:`.coordinator.gpu_time`), so that it never reads the log again."""

    def __init__(self, service: bool = False) -> None:
        self.service = service
        self.held: dict[str, tuple[float, int]] = {}
        self.placed: dict[str, tuple[Optional[int], int]] = {}

    def fold(self, time: float, kind: str, job: str, detail: dict) -> Optional[tuple[str, float, float, int]]:
        """Fold one event; returns the span it closes ``(job, from, to, GPUs)``, or None."""
        begins = kind in _STARTS or kind in _RESTARTS
        closed = None
        if begins or kind in _RUN_ENDS:
            if job in self.held:
                t0, g = self.held.pop(job)
                closed = (job, t0, time, g)
            self.placed.pop(job, None)
        if begins:
            gpus = sum(int(g) for _, g in detail.get("placement") or ())
            if gpus > 0:
                if self.service:
                    run = detail.get("run")
                    self.placed[job] = (run + 1 if kind in _RESTARTS and isinstance(run, int) else run, gpus)
                else:
                    self.held[job] = (time, gpus)
        elif kind == "first_step" and job in self.placed:
            run, gpus = self.placed[job]
            if run is None or detail.get("run") in (None, run):  # (not an older run's worker, still stopping)
                del self.placed[job]
                self.held[job] = (time, gpus)
        return closed


#: the event kinds that open or close a span (the others are passed by)
SPAN_KINDS = frozenset((*_STARTS, *_RESTARTS, *_RUN_ENDS, "first_step"))


def gpu_spans(events: Iterable, now: float, service: bool = False) -> list[tuple[str, float, float, int]]:
    """``(job, from, to, GPUs)`` for every span of GPUs in event records (``time``, ``kind``,
    ``job``, ``detail``, in log order); a run still going ends at ``now``."""
    folder = SpanFolder(service)
    spans: list[tuple[str, float, float, int]] = []
    for e in events:
        closed = folder.fold(e.time, e.kind, e.job, e.detail)
        if closed is not None:
            spans.append(closed)
    spans.extend((job, t0, now, g) for job, (t0, g) in folder.held.items())
    return spans


def within(spans: Iterable[tuple[str, float, float, int]], start: float, end: float) -> dict[str, float]:
    """GPU-seconds per job of ``spans`` that fall within ``[start, end)``."""
    out: dict[str, float] = {}
    for job, a, b, g in spans:
        overlap = min(b, end) - max(a, start)
        if overlap > 0:
            out[job] = out.get(job, 0.0) + overlap * g
    return out
