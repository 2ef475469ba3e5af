"""Frozen value types shared by the runtime, the coordinator and (later) the policies.

These are plain dataclasses: they validate themselves in ``__post_init__`` and travel
on the wire through :mod:`elastictrain.wire` unchanged.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property

from .errors import ConfigError

__all__ = ["DatasetSpec", "JobSpec", "NAME_RE", "CHECKPOINT_RE", "NAME_PATTERN", "check_name", "JOB_STATES",
           "check_states", "GPU_TYPE_RE", "check_gpu_type"]

#: The one rule for names that become part of a URL, a file name or a database key: jobs,
#: datasets, nodes, users (1-128 characters) and checkpoint ids (1-255). ASCII letters, digits and
#: ``._-``, starting with a letter or digit: no path separator, no "..", no NUL, no newline,
#: nothing that needs quoting. The wire schemas (``elastictrain.wire``) use the same patterns.
NAME_RE = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
MAX_WORKERS = 100_000  # a job's most workers (GPUs) in a trace (JobSpec.max_gpu)
MIN_PRIORITY, MAX_PRIORITY = -1000, 1000  # a job's priority (submit --priority; policies/tiers.py's tiers)
CHECKPOINT_RE = r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}"
NAME_PATTERN = re.compile(NAME_RE)
_CHECKPOINT = re.compile(CHECKPOINT_RE)
#: the GPU type a job needs: a name, or up to 8 alternatives joined by ``|`` (Slurm's
#: ``--constraint "a100|h100"``: any of them, a gang may mix them), or in brackets (``[a100|h100]``:
#: any one of them, the whole gang on one)
_ALTERNATIVES = rf"{NAME_RE}(?:\|{NAME_RE}){{0,7}}"
GPU_TYPE_RE = rf"(?:{_ALTERNATIVES}|\[{_ALTERNATIVES}\])"
_GPU_TYPE = re.compile(GPU_TYPE_RE)


def check_name(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid name of ``kind`` (``checkpoint`` ids may be longer).

    Raises:
        ConfigError: the name is empty, too long or has characters outside ``[A-Za-z0-9._-]``.
    """
    pattern, most = (_CHECKPOINT, 255) if kind == "checkpoint" else (NAME_PATTERN, 128)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ConfigError(
            f"{kind} name {value!r} is invalid: use 1-{most} characters from [A-Za-z0-9._-], "
            "starting with a letter or digit"
        )
    return value


#: a scheduled job's states, and Slurm's names for them (squeue -t)
JOB_STATES = ("queued", "running", "preempted", "finished", "failed", "cancelled")
_SLURM_STATES = {"pending": ("queued", "preempted"), "pd": ("queued", "preempted"), "r": ("running",),
                 "completed": ("finished",), "cd": ("finished",), "f": ("failed",), "ca": ("cancelled",),
                 "canceled": ("cancelled",)}


def check_states(text: str) -> frozenset[str]:
    """The states a comma-separated ``--state``/``?state=`` names (ours or Slurm's, any case).

    Raises:
        ConfigError: a name is neither.
    """
    out: set = set()
    for s in (x.strip().lower() for x in text.split(",")):
        if s in JOB_STATES:
            out.add(s)
        elif s in _SLURM_STATES:
            out.update(_SLURM_STATES[s])
        elif s:
            raise ConfigError(f"state {s[:40]!r} is not one of {', '.join(JOB_STATES)} (or Slurm's PENDING, RUNNING, "
                              "COMPLETED, FAILED, CANCELLED, and PD, R, CD, F, CA)")
    if not out:
        raise ConfigError("give at least one state (comma-separated)")
    return frozenset(out)


def check_gpu_type(value: str) -> str:
    """Return ``value`` if it is a valid GPU type for a job (:data:`GPU_TYPE_RE`).

    Raises:
        ConfigError: it is not one name or up to 8 names joined by ``|``.
    """
    if not isinstance(value, str) or not _GPU_TYPE.fullmatch(value):
        raise ConfigError(f"GPU type name {value!r} is invalid: use 1-128 characters from [A-Za-z0-9._-], starting "
                          "with a letter or digit, or up to 8 such names joined by | for any of them (e.g. a100|h100), "
                          "in brackets for all of a job's GPUs on one of them ([a100|h100])")
    return value


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset as the coordinator shards it.

    Each epoch is a deterministic permutation of ``range(num_samples)`` (see
    :mod:`elastictrain.sharding`) cut into shards of ``shard_size`` consecutive
    positions. Shard ids run epoch-major: ``shard_id = epoch * shards_per_epoch + i``.

    ``taper`` (0: off; else 2-1024, about the number of ranks): the end of each epoch is cut into
    shards that shrink, as guided self-scheduling hands out loop chunks. The last ``taper``
    shards' worth of positions becomes shards of ``ceil(left / taper)`` positions (``left``: the
    positions after the shard's start), none smaller than ``ceil(shard_size / taper)`` but the
    last, which takes what remains. So at an
    epoch's end no rank is left holding a whole shard while the others have run out (and wait
    for it, with ``even_batches``); the epoch then ends within a small shard's time on every
    rank, a straggler's included. It costs about ``taper * (ln(taper) + 1)`` more leases an
    epoch. Shards are still a fixed partition of each epoch, so exactly-once is unchanged.
    """

    name: str
    num_samples: int
    shard_size: int
    epochs: int = 1
    seed: int = 0
    shuffle: bool = True
    #: seconds a lease lives without a heartbeat before its remainder returns to TODO
    lease_ttl: float = 30.0
    #: shrinking shards at each epoch's end (0: every shard is ``shard_size``; see above)
    taper: int = 0

    def __post_init__(self) -> None:
        check_name("dataset", self.name)
        if self.num_samples < 1:
            raise ConfigError(f"dataset {self.name!r}: num_samples must be >= 1, got {self.num_samples}")
        if not 1 <= self.shard_size <= 10_000_000:
            raise ConfigError(
                f"dataset {self.name!r}: shard_size must be in [1, 10000000], got {self.shard_size}"
            )
        if not 1 <= self.epochs <= 1_000_000:
            raise ConfigError(f"dataset {self.name!r}: epochs must be in [1, 1000000], got {self.epochs}")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"dataset {self.name!r}: seed must be in [0, 2**63), got {self.seed}")
        if not 0.1 <= self.lease_ttl <= 86_400:
            raise ConfigError(
                f"dataset {self.name!r}: lease_ttl must be in [0.1, 86400] seconds, got {self.lease_ttl}"
            )
        if self.num_samples > 2**48:
            raise ConfigError(f"dataset {self.name!r}: num_samples must be <= 2**48, got {self.num_samples}")
        if type(self.taper) is not int or not (self.taper == 0 or 2 <= self.taper <= 1024):
            raise ConfigError(f"dataset {self.name!r}: taper must be 0 (off) or a whole number in [2, 1024] "
                              f"(about the number of ranks), got {self.taper!r}")

    @cached_property
    def _tail(self) -> tuple[int, list[int]]:
        """(positions before the tapered tail, the tail's shard starts relative to it, its end last)."""
        n, size, t = self.num_samples, self.shard_size, self.taper
        if not t:
            return n, [0]
        head = max(0, n - t * size) // size * size
        left, smallest, starts = n - head, -(-size // t), [0]
        while left > 0:
            step = min(size, left, max(smallest, -(-left // t)))
            starts.append(starts[-1] + step)
            left -= step
        return head, starts

    @cached_property
    def shards_per_epoch(self) -> int:
        head, starts = self._tail
        return math.ceil(head / self.shard_size) + len(starts) - 1

    @property
    def total_shards(self) -> int:
        return self.shards_per_epoch * self.epochs

    def shard_bounds(self, shard_id: int) -> tuple[int, int, int]:
        """``(epoch, start, end)`` of a shard in permutation positions ``[start, end)``."""
        epoch, i = divmod(shard_id, self.shards_per_epoch)
        start = i * self.shard_size
        if self.taper:
            head, starts = self._tail
            if start >= head:
                j = i - head // self.shard_size
                return epoch, head + starts[j], head + starts[j + 1]
        return epoch, start, min(start + self.shard_size, self.num_samples)


@dataclass(frozen=True)
class JobSpec:
    """A training job as a trace describes it (times in seconds).

    ``iteration_time`` is the time of one iteration at full speed with ``num_gpu`` GPUs;
    ``stage_times`` the per-iteration time of each resource (storage I/O, GPU compute,
    network...) where the trace has them (Muri's traces do). ``speeds``: ``((gpu_type,
    factor), ...)``, the job's speed on each GPU generation relative to ``iteration_time``
    (Gavel's throughput table; empty: the same everywhere).
    """

    job_id: int
    num_gpu: int
    submit_time: float
    iterations: float
    iteration_time: float
    model: str = ""
    stage_times: tuple[float, ...] = ()
    user: str = ""
    speeds: tuple = ()
    priority: int = 0  # its tier under priority preemption (policies/tiers.py); traces have none
    gpu_type: str = ""  # the GPU type it must run on ("" any: policies/placement.py's type_matches)
    project: str = ""  # the project it is charged to ("" none: fair shares by project, policies/shares.py)
    # elastic: it may run on min_gpu..max_gpu workers (0: num_gpu, rigid); ``serial``: the fraction
    # of an iteration that does not shrink with more workers (Amdahl's law; 0: linear scaling)
    min_gpu: int = 0
    max_gpu: int = 0
    serial: float = 0.0

    def __post_init__(self) -> None:
        s, i, t, g = self.submit_time, self.iterations, self.iteration_time, self.num_gpu
        if not (isinstance(s, (int, float)) and isinstance(i, (int, float)) and isinstance(t, (int, float))
                and isinstance(g, int) and g >= 1 and 0 <= s < math.inf and 0 < i < math.inf and 0 < t < math.inf):
            raise ConfigError(f"job {self.job_id}: need num_gpu >= 1 (an integer), and finite iterations > 0, "
                              f"iteration_time > 0 and submit_time >= 0")
        if self.priority and not (isinstance(self.priority, int) and MIN_PRIORITY <= self.priority <= MAX_PRIORITY):
            raise ConfigError(f"job {self.job_id}: priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, "
                              f"got {self.priority!r}")
        if self.gpu_type:
            check_gpu_type(self.gpu_type)
        if self.project:
            check_name("project", self.project)
        if self.min_gpu or self.max_gpu:
            lo, hi = self.min_gpu or g, self.max_gpu or g
            if not (type(lo) is int and type(hi) is int and 1 <= lo <= g <= hi <= MAX_WORKERS):
                raise ConfigError(f"job {self.job_id}: need 1 <= min_gpu <= num_gpu <= max_gpu <= {MAX_WORKERS} "
                                  f"(integers; 0 leaves one at num_gpu), got {self.min_gpu}..{g}..{self.max_gpu}")
        if self.serial and not (isinstance(self.serial, float) and 0.0 < self.serial < 1.0):
            raise ConfigError(f"job {self.job_id}: serial (the fraction of an iteration more workers do not "
                              f"shorten) must be in [0, 1), got {self.serial!r}")

    def scaling(self, workers: int) -> float:
        """How much longer an iteration takes on ``workers`` than on ``num_gpu`` (Amdahl's law
        with ``serial``; ``num_gpu / workers`` when it scales linearly)."""
        s, g = self.serial, self.num_gpu
        if not s:
            return g / workers
        return (s + (1.0 - s) / workers) / (s + (1.0 - s) / g)

    @property
    def duration(self) -> float:
        return self.iterations * self.iteration_time
