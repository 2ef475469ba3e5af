"""Prefetches near an epoch's end: a worker that still holds data is told to come back ``later``
when what it would then hold outlasts the rest of the job (a slow rank must not keep prefetched
leases while the others run out and wait for it); a worker that has run out always gets one."""

import pytest

from elastictrain.clock import ManualClock
from elastictrain.coordinator.pacing import left
from elastictrain.model import DatasetSpec
from elastictrain.wire import LeaseRequest, ProgressRequest, ShardUpdate

from .test_shards_exactly_once import DS, JOB, Coord


class Job:
    """Two workers that lease on demand and report what they consumed once a second."""

    def __init__(self, tmp_path, num_samples=20_000):
        self.clock = ManualClock(0.0)
        self.coord = Coord(str(tmp_path / "c.db"), self.clock)
        self.coord.members.create_job(JOB, 1, 2)
        self.coord.members.open_generation(JOB, 0, 2, "start")
        self.coord.shards.register(JOB, DatasetSpec(DS, num_samples, 500))
        self.cur = {0: None, 1: None}  # worker -> [lease, offset]
        self.n = 0

    def ask(self, worker, held=0, rate=0.0):
        self.n += 1
        return self.coord.shards.lease(JOB, DS, LeaseRequest(1, worker, f"r{self.n}", 0, held, rate))

    def run(self, seconds, rates):
        """Each worker consumes ``rates[w]`` positions a second from its lease."""
        for _ in range(seconds):
            self.clock.advance(1.0)
            for w, rate in rates.items():
                want = rate
                while want:
                    if self.cur[w] is None:
                        self.cur[w] = [self.ask(w).lease, None]
                        self.cur[w][1] = self.cur[w][0].offset
                    ls, pos = self.cur[w]
                    take = min(want, ls.end - pos)
                    want -= take
                    self.cur[w][1] = pos + take
                    self.coord.shards.progress(JOB, DS, ProgressRequest(1, w, [ShardUpdate(
                        ls.shard_id, ls.lease_id, pos + take)]))
                    if pos + take == ls.end:
                        self.cur[w] = None

    def left(self):
        return left(self.coord.shards._ds[(JOB, DS)], 0)


def test_a_slow_worker_prefetches_mid_epoch_but_not_at_its_end(tmp_path):
    job = Job(tmp_path)
    job.run(10, {0: 900, 1: 100})  # the job consumes 1,000 positions a second
    assert job.left() == 10_000
    # mid-epoch: 10 s of work left; holding 200 + 500 more is 7 s at 100/s: granted
    assert job.ask(1, held=200, rate=100.0).lease is not None
    job.run(6, {0: 900, 1: 100})
    assert 3_000 <= job.left() <= 4_000  # 3-4 s left for the job
    reply = job.ask(1, held=200, rate=100.0)  # 7 s of its own work: it would be the last by far
    assert reply.lease is None and reply.later and not reply.exhausted
    fast = job.ask(0, held=200, rate=900.0)  # 0.8 s at its rate: granted
    assert fast.lease is not None and not fast.later
    assert job.ask(1).lease is not None  # out of data (held 0): always served


@pytest.mark.parametrize("held, rate", [(200, 0.0), (0, 100.0)])
def test_without_its_rate_or_holdings_a_worker_is_served(tmp_path, held, rate):
    job = Job(tmp_path)
    job.run(16, {0: 900, 1: 100})
    assert job.ask(1, held=held, rate=rate).lease is not None


def test_the_jobs_rate_must_be_measured_first(tmp_path):
    job = Job(tmp_path, num_samples=1_500)
    job.run(1, {0: 500, 1: 100})  # one second of reports: no rate yet, nothing is refused
    assert job.ask(1, held=400, rate=100.0).lease is not None


def test_a_refused_prefetch_changes_nothing(tmp_path):
    job = Job(tmp_path)
    job.run(16, {0: 900, 1: 100})
    before = job.coord.shards.info(JOB, DS)
    assert job.ask(1, held=200, rate=100.0).later
    assert job.coord.shards.info(JOB, DS) == before
    job.coord.restart()  # nor anything durable
    assert job.coord.shards.info(JOB, DS) == before
