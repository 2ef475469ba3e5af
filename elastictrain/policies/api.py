"""The policy contract shared by the simulator and (later) the live coordinator.

A policy is a small object with one method, ``decide(snapshot) -> Decision``. The snapshot
carries every input a policy may use: the time, the runnable jobs (arrived, unfinished) with
their attained service, and the cluster's nodes. The Decision says which jobs run and where.
The engine applies it: it starts placed jobs that were not running and preempts running jobs
that were not placed. Nothing outside ``policies/`` branches on a policy's name.

Policies may keep state between calls (Tiresias remembers queue positions); they never
change the snapshot. ``JobState`` objects are the engine's own records, handed over without
copying for speed (a simulation makes millions of them otherwise); treat them as read-only.
The invariant tests run every policy on frozen copies to hold them to that.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence

from ..errors import ConfigError

__all__ = ["JobState", "ClusterSnapshot", "Decision", "Policy", "register", "create", "registered", "options_of"]


class JobState:
    """A runnable job as policies see it. Times are seconds."""

    __slots__ = ("job_id", "num_gpu", "submit_time", "model", "iteration_time", "iterations",
                 "remaining_iterations", "attained", "attained_gpu", "running", "start_time",
                 "pending_since", "preemptions", "stage_times", "user", "skew", "placement",
                 "slowdown", "restart_cost", "speeds", "extra")

    def __init__(self, job_id: int, num_gpu: int, submit_time: float, model: str, iteration_time: float,
                 iterations: float, stage_times: tuple = (), user: str = "", skew: float = 0.0) -> None:
        self.job_id, self.num_gpu, self.submit_time, self.model = job_id, num_gpu, submit_time, model
        self.iteration_time, self.iterations = iteration_time, iterations
        self.remaining_iterations = float(iterations)
        self.attained = 0.0  # seconds of service received (wall time while running)
        self.attained_gpu = 0.0  # GPU-seconds of service received
        self.running = False
        self.start_time: Optional[float] = None  # first start
        self.pending_since = submit_time
        self.preemptions = 0
        self.stage_times = stage_times
        self.user = user
        self.skew = skew
        self.placement: tuple = ()  # ((node, gpus), ...) while running
        self.slowdown = 1.0  # > 1 while the placement slows the job down (engine-set)
        self.restart_cost = 0.0  # seconds lost per (re)start (engine-set)
        self.speeds: dict = {}  # GPU type -> speed relative to iteration_time (empty: same everywhere)
        self.extra: dict = {}

    @property
    def remaining_time(self) -> float:
        """Seconds left at full speed (known only to policies that may assume durations)."""
        return self.remaining_iterations * self.iteration_time

    def __repr__(self) -> str:
        return f"JobState({self.job_id}, gpus={self.num_gpu}, running={self.running})"


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything a policy may use. ``arrived``/``ended`` are the changes since the previous
    snapshot handed to the same policy (incremental policies use them to stay O(changes))."""

    now: float
    jobs: tuple  # JobState, in arrival order
    gpus_per_node: tuple[int, ...]  # capacity of node i
    nodes_per_switch: int
    arrived: tuple = ()  # JobState that arrived since the previous snapshot
    ended: tuple = ()  # ids of jobs that finished since the previous snapshot
    running: tuple = ()  # JobState running before this decision
    node_types: tuple = ()  # GPU type of node i on a heterogeneous cluster (empty: one type)

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus_per_node)


@dataclass(frozen=True)
class Decision:
    """``run`` maps job id -> placement ``((node, gpus), ...)``; a job absent from it does not run.

    ``wakeup``: the next time the policy wants to decide again even if nothing arrives or ends
    (e.g. a Tiresias queue demotion), or None.

    ``groups``: jobs that share their GPUs by interleaving (Muri); the members of a group have
    one placement and use its GPUs once. ``slowdown``: job id -> factor on its iteration time
    while it runs this way (a group's interleaved iteration over the job's own); 1 if absent.
    """

    run: dict[int, tuple] = field(default_factory=dict)
    wakeup: Optional[float] = None
    groups: tuple = ()
    slowdown: dict = field(default_factory=dict)


class Policy(Protocol):
    name: str

    def decide(self, snapshot: ClusterSnapshot) -> Decision: ...


_REGISTRY: dict[str, Callable[..., Policy]] = {}
_OPTIONS: dict[str, Optional[frozenset[str]]] = {}


def register(name: str, factory: Callable[..., Policy], options: Optional[Sequence[str]] = None) -> None:
    """Register ``factory`` under ``name``; ``options``: the keyword options it takes (default:
    read from its signature, or from the class it builds)."""
    _REGISTRY[name] = factory
    if options is None:
        params = inspect.signature(factory).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            options = [n for n in params if n != "self"]
    _OPTIONS[name] = frozenset(options) if options is not None else None


def options_of(name: str) -> Optional[frozenset[str]]:
    """The keyword options a registered policy takes (None if it did not say)."""
    _load_builtin()
    return _OPTIONS.get(name)


def registered() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def create(name: str, *, only_known: bool = False, **options) -> Policy:
    """Build a registered policy by name (also from the ``elastictrain.policies`` entry points).

    ``only_known=True`` drops options the policy does not take (for callers that hold one set of
    options for several policies, like ``elastictrain simulate``); otherwise they are an error.

    Raises:
        ConfigError: the name is not registered, or an option is unknown or invalid.
    """
    _load_builtin()
    if name not in _REGISTRY:
        from importlib.metadata import entry_points

        for ep in entry_points(group="elastictrain.policies"):
            if ep.name == name:
                register(name, ep.load())
    if name not in _REGISTRY:
        raise ConfigError(f"policy {name!r} is not registered (known: {', '.join(sorted(_REGISTRY))}). "
                          "Did you forget to call elastictrain.policies.api.register or to install the "
                          "package that provides it?")
    known = _OPTIONS.get(name)
    if only_known and known is not None:
        options = {k: v for k, v in options.items() if k in known}
    try:
        return _REGISTRY[name](**options)
    except TypeError as exc:
        raise ConfigError(f"policy {name!r}: bad option: {exc}") from None


def _load_builtin() -> None:
    for mod in ("fifo", "srtf", "tiresias", "timeslice", "gandiva_fair", "muri"):
        importlib.import_module(f".{mod}", __package__)
