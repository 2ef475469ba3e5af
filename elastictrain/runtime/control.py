"""The channel between an ``etrun`` agent and a worker that recovers in process.

A worker that opts in (``elastictrain_torch.elastic.run``) writes ``inprocess`` (its pid and the
generation whose process group it has joined) into the directory named by ``ET_CONTROL_DIR``.
When a peer fails, or the job's membership changes, an agent whose local workers all opted in
(and joined the generation that failed) does not stop them: once the next generation is formed it
writes ``assignment.json`` (the generation and the worker's new environment: ``RANK``,
``WORLD_SIZE``, ``MASTER_PORT``, ``ET_GENERATION``, ...) for each survivor and starts a
replacement only for the worker that died. Both files are written atomically (rename).
"""

from __future__ import annotations

import json
import os
import time
from typing import Optional

from ..errors import ElasticTrainError

__all__ = ["ControlChannel", "MembershipChanged", "write_assignment", "opted_in", "mark_inprocess", "INPROCESS", "ASSIGNMENT",
           "PEER_GONE"]

#: words of the error a worker's collective raises when a peer's process is gone (lower case)
PEER_GONE = ("connection closed by peer", "connection reset by peer", "remote worker crashing", "broken pipe")

INPROCESS = "inprocess"
ASSIGNMENT = "assignment.json"


class MembershipChanged(ElasticTrainError):
    """The job formed a newer generation: leave the current process group and join the new one."""


def _write(path: str, data: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(data)
    os.replace(tmp, path)


def write_assignment(directory: str, generation: int, env: dict[str, str]) -> None:
    """Agent side: hand a surviving worker its place in ``generation``."""
    _write(os.path.join(directory, ASSIGNMENT), json.dumps({"generation": generation, "env": env}))


def mark_inprocess(directory: str, pid: int) -> None:
    """Agent side: record that the worker with this pid recovers in process (for workers that
    cannot write it themselves: Horovod's, which register with the agent's rendezvous instead)."""
    os.makedirs(directory, exist_ok=True)
    _write(os.path.join(directory, INPROCESS), str(pid))


def opted_in(directory: str, pid: int, generation: Optional[int] = None) -> bool:
    """Agent side: did the worker with this pid opt in to in-process recovery, and (with
    ``generation``) has it joined that generation's process group? A survivor still joining the
    group of the generation that just failed (blocked in ``init_process_group`` on a replacement
    that died meanwhile) would never see the next one: it is stopped, not kept. A worker the agent
    marked itself (Horovod's, :func:`mark_inprocess`) names no generation and is taken at its word."""
    try:
        with open(os.path.join(directory, INPROCESS)) as f:
            words = f.read().split()
    except OSError:
        return False
    if not words or words[0] != str(pid):
        return False
    return generation is None or len(words) < 2 or words[1] == str(generation)


class ControlChannel:
    """Worker side of the channel (None from :meth:`from_env` outside etrun)."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self._path = os.path.join(directory, ASSIGNMENT)
        self._seen: Optional[float] = None

    @classmethod
    def from_env(cls) -> Optional["ControlChannel"]:
        directory = os.environ.get("ET_CONTROL_DIR")
        return cls(directory) if directory and os.path.isdir(directory) else None

    def announce(self, generation: int) -> None:
        """Opt in to in-process recovery, as a member of ``generation``'s process group (called
        once the worker has joined it, again after each recovery)."""
        _write(os.path.join(self.dir, INPROCESS), f"{os.getpid()} {generation}")

    def newer(self, generation: int) -> Optional[dict]:
        """The assignment of a generation after ``generation``, if the agent wrote one (cheap:
        one ``stat`` unless the file changed)."""
        try:
            mtime = os.stat(self._path).st_mtime_ns
        except OSError:
            return None
        if mtime == self._seen:
            return None
        try:
            with open(self._path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            return None
        if int(data.get("generation", 0)) > generation:
            return data
        self._seen = mtime
        return None

    def wait(self, generation: int, timeout: float) -> dict:
        """Block until the agent hands out a generation after ``generation``.

        Raises:
            ElasticTrainError: none came within ``timeout`` seconds (the agent gave up on this
                worker, e.g. the job ended, and will stop it).
        """
        deadline = time.monotonic() + timeout
        while True:
            data = self.newer(generation)
            if data is not None:
                return data
            if time.monotonic() > deadline:
                raise ElasticTrainError(f"no generation after {generation} within {timeout:.0f} s: the agent did not "
                                        "re-form the job around this worker")
            time.sleep(0.002)
