"""Randomized exactly-once check of the shard manager, in process, against a real SQLite file.

A simulated data-parallel job trains a "model" that counts how often it saw each
(epoch, index). Workers lease shards, consume them in steps, checkpoint every few steps
(model + commit parts), and at random moments: a worker crashes (the job restores the last
committed checkpoint in a new generation with a new world size), a crash hits in the middle
of a commit, a lease expires, or the coordinator itself restarts from its database file.
At the end every count must be exactly 1.
"""

import random
import uuid

import numpy as np
import pytest

from elastictrain.clock import ManualClock
from elastictrain.coordinator.membership import Membership
from elastictrain.coordinator.shards import ShardManager
from elastictrain.coordinator.store import SQLiteStore
from elastictrain.errors import ConflictError, LeaseLostError, StaleGenerationError
from elastictrain.model import DatasetSpec
from elastictrain.sharding import permuted_indices
from elastictrain.wire import CommitRequest, LeaseRequest, ProgressRequest, RestoreRequest, ShardUpdate

JOB, DS = "job", "data"


class Coord:
    def __init__(self, path, clock):
        self.path, self.clock = path, clock
        self.open()

    def open(self):
        self.store = SQLiteStore(self.path)
        loaded = self.store.load()
        self.members = Membership(self.store, loaded.jobs)
        self.shards = ShardManager(self.store, self.members, self.clock, keep_commits=8)
        self.shards.load(loaded)

    def restart(self):
        self.store.close()
        self.open()


class Worker:
    """The client side, without threads: leases, consumption, touched offsets."""

    def __init__(self, coord, spec, gen, rank):
        self.c, self.spec, self.gen, self.rank = coord, spec, gen, rank
        self.cur = None  # [lease, indices, pos]
        self.touched = {}  # shard_id -> (lease_id, offset)
        self.done = False
        self.ready = []  # prefetched leases, not consumed from yet

    def _lease(self):
        reply = self.c.shards.lease(JOB, DS, LeaseRequest(self.gen, self.rank, uuid.uuid4().hex))
        return reply.lease

    def prefetch(self):
        ls = self._lease()
        if ls is not None:
            self.ready.append(ls)

    def take(self, n):
        out = []
        while len(out) < n and not self.done:
            if self.cur is None:
                ls = self.ready.pop(0) if self.ready else self._lease()
                if ls is None:
                    self.done = True
                    break
                idx = permuted_indices(self.spec.num_samples, self.spec.seed, ls.epoch, ls.offset, ls.end)
                self.cur = [ls, idx, 0]
            ls, idx, pos = self.cur
            k = min(n - len(out), len(idx) - pos)
            out.extend((ls.epoch, int(i)) for i in idx[pos:pos + k])
            pos += k
            self.cur[2] = pos
            self.touched[ls.shard_id] = (ls.lease_id, ls.offset + pos)
            if pos == len(idx):
                self.cur = None
        return out

    def part(self):
        return [ShardUpdate(s, lid, off) for s, (lid, off) in sorted(self.touched.items())]


def run_job(tmp_path, seed, *, num_samples=2000, shard_size=37, epochs=2, taper=0):
    rng = random.Random(seed)
    clock = ManualClock(1000.0)
    coord = Coord(str(tmp_path / f"c{seed}.db"), clock)
    spec = DatasetSpec(DS, num_samples, shard_size, epochs=epochs, seed=seed, lease_ttl=30, taper=taper)
    coord.members.create_job(JOB, 1, 4)
    coord.shards.register(JOB, spec)
    saved = {}  # checkpoint id -> model counts (the "checkpoint files")
    model = np.zeros((epochs, num_samples), dtype=np.int32)
    gen, ckpt_no, steps, crashes = 0, 0, 0, 0
    latest = None
    while True:
        world = rng.randint(1, 4)
        info = coord.members.open_generation(JOB, gen, world, "failure" if gen else "start")
        gen = info.generation
        latest = coord.shards.commits(JOB, DS)[-1].checkpoint if coord.shards.commits(JOB, DS) else None
        coord.shards.restore(JOB, DS, RestoreRequest(gen, latest))
        model = saved[latest].copy() if latest else np.zeros_like(model)
        workers = [Worker(coord, spec, gen, r) for r in range(world)]
        crashed = False
        while not all(w.done for w in workers):
            for w in workers:
                if rng.random() < 0.1 and len(w.ready) < 2:
                    w.prefetch()
            batch = [w.take(rng.randint(1, 50)) for w in workers]
            for samples in batch:  # the synchronized step: every rank's samples enter the model
                for e, i in samples:
                    model[e, i] += 1
            steps += 1
            event = rng.random()
            if event < 0.02:  # a worker crashes: all state since the last commit is lost
                crashed = True
                break
            if event < 0.04:
                coord.restart()
            if event < 0.05:  # progress reports with a lease that expires under a slow worker
                w = rng.choice(workers)
                coord.shards.progress(JOB, DS, ProgressRequest(gen, w.rank, w.part()))
            if steps % rng.randint(3, 8) == 0:
                ckpt_no += 1
                name = f"ck{ckpt_no}"
                saved[name] = model.copy()  # rank 0 persists the model before its part
                parts = [(w.rank, w.part()) for w in workers]
                rng.shuffle(parts)
                cut = len(parts) if rng.random() > 0.1 else rng.randint(0, len(parts) - 1)
                for rank, upd in parts[:cut]:
                    coord.shards.commit(JOB, DS, CommitRequest(gen, rank, world, name, steps, upd))
                if cut < len(parts):  # crash in the middle of a commit
                    crashed = True
                    break
        if crashed:
            crashes += 1
            if rng.random() < 0.3:  # a zombie of the dead generation must be fenced off
                coord.members.open_generation(JOB, gen, 1, "failure")
                with pytest.raises(StaleGenerationError):
                    coord.shards.lease(JOB, DS, LeaseRequest(gen, 0, "zombie"))
                gen += 1
            continue
        # finished: final checkpoint
        ckpt_no += 1
        saved["final"] = model.copy()
        for w in workers:
            coord.shards.commit(JOB, DS, CommitRequest(gen, w.rank, world, "final", steps + 1, w.part()))
        break
    final = coord.shards.commits(JOB, DS)[-1].checkpoint
    assert final == "final"
    assert coord.shards.info(JOB, DS).finished
    coord.store.close()
    return saved[final], crashes


@pytest.mark.parametrize("seed", range(24))
def test_every_sample_exactly_once(tmp_path, seed):
    counts, crashes = run_job(tmp_path, seed)
    assert counts.min() == 1 and counts.max() == 1, (
        f"seed {seed}: {np.count_nonzero(counts == 0)} lost, {np.count_nonzero(counts > 1)} repeated")


@pytest.mark.parametrize("seed, taper", [(s, 2 + s % 4) for s in range(40, 48)])
def test_every_sample_exactly_once_with_shrinking_shards(tmp_path, seed, taper):
    # shards of many sizes at each epoch's end: leases, restores and commits must not care
    counts, _ = run_job(tmp_path, seed, shard_size=97, taper=taper)
    assert counts.min() == 1 and counts.max() == 1, (
        f"seed {seed}: {np.count_nonzero(counts == 0)} lost, {np.count_nonzero(counts > 1)} repeated")


def test_crashes_actually_happen(tmp_path):
    total = sum(run_job(tmp_path, s, num_samples=800)[1] for s in range(100, 106))
    assert total > 0


def test_expired_lease_returns_only_the_remainder(tmp_path):
    clock = ManualClock(0.0)
    coord = Coord(str(tmp_path / "c.db"), clock)
    spec = DatasetSpec(DS, 100, 10, lease_ttl=5)
    coord.members.create_job(JOB, 1, 2)
    coord.members.open_generation(JOB, 0, 2, "start")
    coord.shards.register(JOB, spec)
    a = coord.shards.lease(JOB, DS, LeaseRequest(1, 0, "a")).lease
    coord.shards.progress(JOB, DS, ProgressRequest(1, 0, [ShardUpdate(a.shard_id, a.lease_id, 4)]))
    clock.advance(6)
    b = coord.shards.lease(JOB, DS, LeaseRequest(1, 1, "b")).lease
    assert (b.shard_id, b.offset) == (a.shard_id, 4)  # only [4, 10) came back
    lost = coord.shards.progress(JOB, DS, ProgressRequest(1, 0, [ShardUpdate(a.shard_id, a.lease_id, 7)]))
    assert lost.lost == [a.shard_id]  # the old holder is fenced by the lease id
    with pytest.raises(LeaseLostError):
        coord.shards.commit(JOB, DS, CommitRequest(1, 0, 2, "c1", 1, [ShardUpdate(a.shard_id, a.lease_id, 7)]))


def test_lease_retry_is_idempotent(tmp_path):
    coord = Coord(str(tmp_path / "c.db"), ManualClock())
    coord.members.create_job(JOB, 1, 1)
    coord.members.open_generation(JOB, 0, 1, "start")
    coord.shards.register(JOB, DatasetSpec(DS, 100, 10))
    first = coord.shards.lease(JOB, DS, LeaseRequest(1, 0, "same")).lease
    coord.restart()
    again = coord.shards.lease(JOB, DS, LeaseRequest(1, 0, "same")).lease
    assert first == again
    assert coord.shards.info(JOB, DS).doing == 1


def test_late_progress_after_the_commit_that_finished_the_shard(tmp_path):
    """A progress report retried across a coordinator restart may land after the commit that
    finished its shard: it is a harmless repeat of the finishing lease, not a lost lease. A
    report under any other lease is refused."""
    coord = Coord(str(tmp_path / "c.db"), ManualClock())
    coord.members.create_job(JOB, 1, 1)
    coord.members.open_generation(JOB, 0, 1, "start")
    coord.shards.register(JOB, DatasetSpec(DS, 100, 10))
    ls = coord.shards.lease(JOB, DS, LeaseRequest(1, 0, "a")).lease
    stale = ShardUpdate(ls.shard_id, ls.lease_id, 4)  # computed before the shard was finished
    assert coord.shards.commit(JOB, DS, CommitRequest(1, 0, 1, "c1", 1, [ShardUpdate(ls.shard_id, ls.lease_id, 10)]))
    assert coord.shards.progress(JOB, DS, ProgressRequest(1, 0, [stale])).lost == []
    coord.restart()
    assert coord.shards.progress(JOB, DS, ProgressRequest(1, 0, [stale])).lost == []
    other = ShardUpdate(ls.shard_id, ls.lease_id + 1, 4)
    assert coord.shards.progress(JOB, DS, ProgressRequest(1, 0, [other])).lost == [ls.shard_id]


def _two_workers(tmp_path):
    coord = Coord(str(tmp_path / "c.db"), ManualClock())
    coord.members.create_job(JOB, 1, 2)
    coord.members.open_generation(JOB, 0, 2, "start")
    coord.shards.register(JOB, DatasetSpec(DS, 100, 10))
    return coord


def test_a_second_part_of_one_checkpoint_adds_and_never_replaces(tmp_path):
    """The bug of the README's loop: rank 1 sends its part of c1 (finished shard A), then a
    second save at the same step sends a part without A; rank 0 completes c1. A must be in
    the committed cursor, or the next restore serves its samples again."""
    coord = _two_workers(tmp_path)
    a = coord.shards.lease(JOB, DS, LeaseRequest(1, 1, "a")).lease
    b = coord.shards.lease(JOB, DS, LeaseRequest(1, 0, "b")).lease
    first = coord.shards.commit(JOB, DS, CommitRequest(1, 1, 2, "c1", 5, [ShardUpdate(a.shard_id, a.lease_id, a.end)]))
    assert not first.complete and first.committed_step == -1
    again = coord.shards.commit(JOB, DS, CommitRequest(1, 1, 2, "c1", 5, []))  # the second save's empty part
    assert not again.complete and again.parts == 1
    coord.restart()  # parts are durable and merged across a restart too
    done = coord.shards.commit(JOB, DS, CommitRequest(1, 0, 2, "c1", 5, [ShardUpdate(b.shard_id, b.lease_id, b.end)]))
    assert done.complete and done.committed_step == 5
    coord.members.open_generation(JOB, 1, 2, "failure")
    coord.shards.restore(JOB, DS, RestoreRequest(2, "c1"))
    served = set()
    while (ls := coord.shards.lease(JOB, DS, LeaseRequest(2, 0, uuid.uuid4().hex)).lease) is not None \
            and ls.epoch == 0:
        served.add(ls.shard_id)
        coord.shards.commit(JOB, DS, CommitRequest(2, 0, 2, f"x{ls.shard_id}", ls.shard_id,
                                                   [ShardUpdate(ls.shard_id, ls.lease_id, ls.end)]))
    assert a.shard_id not in served and b.shard_id not in served
    assert len(served) == 8


def test_a_second_part_that_contradicts_the_first_is_refused(tmp_path):
    coord = _two_workers(tmp_path)
    a = coord.shards.lease(JOB, DS, LeaseRequest(1, 1, "a")).lease
    coord.shards.commit(JOB, DS, CommitRequest(1, 1, 2, "c1", 5, [ShardUpdate(a.shard_id, a.lease_id, 4)]))
    with pytest.raises(ConflictError, match="same data cursor"):
        coord.shards.commit(JOB, DS, CommitRequest(1, 1, 2, "c1", 5, [ShardUpdate(a.shard_id, a.lease_id, 6)]))
    with pytest.raises(ConflictError, match="at step 5"):
        coord.shards.commit(JOB, DS, CommitRequest(1, 1, 2, "c1", 6, [ShardUpdate(a.shard_id, a.lease_id, 4)]))
    # the same part again is a no-op; a new shard is added
    b = coord.shards.lease(JOB, DS, LeaseRequest(1, 1, "b")).lease
    assert coord.shards.commit(JOB, DS, CommitRequest(1, 1, 2, "c1", 5, [ShardUpdate(a.shard_id, a.lease_id, 4)])).parts == 1
    coord.shards.commit(JOB, DS, CommitRequest(1, 1, 2, "c1", 5, [ShardUpdate(b.shard_id, b.lease_id, b.end)]))
    done = coord.shards.commit(JOB, DS, CommitRequest(1, 0, 2, "c1", 5, []))
    assert done.complete
    # after completion, a part may repeat what the commit holds, and nothing more
    assert coord.shards.commit(JOB, DS, CommitRequest(1, 1, 2, "c1", 5, [ShardUpdate(b.shard_id, b.lease_id, b.end)])).complete
    with pytest.raises(ConflictError, match="already committed"):
        coord.shards.commit(JOB, DS, CommitRequest(1, 1, 2, "c1", 5, [ShardUpdate(a.shard_id, a.lease_id, 8)]))
