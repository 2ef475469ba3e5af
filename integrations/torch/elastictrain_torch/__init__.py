"""PyTorch glue for elastictrain: a Sampler and DataLoader over exactly-once shards."""

from .data import ElasticDataLoader, ElasticSampler, even_batches

__all__ = ["ElasticSampler", "ElasticDataLoader", "even_batches"]
