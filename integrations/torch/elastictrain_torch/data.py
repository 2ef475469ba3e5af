"""``torch.utils.data`` over the coordinator's shards.

``ElasticSampler`` is a drop-in for ``DistributedSampler`` (``set_epoch`` included): each
rank draws whichever shards it leases, so ranks that run faster simply see more data and
a rank that joins or dies changes nothing for the others.

``ElasticDataLoader`` wraps a ``DataLoader`` whose workers prefetch batches: a sample is
counted as consumed when its batch is handed to the training loop, not when the sampler
produced it, so the cursor a checkpoint commits matches what the model has seen.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable, Iterator, Optional

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

from elastictrain.errors import ConfigError
from elastictrain.runtime.shards import ShardIterator

__all__ = ["ElasticSampler", "ElasticDataLoader", "even_batches"]


class ElasticSampler(Sampler[int]):
    """Sample indices from a :class:`ShardIterator`; ``set_epoch(e)`` bounds it to epochs ``<= e``."""

    def __init__(self, shards: ShardIterator) -> None:
        self.shards = shards
        self.epoch: Optional[int] = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.shards.set_max_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(self.shards)


class _CountingBatchSampler(Sampler[list[int]]):
    def __init__(self, sampler: ElasticSampler, batch_size: int) -> None:
        self.sampler, self.batch_size = sampler, batch_size
        self.sizes: deque[int] = deque()

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.batch_size:
                self.sizes.append(len(batch))
                yield batch
                batch = []
        if batch:
            self.sizes.append(len(batch))
            yield batch


class ElasticDataLoader:
    """A ``DataLoader`` over ``dataset`` that reads its indices from ``shards``.

    Takes ``DataLoader``'s keyword arguments except ``sampler``, ``batch_sampler``,
    ``shuffle`` (the coordinator's permutation shuffles) and ``drop_last`` (a dropped
    sample would be lost; the last batch of an epoch may be short instead).

    Raises:
        ConfigError: one of the excluded arguments was given.
    """

    def __init__(self, dataset: Dataset, shards: ShardIterator, batch_size: int = 1, **kwargs: Any) -> None:
        for bad in ("sampler", "batch_sampler", "shuffle", "drop_last"):
            if kwargs.get(bad):
                raise ConfigError(f"ElasticDataLoader does not take {bad}=: the coordinator's shards decide "
                                  "the order, and no sample may be dropped")
            kwargs.pop(bad, None)
        shards.auto_consume = False
        self.shards = shards
        self.sampler = ElasticSampler(shards)
        self._batches = _CountingBatchSampler(self.sampler, batch_size)
        self.loader = DataLoader(dataset, batch_sampler=self._batches, **kwargs)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        self._batches.sizes.clear()
        # DataLoader draws its workers' base seed from the *global* torch RNG at every iter(),
        # which would shift the training RNG across a resume; draw it from a generator of
        # our own, seeded by the dataset seed and the epoch, instead.
        epoch = self.sampler.epoch or 0
        self.loader.generator = torch.Generator().manual_seed(self.shards.spec.seed * 1_000_003 + epoch)
        for batch in self.loader:
            # handed to the loop now: counted before any checkpoint of this step can be taken
            self.shards.mark_consumed(self._batches.sizes.popleft())
            yield batch


def even_batches(batches: Iterable[Any], group: Optional[dist.ProcessGroup] = None) -> Iterator[Optional[Any]]:
    """Yield ``batches`` until *every* rank has run out, then stop on all ranks together.

    Dynamic shards give ranks uneven amounts of data; a rank that has run out yields None
    (run a step with no samples, or skip the forward pass but join the collectives) while
    others still have data. Costs one small all-reduce per step, on ``group`` (default: the
    job's own group, which inside ``etrun --group`` is not the default one).
    """
    if group is None:
        from .distributed import job_group

        group = job_group()
    it = iter(batches)
    flag = torch.zeros(1, dtype=torch.int32)
    while True:
        batch = next(it, None)
        flag.fill_(0 if batch is None else 1)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        if flag.item() == 0:
            return
        yield batch
