"""PyTorch glue for elastictrain: a Sampler and DataLoader over exactly-once shards, and the
checkpointer's tensor support, and the DDP communication profiler."""

from . import elastic
from .checkpoint import RNGState, TorchCheckpointer
from .data import ElasticDataLoader, ElasticSampler, even_batches
from .distributed import init_process_group, job_group
from .profiling import CommProfiler, tensor_bytes

__all__ = ["ElasticSampler", "ElasticDataLoader", "even_batches", "TorchCheckpointer", "RNGState", "CommProfiler",
           "tensor_bytes", "init_process_group", "job_group", "elastic"]
