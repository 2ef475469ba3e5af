"""The scheduler's event log and the jobs' output (cluster mode), both durable in the store.

Events are structured: a kind (``submit``, ``start``, ``resume``, ``preempt``, ``preempted``,
``migrate``, ``finish``, ``fail``, ``cancel``, ``requeue``, ``launch``, ``exit``, ``node_up``,
``node_down``, ``node_left``, ``assumed``, ``deferred``, ``policy_error``), the job and node
they concern, and a JSON detail. They are written in the same transaction as the state change
they describe and are also logged (``elastictrain.events``) as one JSON object per line.

A ``deferred`` or ``plan`` event identical to the job's previous event (the same decision
taken again at the next tick) is folded into it: its detail gains ``count`` (how many times)
and ``last`` (when last), instead of a new row per tick.

Job output arrives from the node daemons in chunks (``etrun --tee`` lines of every rank) and
is kept per job up to ``log_cap`` bytes; older chunks are dropped first.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Callable, Optional

from ..wire import EventInfo, EventList, LogList, LogRecord
from .gpu_time import GpuTime
from .store import EventRow, LogRow, Store

__all__ = ["EventLog", "LogBook", "LOG_CAP"]

log = logging.getLogger("elastictrain.events")
LOG_CAP = 8 << 20  # bytes of output kept per job
MAX_EVENTS = 1000  # events per reply
MAX_LOG_REPLY = 1 << 20  # bytes of output per reply
FOLDED = frozenset({"deferred", "plan"})  # kinds whose repeats fold into one event with a count


class EventLog:
    def __init__(self, store: Store, last_seq: int, meta: Optional[dict] = None) -> None:
        self._store = store
        self.seq = last_seq
        self.gpu_time = GpuTime(store, meta or {}, last_seq)  # spans of GPU time, folded as events are written
        self.pending: list[EventRow] = []
        # job -> its last event (seq, kind, node, detail, count): a repeat of it folds into it
        self._last: dict[str, tuple[int, str, str, str, int]] = {}
        self._folds: dict[int, str] = {}  # seq -> new detail of a row already written, folded since the last flush
        self.counts: dict[str, int] = {}  # kind -> events emitted since this process started (GET /metrics)

    def emit(self, now: float, event: str, job: str = "", node: str = "", /, **detail) -> None:
        """Queue an event; it is written with the next flush (the change it describes)."""
        self.counts[event] = self.counts.get(event, 0) + 1
        text = json.dumps(detail, sort_keys=True, default=str)
        last = self._last.get(job) if job else None
        if event in FOLDED and last is not None and last[1:4] == (event, node, text):
            seq, count = last[0], last[4] + 1
            folded = json.dumps({**detail, "count": count, "last": round(now, 3)}, sort_keys=True, default=str)
            self._last[job] = (seq, event, node, text, count)
            for i, row in enumerate(self.pending):
                if row.seq == seq:
                    self.pending[i] = EventRow(seq, row.time, event, job, node, folded)
                    break
            else:
                self._folds[seq] = folded
            return
        self.seq += 1
        if job:
            if len(self._last) > 10_000:  # jobs long gone: their next repeat is a row of its own
                self._last.clear()
            self._last[job] = (self.seq, event, node, text, 1)
        self.pending.append(EventRow(self.seq, now, event, job, node, text))
        if log.isEnabledFor(logging.INFO):
            log.info(json.dumps({"seq": self.seq, "time": round(now, 3), "kind": event, "job": job, "node": node,
                                 "detail": detail}, default=str))

    def forget_below(self, seq: int) -> None:
        """After --retain deleted the events numbered below ``seq``: a repeat of a job's last event is
        not folded into a row that is gone; it gets a row of its own."""
        self._last = {job: last for job, last in self._last.items() if last[0] >= seq}

    @property
    def dirty(self) -> bool:
        """Events or folds wait to be written."""
        return bool(self.pending or self._folds)

    def write(self, tx) -> None:
        for row in self.pending:
            tx.add_event(row)
        self.gpu_time.fold(tx, self.pending)
        for seq, detail in self._folds.items():
            tx.fold_event(seq, detail)
        self.pending.clear()
        self._folds.clear()

    def list(self, after: int, job: Optional[str] = None, limit: int = MAX_EVENTS) -> EventList:
        rows = self._store.read_events(after, min(limit, MAX_EVENTS), job)
        events = [EventInfo(r.seq, r.time, r.kind, r.job, r.node, json.loads(r.detail)) for r in rows]
        return EventList(events, rows[-1].seq if rows else after)


class LogBook:
    def __init__(self, store: Store, sizes: dict[str, tuple[int, int]], cap: int = LOG_CAP,
                 clock: Callable[[], float] = time.time) -> None:
        self._store, self.cap, self._clock = store, cap, clock
        self._size = {job: size for job, (size, _) in sizes.items()}
        self._seq = {job: seq for job, (_, seq) in sizes.items()}
        self.pending: list[LogRow] = []
        self._heard: dict[str, float] = {}  # job -> when its output last arrived (since this process started)
        self._start = clock()

    def add(self, job: str, node: str, run: int, data: bytes) -> None:
        if not data:
            return
        seq = self._seq.get(job, 0) + 1
        self._seq[job] = seq
        self._size[job] = self._size.get(job, 0) + len(data)
        self._heard[job] = self._clock()
        self.pending.append(LogRow(job, seq, node, run, data))

    def jobs(self) -> list[str]:
        """The jobs with output kept."""
        return list(self._size)

    def heard(self, job: str) -> float:
        """When ``job``'s output last arrived (this process's start, for output kept from before it)."""
        return self._heard.get(job, self._start)

    def forget(self, job: str) -> None:
        """``job``'s output was deleted (--retain). Its numbering goes on: a reader's cursor stays valid."""
        self._size.pop(job, None)
        self._heard.pop(job, None)

    def write(self, tx) -> None:
        over = set()
        for row in self.pending:
            tx.add_log(row)
            if self._size[row.job] > self.cap:
                over.add(row.job)
        self.pending.clear()
        for job in over:
            keep_from = self._store.log_seq_at(job, self.cap // 2)  # trim to half, not a chunk at a time
            if keep_from:
                tx.prune_log(job, keep_from)
                self._size[job] = self.cap // 2

    def kept(self, job: str, run: int) -> int:
        """Bytes of ``job``'s output from run ``run`` received so far (stored, or to be stored at
        the next commit): where an engine run adopted after a restart resumes shipping. (Output
        past the cap was pruned, so for a run that printed more than half the cap this is short
        and some of its output is shipped again.)"""
        return self._store.log_bytes(job, run) + sum(len(r.data) for r in self.pending
                                                     if r.job == job and r.run == run)

    def list(self, job: str, after: int, ended: bool) -> LogList:
        rows = self._store.read_logs(job, after, MAX_LOG_REPLY)
        chunks = [LogRecord(r.seq, r.node, r.run, r.data) for r in rows]
        return LogList(job, chunks, rows[-1].seq if rows else after, ended)
