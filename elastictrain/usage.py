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

__all__ = ["all_events", "gpu_spans", "within"]

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


def gpu_spans(events: Iterable, now: float, service: bool = False) -> list[tuple[str, float, float, int]]:
    """``(job, from, to, GPUs)`` for every span of GPUs in event records (``time``, ``kind``,
    ``job``, ``detail``, in log order); a run still going ends at ``now``."""
    spans: list[tuple[str, float, float, int]] = []
    held: dict[str, tuple[float, int]] = {}  # job -> (since, GPUs) of its open span
    placed: dict[str, tuple[Optional[int], int]] = {}  # (service) job -> (run, GPUs) placed, first step not seen
    for e in events:
        job, kind = e.job, e.kind
        begins = kind in _STARTS or kind in _RESTARTS
        if begins or kind in _RUN_ENDS:
            if job in held:
                t0, g = held.pop(job)
                spans.append((job, t0, e.time, g))
            placed.pop(job, None)
        if begins:
            gpus = sum(int(g) for _, g in e.detail.get("placement") or ())
            if gpus > 0:
                if service:
                    run = e.detail.get("run")
                    placed[job] = (run + 1 if kind in _RESTARTS and isinstance(run, int) else run, gpus)
                else:
                    held[job] = (e.time, gpus)
        elif kind == "first_step" and job in placed:
            run, gpus = placed[job]
            if run is None or e.detail.get("run") in (None, run):  # (not an older run's worker, still stopping)
                del placed[job]
                held[job] = (e.time, gpus)
    spans.extend((job, t0, now, g) for job, (t0, g) in held.items())
    return spans


def within(spans: Iterable[tuple[str, float, float, int]], start: float, end: float) -> dict[str, float]:
    """GPU-seconds per job of ``spans`` that fall within ``[start, end)``."""
    out: dict[str, float] = {}
    for job, a, b, g in spans:
        overlap = min(b, end) - max(a, start)
        if overlap > 0:
            out[job] = out.get(job, 0.0) + overlap * g
    return out
