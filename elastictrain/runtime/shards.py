"""The worker side of dynamic data sharding: an iterator over leased sample indices.

A background thread keeps ``prefetch`` leases ready and reports progress (which is also
the heartbeat that keeps this worker's leases alive), so in the steady state the training
loop never waits on the coordinator. The iterator tracks what was *consumed* (by default:
what it yielded; a DataLoader adapter that prefetches marks consumption itself with
:meth:`ShardIterator.mark_consumed`), and :meth:`ShardIterator.commit` sends this worker's
part of a checkpoint's data cursor.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Iterator, Optional

from ..errors import BadRequestError, ElasticTrainError, LeaseLostError
from ..model import DatasetSpec
from ..rates import WindowRate
from ..sharding import permuted_indices
from ..wire import CommitReply, Lease, ShardUpdate
from .client import CoordinatorClient

__all__ = ["ShardIterator", "CursorPart"]

log = logging.getLogger(__name__)
_END = object()


@dataclass(frozen=True)
class CursorPart:
    """This worker's consumed offsets at one step, ready to be committed with a checkpoint."""

    step: int
    updates: tuple[ShardUpdate, ...]


class ShardIterator:
    """Yields the sample indices of the shards this worker leases, epoch after epoch.

    Args:
        client: a client for the coordinator (the background thread opens its own session).
        job: the job id.
        spec: the dataset; registered with the coordinator (idempotent).
        generation, worker: this worker's generation and rank.
        max_epoch: only lease shards of epochs ``<= max_epoch`` (see :meth:`set_max_epoch`).
        prefetch: leases kept ready ahead of the one being consumed.
        report_interval: seconds between progress reports / heartbeats (keep it well under
            the dataset's ``lease_ttl``).
        auto_consume: count a sample as consumed when it is yielded. Set False when a
            consumer prefetches (a DataLoader) and call :meth:`mark_consumed` instead.
        pace: tell the coordinator, with each prefetch, how much this worker still holds and how
            fast it consumes, so that near the end of an epoch a worker that would still be busy
            when the others have run out takes its next lease only once it needs it (a slow rank
            does not keep ``prefetch`` leases to itself while the others wait). False: prefetch
            regardless (as before, and against a coordinator of an older release).

    Raises (while iterating): LeaseLostError when a lease was taken back, StaleGenerationError
    when the job moved to a newer generation, CoordinatorUnavailableError.
    """

    def __init__(self, client: CoordinatorClient, job: str, spec: DatasetSpec, *, generation: int,
                 worker: int, max_epoch: Optional[int] = None, prefetch: int = 2,
                 report_interval: float = 1.0, auto_consume: bool = True, register: bool = True,
                 pace: bool = True) -> None:
        self.job, self.spec = job, spec
        self.generation, self.worker = generation, worker
        self.auto_consume = auto_consume
        self._client = client
        self._bg = CoordinatorClient(client.addresses, client.token, timeout=client.timeout,
                                     retry_for=client.retry_for)
        if register:
            client.register_dataset(job, spec)
        self._prefetch = max(1, prefetch)
        self._interval = report_interval
        self._lock = threading.Condition()
        self._ready: deque = deque()  # (Lease, its sample indices), or _END
        self._max_epoch = max_epoch
        self._ended = False  # the coordinator said "exhausted" for the current max_epoch
        self._finished = False  # ... and every epoch is done
        self._error: Optional[BaseException] = None
        self._closed = False
        # consumption accounting
        self._pending: deque[list] = deque()  # segments being yielded / consumed, see samples()
        self._consumed: dict[int, tuple[int, int]] = {}  # finished, not yet reported: id -> (lease, offset)
        self._reported: dict[int, int] = {}
        self._touched: dict[int, tuple[int, int]] = {}  # not yet in a complete commit
        self._unconfirmed: list[tuple[int, list]] = []  # (step, finished shards) of parts sent, not yet complete
        self.epoch: Optional[int] = None  # epoch of the sample yielded last
        self.lease_waits = 0  # times the iterator found no lease ready (the first one always does)
        self.deferred = 0  # prefetches the coordinator answered "later" (pace)
        self._pace = pace
        self._later = False  # the last prefetch was answered "later": lease again once out of data
        self._waiting = False  # the training loop waits for a lease
        self._used = 0  # positions of retired segments (the rate)
        self._rate_of = WindowRate(every=0.5, window=10.0, least=1.0)  # positions used: this worker's rate
        # started on first use, so that a restore() between construction and iteration is safe
        self._thread = threading.Thread(target=self._run, name=f"et-shards-{spec.name}", daemon=True)

    def _ensure_started(self) -> None:
        if not self._thread.is_alive() and not self._closed and self._thread.ident is None:
            self._thread.start()

    # ------------------------------------------------------------------ iteration
    def set_max_epoch(self, max_epoch: Optional[int]) -> None:
        """Allow shards up to ``max_epoch`` (None: all) and resume after an exhausted epoch."""
        with self._lock:
            if max_epoch != self._max_epoch:
                self._max_epoch = max_epoch
                if self._ready and self._ready[-1] is _END:
                    self._ready.pop()
                self._ended = self._later = False
                self._lock.notify_all()

    @property
    def finished(self) -> bool:
        """True once every sample of every epoch has been consumed (by any worker)."""
        return self._finished or self._client.dataset(self.job, self.spec.name).finished

    def info(self):
        """The coordinator's counts for this dataset (:class:`~elastictrain.wire.DatasetInfo`)."""
        return self._client.dataset(self.job, self.spec.name)

    def __iter__(self) -> Iterator[int]:
        for _epoch, index in self.samples():
            yield index

    def samples(self) -> Iterator[tuple[int, int]]:
        """Yield ``(epoch, index)`` pairs until no shard of an allowed epoch is left."""
        self._ensure_started()
        while True:
            item = self._next_lease()
            if item is None:
                self._report(self._client)  # the end of an epoch: make the coordinator's view exact
                return
            lease, indices = item
            self.epoch = lease.epoch
            # [shard_id, lease_id, consumed offset, yielded-but-unconsumed count, first offset]
            seg = [lease.shard_id, lease.lease_id, lease.offset, 0, lease.offset]
            with self._lock:
                self._pending.append(seg)
            epoch, auto, pos = lease.epoch, self.auto_consume, lease.offset
            for index in indices:
                if self._error is not None:
                    self._raise()
                pos += 1
                if auto:
                    seg[2] = pos  # one store: the reporter thread reads it under the GIL
                else:
                    seg[3] += 1
                yield epoch, index
            if auto:
                with self._lock:
                    self._retire(seg)

    def _retire(self, seg: list) -> None:
        """A segment was consumed to its end (caller holds the lock)."""
        self._pending.remove(seg)
        self._used += seg[2] - seg[4]
        self._consumed[seg[0]] = (seg[1], seg[2])
        self._touched[seg[0]] = (seg[1], seg[2])

    def _view(self, done: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
        """``done`` plus the shards in progress that saw consumption (caller holds the lock)."""
        view = dict(done)
        for seg in self._pending:
            if seg[2] > seg[4]:
                view[seg[0]] = (seg[1], seg[2])
        return view

    def mark_consumed(self, n: int) -> None:
        """Count the next ``n`` yielded samples as consumed (with ``auto_consume=False``)."""
        with self._lock:
            for seg in list(self._pending):
                if n == 0:
                    break
                take = min(n, seg[3])
                seg[2] += take
                seg[3] -= take
                n -= take
                if seg[2] == self.spec.shard_bounds(seg[0])[2]:
                    self._retire(seg)
                elif seg[3] == 0:
                    break
            if n:
                raise ElasticTrainError(f"mark_consumed: {n} more samples than were yielded")

    def _next_lease(self) -> Optional[tuple[Lease, list[int]]]:
        with self._lock:
            if not self._ready:
                self.lease_waits += 1  # the training loop had to wait for the coordinator
            while not self._ready and self._error is None:
                self._waiting = True
                self._lock.notify_all()
                self._lock.wait(0.5)
            self._waiting = False
            if self._error is not None:
                self._raise()
            item = self._ready[0]
            if item is _END:
                return None
            self._ready.popleft()
            self._lock.notify_all()
            return item

    def _raise(self) -> None:
        err = self._error
        raise err  # type: ignore[misc]

    # ------------------------------------------------------------------ cursor and commit
    def cursor(self, step: int) -> CursorPart:
        """Snapshot this worker's consumed offsets now (call it at the checkpointed step)."""
        with self._lock:
            return CursorPart(step, tuple(ShardUpdate(sid, lid, off) for sid, (lid, off) in
                                          sorted(self._view(self._touched).items())))

    def commit(self, checkpoint: str, step: int, world_size: int,
               part: Optional[CursorPart] = None) -> CommitReply:
        """Send this worker's part of ``checkpoint``; call it once the checkpoint is durable.

        Raises:
            LeaseLostError: a shard in the part is no longer held by this worker.
        """
        part = part or self.cursor(step)
        reply = self._client.commit(self.job, self.spec.name, self.generation, self.worker, world_size,
                                    checkpoint, part.step, list(part.updates))
        with self._lock:
            # A finished shard is sent with every part until a *complete* commit covers a part that
            # named it: an acknowledged part of an incomplete checkpoint may never complete (a rank
            # dies first), and then the next checkpoint must still carry that shard.
            done = [(u.shard_id, (u.lease_id, u.offset)) for u in part.updates
                    if u.offset == self.spec.shard_bounds(u.shard_id)[2]]
            if done:
                self._unconfirmed.append((part.step, done))
            covered = reply.committed_step if not reply.complete else max(reply.committed_step, part.step)
            if covered >= 0 and self._unconfirmed:
                keep = []
                for step, items in self._unconfirmed:
                    if step > covered:
                        keep.append((step, items))
                        continue
                    for sid, v in items:
                        if self._touched.get(sid) == v:
                            del self._touched[sid]
                self._unconfirmed = keep
        return reply

    # ------------------------------------------------------------------ background
    def _run(self) -> None:
        try:
            next_report = time.monotonic() + self._interval
            while True:
                with self._lock:
                    while not self._closed:
                        ready = sum(1 for x in self._ready if x is not _END)
                        want = (not self._ended and ready < self._prefetch
                                and (not self._later or (not ready and self._waiting)))
                        if want or time.monotonic() >= next_report:
                            break
                        self._lock.wait(max(0.0, next_report - time.monotonic()))
                    if self._closed:
                        return
                    max_epoch = self._max_epoch
                    rate = self._rate(time.monotonic())
                    held = self._held() if want and self._pace else 0
                if want:
                    reply = self._lease(max_epoch, held, rate if held else 0.0)
                    ls = reply.lease
                    indices = None if ls is None else permuted_indices(  # here, off the training thread
                        self.spec.num_samples, self.spec.seed, ls.epoch, ls.offset, ls.end, self.spec.shuffle).tolist()
                    with self._lock:
                        # (an answer for an epoch bound set_max_epoch has since changed defers nothing)
                        self._later = reply.later and max_epoch == self._max_epoch
                        if ls is not None:
                            self._ready.append((ls, indices))
                        elif reply.later:
                            self.deferred += 1
                        elif max_epoch == self._max_epoch:
                            self._ended = True
                            self._finished = reply.finished
                            self._ready.append(_END)
                        self._lock.notify_all()
                if time.monotonic() >= next_report:
                    self._report()
                    next_report = time.monotonic() + self._interval
        except BaseException as exc:  # handed to the training thread, raised on its next sample
            with self._lock:
                self._error = exc
                self._lock.notify_all()

    def _held(self) -> int:
        """Positions leased and not yet handed to the training loop (caller holds the lock)."""
        held = sum(x[0].end - x[0].offset for x in self._ready if x is not _END)
        for seg in self._pending:
            held += self.spec.shard_bounds(seg[0])[2] - seg[2] - seg[3]
        return held

    def _rate(self, now: float) -> float:
        """Positions per second this worker consumed over about the last 10 s (0: not known yet);
        records a mark at most twice a second (caller holds the lock)."""
        used = self._used + sum(seg[2] - seg[4] for seg in self._pending)
        self._rate_of.mark(now, used)
        return self._rate_of.rate(now, used)

    def _lease(self, max_epoch: Optional[int], held: int, rate: float):
        try:
            return self._bg.lease(self.job, self.spec.name, self.generation, self.worker, uuid.uuid4().hex,
                                  max_epoch, held, rate)
        except BadRequestError as exc:
            if not (held and "held" in str(exc) or rate and "rate" in str(exc)):
                raise
            log.warning("the coordinator does not take a prefetch's pace (%s): an older release; prefetching "
                        "without it", exc)
            self._pace = False
            return self._bg.lease(self.job, self.spec.name, self.generation, self.worker, uuid.uuid4().hex,
                                  max_epoch)

    def _report(self, client: Optional[CoordinatorClient] = None) -> None:
        with self._lock:
            updates = [ShardUpdate(sid, lid, off) for sid, (lid, off) in self._view(self._consumed).items()
                       if self._reported.get(sid) != off]
        reply = (client or self._bg).progress(self.job, self.spec.name, self.generation, self.worker, updates)
        with self._lock:
            for u in updates:
                self._reported[u.shard_id] = u.offset
                if u.offset == self.spec.shard_bounds(u.shard_id)[2]:
                    self._consumed.pop(u.shard_id, None)
                    self._reported.pop(u.shard_id, None)
        if reply.lost:
            raise LeaseLostError(f"worker {self.worker} lost its lease on shard(s) {reply.lost[:10]} of "
                                 f"{self.spec.name!r}; restart from the last committed checkpoint")

    def flush(self) -> None:
        """Report consumption now (also a heartbeat)."""
        self._report(self._client)

    def close(self, release: bool = True) -> None:
        """Stop the background thread; report progress and return unconsumed remainders."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
        if self._thread.ident is not None:
            self._thread.join(timeout=30)
        if release and self._error is None:
            try:
                self._report()
                self._bg.release(self.job, self.spec.name, self.generation, self.worker)
            except ElasticTrainError as exc:
                log.warning("could not return leases of worker %d on close: %s", self.worker, exc)
        self._bg.close()

    def rebase(self, generation: int, worker: int) -> None:
        """Continue as ``worker`` of ``generation`` (in-process recovery): the background thread
        stops, everything leased and not committed is forgotten here (the coordinator takes it
        back when the next restore resets the cursor), and leasing starts again on next use."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._thread.ident is not None:
            self._thread.join(timeout=30)
        with self._lock:
            self.generation, self.worker = generation, worker
            self._ready.clear()
            self._pending.clear()
            self._consumed.clear()
            self._reported.clear()
            self._touched.clear()
            self._unconfirmed.clear()
            self._ended = self._finished = self._closed = self._later = self._waiting = False
            self._error = None
            self.epoch = None
            self._used = 0
            self._rate_of.clear()
        self._thread = threading.Thread(target=self._run, name=f"et-shards-{self.spec.name}", daemon=True)

    def __enter__(self) -> "ShardIterator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
