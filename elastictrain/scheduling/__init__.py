"""The mechanism core shared by the simulator and the coordinator (see :mod:`.api`)."""

from .api import ENDED, Action, ActionKind, Backend, ClusterShape, JobStatus
from .loop import Scheduler
from .plan import plan
from .table import Entry, Feed, JobTable

__all__ = ["Action", "ActionKind", "Backend", "ClusterShape", "ENDED", "Entry", "Feed", "JobStatus", "JobTable",
           "Scheduler", "plan"]
