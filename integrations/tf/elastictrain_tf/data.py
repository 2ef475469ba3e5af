"""``tf.data`` over the coordinator's shards, with consumption counted at the training step."""

from __future__ import annotations

import math
from collections import deque
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from elastictrain.errors import ConfigError
from elastictrain.runtime.shards import ShardIterator

__all__ = ["ElasticTFData"]


class ElasticTFData:
    """Batches of sample indices leased from the coordinator, as a ``tf.data.Dataset``.

    ``map_fn`` turns a batch of indices (int64 vector) into the model's inputs, for example
    ``lambda i: (tf.gather(x, i), tf.gather(y, i))``. tf.data runs ahead of training, so a
    batch counts as consumed only when :meth:`batch_done` is called (the Keras callback does
    it after every training batch; call it yourself in a custom loop). ``set_epoch(e)`` bounds
    the next pass to epochs ``<= e``, like ``DistributedSampler.set_epoch``.
    """

    def __init__(self, shards: ShardIterator, batch_size: int,
                 map_fn: Optional[Callable] = None, prefetch: int = 2) -> None:
        shards.auto_consume = False
        self.shards, self.batch_size = shards, batch_size
        self._sizes: deque[int] = deque()
        ds = tf.data.Dataset.from_generator(self._batches, output_signature=tf.TensorSpec((None,), tf.int64))
        if map_fn is not None:
            ds = ds.map(map_fn)
        self.dataset = ds.prefetch(prefetch)

    def _batches(self):
        self._sizes.clear()
        batch: list[int] = []
        for i in self.shards:
            batch.append(i)
            if len(batch) == self.batch_size:
                self._sizes.append(len(batch))
                yield np.asarray(batch, dtype=np.int64)
                batch = []
        if batch:
            self._sizes.append(len(batch))
            yield np.asarray(batch, dtype=np.int64)

    def set_epoch(self, epoch: int) -> None:
        self.shards.set_max_epoch(epoch)

    def distributed(self, strategy: tf.distribute.Strategy):
        """This worker's batches as a distributed dataset of ``strategy`` (one replica per
        worker): each worker feeds its own shards, nothing is re-sharded or re-batched."""
        if strategy.extended.worker_devices and len(strategy.extended.worker_devices) != 1:
            raise ConfigError(f"{len(strategy.extended.worker_devices)} replicas on this worker: elastictrain "
                              "runs one replica per worker process; start one worker per device with etrun")
        return strategy.distribute_datasets_from_function(lambda _ctx: self.dataset)

    def steps_hint(self, epoch: int, replicas: int = 1) -> Optional[int]:
        """About how many steps ``epoch`` has left, from the coordinator's counts (a progress
        bar's total; the bar settles on the real count at the epoch's end); None if unknown."""
        try:
            info = self.shards.info()
        except Exception:  # noqa: BLE001 - a hint only; the bar then says "Unknown"
            return None
        spec = info.spec
        per_epoch = spec.shards_per_epoch
        left = max(0, min(per_epoch, (epoch + 1) * per_epoch - info.done))
        if left == 0:
            return None
        samples = spec.num_samples - spec.shard_bounds(per_epoch - left)[1]
        return max(1, math.ceil(samples / (self.batch_size * replicas)))

    def batch_done(self) -> None:
        """The oldest batch handed out has been trained on. A step on which this worker had no
        data left (the others still had) consumes nothing."""
        if self._sizes:
            self.shards.mark_consumed(self._sizes.popleft())
