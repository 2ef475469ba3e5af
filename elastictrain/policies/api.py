"""The policy contract shared by the simulator and the live coordinator.

A policy is a small object with one method, ``decide(snapshot) -> Decision``. The snapshot
carries every input a policy may use: the time, the runnable jobs (arrived, unfinished, not
being stopped) as frozen :class:`JobView` records, and the GPUs of each node that this
decision may hand out. The Decision says which jobs run, where, with how many workers and in
which interleaving groups. The mechanism core (:mod:`elastictrain.scheduling`) checks it and
turns it into actions: start, preempt, migrate, regroup, resize. Nothing outside
``policies/`` branches on a policy's name.

Policies may keep state between calls (Tiresias remembers queue positions), **by job key,
never by object**: a :class:`JobView` is a frozen snapshot of one moment, replaced by a new one
whenever the job changes. Look a job up again with :meth:`ClusterSnapshot.job`. ``arrived`` and
``ended`` are the changes since the previous snapshot handed to the same policy; a policy built
afresh (e.g. after a coordinator restart) gets every known job as arrived, and it must accept
a job it has not seen in ``arrived`` (treat it as arrived) and an ``arrived`` job it already
knows (ignore it), because a decision that failed is followed by one that repeats its changes.
"""

from __future__ import annotations

import importlib
import inspect
from collections import abc
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, Union

import msgspec

from ..errors import ConfigError

__all__ = ["JobKey", "JobView", "JobsInOrder", "ClusterSnapshot", "Decision", "Policy", "register", "create",
           "registered", "options_of", "EMPTY", "nothing_changed"]

#: a job's key: a string (the coordinator's job ids) or an int (trace job ids)
JobKey = Union[str, int]
EMPTY: Mapping = MappingProxyType({})


class JobView(msgspec.Struct, frozen=True, gc=False):
    """A runnable job as policies see it, at one moment. Times are seconds.

    ``num_gpu`` is the size the job asks for (elastic jobs: their current or preferred size);
    ``min_gpu``/``max_gpu`` bound what a decision may give an elastic job (both equal
    ``num_gpu`` for a rigid one). ``iteration_time`` is one iteration at full speed with
    ``num_gpu`` GPUs; ``remaining_iterations`` what is left (measured or assumed: policies
    that use durations may rely on it). ``placement`` is ``((node, gpus), ...)`` while running.
    ``speeds``: GPU type -> speed relative to ``iteration_time`` (empty: the same everywhere).
    ``rate``: measured throughput (samples/s from the shard cursors) over the latest
    ``rate_window`` seconds of the current run (0 until measured; in the simulator, an elastic job's
    modelled iterations per second).
    ``gpu_type``: the GPU type it must run on (Slurm's ``--gres=gpu:TYPE:N``, a Kubernetes node
    selector); the mechanism refuses a decision that places it elsewhere (scheduling/plan.py).
    """

    job_id: Any
    num_gpu: int
    submit_time: float
    model: str = ""
    iteration_time: float = 1.0
    iterations: float = 1.0
    remaining_iterations: float = 1.0
    attained: float = 0.0  # seconds of service received (wall time while running)
    attained_gpu: float = 0.0  # GPU-seconds of service received
    running: bool = False
    placement: tuple = ()
    start_time: Optional[float] = None  # first start
    pending_since: float = 0.0
    preemptions: int = 0
    stage_times: tuple = ()
    user: str = ""
    skew: float = 0.0
    speeds: Mapping = EMPTY
    restart_cost: float = 0.0  # seconds lost per (re)start
    min_gpu: int = 0  # 0: the same as num_gpu
    max_gpu: int = 0
    priority: int = 0
    rate: float = 0.0  # measured data samples/s of the current run, at num_gpu workers (0: not yet)
    rate_window: float = 0.0  # seconds that measurement covers (all since the run's first step)
    peak_memory: float = 0.0  # bytes: the largest resident memory one of its workers reported (live jobs)
    starting: bool = False  # running, but its run has not trained its first step yet: no service accrues
    ready_at: Optional[float] = None  # while starting: when its first step is due, where known (the simulator)
    gpu_type: str = ""  # the GPU type it must run on ("" any; placement.type_mask says which nodes match)
    project: str = ""  # the project it is charged to ("" none; fair shares by project: policies/shares.py)
    # False: its work left is assumed, not known (a live job with no --steps/--epochs: the rest of its
    # --time, or an hour), so more workers would not be known to shorten it (backfill grows no such job)
    work_known: bool = True

    @property
    def remaining_time(self) -> float:
        """Seconds left at full speed (known only to policies that may assume durations)."""
        return self.remaining_iterations * self.iteration_time

    @property
    def elastic(self) -> bool:
        return (self.min_gpu or self.num_gpu) != (self.max_gpu or self.num_gpu)


class JobsInOrder(abc.Sequence):
    """A snapshot's jobs, read from the mechanism's table without copying them: a decision may
    look at a few jobs of a long queue, and copying thousands at every decision would cost more
    than deciding. Iterates in arrival order; indexing copies once. Valid during ``decide``."""

    __slots__ = ("_views", "_tuple")

    def __init__(self, views: Mapping) -> None:
        self._views, self._tuple = views, None

    def __len__(self) -> int:
        return len(self._views)

    def __iter__(self):
        return iter(self._views.values())

    def __getitem__(self, i):
        if self._tuple is None:
            self._tuple = tuple(self._views.values())
        return self._tuple[i]

    def __repr__(self) -> str:
        return f"JobsInOrder({len(self._views)} jobs)"


class ClusterSnapshot(msgspec.Struct, frozen=True):
    """Everything a policy may use, valid for the duration of one ``decide`` call.

    ``gpus_per_node``: the GPUs of each node (0 for a node that is down). GPUs a job being
    stopped still holds count as free: a start placed on them waits until they are. ``jobs``: the runnable jobs in
    arrival order. ``arrived``/``ended``: changes since the previous snapshot of the same policy
    (incremental policies use them to stay O(changes)). ``running``: jobs running before this
    decision. ``by_key``: job key -> view for every job in ``jobs`` (see :meth:`job`).
    """

    now: float
    jobs: Sequence  # JobView, in arrival order (a tuple, or JobsInOrder)
    gpus_per_node: tuple[int, ...]
    nodes_per_switch: int
    arrived: tuple = ()  # JobView that arrived since the previous snapshot
    ended: tuple = ()  # keys of jobs that ended since the previous snapshot
    running: tuple = ()  # JobView running before this decision
    node_types: tuple = ()  # GPU type of node i on a heterogeneous cluster (empty: one type)
    by_key: Optional[Mapping] = None
    #: planned maintenance, ((node, start, end), ...): the node offers nothing from start to end
    #: (``nodes drain NAME --at``); a policy that plans ahead (backfill) starts nothing there that would overlap
    windows: tuple = ()

    def __post_init__(self) -> None:
        if self.by_key is None:
            msgspec.structs.force_setattr(self, "by_key", {j.job_id: j for j in self.jobs})

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus_per_node)

    def job(self, key: JobKey) -> Optional[JobView]:
        """The view of runnable job ``key`` in this snapshot, or None (ended, or being stopped)."""
        return self.by_key.get(key)


class Decision(msgspec.Struct, frozen=True):
    """``run`` maps job key -> placement ``((node, gpus), ...)``; a job absent from it does not run.

    A placement's node is an index into ``gpus_per_node``, or -1 for "any node" (the mechanism
    picks nodes, keeping a running job where it is). ``workers``: job key -> GPUs (workers) to
    run an elastic job with, within its ``min_gpu..max_gpu`` (absent: ``num_gpu``); the
    placement must add up to it.

    ``wakeup``: the next time the policy wants to decide again even if nothing arrives or ends
    (e.g. a Tiresias queue demotion), or None.

    ``notes``: the policy's reasons, as ``(job key, dict)`` pairs; the coordinator writes each
    to its event log as a ``plan`` event (the simulator ignores them).

    ``groups``: jobs that share their GPUs by interleaving (Muri); the members of a group have
    one placement and use its GPUs once. ``slowdown``: job key -> factor on its iteration time
    while it runs this way (a group's interleaved iteration over the job's own); 1 if absent.
    """

    run: dict = msgspec.field(default_factory=dict)
    wakeup: Optional[float] = None
    groups: tuple = ()
    slowdown: dict = msgspec.field(default_factory=dict)
    workers: dict = msgspec.field(default_factory=dict)
    notes: tuple = ()  # (job key, {field: value}) the backend writes to its event log: why
    #: job key -> each worker's memory limit in bytes (a resource plan's; applied from the job's next start)
    limits: dict = msgspec.field(default_factory=dict)


class Policy(Protocol):
    name: str

    def decide(self, snapshot: ClusterSnapshot) -> Decision: ...


def nothing_changed(s: ClusterSnapshot, ran, gpus: tuple) -> bool:
    """Nothing arrived or ended since the policy's last snapshot, exactly the jobs of its last
    decision (``ran``: their keys) run, and the nodes offer the GPUs they did then (``gpus``: its
    ``gpus_per_node``): the decision was carried out as made and nothing the snapshot reports has
    changed since (a decision point such as a run's first step or a periodic round). A job that
    failed, lost its node or was kept running against the decision breaks it, and so does a node
    lost, back, joined or cordoned."""
    return not s.arrived and not s.ended and bool(s.running) and len(s.running) == len(ran) \
        and s.gpus_per_node == gpus and all(j.job_id in ran for j in s.running)


class Restored:
    """``import_state``'s view of the jobs now: an exported job key (a string) -> the job's view,
    and its id in this instance (``rename``: the ids it has where the instance runs, e.g. a
    forecast's simulation, by exported key; absent: its own)."""

    def __init__(self, jobs, rename: Optional[dict] = None) -> None:
        self.views = {str(j.job_id): j for j in jobs}
        self.rename = rename

    def id(self, key) -> Any:
        """The job's id here, or None if it is not among the jobs now."""
        j = self.views.get(str(key))
        if j is None:
            return None
        return j.job_id if self.rename is None else self.rename.get(str(key), j.job_id)

    def view(self, key) -> Optional[JobView]:
        return self.views.get(str(key))

    def ids(self) -> set:
        """Every job's id here (what ``restored_arrivals`` takes as known)."""
        return {self.id(k) for k in self.views}


def restored_arrivals(s: ClusterSnapshot, known: Optional[set]) -> ClusterSnapshot:
    """The snapshot a policy restored by ``import_state`` decides its first decision on: a rebuilt
    policy sees every job arrive, but the jobs it restored (``known``) are no arrivals to it."""
    if known and s.arrived and all(j.job_id in known for j in s.arrived):
        return msgspec.structs.replace(s, arrived=())
    return s


_REGISTRY: dict[str, Callable[..., Policy]] = {}
_OPTIONS: dict[str, Optional[frozenset[str]]] = {}


def register(name: str, factory: Callable[..., Policy], options: Optional[Sequence[str]] = None, *,
             replace: bool = False) -> None:
    """Register ``factory`` under ``name``; ``options``: the keyword options it takes (default:
    read from its signature, or from the class it builds).

    Raises:
        ConfigError: ``name`` is already registered (pass ``replace=True`` to override it).
    """
    if name in _REGISTRY and not replace and _REGISTRY[name] is not factory:
        raise ConfigError(f"policy {name!r} is already registered; pick another name, or pass replace=True "
                          "to override it on purpose")
    _REGISTRY[name] = factory
    if options is None:
        params = inspect.signature(factory).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            options = [n for n in params if n != "self"]
    _OPTIONS[name] = frozenset(options) if options is not None else None


def options_of(name: str) -> Optional[frozenset[str]]:
    """The keyword options a registered policy takes (None if it did not say)."""
    _load_builtin(name)
    return _OPTIONS.get(name)


def registered() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def check_registered(name: str) -> None:
    """Raises ConfigError (naming the known policies) if ``name`` is not a policy.

    ``module:attr`` (``my_policies:UserTurns``) names a factory in an importable module (the
    working directory first, then ``sys.path``): it is imported and registered under that name."""
    if name in _REGISTRY:
        return
    if ":" in name:  # (a policy of the user's: no shipped module is imported for it)
        _register_path(name)
        return
    _load_builtin(name)
    if name not in _REGISTRY:
        from importlib.metadata import entry_points

        for ep in entry_points(group="elastictrain.policies"):
            if ep.name == name:
                register(name, ep.load())
    if name not in _REGISTRY:
        raise ConfigError(f"policy {name!r} is not registered (known: {', '.join(sorted(_REGISTRY))}). "
                          "Did you forget to call elastictrain.policies.api.register or to install the "
                          "package that provides it?")


def create(name: str, *, only_known: bool = False, **options) -> Policy:
    """Build a registered policy by name (also from the ``elastictrain.policies`` entry points).

    ``only_known=True`` drops options the policy does not take (for callers that hold one set of
    options for several policies, like ``elastictrain simulate``); otherwise they are an error.

    Raises:
        ConfigError: the name is not registered, or an option is unknown or invalid.
    """
    check_registered(name)
    known = _OPTIONS.get(name)
    if only_known and known is not None:
        options = {k: v for k, v in options.items() if k in known}
    try:
        return _REGISTRY[name](**options)
    except TypeError as exc:
        raise ConfigError(f"policy {name!r}: bad option: {exc}") from None


def _register_path(name: str) -> None:
    import os
    import re
    import sys

    if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", name):
        raise ConfigError(f"policy {name!r}: write a policy in a module as module:attr, e.g. my_policies:UserTurns")
    module, attr = name.split(":")
    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"policy {name!r}: cannot import {module!r} ({exc}); run from its directory or add it "
                          "to PYTHONPATH") from None
    finally:
        if added:
            sys.path.remove(os.getcwd())
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise ConfigError(f"policy {name!r}: {module} has no callable {attr!r} (a policy class or factory)")
    register(name, factory)


#: the shipped policies, by the module that registers them (imported when one of its names is
#: asked for: a simulation of one policy does not import the others, nor numpy for Tiresias-G)
_BUILTIN = {"fifo": ("yarn-cs", "fifo", "fifo-be"), "backfill": ("backfill",), "multifactor": ("multifactor",),
            "srtf": ("srtf", "srsf"), "tiresias": ("tiresias-l", "tiresias-g"),
            "timeslice": ("gandiva-ts",),
            "gandiva_fair": ("gandiva-fair", "gandiva-fair-notrade", "gandiva-fair-global"),
            "muri": ("muri-s", "muri-l", "muri-l-worst", "muri-l-noblossom"), "autoscale": ("autoscale",)}


def _load_builtin(name: Optional[str] = None) -> None:
    """Import the shipped policy modules: the one that registers ``name``, or all of them (no
    name, or a name none of them has: the error lists every known policy)."""
    mods = [m for m, names in _BUILTIN.items() if name in names] if name is not None else []
    for mod in mods or _BUILTIN:
        importlib.import_module(f".{mod}", __package__)
