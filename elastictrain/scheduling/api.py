"""The mechanism core's contract: job states, actions, the cluster's shape, the Backend protocol.

One core runs every policy, in the simulator and in the coordinator: a :class:`JobTable` of
stable records keyed by job key, snapshots for each policy, :func:`plan` (a Decision, checked,
becomes actions) and a :class:`Scheduler` that acts through a :class:`Backend`. The simulated
backend models progress, restart costs and slowdowns; the live one starts and stops real
workers through node daemons. A third (Slurm, Kubernetes) implements the same four methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional, Protocol

import msgspec

__all__ = ["JobStatus", "ActionKind", "Action", "ClusterShape", "Backend", "ENDED"]


class JobStatus(str, Enum):
    """A job's state, spelled the same in the API, the CLI and the database."""

    QUEUED = "queued"  # waiting, never ran
    RUNNING = "running"  # placed (its workers run, or are being started or stopped)
    PREEMPTED = "preempted"  # ran, was stopped by a decision; waits to resume from its checkpoint
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


ENDED = frozenset({JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELLED})


class ActionKind(str, Enum):
    START = "start"  # a waiting job starts (or resumes) on ``placement``
    PREEMPT = "preempt"  # a running job stops; it waits again
    MIGRATE = "migrate"  # a running job moves to ``placement`` (its workers restart there)
    REGROUP = "regroup"  # a running job's interleaving group changed (the group restarts)
    RESIZE = "resize"  # a running elastic job changes its worker count


#: the kinds under plain names, for the mechanism's loops: they compare kinds millions of times in
#: a simulation, and an Enum member looked up on its class costs ten times a global (Python 3.11)
START, PREEMPT, MIGRATE, REGROUP, RESIZE = (ActionKind.START, ActionKind.PREEMPT, ActionKind.MIGRATE,
                                            ActionKind.REGROUP, ActionKind.RESIZE)


class Action(msgspec.Struct, frozen=True):
    """One change a decision makes to one job.

    ``placement``: where the job runs after the action (empty for a preemption); ``previous``:
    where it ran before. ``group``: the keys of the job's interleaving group after the action
    (empty: alone). ``slowdown``: the policy's factor on the job's iteration time (None: not
    given). ``moved``: its GPUs changed (a regroup or resize may move a job too).
    """

    kind: ActionKind
    key: object
    placement: tuple = ()
    previous: tuple = ()
    workers: int = 0
    group: tuple = ()
    slowdown: Optional[float] = None
    moved: bool = False


@dataclass(frozen=True)
class ClusterShape:
    """The nodes a backend offers now: GPUs (or slots) of each node (0 while a node is down),
    nodes per switch (for consolidated placement), GPU type of each node (empty: one type), and the
    maintenance windows planned, ``((node, start, end), ...)``."""

    gpus_per_node: tuple
    nodes_per_switch: int = 1
    node_types: tuple = ()
    windows: tuple = ()

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus_per_node)


class Backend(Protocol):
    """Where actions go. ``stop`` may finish later: the backend calls
    :meth:`JobTable.stopped` once the job's workers are gone (the simulator does it at once).

    Optional, read by :meth:`Scheduler.act` (the simulator's): ``instant_stop = True``, its stops
    complete at once, so the core preempts with :meth:`JobTable.preempt_now` and never calls
    ``stop``; ``free_moves = True``, a migration keeps the run training, so the core calls
    ``moved(entry, action)`` instead of ``restart`` and the run does not become starting again.
    Read by the other path (the live one's): ``refuses(action) -> str``, why a start or a move may
    not go where the decision put it ("" where it may); the core then waits or stops instead."""

    def shape(self) -> ClusterShape:
        """The cluster as the next decision may use it."""
        ...

    def start(self, entry, action: Action) -> None:
        """Start (or resume) a job on ``action.placement``."""
        ...

    def stop(self, entry, action: Action) -> None:
        """Stop a job with its grace period (its workers checkpoint), then report it stopped."""
        ...

    def restart(self, entry, action: Action) -> None:
        """Stop a running job and start it again as ``action`` says (migrate, regroup, resize)."""
        ...
