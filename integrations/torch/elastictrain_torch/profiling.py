"""Communication profiling for DDP: a communication hook that all-reduces (as DDP's default
hook does) and records each bucket's bytes and time, plus the model's tensor-size profile.

    ddp = DistributedDataParallel(model)
    prof = CommProfiler(ddp)            # registers the hook; one per DDP model
    ...train...
    prof.profile()                      # -> elastictrain.wire.CommProfile

The time of a collective runs from the hook's launch to the completion of its future (on
NCCL, when the all-reduce's work completes on the device). Iterations are counted at each
iteration's last bucket. ``skew`` (largest tensor / total) is what Tiresias's placement
compares with PACKLIMIT.
"""

from __future__ import annotations

import time
from typing import Optional

import torch
import torch.distributed as dist

from elastictrain.runtime.profiler import CommStats, comm_profile, register_comm
from elastictrain.wire import CommProfile

__all__ = ["CommProfiler", "tensor_bytes"]


def tensor_bytes(model: torch.nn.Module) -> list[int]:
    """Bytes of each trainable parameter (what gradient sync moves)."""
    return [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]


class CommProfiler:
    def __init__(self, ddp_model, process_group: Optional[dist.ProcessGroup] = None) -> None:
        self.stats = CommStats()
        # DDP's own group (a job's own one inside etrun --group) unless told otherwise
        self.group = process_group if process_group is not None else getattr(ddp_model, "process_group", None)
        module = getattr(ddp_model, "module", ddp_model)
        self.sizes = tensor_bytes(module)
        ddp_model.register_comm_hook(self, CommProfiler._hook)
        register_comm(self)

    @staticmethod
    def _hook(self, bucket):  # no annotations: DDP checks them, and they are strings here
        buf = bucket.buffer()
        nbytes = buf.numel() * buf.element_size()
        world = dist.get_world_size(self.group)
        t0 = time.perf_counter()
        fut = dist.all_reduce(buf, group=self.group, async_op=True).get_future()
        last = bucket.is_last()

        def done(f):
            self.stats.record(nbytes, time.perf_counter() - t0)
            if last:
                self.stats.step()
            return f.value()[0].div_(world)

        return fut.then(done)

    def profile(self, worker: Optional[int] = None) -> CommProfile:
        if worker is None:
            worker = dist.get_rank(self.group) if dist.is_initialized() else 0
        return comm_profile(self.stats, self.sizes, worker)
