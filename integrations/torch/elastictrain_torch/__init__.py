"""PyTorch glue for elastictrain: a Sampler and DataLoader over exactly-once shards, and the
checkpointer's tensor support."""

from .checkpoint import RNGState, TorchCheckpointer
from .data import ElasticDataLoader, ElasticSampler, even_batches

__all__ = ["ElasticSampler", "ElasticDataLoader", "even_batches", "TorchCheckpointer", "RNGState"]
