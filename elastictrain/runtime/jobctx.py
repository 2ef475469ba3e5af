"""Per-job context for jobs sharing one process (``etrun --group``): each job's thread sees
its own name, ``sys.argv`` and process group.

Outside a group nothing is bound and every lookup falls through to the process (the real
``sys.argv``, the default process group), so library code works the same alone or grouped.
The environment is shared: grouped jobs run with the same ranks and coordinator, and keep their
datasets apart by name (``Job.namespace``).
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

__all__ = ["JobContext", "current", "bound", "install_argv_proxy", "on_preempt", "notify_preempt"]

_local = threading.local()
_preempt_lock = threading.Lock()
_preempt_listeners: list = []


@dataclass
class JobContext:
    """One grouped job: ``name`` (unique in its group; its datasets live under ``<name>.``),
    ``argv`` (``argv[0]`` is the script) and ``process_group`` (its own collectives' group, or
    None when torch is not in use).

    A group the scheduler formed (cluster mode) runs jobs that exist at the coordinator on their
    own: ``job_id``, ``generation`` and ``restart_reason`` are then the job's own, and its
    datasets keep their names (they are the job's, grouped or not)."""

    name: str
    argv: list[str]
    process_group: Any = None
    job_id: Optional[str] = None
    generation: Optional[int] = None
    restart_reason: Optional[str] = None


def current() -> Optional[JobContext]:
    """The calling thread's job context, or None outside ``etrun --group``."""
    return getattr(_local, "ctx", None)


@contextmanager
def bound(ctx: JobContext) -> Iterator[JobContext]:
    """Bind ``ctx`` to the calling thread for the duration."""
    prev = getattr(_local, "ctx", None)
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = prev


class _ArgvProxy(list):
    """``sys.argv`` for a process running several jobs: a job's thread sees its own argv (what
    argparse reads), any other thread the process's. The list storage holds the latter."""

    def _cur(self) -> list:
        ctx = getattr(_local, "ctx", None)
        return ctx.argv if ctx is not None else list.copy(self)

    def __getitem__(self, i):
        return self._cur()[i]

    def __setitem__(self, i, v) -> None:
        ctx = getattr(_local, "ctx", None)
        if ctx is not None:
            ctx.argv[i] = v
        else:
            super().__setitem__(i, v)

    def __len__(self) -> int:
        return len(self._cur())

    def __iter__(self):
        return iter(self._cur())

    def __contains__(self, v) -> bool:
        return v in self._cur()

    def __eq__(self, other) -> bool:
        return self._cur() == other

    def __repr__(self) -> str:
        return repr(self._cur())

    def copy(self) -> list:
        return list(self._cur())

    def index(self, *a):
        return self._cur().index(*a)


def install_argv_proxy() -> None:
    """Make ``sys.argv`` per-job (idempotent)."""
    if not isinstance(sys.argv, _ArgvProxy):
        sys.argv = _ArgvProxy(sys.argv)


def on_preempt(fn) -> None:
    """Call ``fn()`` when the process is asked to checkpoint and stop. Signal handlers can only
    be installed by the main thread; ``etrun --group`` installs them there and calls these."""
    with _preempt_lock:
        _preempt_listeners.append(fn)


def notify_preempt() -> None:
    with _preempt_lock:
        listeners = list(_preempt_listeners)
    for fn in listeners:
        fn()


class PrefixedStream:
    """A text stream that starts each line a job writes with ``[job] `` (the job bound to the
    writing thread); lines written outside any job pass unchanged. ``etrun --group`` puts one
    over ``sys.stdout`` and ``sys.stderr`` so interleaved jobs' output can be told apart."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._at_start: dict[int, bool] = {}

    def write(self, text: str) -> int:
        ctx = current()
        if ctx is None or not text:
            return self._stream.write(text)
        me = threading.get_ident()
        with self._lock:
            for piece in text.splitlines(keepends=True):
                if self._at_start.get(me, True):
                    self._stream.write(f"[{ctx.name}] ")
                self._stream.write(piece)
                self._at_start[me] = piece.endswith("\n")
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name):  # flush, fileno, buffer, encoding, isatty, ...
        return getattr(self._stream, name)
