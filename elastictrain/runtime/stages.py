"""Stage annotations: ``et.stage("load" | "preprocess" | "compute" | "sync")``.

As a context manager or a decorator, in an ordinary training loop::

    for batch in loader:
        with et.stage("load"):
            x, y = next(it)
        with et.stage("compute"):
            loss = model(x).loss; loss.backward()
        with et.stage("sync"):
            optimizer.step()

Each span goes to the calling thread's :class:`Recorder` (per-iteration seconds of each
stage). A new iteration starts when the iteration's first stage starts again. The cost is two
``perf_counter`` calls and a few attribute operations per span (``benchmarks/
profiling_overhead.py`` measures it). On CUDA (``Recorder(cuda=True)``, or ``ET_STAGE_CUDA=1``
when torch sees a GPU) ``compute`` and ``sync`` spans are also timed with CUDA events on the
current stream, which measure the device work rather than the host's launch time; they are
read when the profile is built, never in the loop.

The same annotations are how the interleaving executor (:mod:`.interleave`) holds a job at
the barrier of a slot: a thread that belongs to an interleaving group passes every stage
through its group's gate.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from typing import Callable, Optional

from ..errors import ConfigError

__all__ = ["STAGES", "stage", "Recorder", "recorder", "use_recorder"]

#: the stage types, in the order a training iteration uses them (one resource type each)
STAGES = ("load", "preprocess", "compute", "sync")
_DEVICE_STAGES = ("compute", "sync")

_local = threading.local()


class Recorder:
    """Per-iteration stage times of one job.

    ``iterations``: completed iterations, each a dict stage -> seconds (summed if a stage
    runs several times in one iteration). Where an iteration's spans overlap in time (stages
    annotated on several threads), its times are attributed instead
    (:func:`~elastictrain.runtime.profiler.attribute_spans`, Muri section 4), so they never add
    up to more than the wall time. Bounded: keeps ``max_iterations``.
    """

    def __init__(self, *, cuda: Optional[bool] = None, max_iterations: int = 100_000,
                 on_iteration: Optional[Callable[[int], None]] = None) -> None:
        if cuda is None:
            cuda = os.environ.get("ET_STAGE_CUDA") == "1"
        self.cuda = bool(cuda) and _cuda_available()
        self.iterations: list[dict[str, float]] = []
        self.max_iterations = max_iterations
        self.on_iteration = on_iteration
        self._current: dict[str, float] = {}
        self._cur_spans: list[tuple[str, float, float]] = []
        self._max_end = float("-inf")
        self._overlap = False
        self._first: Optional[str] = None
        self.busy = 0.0  # seconds in every span but sync's so far (a rank's own work; the straggler watch)
        self._events: list[tuple[int, str, object, object]] = []  # (iteration, stage, start, end)

    @property
    def completed(self) -> int:
        return len(self.iterations)

    def begin(self, name: str) -> None:
        if self._first is None:
            self._first = name
        elif name == self._first and self._current:
            self.next_iteration()

    def add(self, name: str, start: float, end: float) -> None:
        cur = self._current
        cur[name] = cur.get(name, 0.0) + (end - start)
        if name != "sync":
            self.busy += end - start
        if start < self._max_end - 1e-9:
            self._overlap = True
        if end > self._max_end:
            self._max_end = end
        self._cur_spans.append((name, start, end))

    def next_iteration(self) -> None:
        """Close the current iteration (called automatically when the first stage repeats)."""
        if not self._current:
            return
        if self._overlap:
            from .profiler import attribute_spans

            self._current = {k: v for k, v in attribute_spans(self._cur_spans).items() if v > 0}
        self.iterations.append(self._current)
        self._current = {}
        self._cur_spans = []
        self._overlap = False
        if len(self.iterations) > self.max_iterations:
            del self.iterations[: len(self.iterations) - self.max_iterations]
        if self.on_iteration is not None:
            self.on_iteration(len(self.iterations))

    def device_times(self) -> list[dict[str, float]]:
        """Per-iteration seconds of the CUDA-timed stages (synchronizes on the recorded events)."""
        out: dict[int, dict[str, float]] = {}
        for it, name, start, end in self._events:
            end.synchronize()
            d = out.setdefault(it, {})
            d[name] = d.get(name, 0.0) + start.elapsed_time(end) / 1000.0
        return [out[i] for i in sorted(out)]


def _cuda_available() -> bool:
    torch = sys.modules.get("torch")
    try:
        return torch is not None and torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a broken CUDA setup means: time on the host
        return False


def recorder() -> Recorder:
    """The calling thread's recorder (created on first use)."""
    rec = getattr(_local, "recorder", None)
    if rec is None:
        rec = _local.recorder = Recorder()
        from .profiler import arm_from_env

        arm_from_env(rec)
    return rec


def use_recorder(rec: Optional[Recorder], gate=None) -> None:
    """Make ``rec`` the calling thread's recorder (and ``gate`` its interleaving gate)."""
    _local.recorder = rec
    _local.gate = gate


class stage:
    """Mark a stage of the training iteration; see the module docstring."""

    __slots__ = ("name", "_t0", "_rec", "_gate", "_ev")

    def __init__(self, name: str) -> None:
        if name not in STAGES:
            raise ConfigError(f"unknown stage {name!r}; use one of {', '.join(STAGES)}")
        self.name = name

    def __enter__(self) -> "stage":
        rec = getattr(_local, "recorder", None) or recorder()
        gate = getattr(_local, "gate", None)
        rec.begin(self.name)
        if gate is not None:
            gate.enter(self.name)
        self._rec, self._gate, self._ev = rec, gate, None
        if rec.cuda and self.name in _DEVICE_STAGES:
            import torch

            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self._ev = start
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        t1 = time.perf_counter()
        rec = self._rec
        rec.add(self.name, self._t0, t1)
        if self._ev is not None:
            import torch

            end = torch.cuda.Event(enable_timing=True)
            end.record()
            rec._events.append((rec.completed, self.name, self._ev, end))
        if self._gate is not None:
            self._gate.exit(self.name)

    def __call__(self, fn: Callable) -> Callable:
        name = self.name

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with stage(name):
                return fn(*args, **kwargs)

        return wrapper
