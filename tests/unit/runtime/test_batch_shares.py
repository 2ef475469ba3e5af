"""Uneven batches: the split every rank computes alike, the share versions a worker heard of, and
Job.local_batch's part and loss scale."""

import pytest

from elastictrain.errors import ConfigError
from elastictrain.runtime.batch_shares import SharesBook, split_batch
from elastictrain.runtime.job import Job
from elastictrain.wire import BatchShares


def test_split_is_proportional_whole_and_gives_everyone_one():
    assert split_batch(32, [1, 1, 1, 1]) == [8, 8, 8, 8]
    assert split_batch(10, [1, 1, 1]) == [4, 3, 3]  # the remainder to the lower rank
    assert split_batch(32, [1, 1, 1, 1 / 3]) == [10, 10, 9, 3]
    for total in (4, 7, 33, 1000):
        for weights in ([1, 0.02, 1, 1], [0.5, 0.25, 1.0, 1.0], [1.0]):
            parts = split_batch(total, weights)
            assert sum(parts) == total and min(parts) >= 1
    assert split_batch(2, [1, 1, 1]) == [1, 1, 0]  # fewer samples than ranks
    with pytest.raises(ConfigError):
        split_batch(8, [1, 0])


def test_the_newest_version_in_force_at_a_step_applies():
    book = SharesBook()
    assert book.weights(1, 100, 3) is None
    book.heard(BatchShares(1, 1, 50, [1.0, 1.0, 0.5]))
    book.heard(BatchShares(1, 2, 80, [1.0, 0.5, 0.5]))
    book.heard(BatchShares(1, 2, 80, [1.0, 0.5, 0.5]))  # heard twice: kept once
    assert book.weights(1, 49, 3) is None
    assert book.weights(1, 50, 3) == [1.0, 1.0, 0.5]  # a rank that heard of version 2 first still applies 1
    assert book.weights(1, 80, 3) == [1.0, 0.5, 0.5]
    assert book.weights(2, 80, 3) is None and book.weights(1, 80, 4) is None  # another generation or world


class _Monitor:
    def __init__(self):
        self.shares, self.local_batch = SharesBook(), None


def test_local_batch_gives_the_part_and_the_loss_scale():
    job = Job(client=None, job_id="j", generation=3, rank=3, world_size=4)
    assert job.local_batch(32, 0) == (8, 1.0)
    job.monitor = _Monitor()
    job.monitor.shares.heard(BatchShares(3, 1, 10, [1.0, 1.0, 1.0, 1 / 3]))
    assert job.local_batch(32, 9) == (8, 1.0) and job.monitor.local_batch == 8
    part, scale = job.local_batch(32, 10)
    assert (part, scale) == (3, 4 * 3 / 32) and job.monitor.local_batch == 3
    with pytest.raises(ConfigError, match="global_batch"):
        job.local_batch(0, 1)
    with pytest.raises(ConfigError, match="step"):
        job.local_batch(8, -1)
