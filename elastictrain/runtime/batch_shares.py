"""Uneven batches for a straggling rank: DLRover's dynamic-sharding answer, for synchronous data
parallelism.

In an all-reduce job every rank waits for the slowest at each step, so a rank that computes 3x
slower holds the whole job to a third of its speed. Handing it fewer samples per step evens the
ranks' step times again. The coordinator decides the shares (a weight per rank, see
:mod:`elastictrain.coordinator.stragglers`) and returns them with each resource report; every
rank applies a version from the same training step (``from_step``), so the ranks' parts add up to
the global batch at every step. Samples still come from the exactly-once shard iterator: a rank
with a smaller part simply leases shards less often.

The loss of a rank with ``n`` of the ``N`` samples of a step is scaled by ``world * n / N``: the
all-reduce averages the ranks' gradients, so the step's gradient is then the mean over all ``N``
samples, as with equal parts.
"""

from __future__ import annotations

import threading
from typing import Optional, Sequence

from ..errors import ConfigError
from ..wire import BatchShares

__all__ = ["split_batch", "SharesBook"]


def split_batch(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` samples split in proportion to ``weights`` (largest remainders, ties to the lower
    rank; every rank gets at least one where there are enough). Every rank computes the same split."""
    if not weights:
        raise ConfigError("split_batch needs at least one weight")
    if any(not w > 0 for w in weights):
        raise ConfigError(f"batch weights must be > 0, got {list(weights)}")
    whole = sum(weights)
    raw = [total * w / whole for w in weights]
    parts = [int(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: (parts[i] - raw[i], i))[:total - sum(parts)]:
        parts[i] += 1
    if total >= len(parts):
        for i, n in enumerate(parts):
            if n == 0:
                parts[max(range(len(parts)), key=lambda j: (parts[j], -j))] -= 1
                parts[i] = 1
    return parts


class SharesBook:
    """The share versions a worker has heard of (the monitor records each report's answer)."""

    def __init__(self, keep: int = 8) -> None:
        self._versions: list[BatchShares] = []
        self._keep = keep
        self._lock = threading.Lock()

    def heard(self, shares: Optional[BatchShares]) -> None:
        if shares is None:
            return
        with self._lock:
            if any(v.generation == shares.generation and v.version == shares.version for v in self._versions):
                return
            self._versions = sorted([*self._versions, shares], key=lambda v: (v.generation, v.version))[-self._keep:]

    def weights(self, generation: int, step: int, world: int) -> Optional[list[float]]:
        """The newest version of ``generation`` in force at ``step`` (None: equal parts)."""
        with self._lock:
            live = [v for v in self._versions if v.generation == generation and v.from_step <= step
                    and len(v.weights) == world]
        return list(live[-1].weights) if live else None
