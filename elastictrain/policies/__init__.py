"""Scheduling policies: pure decisions over a :class:`ClusterSnapshot` (see :mod:`.api`)."""

from .api import ClusterSnapshot, Decision, JobView, Policy, create, registered

__all__ = ["ClusterSnapshot", "Decision", "JobView", "Policy", "create", "registered"]
