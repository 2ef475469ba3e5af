"""The engine contract: what an engine adapter knows (capacity, launch, withdraw, kill, runs).

The scheduler decides; an *engine* carries its decisions out. The node daemons are one engine
(out of process: each daemon polls the coordinator for the tasks placed on its node). An
in-process engine adapter (Slurm today) implements :class:`EngineAdapter`, and
:class:`~elastictrain.engines.bridge.EngineBridge` connects it to the coordinator through the same
node protocol the daemons speak, so everything engine-neutral (runs and their numbers, rendezvous
expectations, group tasks, the exit rules: 0 finished, 75 or a lost allocation requeued from the
checkpoint, anything else a failure with restarts) stays in one place above the adapters.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Optional, Protocol

from ..errors import ConfigError
from ..model import NAME_PATTERN
from ..wire import Task

__all__ = ["EngineNode", "RunLaunch", "RunState", "EngineAdapter", "ACTIVE", "ENDED", "REQUEUED", "run_name",
           "parse_run_name", "PREEMPTED", "combine_codes", "check_cpus_per_worker", "warn_if_no_gpus", "gpu_type_name"]

log = logging.getLogger(__name__)

ACTIVE, ENDED, REQUEUED = "active", "ended", "requeued"
PREEMPTED = 75  # etrun's exit code when its workers checkpointed and stopped on request

_NAME = re.compile(r"^et\.(?P<job>[A-Za-z0-9][A-Za-z0-9._-]{0,127})\.r(?P<run>[0-9]{1,10})$")


def run_name(job: str, run: int) -> str:
    """The engine-side name of one run of a job (a Slurm job's name, a Ray placement group's, a
    Kubernetes pod's prefix): ``et.<job>.r<run>``. A restarted coordinator finds its runs by it."""
    return f"et.{job}.r{run}"


def parse_run_name(name: str) -> Optional[tuple[str, int]]:
    m = _NAME.match(name or "")
    return (m.group("job"), int(m.group("run"))) if m else None


def combine_codes(codes: list[Optional[int]]) -> Optional[int]:
    """One exit status for a run from its nodes' (one ``etrun`` per node): a failure if any node
    failed (the first such), else preempted if any was, else 0; None if none is known."""
    known = [c for c in codes if c is not None]
    if not known:
        return None
    failed = [c for c in known if c not in (0, PREEMPTED)]
    if failed:
        return failed[0]
    return PREEMPTED if PREEMPTED in known else 0


def gpu_type_name(text: str) -> str:
    """A node's GPU type as an engine names it (Kubernetes' ``nvidia.com/gpu.product`` label, Ray's
    ``accelerator_type:`` resource), kept where it is a valid name (model.check_name's rule), else none."""
    return text if NAME_PATTERN.fullmatch(text or "") else ""


def check_cpus_per_worker(n) -> int:
    """``--engine-cpus-per-worker``: 0 (schedule GPUs) or a whole number of CPUs from 1 to 4096."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 4096:
        raise ConfigError(f"--engine-cpus-per-worker {n!r}: give the CPUs each worker gets on nodes without GPUs, "
                          "a whole number from 1 to 4096 (0 or left out: schedule the nodes' GPUs)")
    return n


def warn_if_no_gpus(nodes, cpus_per_worker: int, engine: str, where: str, warned: bool) -> bool:
    """Log once (until it changes) that an engine scheduling GPUs found none on any of ``nodes``,
    naming the option that schedules their CPUs; returns whether that is the case now. (A warning,
    not an error: the nodes are still reported, so runs on nodes that left are still requeued.)"""
    none = not cpus_per_worker and bool(nodes) and not any(n.gpus for n in nodes)
    if none and not warned:
        log.warning("%s has no GPUs: it offers nothing. To schedule its CPUs, start the coordinator with "
                    "--engine-cpus-per-worker N (N CPUs per worker; --backend %s)", where, engine)
    return none


@dataclass(frozen=True)
class EngineNode:
    """A node the engine offers: its GPUs (0 where it has none; its worker slots where ``kind`` is
    ``slot``, a CPU partition's), whether it is up (a down or failed node is not: it leaves, and
    its runs are requeued), and whether it is *cordoned* by the engine's own administrator
    (Slurm's drain, ``kubectl cordon``): up, its runs go on, and nothing new is placed there. Its
    GPU type: Slurm's GRES type (``gpu:a100:4``), Kubernetes' ``nvidia.com/gpu.product`` label,
    Ray's ``accelerator_type:`` resource."""

    name: str
    gpus: int
    up: bool
    state: str = ""
    kind: str = "gpu"  # gpu | slot (what the coordinator's cluster view calls the units)
    cordoned: bool = False
    gpu_type: str = ""  # its GPUs' type, where the engine names one (jobs may need it: submit --gpu-type)


@dataclass(frozen=True)
class RunLaunch:
    """One run of one job: one :class:`~elastictrain.wire.Task` per node of its placement, in node
    order (``tasks[i].slots`` GPUs on ``nodes[i]``)."""

    job: str
    run: int
    nodes: tuple[str, ...]
    tasks: tuple[Task, ...]
    project: str = ""  # the job's project (submit -A): Slurm's --account with --slurm-accounts


@dataclass
class RunState:
    """What the engine says of a run it launched. ``state``: ``active`` (pending or running),
    ``ended`` (``code`` is its exit status: 128+N for a signal, None if unknown), ``requeued`` (the
    engine itself put it back in its queue: a preemption of its own, an admin's requeue).
    ``cancelled``: it ended by a cancel nobody here asked for. ``lost``: its node failed."""

    handle: str
    job: str
    run: int
    state: str
    code: Optional[int] = None
    detail: str = ""
    cancelled: bool = False
    lost: bool = False
    nodes: list[str] = field(default_factory=list)


class EngineAdapter(Protocol):
    name: str
    #: CPUs per worker on nodes without GPUs (0: schedule the nodes' GPUs)
    cpus_per_worker: int
    #: where the GPUs would come from, for the warning that there are none ("partition 'p' (...)")
    gpus_from: str

    async def nodes(self) -> list[EngineNode]:
        """The nodes of the engine's part of the cluster (a partition, a reservation)."""
        ...

    async def launch(self, run: RunLaunch) -> str:
        """Start ``run``; returns the engine's handle for it (e.g. a Slurm job id)."""
        ...

    async def withdraw(self, handle: str) -> None:
        """Ask the run to stop: its ``etrun`` gets SIGTERM, its workers checkpoint and exit 75."""
        ...

    async def kill(self, handle: str) -> None:
        """Stop the run now (after the grace period, or a copy the engine requeued by itself)."""
        ...

    async def runs(self, handles: dict[str, tuple[str, int]]) -> list[RunState]:
        """The state of every run of ours the engine knows: those in ``handles`` (handle -> job,
        run) and any other it runs for this coordinator (adopted after a coordinator restart)."""
        ...

    def output(self, handle: str) -> Optional[str]:
        """The path of the run's output file, where it has one."""
        ...
