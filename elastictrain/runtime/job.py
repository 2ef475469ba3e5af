"""``et.init()``: the worker's view of its job, read from the environment ``etrun`` sets."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import threading
from dataclasses import dataclass
from typing import Optional

from ..errors import ConfigError
from ..model import DatasetSpec, check_name
from ..wire import ProfileList, ProfileReport
from .batch_shares import split_batch
from .client import CoordinatorClient
from .jobctx import current
from .monitor import ResourceMonitor, start_from_env
from .profiler import report_when_ready
from .progress import StepReporter
from .shards import ShardIterator
from .stages import recorder

__all__ = ["Job", "init", "accumulation"]


@dataclass
class Job:
    """One worker of an elastic job.

    Attributes:
        rank, world_size, local_rank: as torchrun defines them.
        generation: the membership round this worker belongs to (``ET_GENERATION``).
        restart_count: how many times the group was restarted (``TORCHELASTIC_RESTART_COUNT``).
        restart_reason: why this generation started (``ET_RESTART_REASON``), e.g. ``failure``.
    """

    client: CoordinatorClient
    job_id: str
    generation: int
    rank: int
    world_size: int
    local_rank: int = 0
    restart_count: int = 0
    restart_reason: str = "start"
    prev_world_size: Optional[int] = None
    #: ``<name>.`` for a job in an ``etrun --group`` (its datasets are kept apart), else ""
    namespace: str = ""
    _steps: Optional[StepReporter] = dataclasses.field(default=None, repr=False)
    #: this worker's resource monitor (``ET_MONITOR_PERIOD``; None when off)
    monitor: Optional[ResourceMonitor] = dataclasses.field(default=None, repr=False)

    def report_step(self, step: int) -> None:
        """Tell the coordinator this job's training step (cheap; call it every step). The
        scheduler measures iteration time and progress from it. Rank 0's reports are sent, in the
        background; every rank's step time goes out with its resource samples. The checkpointer
        calls this for you at every ``save``/``preempted``."""
        if self.monitor is not None:
            rec = recorder()
            self.monitor.step(step, rec.busy if rec.busy > 0 else None)
        if self.rank != 0:
            return
        if self._steps is None:
            self._steps = StepReporter(self.client, self.job_id, self.rank,
                                       float(os.environ.get("ET_STEP_REPORT_INTERVAL", 1.0)), self.generation)
        self._steps.step(step)

    def local_batch(self, global_batch: int, step: int) -> tuple[int, float]:
        """This rank's part of training step ``step``'s ``global_batch`` samples, and the factor to
        scale its loss by (``world * part / global_batch``) so the all-reduced gradient is the mean
        over the whole batch. Parts are equal until the coordinator finds this job has a straggler:
        it then cuts the slow rank's share, from a step every rank applies at once
        (:mod:`elastictrain.runtime.batch_shares`). Call it every step, before taking the samples."""
        if isinstance(global_batch, bool) or not isinstance(global_batch, int) or not 1 <= global_batch <= 1 << 31:
            raise ConfigError(f"global_batch must be a whole number from 1 to 2**31, not {global_batch!r}")
        if step < 0:
            raise ConfigError(f"step must be >= 0, not {step}")
        world = max(1, self.world_size)
        weights = self.monitor.shares.weights(self.generation, step, world) if self.monitor is not None else None
        part = split_batch(global_batch, weights or [1.0] * world)[min(self.rank, world - 1)]
        if self.monitor is not None:
            self.monitor.local_batch = part
        return part, world * part / global_batch

    def hang_watch_paused(self):
        """Inside this block (an evaluation pass, a long save, anything without training steps)
        the monitor does not take the missing steps for a hang."""
        return self.monitor.hang_watch_paused() if self.monitor is not None else contextlib.nullcontext()

    def dataset_name(self, name: str) -> str:
        """The coordinator's name for this job's dataset ``name``."""
        return name if not self.namespace or name.startswith(self.namespace) else self.namespace + name

    def register_dataset(self, spec: DatasetSpec):
        """Register ``spec`` with the coordinator under this job's name for it (inside
        ``etrun --group``, ``<job>.<dataset>``); idempotent. :meth:`shards` does it for you."""
        if self.namespace:
            spec = dataclasses.replace(spec, name=self.dataset_name(spec.name))
        return self.client.register_dataset(self.job_id, spec)

    def shards(self, spec: DatasetSpec, **kwargs) -> ShardIterator:
        """A :class:`ShardIterator` over ``spec`` for this worker (registers the dataset)."""
        if self.namespace:
            spec = dataclasses.replace(spec, name=self.dataset_name(spec.name))
        return ShardIterator(self.client, self.job_id, spec, generation=self.generation, worker=self.rank,
                             **kwargs)

    def latest_commit(self, dataset: str) -> Optional[str]:
        """The newest checkpoint whose data cursor is committed for ``dataset`` (None if none)."""
        commits = self.client.commits(self.job_id, self.dataset_name(dataset)).commits
        return commits[-1].checkpoint if commits else None

    def report_profile(self, report: ProfileReport) -> ProfileList:
        """Send a profile report for this job now (the coordinator keeps each worker's latest)."""
        return self.client.report_profile(self.job_id, report)

    def profile_stages(self, warmup: int = 5, iterations: int = 20) -> threading.Event:
        """Send this thread's stage profile (and the comm profile of the attached DDP hook, if
        any) to the coordinator once ``warmup + iterations`` iterations of ``et.stage`` spans
        are recorded. Training goes on; the returned event is set once the report went out."""
        return report_when_ready(self.client, self.job_id, recorder(), warmup, iterations, self.rank)

    def rebase(self) -> None:
        """Re-read this worker's place in the job from the environment (in-process recovery
        moved it to a new generation)."""
        prev = os.environ.get("ET_PREV_WORLD_SIZE")
        self.generation = _int_env("ET_GENERATION", 1)
        self.rank, self.world_size = _int_env("RANK", 0), _int_env("WORLD_SIZE", 1)
        self.local_rank = _int_env("LOCAL_RANK", 0)
        self.restart_count = _int_env("TORCHELASTIC_RESTART_COUNT", 0)
        self.restart_reason = os.environ.get("ET_RESTART_REASON", "start")
        self.prev_world_size = int(prev) if prev else None
        self._steps = None  # rank 0's reporter is made again by whoever is rank 0 now
        if self.monitor is not None:
            self.monitor.worker = self.rank

    def restore(self, dataset: str, checkpoint: Optional[str]) -> None:
        """Reset ``dataset`` to the cursor committed with ``checkpoint`` (once per generation)."""
        self.client.restore(self.job_id, self.dataset_name(dataset), self.generation, checkpoint)


def accumulation() -> int:
    """Gradient accumulation steps this generation runs with (``ET_ACCUMULATE``, default 1): split
    each step's batch into this many micro-batches. ``etrun --oom-policy accumulate`` doubles it
    job-wide after a GPU out-of-memory failure, so the micro-batch halves and the global batch stays.

    Raises:
        ConfigError: ``ET_ACCUMULATE`` is not an integer in [1, 4096].
    """
    n = _int_env("ET_ACCUMULATE", 1)
    if not 1 <= n <= 4096:
        raise ConfigError(f"ET_ACCUMULATE must be in [1, 4096], got {n}")
    return n


def _int_env(name: str, default: Optional[int] = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise ConfigError(f"{name} is not set: start this script with `etrun` (or set {name})")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def init(coordinator: Optional[str] = None, job_id: Optional[str] = None) -> Job:
    """Connect this worker to its coordinator, from arguments or the environment.

    Reads ``ET_COORDINATOR``, ``ET_JOB_ID``, ``ET_GENERATION``, ``ET_TOKEN_FILE``, ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``TORCHELASTIC_RESTART_COUNT``, ``ET_RESTART_REASON``
    and ``ET_PREV_WORLD_SIZE``. Inside ``etrun --group``, the job's datasets are named
    ``<job name>.<dataset>`` at the coordinator (see :attr:`Job.namespace`).

    Raises:
        ConfigError: a required variable is missing (the message says which).
    """
    url = coordinator or os.environ.get("ET_COORDINATOR")
    if not url:
        raise ConfigError("no coordinator: start this script with `etrun`, or set ET_COORDINATOR="
                          "http://HOST:PORT of a running `elastictrain coordinator`")
    ctx = current()
    own = ctx is not None and ctx.job_id is not None  # a job of its own in a scheduler's group
    job_id = check_name("job", job_id or (ctx.job_id if own else None) or os.environ.get("ET_JOB_ID", "default"))
    prev = os.environ.get("ET_PREV_WORLD_SIZE")
    job = Job(
        client=CoordinatorClient(url),
        job_id=job_id,
        generation=ctx.generation if own else _int_env("ET_GENERATION", 1),
        rank=_int_env("RANK", 0),
        world_size=_int_env("WORLD_SIZE", 1),
        local_rank=_int_env("LOCAL_RANK", 0),
        restart_count=_int_env("TORCHELASTIC_RESTART_COUNT", 0),
        restart_reason=ctx.restart_reason if own else os.environ.get("ET_RESTART_REASON", "start"),
        prev_world_size=int(prev) if prev else None,
        namespace=f"{ctx.name}." if ctx is not None and not own else "",
    )
    steps = os.environ.get("ET_PROFILE_STEPS")
    if steps and steps.isdigit() and int(steps) > 0:  # the scheduler wants this job's stage profile
        job.profile_stages(warmup=min(5, int(steps)), iterations=int(steps))
    if ctx is None:  # in etrun --group the process is shared: its resource use is not one job's
        job.monitor = start_from_env(job.client, job.job_id, job.rank)
        if job.monitor is not None:
            atexit.register(job.monitor.stop)
    return job
