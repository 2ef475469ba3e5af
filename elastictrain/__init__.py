"""elastictrain: elastic deep-learning training with exactly-once data and a coordinator.

The public API is small::

    import elastictrain as et

    job = et.init()                      # reads ET_* / RANK / WORLD_SIZE set by etrun
    shards = job.shards(et.DatasetSpec("train", num_samples=50_000, shard_size=500, epochs=3))
    for index in shards: ...

``import elastictrain`` never imports torch or tensorflow; their glue lives in
``elastictrain_torch`` and ``elastictrain_tf``. Names are imported lazily, so that
``etrun`` starts without paying for what only workers need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: exit code of a worker that stopped because it was preempted and can resume from its checkpoint
PREEMPTED_EXIT_CODE = 75

_LAZY = {
    "init": "runtime.job", "Job": "runtime.job", "accumulation": "runtime.job",
    "DatasetSpec": "model",
    "ShardIterator": "runtime.shards",
    "CoordinatorClient": "runtime.client",
    "stage": "runtime.stages", "STAGES": "runtime.stages",
    "InterleaveGroup": "runtime.interleave", "GroupJob": "runtime.interleave",
    "ElasticTrainError": "errors", "ConfigError": "errors", "BadRequestError": "errors",
    "AuthError": "errors", "NotFoundError": "errors", "ConflictError": "errors",
    "StaleGenerationError": "errors", "LeaseLostError": "errors", "CoordinatorUnavailableError": "errors",
}

__all__ = ["__version__", "PREEMPTED_EXIT_CODE", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'elastictrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from .errors import (
        AuthError, BadRequestError, ConfigError, ConflictError, CoordinatorUnavailableError,
        ElasticTrainError, LeaseLostError, NotFoundError, StaleGenerationError,
    )
    from .model import DatasetSpec
    from .runtime.client import CoordinatorClient
    from .runtime.job import Job, accumulation, init
    from .runtime.interleave import GroupJob, InterleaveGroup
    from .runtime.shards import ShardIterator
    from .runtime.stages import STAGES, stage
