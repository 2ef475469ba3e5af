"""ShardIterator and the torch adapters against a real coordinator process."""

import time

import pytest

from elastictrain import DatasetSpec
from elastictrain.runtime.client import CoordinatorClient
from elastictrain.runtime.shards import ShardIterator


@pytest.fixture
def job(client):
    client.create_job("it", 1, 2)
    client.open_generation("it", 0, 1)
    return "it"


def test_iterates_every_index_once_across_epochs(client, job):
    spec = DatasetSpec("d", 1000, 64, epochs=2, seed=3)
    with ShardIterator(client, job, spec, generation=1, worker=0) as it:
        got = list(it.samples())
    assert sorted(i for e, i in got if e == 0) == list(range(1000))
    assert sorted(i for e, i in got if e == 1) == list(range(1000))
    assert it.finished and client.dataset(job, "d").finished


def test_max_epoch_bounds_leases_and_resumes(client, job):
    spec = DatasetSpec("d", 300, 50, epochs=3)
    with ShardIterator(client, job, spec, generation=1, worker=0, max_epoch=0) as it:
        first = list(it)
        it.set_max_epoch(1)
        second = list(it)
    assert sorted(first) == list(range(300)) and sorted(second) == list(range(300))


def test_steady_state_never_waits_on_the_coordinator(client, job, monkeypatch):
    # a training loop that spends a little time per shard: the prefetched leases must be there
    # already (counted, not timed: the iterator records each time it found none ready) unless the
    # coordinator itself was slow. Two leases ahead cover 20 ms of compute; a single commit on
    # PostgreSQL (an fsync) sometimes takes 100-300 ms on a busy disk, and no prefetch of two
    # hides that, so the test times each call and allows one wait per slow call.
    slow = []
    for name in ("lease", "progress"):
        call = getattr(CoordinatorClient, name)

        def timed(self, *a, _call=call, **k):
            t = time.monotonic()
            try:
                return _call(self, *a, **k)
            finally:
                if time.monotonic() - t > 0.01:  # longer than one shard's compute
                    slow.append(time.monotonic() - t)
        monkeypatch.setattr(CoordinatorClient, name, timed)
    spec = DatasetSpec("d", 20_000, 100)
    with ShardIterator(client, job, spec, generation=1, worker=0, prefetch=2) as it:
        for n, _ in enumerate(it):
            if n % 100 == 99:
                time.sleep(0.01)  # "compute" for a shard's worth of samples
            if n == 10_000:
                break
    assert it.lease_waits <= 2 + len(slow), (
        f"waited for a lease {it.lease_waits} times in 100 shards; {len(slow)} coordinator calls took over 10 ms")


def test_cursor_counts_what_a_prefetching_loader_handed_out(client, job):
    torch = pytest.importorskip("torch")
    from elastictrain_torch import ElasticDataLoader

    spec = DatasetSpec("d", 1000, 100)
    data = torch.arange(1000)
    shards = ShardIterator(client, job, spec, generation=1, worker=0)
    loader = ElasticDataLoader(data, shards, batch_size=10, num_workers=2, prefetch_factor=4)
    seen = []
    for batch in loader:
        seen.extend(batch.tolist())
        if len(seen) == 130:
            break
    part = shards.cursor(step=13)
    consumed = sum(u.offset - spec.shard_bounds(u.shard_id)[1] for u in part.updates)
    assert consumed == 130  # not what the workers prefetched
    assert len(set(seen)) == 130
    shards.close()


def test_commit_then_restore_serves_exactly_the_rest(client, job):
    spec = DatasetSpec("d", 500, 30, seed=9)
    a = ShardIterator(client, job, spec, generation=1, worker=0)
    g = iter(a)
    before = [next(g) for _ in range(200)]
    part = a.cursor(step=1)
    assert a.commit("c1", 1, 1, part).complete
    lost = [next(g) for _ in range(77)]  # consumed after the checkpoint, then the worker dies
    a.close(release=False)
    client.open_generation(job, 1, 1, "failure")
    client.restore(job, "d", 2, "c1")
    with ShardIterator(client, job, spec, generation=2, worker=0, register=False) as b:
        after = list(b)
    assert sorted(before + after) == list(range(500))
    assert set(lost) <= set(after)


def test_finished_shards_are_forgotten_only_once_a_complete_commit_holds_them(client):
    """An acknowledged part of a checkpoint that is not complete yet may never complete (its
    other rank dies first): the worker must keep sending its finished shards until a complete
    commit covers them, and a second save at the same step must send the same part."""
    client.create_job("two", 1, 2)
    client.open_generation("two", 0, 2)
    spec = DatasetSpec("d", 600, 30, seed=4)
    r0 = ShardIterator(client, "two", spec, generation=1, worker=0)
    r1 = ShardIterator(client, "two", spec, generation=1, worker=1, register=False)
    g1 = iter(r1)
    for _ in range(35):  # one shard finished, one begun
        next(g1)
    part = r1.cursor(step=1)
    finished = [u.shard_id for u in part.updates if u.offset == spec.shard_bounds(u.shard_id)[2]]
    assert len(finished) == 1
    assert not r1.commit("c1", 1, 2, part).complete
    assert r1.cursor(step=1) == part  # the second save at one step: the same part, nothing forgotten
    assert r1.commit("c1", 1, 2).parts == 1
    assert r0.commit("c1", 1, 2).complete
    reply = r1.commit("c2", 2, 2)
    assert reply.committed_step == 1
    assert finished[0] not in [u.shard_id for u in r1.cursor(step=3).updates]
    r0.close(release=False)
    r1.close(release=False)


def test_a_slow_worker_takes_no_prefetch_the_others_would_wait_for(client):
    # two workers of one job, one consuming a quarter as fast (both report 5 times a second):
    # near the end the slow one's prefetches are answered "later" and it leases once it runs out
    # (at the very end a fast one's may be too), and every sample is still consumed once
    import threading

    client.create_job("pace", 1, 2)
    client.open_generation("pace", 0, 2)
    spec = DatasetSpec("d", 6_000, 100, seed=1)
    its = [ShardIterator(client, "pace", spec, generation=1, worker=w, report_interval=0.2) for w in (0, 1)]
    got: list[list[int]] = [[], []]

    def consume(w: int, pause: float) -> None:
        for i in its[w]:
            got[w].append(i)
            if len(got[w]) % 25 == 0:
                time.sleep(pause)

    threads = [threading.Thread(target=consume, args=(0, 0.025)), threading.Thread(target=consume, args=(1, 0.1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for it in its:
        it.close()
    assert sorted(got[0] + got[1]) == list(range(6_000))
    assert its[1].deferred >= 1, (its[0].deferred, its[1].deferred)


def test_against_an_older_coordinator_prefetches_go_unpaced(client, job):
    # a coordinator of the previous release refuses the fields it does not know (400, naming it)
    from elastictrain.errors import BadRequestError

    spec = DatasetSpec("d", 2_000, 100)
    it = ShardIterator(client, job, spec, generation=1, worker=0)
    real = it._bg.lease

    def old_lease(job, name, generation, worker, request_id, max_epoch=None, held=0, rate=0.0):
        if held or rate:
            raise BadRequestError("Object contains unknown field `held` - at `$`")
        return real(job, name, generation, worker, request_id, max_epoch)

    it._bg.lease = old_lease
    got = []
    with it:
        for i in it:
            got.append(i)
            if len(got) % 100 == 0:
                time.sleep(0.02)  # "compute": the iterator prefetches meanwhile
    assert sorted(got) == list(range(2_000))
    assert not it._pace  # it said so in the log and went on without


def test_registering_where_the_coordinator_drops_a_field_is_refused(client, job, monkeypatch):
    import dataclasses

    from elastictrain.errors import ConfigError

    spec = DatasetSpec("d", 1_000, 100, taper=4)
    real = client._call

    def old_call(method, path, reply, body=None):  # an older release decodes the spec without taper
        return real(method, path, reply, dataclasses.replace(body, taper=0) if isinstance(body, DatasetSpec) else body)

    monkeypatch.setattr(client, "_call", old_call)
    with pytest.raises(ConfigError, match="older release"):
        client.register_dataset(job, spec)
    assert client.register_dataset(job, DatasetSpec("e", 1_000, 100)).spec.name == "e"
