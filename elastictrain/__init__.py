"""elastictrain: elastic deep-learning training with exactly-once data and a coordinator.

The public API is small::

    import elastictrain as et

    job = et.init()                      # reads ET_* / RANK / WORLD_SIZE set by etrun
    shards = job.shards(et.DatasetSpec("train", num_samples=50_000, shard_size=500, epochs=3))
    for index in shards: ...

``import elastictrain`` never imports torch or tensorflow; their glue lives in
``elastictrain_torch`` and ``elastictrain_tf``.
"""

__version__ = "0.1.0"

from .errors import (  # noqa: E402
    AuthError, BadRequestError, ConfigError, ConflictError, CoordinatorUnavailableError,
    ElasticTrainError, LeaseLostError, NotFoundError, StaleGenerationError,
)
from .model import DatasetSpec  # noqa: E402
from .runtime.client import CoordinatorClient  # noqa: E402
from .runtime.job import Job, init  # noqa: E402
from .runtime.shards import ShardIterator  # noqa: E402

__all__ = [
    "__version__", "init", "Job", "DatasetSpec", "ShardIterator", "CoordinatorClient",
    "ElasticTrainError", "ConfigError", "BadRequestError", "AuthError", "NotFoundError",
    "ConflictError", "StaleGenerationError", "LeaseLostError", "CoordinatorUnavailableError",
]
