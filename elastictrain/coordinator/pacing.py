"""Prefetch pacing: near the end of the allowed epochs, a worker that still holds data is told to
come back ``later`` when what it would then hold outlasts the rest of the job.

A ShardIterator keeps ``prefetch`` leases ready so that training never waits for the coordinator.
A rank that consumes a third as fast as its peers (a straggler given a smaller part of each step)
would keep them to the end, while the others run out and wait for it (a synchronous job runs empty
steps until every rank is out). So each prefetch says what the worker holds and its rate, and it is
refused when ``(held + the next shard) / its rate`` exceeds the time the whole job needs for all
that is left at the job's rate: guided self-scheduling, weighted by rate. A worker that holds
nothing is always served, and so is everyone until both rates are measured. Refusing changes no
state, so the exactly-once bookkeeping (:mod:`.shards`) is untouched; this module only reads it.
"""

from __future__ import annotations

from ..rates import WindowRate
from ..wire import LeaseRequest

__all__ = ["Pace"]


class Pace:
    """One dataset's consumption rate and its workers' last progress reports (not durable: a
    restarted coordinator measures again, and serves every prefetch meanwhile)."""

    def __init__(self) -> None:
        self._consumed = WindowRate(every=1.0, window=30.0, least=2.0)  # samples consumed: the job's rate
        self._heard: dict[tuple[int, int], float] = {}  # (generation, worker) -> its last report

    def consumed(self, now: float, total: int) -> None:
        """The dataset's consumed count went up to ``total``."""
        self._consumed.mark(now, total)

    def heard(self, key: tuple[int, int], now: float) -> None:
        """A worker reported its progress (or took its first lease: nothing unreported yet)."""
        self._heard[key] = now

    def restored(self) -> None:
        self._heard.clear()

    def too_soon(self, now: float, d, req: LeaseRequest, size: int, max_epoch: int) -> bool:
        """Whether ``req``'s worker, which holds data, should wait before taking ``size`` more of
        dataset ``d`` (a :class:`~.shards._Dataset`)."""
        if not req.held or not req.rate > 0:
            return False
        rate = self._consumed.rate(now, d.consumed)  # over about the last half minute
        if not rate > 0:
            return False
        return (req.held + size) / req.rate > left(d, max_epoch) / rate - self._age(now, d)

    def _age(self, now: float, d) -> float:
        """Seconds since the workers holding shards last reported, on average: what they consumed
        since is not in the offsets yet, so :func:`left` counts about this many seconds of the
        job's consumption too many."""
        ages = [now - self._heard.get(key, now) for key, held in d.holders.items() if held]
        return max(0.0, sum(ages) / len(ages)) if ages else 0.0


def left(d, max_epoch: int) -> int:
    """Positions of dataset ``d``'s epochs ``<= max_epoch`` that nobody has reported consumed
    (leased or not)."""
    spec = d.spec
    per, n = spec.shards_per_epoch, spec.num_samples
    max_epoch = min(max_epoch, spec.epochs - 1)
    out = 0
    if d.fresh < spec.total_shards and d.fresh // per <= max_epoch:
        epoch, start, _ = spec.shard_bounds(d.fresh)
        out += (max_epoch - epoch + 1) * n - start
    for sid in d.todo:
        if sid // per <= max_epoch:
            out += spec.shard_bounds(sid)[2] - d.live[sid].offset
    for held in d.holders.values():
        for sid in held:
            if sid // per <= max_epoch:
                out += spec.shard_bounds(sid)[2] - d.live[sid].offset
    return out
