"""Each job of an interleaving group sets up alone, from the same RNG state.

Jobs of ``etrun --group`` share one process, so they share its global random number generators
(``random``, numpy's, torch's CPU generator). Run concurrently, two jobs' set-up code (seeding,
then building a dataset or initial weights from the global RNG) interleaves differently on each
rank, and the ranks of one job silently train on different data. So the group runs each job's
set-up (everything before its first stage) alone, in job order (the same on every rank, so
collectives inside set-up pair up), each starting from the RNG state the process had when the
group began, as if it ran alone; training starts once every job has set up. (Random numbers drawn
while the jobs train concurrently, e.g. dropout, still come from the shared generators: they need
not agree across ranks.) A job that never enters a stage runs entirely in its turn.
"""

from __future__ import annotations

import random
import sys
import threading

__all__ = ["SetupTurns", "capture_rng", "restore_rng"]


def capture_rng() -> dict:
    """The global RNG states of ``random`` and, where imported, numpy and torch (CPU)."""
    state: dict = {"random": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_rng_state"):
        state["torch"] = torch.get_rng_state()
    return state


def restore_rng(state: dict) -> None:
    random.setstate(state["random"])
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in state:
        np.random.set_state(state["numpy"])
    torch = sys.modules.get("torch")
    if torch is not None:
        if "torch" in state:
            torch.set_rng_state(state["torch"])
        else:  # torch was imported by a job: what a fresh process's generator starts from
            torch.manual_seed(torch.initial_seed())


class SetupTurns:
    """Set-up turns for ``n`` jobs: :meth:`begin` (in the job's thread, before its code) waits for
    its turn and restores the group's initial RNG state; :meth:`ready` (at its first stage) ends
    its turn and waits until every job has set up; :meth:`end` ends its turn without waiting (the
    job ended or failed)."""

    def __init__(self, n: int) -> None:
        self._cond = threading.Condition()
        self._done = [False] * n
        self._turn = 0  # the first job that has not finished its set-up
        self._start = capture_rng()

    def begin(self, i: int) -> None:
        with self._cond:
            while self._turn < i:
                self._cond.wait()
        restore_rng(self._start)

    def end(self, i: int) -> None:
        with self._cond:
            if self._done[i]:
                return
            self._done[i] = True
            while self._turn < len(self._done) and self._done[self._turn]:
                self._turn += 1
            self._cond.notify_all()

    def ready(self, i: int) -> None:
        self.end(i)
        with self._cond:
            while self._turn < len(self._done):
                self._cond.wait()
