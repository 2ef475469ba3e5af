"""Exactly-once dynamic data shards: TODO / DOING / DONE with leases and checkpoint commits.

The idea is DLRover's dynamic sharding; the bookkeeping is ours, so that progress is
exact instead of replayed:

* Workers *lease* shards. A lease has an id (a fencing token) and a deadline that every
  progress report from its holder extends. A finished shard keeps its record (and the id of
  the lease that finished it) until the next restore, so a report that arrives late (retried
  across a coordinator restart, say) is still checked against the right lease. A shard's *offset* is its first unconsumed
  position. When a worker leaves or its lease expires, only ``[offset, end)`` returns to
  TODO.
* Progress becomes durable through *commits*. Each worker sends its part of checkpoint C:
  the offsets it had reached at the checkpointed step. When all ``world_size`` parts are
  in, the cursor of C is computed and stored: a *frontier* (every shard at or past it is
  untouched) and the offsets of the unfinished shards below it.
* :meth:`ShardManager.restore` resets the live state to a committed cursor; every sample
  consumed after C returns to TODO, because the model that consumed it was lost too.

Counting the samples consumed by the training state that was restored, every index of
every epoch is consumed exactly once (see docs/data-shards.md for the argument).
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, field, replace
from typing import Iterable, Optional

import msgspec

from ..clock import Clock
from ..errors import BadRequestError, ConflictError, LeaseLostError, NotFoundError
from ..model import DatasetSpec, check_name
from ..wire import (
    CommitInfo, CommitReply, CommitRequest, DatasetInfo, Lease, LeaseReply, LeaseRequest,
    ProgressReply, ProgressRequest, ReleaseReply, ReleaseRequest, RestoreReply, RestoreRequest,
    ShardUpdate,
)
from .membership import Membership
from .pacing import Pace
from .store import CommitRow, DatasetRow, LiveRow, LoadedState, PartRow, Store, Tx

__all__ = ["ShardManager", "Cursor"]

log = logging.getLogger(__name__)

TODO, DOING, DONE = "todo", "doing", "done"
_UPDATES = msgspec.msgpack.Decoder(list[ShardUpdate])
_ENC = msgspec.msgpack.Encoder()


class Cursor(msgspec.Struct, frozen=True):
    """A committed data cursor: shards ``>= frontier`` are untouched; ``partial`` maps each
    unfinished shard below the frontier to its first unconsumed position."""

    frontier: int
    partial: dict[int, int]


_EMPTY = Cursor(0, {})


@dataclass
class _Live:
    state: str
    offset: int
    lease_id: int = 0
    worker: int = -1
    generation: int = 0
    request_id: str = ""
    deadline: float = 0.0


@dataclass
class _Commit:
    seq: int
    info: CommitInfo


@dataclass
class _Dataset:
    job: str
    spec: DatasetSpec
    spec_blob: bytes
    fresh: int = 0
    lease_seq: int = 0
    live: dict[int, _Live] = field(default_factory=dict)
    todo: list[int] = field(default_factory=list)  # heap of shard ids in state TODO
    holders: dict[tuple[int, int], set[int]] = field(default_factory=dict)  # (gen, worker) -> DOING
    parts: dict[tuple[str, int], PartRow] = field(default_factory=dict)  # (checkpoint, worker)
    base: Cursor = _EMPTY
    base_checkpoint: Optional[str] = None
    restored_from: Optional[str] = None
    restored_generation: int = 0
    commits: dict[str, _Commit] = field(default_factory=dict)  # in commit order
    consumed: int = 0  # samples reported consumed since this coordinator started (throughput; not durable)
    pace: Pace = field(default_factory=Pace)  # the job's rate and its workers' last reports (prefetch pacing)

    def row(self) -> DatasetRow:
        return DatasetRow(self.job, self.spec.name, self.spec_blob, self.fresh, self.lease_seq,
                          self.base_checkpoint, self.restored_from, self.restored_generation)

    def live_row(self, sid: int, lv: _Live) -> LiveRow:
        return LiveRow(self.job, self.spec.name, sid, lv.state, lv.offset, lv.lease_id, lv.worker,
                       lv.generation, lv.request_id)

    @property
    def doing(self) -> int:
        return sum(len(s) for s in self.holders.values())

    @property
    def finished(self) -> bool:
        return not self.todo and self.fresh == self.spec.total_shards and self.doing == 0


class ShardManager:
    """All datasets of all jobs. Every method is one atomic state change or a read.

    Raises (from every method): NotFoundError for an unknown job or dataset,
    StaleGenerationError / ConflictError for a request of another generation.
    """

    def __init__(self, store: Store, membership: Membership, clock: Clock, *,
                 keep_commits: int = 64) -> None:
        self._store = store
        self._members = membership
        self._clock = clock
        self._keep = keep_commits
        self._ds: dict[tuple[str, str], _Dataset] = {}
        self._by_job: dict[str, dict[str, _Dataset]] = {}  # the same datasets, by job (read per tick)

    def _add(self, d: _Dataset) -> None:
        self._ds[(d.job, d.spec.name)] = d
        self._by_job.setdefault(d.job, {})[d.spec.name] = d

    # ------------------------------------------------------------------ loading
    def load(self, state: LoadedState) -> None:
        now = self._clock.now()
        for r in state.datasets:
            spec = msgspec.msgpack.decode(r.spec, type=DatasetSpec)
            d = _Dataset(r.job, spec, r.spec, r.fresh, r.lease_seq, base_checkpoint=r.base_checkpoint,
                         restored_from=r.restored_from, restored_generation=r.restored_generation)
            self._add(d)
        for r in state.live:
            d = self._ds[(r.job, r.ds)]
            # deadlines are not stored: a restarted coordinator gives every lease a fresh TTL
            lv = _Live(r.state, r.offset, r.lease_id, r.worker, r.generation, r.request_id,
                       now + d.spec.lease_ttl)
            d.live[r.shard_id] = lv
            if r.state == TODO:
                d.todo.append(r.shard_id)
            elif r.state == DOING:
                d.holders.setdefault((r.generation, r.worker), set()).add(r.shard_id)
        for r in state.parts:
            self._ds[(r.job, r.ds)].parts[(r.checkpoint, r.worker)] = r
        for r in state.commits:
            d = self._ds[(r.job, r.ds)]
            d.commits[r.checkpoint] = _Commit(r.seq, CommitInfo(r.checkpoint, r.step, r.generation, r.time))
        for d in self._ds.values():
            heapq.heapify(d.todo)
            if d.base_checkpoint is not None:
                row = self._store.load_commit(d.job, d.spec.name, d.base_checkpoint)
                if row is None:  # cannot happen unless the file was edited by hand
                    raise ConflictError(f"dataset {d.job}/{d.spec.name}: base checkpoint "
                                        f"{d.base_checkpoint!r} is missing from the store")
                d.base = msgspec.msgpack.decode(row.partial, type=Cursor)

    # ------------------------------------------------------------------ helpers
    def _get(self, job: str, name: str) -> _Dataset:
        d = self._ds.get((job, name))
        if d is None:
            self._members.get(job)
            raise NotFoundError(f"dataset {name!r} of job {job!r} is not registered; "
                                "register it with POST /v1/jobs/{job}/datasets first")
        return d

    def _check_update(self, d: _Dataset, u: ShardUpdate) -> tuple[int, int]:
        if not 0 <= u.shard_id < d.spec.total_shards:
            raise BadRequestError(f"shard_id {u.shard_id} is outside [0, {d.spec.total_shards}) "
                                  f"for dataset {d.spec.name!r}")
        _, start, end = d.spec.shard_bounds(u.shard_id)
        if not start <= u.offset <= end:
            raise BadRequestError(f"offset {u.offset} of shard {u.shard_id} is outside its "
                                  f"positions [{start}, {end}]")
        return start, end

    def _owned(self, d: _Dataset, u: ShardUpdate, gen: int, worker: int) -> Optional[_Live]:
        lv = d.live.get(u.shard_id)
        if lv is None or lv.state == TODO or lv.lease_id != u.lease_id:
            return None
        if lv.generation != gen or lv.worker != worker:
            return None
        return lv

    def _advance(self, d: _Dataset, tx: Tx, updates: Iterable[ShardUpdate], gen: int, worker: int,
                 ) -> tuple[list[int], list[tuple[int, _Live]]]:
        """Validate updates and write the advanced offsets; returns (lost shards, new live)."""
        lost: list[int] = []
        changed: list[tuple[int, _Live]] = []
        for u in updates:
            _, end = self._check_update(d, u)
            lv = self._owned(d, u, gen, worker)
            if lv is None:
                lost.append(u.shard_id)
                continue
            if u.offset > lv.offset:
                new = _Live(DONE if u.offset == end else lv.state, u.offset, lv.lease_id, lv.worker,
                            lv.generation, lv.request_id, lv.deadline)
                tx.put_live(d.live_row(u.shard_id, new))
                changed.append((u.shard_id, new))
        return lost, changed

    @staticmethod
    def _unhold(d: _Dataset, sid: int, lv: _Live) -> None:
        """Forget that ``lv``'s worker holds shard ``sid``."""
        key = (lv.generation, lv.worker)
        held = d.holders.get(key)
        if held is not None:
            held.discard(sid)
            if not held:
                del d.holders[key]

    def _apply_live(self, d: _Dataset, changed: list[tuple[int, _Live]]) -> None:
        for sid, new in changed:
            old = d.live.get(sid)
            if old is not None and new.offset > old.offset:
                d.consumed += new.offset - old.offset
            d.live[sid] = new
            if new.state == DONE:
                self._unhold(d, sid, new)
        if changed:
            d.pace.consumed(self._clock.now(), d.consumed)

    def _reap(self, d: _Dataset) -> None:
        """Return the remainder of every expired lease to TODO."""
        now = self._clock.now()
        expired = [sid for held in d.holders.values() for sid in held if d.live[sid].deadline < now]
        if expired:
            log.warning("dataset %s/%s: %d lease(s) expired, remainders back to TODO: %s",
                        d.job, d.spec.name, len(expired), expired[:10])
            self._return(d, expired)

    def _return(self, d: _Dataset, sids: list[int]) -> None:
        with self._store.transaction() as tx:
            for sid in sids:
                tx.put_live(d.live_row(sid, _Live(TODO, d.live[sid].offset)))
        for sid in sids:
            lv = d.live[sid]
            self._unhold(d, sid, lv)
            d.live[sid] = _Live(TODO, lv.offset)
            heapq.heappush(d.todo, sid)

    def info(self, job: str, name: str) -> DatasetInfo:
        d = self._get(job, name)
        doing = d.doing
        todo = len(d.todo) + d.spec.total_shards - d.fresh
        last = next(reversed(d.commits)) if d.commits else None
        return DatasetInfo(d.spec, todo, doing, d.spec.total_shards - todo - doing, d.spec.total_shards,
                           d.finished, last, d.restored_from)

    def consumed(self, job: str) -> int:
        """Samples the job's workers reported consumed, over all its datasets, since this
        coordinator started (work redone after a restart counts again: it is throughput)."""
        return sum(d.consumed for d in self._by_job.get(job, {}).values())

    def datasets(self, job: str) -> list[str]:
        return sorted(self._by_job.get(job, ()))

    def commits(self, job: str, name: str) -> list[CommitInfo]:
        return [c.info for c in self._get(job, name).commits.values()]

    def reap_all(self) -> None:
        for d in list(self._ds.values()):
            if d.holders:
                self._reap(d)

    # ------------------------------------------------------------------ operations
    def register(self, job: str, spec: DatasetSpec) -> DatasetInfo:
        """Register a dataset (idempotent for an identical spec).

        Raises:
            ConflictError: a dataset of that name exists with a different spec.
        """
        check_name("dataset", spec.name)
        self._members.get(job)
        d = self._ds.get((job, spec.name))
        if d is not None:
            if d.spec != spec:
                raise ConflictError(
                    f"dataset {spec.name!r} of job {job!r} is registered with a different spec "
                    f"({d.spec}); keep the spec unchanged across restarts or use a new dataset name")
            return self.info(job, spec.name)
        d = _Dataset(job, spec, _ENC.encode(spec))
        with self._store.transaction() as tx:
            tx.put_dataset(d.row())
        self._add(d)
        return self.info(job, spec.name)

    def lease(self, job: str, name: str, req: LeaseRequest) -> LeaseReply:
        self._members.check_generation(job, req.generation)
        d = self._get(job, name)
        key = (req.generation, req.worker)
        spec = d.spec
        for sid in d.holders.get(key, ()):  # a retry of a request that already got its lease
            lv = d.live[sid]
            if lv.request_id == req.request_id:
                lv.deadline = self._clock.now() + spec.lease_ttl
                return LeaseReply(self._lease_msg(d, sid, lv), False, False)
        self._reap(d)
        per_epoch = spec.shards_per_epoch
        max_epoch = spec.epochs - 1 if req.max_epoch is None else req.max_epoch
        if d.todo and d.todo[0] // per_epoch <= max_epoch:
            sid, offset = d.todo[0], d.live[d.todo[0]].offset
        elif d.fresh < spec.total_shards and d.fresh // per_epoch <= max_epoch:
            sid = d.fresh
            offset = spec.shard_bounds(sid)[1]
        else:
            return LeaseReply(None, True, d.finished)
        if req.held and d.pace.too_soon(self._clock.now(), d, req, spec.shard_bounds(sid)[2] - offset, max_epoch):
            return LeaseReply(None, False, False, later=True)
        lv = _Live(DOING, offset, d.lease_seq + 1, req.worker, req.generation, req.request_id,
                   self._clock.now() + spec.lease_ttl)
        from_fresh = sid == d.fresh
        with self._store.transaction() as tx:
            tx.put_live(d.live_row(sid, lv))
            tx.put_dataset(replace(d.row(), fresh=d.fresh + from_fresh, lease_seq=lv.lease_id))
        d.lease_seq = lv.lease_id
        d.fresh += from_fresh
        if not from_fresh:
            heapq.heappop(d.todo)
        d.live[sid] = lv
        if key not in d.holders:  # it held nothing: it has consumed nothing unreported yet
            d.pace.heard(key, self._clock.now())
        d.holders.setdefault(key, set()).add(sid)
        return LeaseReply(self._lease_msg(d, sid, lv), False, False)

    def _lease_msg(self, d: _Dataset, sid: int, lv: _Live) -> Lease:
        epoch, start, end = d.spec.shard_bounds(sid)
        return Lease(sid, epoch, start, end, lv.offset, lv.lease_id, d.spec.lease_ttl)

    def progress(self, job: str, name: str, req: ProgressRequest) -> ProgressReply:
        self._members.check_generation(job, req.generation)
        d = self._get(job, name)
        with self._store.transaction() as tx:
            lost, changed = self._advance(d, tx, req.updates, req.generation, req.worker)
        self._apply_live(d, changed)
        now = self._clock.now()
        d.pace.heard((req.generation, req.worker), now)
        deadline = now + d.spec.lease_ttl
        for sid in d.holders.get((req.generation, req.worker), ()):
            d.live[sid].deadline = deadline
        return ProgressReply(lost)

    def release(self, job: str, name: str, req: ReleaseRequest) -> ReleaseReply:
        d = self._get(job, name)
        held = sorted(d.holders.get((req.generation, req.worker), ()))
        if held:
            self._return(d, held)
        return ReleaseReply(len(held))

    def commit(self, job: str, name: str, req: CommitRequest) -> CommitReply:
        """Record one worker's part of a checkpoint; complete the commit with the last part.

        Raises:
            LeaseLostError: an update names a shard this worker no longer holds.
            ConflictError: world size or step disagree with the generation or other parts.
        """
        jobrow = self._members.check_generation(job, req.generation)
        d = self._get(job, name)
        if req.checkpoint in d.commits:  # a retry, or a second save, after the commit completed
            self._check_covered(d, req)
            return CommitReply(True, req.world_size, self._committed_step(d, req.generation))
        if not req.checkpoint or len(req.checkpoint) > 256:
            raise BadRequestError("checkpoint id must be 1-256 characters")
        if req.world_size != jobrow.world_size:
            raise ConflictError(f"commit says world_size {req.world_size} but generation "
                                f"{req.generation} of job {job!r} has {jobrow.world_size} workers")
        if not 0 <= req.worker < req.world_size:
            raise BadRequestError(f"worker {req.worker} is outside [0, {req.world_size})")
        for (ckpt, w), p in d.parts.items():
            if ckpt == req.checkpoint and p.generation == req.generation and p.step != req.step:
                raise ConflictError(f"checkpoint {ckpt!r}: worker {w} committed it at step {p.step}, "
                                    f"worker {req.worker} at step {req.step}; all ranks must agree")
        others = [p for (ckpt, w), p in d.parts.items()
                  if ckpt == req.checkpoint and w != req.worker and p.generation == req.generation]
        updates = req.updates
        earlier = d.parts.get((req.checkpoint, req.worker))
        if earlier is not None and earlier.generation == req.generation:
            updates = _merge_part(req, _UPDATES.decode(earlier.updates), earlier.step)
            if updates is None:  # the same part again (a retry, or a second save at that step)
                return CommitReply(False, len(others) + 1, self._committed_step(d, req.generation))
        part = PartRow(job, name, req.checkpoint, req.worker, req.step, req.generation, req.world_size,
                       _ENC.encode(updates))
        complete = len(others) + 1 == req.world_size
        with self._store.transaction() as tx:
            lost, changed = self._advance(d, tx, req.updates, req.generation, req.worker)
            if lost:
                raise LeaseLostError(
                    f"worker {req.worker} no longer holds shard(s) {lost[:10]} of {name!r} (lease "
                    "expired or revoked); its samples cannot be counted exactly once: restart the "
                    "job from its last committed checkpoint")
            tx.put_part(part)
            if complete:
                seq, cursor = self._complete(d, tx, req, part)
        self._apply_live(d, changed)
        d.parts[(req.checkpoint, req.worker)] = part
        if complete:
            self._after_complete(d, seq, cursor, req)
        return CommitReply(complete, len(others) + 1, self._committed_step(d, req.generation))

    def _check_covered(self, d: _Dataset, req: CommitRequest) -> None:
        """A part for an already complete checkpoint may only repeat what it holds.

        Raises:
            ConflictError: the part names progress the committed cursor does not contain.
        """
        if d.base_checkpoint == req.checkpoint:
            cursor = d.base
        else:
            row = self._store.load_commit(d.job, d.spec.name, req.checkpoint)
            if row is None:
                return
            cursor = msgspec.msgpack.decode(row.partial, type=Cursor)
        for u in req.updates:
            if u.shard_id >= cursor.frontier or cursor.partial.get(u.shard_id, u.offset) < u.offset:
                raise ConflictError(
                    f"checkpoint {req.checkpoint!r} is already committed without worker {req.worker}'s progress on "
                    f"shard {u.shard_id} (offset {u.offset}): a second save at one step must carry the same data "
                    "cursor; save once per step, or after a new step")

    @staticmethod
    def _committed_step(d: _Dataset, generation: int) -> int:
        """The step of the newest complete commit made by ``generation`` (-1: none)."""
        c = d.commits.get(d.base_checkpoint) if d.base_checkpoint is not None else None
        return c.info.step if c is not None and c.info.generation == generation else -1

    def _complete(self, d: _Dataset, tx: Tx, req: CommitRequest, last: PartRow) -> tuple[int, Cursor]:
        parts = [p for p in d.parts.values() if p.generation == req.generation and p.step <= req.step
                 and (p.checkpoint, p.worker) != (last.checkpoint, last.worker)] + [last]
        parts.sort(key=lambda p: (p.step, p.worker))
        cursor = _advance_cursor(d.spec, d.base, (u for p in parts for u in _UPDATES.decode(p.updates)))
        seq = 1 + max((c.seq for c in d.commits.values()), default=0)
        tx.put_commit(CommitRow(d.job, d.spec.name, req.checkpoint, seq, req.step, req.generation,
                                cursor.frontier, _ENC.encode(cursor), self._clock.now()))
        for p in d.parts.values():
            if p.generation != req.generation or p.step <= req.step:
                tx.delete_part(d.job, d.spec.name, p.checkpoint, p.worker)
        tx.delete_part(d.job, d.spec.name, last.checkpoint, last.worker)
        tx.put_dataset(replace(d.row(), base_checkpoint=req.checkpoint))
        tx.prune_commits(d.job, d.spec.name, self._keep)
        return seq, cursor

    def _after_complete(self, d: _Dataset, seq: int, cursor: Cursor, req: CommitRequest) -> None:
        for key in [k for k, p in d.parts.items() if p.generation != req.generation or p.step <= req.step]:
            del d.parts[key]
        d.base, d.base_checkpoint = cursor, req.checkpoint
        d.commits[req.checkpoint] = _Commit(seq, CommitInfo(req.checkpoint, req.step, req.generation,
                                                             self._clock.now()))
        while len(d.commits) > self._keep:
            del d.commits[next(iter(d.commits))]
        log.info("dataset %s/%s: checkpoint %s committed at step %d (frontier %d, %d partial)",
                 d.job, d.spec.name, req.checkpoint, req.step, cursor.frontier, len(cursor.partial))

    def restore(self, job: str, name: str, req: RestoreRequest) -> RestoreReply:
        """Reset the live state to the cursor committed with ``req.checkpoint``.

        Commits after that checkpoint are forgotten (the lineage stays linear).

        Raises:
            NotFoundError: the checkpoint has no complete commit for this dataset.
            ConflictError: this generation already restored from another checkpoint.
        """
        self._members.check_generation(job, req.generation)
        d = self._get(job, name)
        if d.restored_generation == req.generation:
            if d.restored_from == req.checkpoint:
                return RestoreReply(req.checkpoint, False)
            raise ConflictError(f"generation {req.generation} already restored {name!r} from "
                                f"{d.restored_from!r}; all ranks must restore the same checkpoint")
        if req.checkpoint is None:
            cursor, seq = _EMPTY, 0
        else:
            c = d.commits.get(req.checkpoint)
            row = self._store.load_commit(job, name, req.checkpoint) if c else None
            if row is None:
                raise NotFoundError(
                    f"checkpoint {req.checkpoint!r} has no complete commit for dataset {name!r} "
                    f"(committed: {list(d.commits)[-5:]}); restore a committed checkpoint or None")
            cursor, seq = msgspec.msgpack.decode(row.partial, type=Cursor), c.seq
        old = (d.fresh, d.base, d.base_checkpoint, d.restored_from, d.restored_generation)
        d.fresh, d.base, d.base_checkpoint = cursor.frontier, cursor, req.checkpoint
        d.restored_from, d.restored_generation = req.checkpoint, req.generation
        try:
            with self._store.transaction() as tx:
                tx.delete_all_live(job, name)
                tx.delete_all_parts(job, name)
                tx.delete_commits_after(job, name, seq)
                for sid, off in cursor.partial.items():
                    tx.put_live(d.live_row(sid, _Live(TODO, off)))
                tx.put_dataset(d.row())
        except BaseException:
            d.fresh, d.base, d.base_checkpoint, d.restored_from, d.restored_generation = old
            raise
        d.live = {sid: _Live(TODO, off) for sid, off in cursor.partial.items()}
        d.todo = sorted(cursor.partial)
        d.holders.clear()
        d.pace.restored()
        d.parts.clear()
        d.commits = {k: c for k, c in d.commits.items() if c.seq <= seq}
        log.info("dataset %s/%s: generation %d restored from %s (frontier %d, %d partial)",
                 job, name, req.generation, req.checkpoint, cursor.frontier, len(cursor.partial))
        return RestoreReply(req.checkpoint, True)


def _merge_part(req: CommitRequest, earlier: list[ShardUpdate], earlier_step: int) -> Optional[list[ShardUpdate]]:
    """A worker's second part of one checkpoint: parts are additive. The result is the union of
    both (sorted by shard), or None if the new part adds nothing.

    Raises:
        ConflictError: the parts name different steps, or one shard at different positions.
    """
    if req.step != earlier_step:
        raise ConflictError(f"worker {req.worker} already sent its part of checkpoint {req.checkpoint!r} at step "
                            f"{earlier_step}, not {req.step}; a checkpoint id names one step: save under a new name")
    merged = {u.shard_id: u for u in earlier}
    added = False
    for u in req.updates:
        old = merged.get(u.shard_id)
        if old is None:
            merged[u.shard_id] = u
            added = True
        elif (old.lease_id, old.offset) != (u.lease_id, u.offset):
            raise ConflictError(
                f"worker {req.worker}'s parts of checkpoint {req.checkpoint!r} disagree on shard {u.shard_id} "
                f"(lease {old.lease_id} offset {old.offset}, then lease {u.lease_id} offset {u.offset}): a second "
                "save at one step must carry the same data cursor; save once per step, or after a new step")
    return [merged[k] for k in sorted(merged)] if added else None


def _advance_cursor(spec: DatasetSpec, base: Cursor, updates: Iterable[ShardUpdate]) -> Cursor:
    """Apply committed offsets to a cursor (pure; offsets only move forward)."""
    frontier, partial = base.frontier, dict(base.partial)
    for u in updates:
        sid = u.shard_id
        if sid >= frontier:
            for s in range(frontier, sid + 1):  # leased in order: everything up to sid is in play
                partial[s] = spec.shard_bounds(s)[1]
            frontier = sid + 1
        if sid not in partial:
            continue  # already finished in an earlier commit
        end = spec.shard_bounds(sid)[2]
        if u.offset >= end:
            del partial[sid]
        elif u.offset > partial[sid]:
            partial[sid] = u.offset
    return Cursor(frontier, partial)
