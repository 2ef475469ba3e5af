"""Jobs and their generations (rendezvous rounds), with generation fencing.

A generation is one incarnation of a job's worker group with a fixed world size.
Every worker request names its generation; a request from an older generation is
rejected with :class:`StaleGenerationError`, so a zombie worker can never change
state that the current generation relies on.
"""

from __future__ import annotations

from typing import Optional

from ..errors import ConflictError, ConfigError, NotFoundError, StaleGenerationError
from ..model import check_name
from .store import JobRow, Store

__all__ = ["Membership"]

#: why a generation started (ET_RESTART_REASON); "preempt" to "resize" come from the scheduler (cluster
#: mode); "straggler": a slow node was taken out (coordinator/stragglers.py)
_REASONS = ("start", "failure", "scale_up", "scale_down", "preempt", "decision", "requeue", "node_lost", "migrate",
            "regroup", "resize", "coordinator_restart", "straggler")


class Membership:
    def __init__(self, store: Store, jobs: list[JobRow]) -> None:
        self._store = store
        self.jobs: dict[str, JobRow] = {j.job: j for j in jobs}

    def create_job(self, job: str, min_workers: int, max_workers: int) -> JobRow:
        """Create a job, or return it unchanged if it exists (idempotent)."""
        check_name("job", job)
        if not 1 <= min_workers <= max_workers <= 65536:
            raise ConfigError(f"job {job!r}: need 1 <= min_workers <= max_workers <= 65536, "
                              f"got {min_workers}..{max_workers}")
        row = self.jobs.get(job)
        if row is not None:
            return row
        row = JobRow(job, 0, 0, min_workers, max_workers, "created")
        with self._store.transaction() as tx:
            tx.put_job(row)
        self.jobs[job] = row
        return row

    def get(self, job: str) -> JobRow:
        row = self.jobs.get(job)
        if row is None:
            raise NotFoundError(f"job {job!r} does not exist; create it with POST /v1/jobs first")
        return row

    def open_generation(self, job: str, expected: int, world_size: int, reason: str) -> JobRow:
        """Compare-and-set the job to generation ``expected + 1`` (idempotent on retry).

        Raises:
            ConflictError: the job is at another generation than ``expected``.
        """
        row = self.get(job)
        if reason not in _REASONS:
            raise ConfigError(f"reason {reason!r} is not one of {', '.join(_REASONS)}")
        if world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {world_size}")
        if row.generation == expected + 1 and row.world_size == world_size:
            return row  # a retry of the request that already succeeded
        if row.generation != expected:
            raise ConflictError(f"job {job!r} is at generation {row.generation}, not {expected}; "
                                "read the job and retry with the current generation")
        new = JobRow(job, expected + 1, world_size, row.min_workers, row.max_workers, reason)
        with self._store.transaction() as tx:
            tx.put_job(new)
        self.jobs[job] = new
        return new

    def check_generation(self, job: str, generation: int) -> JobRow:
        """Return the job if ``generation`` is its current one.

        Raises:
            StaleGenerationError: the worker belongs to an older generation.
            ConflictError: the generation was never opened.
        """
        row = self.get(job)
        if generation < row.generation:
            raise StaleGenerationError(
                f"job {job!r} moved on to generation {row.generation}; this worker is of generation "
                f"{generation} and must stop (its launcher restarts it)")
        if generation > row.generation:
            raise ConflictError(f"job {job!r} has no generation {generation} (current: {row.generation}); "
                                "open it with POST /v1/jobs/{job}/generations")
        return row

    def world_size(self, job: str) -> Optional[int]:
        row = self.jobs.get(job)
        return row.world_size if row else None
