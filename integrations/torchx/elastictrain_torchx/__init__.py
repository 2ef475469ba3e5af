"""TorchX glue: ``torchx run -s elastictrain`` submits to an elastictrain coordinator
(:mod:`.scheduler`; registered through ``torchx_plugins.schedulers.elastictrain``)."""

from .scheduler import ElastictrainScheduler, create_scheduler, job_request

__all__ = ["ElastictrainScheduler", "create_scheduler", "job_request"]
