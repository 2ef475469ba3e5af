"""Communication profile for TensorFlow from gradient sizes.

Data-parallel TF (MirroredStrategy, MultiWorkerMirroredStrategy, Horovod) all-reduces every
gradient once per step, so the bytes per iteration are the gradients' sizes; the time per
collective is measured where the caller can time it (``seconds``), else left at 0.
"""

from __future__ import annotations

from typing import Optional, Sequence

from elastictrain.runtime.profiler import CommStats, comm_profile
from elastictrain.wire import CommProfile

__all__ = ["comm_profile_from_gradients"]


def comm_profile_from_gradients(gradients: Sequence, iterations: int = 1, seconds: Optional[float] = None,
                                worker: int = 0) -> CommProfile:
    """``gradients``: the tensors (or variables) of one step; ``seconds``: measured all-reduce
    time per iteration if known."""
    sizes = [int(g.shape.num_elements()) * g.dtype.size for g in gradients if g is not None]
    stats = CommStats()
    for _ in range(iterations):
        for s in sizes:
            stats.record(s, (seconds or 0.0) / max(1, len(sizes)))
        stats.step()
    return comm_profile(stats, sizes, worker)
