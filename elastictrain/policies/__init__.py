"""Scheduling policies: one contract (:mod:`.api`), one module per family."""

from .api import ClusterSnapshot, Decision, JobState, Policy, create, registered

__all__ = ["ClusterSnapshot", "Decision", "JobState", "Policy", "create", "registered"]
