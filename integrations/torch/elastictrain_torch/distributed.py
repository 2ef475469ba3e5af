"""The process group a job's collectives use, alone or interleaved with others in one process.

A script that calls :func:`init_process_group` and passes the returned group to DDP and its
collectives runs unchanged under ``torchrun``/``etrun`` (the default group) and inside
``etrun --group`` (a group of its own, so two jobs' all-reduces never pair up with each other).
"""

from __future__ import annotations

from typing import Any, Optional

import torch.distributed as dist

from elastictrain.errors import ConfigError
from elastictrain.runtime.jobctx import current

__all__ = ["init_process_group", "job_group"]


def init_process_group(backend: str = "gloo", **kwargs: Any):
    """Initialize ``torch.distributed`` for this job (from the environment ``etrun`` sets) and
    return the group its collectives must use: pass it to ``DDP(..., process_group=...)`` and
    to ``dist.all_reduce(..., group=...)``.

    Raises:
        ConfigError: inside ``etrun --group`` when the group runs without torch.distributed.
    """
    ctx = current()
    if ctx is not None:
        if ctx.process_group is None:
            raise ConfigError(f"job {ctx.name!r} has no process group: this etrun --group runs without "
                              "torch.distributed (is torch installed in the workers' environment?)")
        return ctx.process_group
    if not dist.is_initialized():
        dist.init_process_group(backend, **kwargs)
    return dist.group.WORLD


def job_group() -> Optional[Any]:
    """The calling job's process group: its own in ``etrun --group``, else the default group
    (None when ``torch.distributed`` is not initialized)."""
    ctx = current()
    if ctx is not None and ctx.process_group is not None:
        return ctx.process_group
    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
