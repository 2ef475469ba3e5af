"""Stage and communication profiles: what Muri's grouping and Tiresias's placement consume.

* :func:`stage_profile`: mean seconds per iteration of each stage type over a window after a
  warm-up (Muri profiles a few tens of iterations). When spans overlap in time (a data-loading
  thread running under the compute stage, say), time is attributed as Muri section 4 does with
  resource usage: :func:`attribute_usage` normalizes each resource's usage to its peak and gives
  every instant to the dominant resource, dropping instants below a threshold.
* :class:`CommStats` accumulates collectives (bytes, seconds) from a framework hook
  (``elastictrain_torch.CommProfiler`` for DDP, ``elastictrain_tf.comm_profile`` from
  gradient sizes) and :func:`comm_profile` turns them and the model's tensor sizes into a
  :class:`~elastictrain.wire.CommProfile`.
* Profiling runs: with ``ET_PROFILE_ITERATIONS`` set (``elastictrain profile`` sets it), the
  thread's recorder writes both profiles to ``$ET_PROFILE_OUT.<rank>.json`` after warm-up +
  that many iterations, sends them to the coordinator where ``ET_COORDINATOR`` is set, and
  ends the script with :class:`ProfileComplete` (exit status 0).
* In ordinary training runs, :func:`report_when_ready` (``Job.profile_stages``) sends the
  report to the coordinator once, in the background, and the run goes on.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Optional, Sequence

import msgspec

from ..errors import ConfigError
from ..wire import CommProfile, ProfileReport, StageProfile
from .stages import STAGES, Recorder

__all__ = ["stage_profile", "attribute_usage", "attribute_spans", "CommStats", "comm_profile", "size_histogram",
           "ProfileComplete", "register_comm", "arm_from_env", "build_report", "report_when_ready"]

# ties between overlapping spans go to the device, then the host stages
_TIE_ORDER = {"compute": 0, "sync": 1, "preprocess": 2, "load": 3}


def attribute_usage(usage: dict[str, Sequence[float]], dt: float, threshold: float = 0.05) -> dict[str, float]:
    """Seconds attributed to each resource from usage samples taken every ``dt`` seconds.

    Each series is normalized to its own peak; each instant goes to the resource with the
    highest normalized usage; an instant where that is below ``threshold`` counts for nobody.
    """
    names = list(usage)
    if not names:
        return {}
    n = len(usage[names[0]])
    if any(len(usage[k]) != n for k in names):
        raise ConfigError("usage series must have the same number of samples")
    peaks = {k: max(usage[k]) or 1.0 for k in names}
    out = dict.fromkeys(names, 0.0)
    for i in range(n):
        best, val = None, threshold
        for k in names:
            v = usage[k][i] / peaks[k]
            if v >= val and (best is None or v > val or _TIE_ORDER.get(k, 9) < _TIE_ORDER.get(best, 9)):
                best, val = k, v
        if best is not None:
            out[best] += dt
    return out


def attribute_spans(spans: Sequence[tuple[str, float, float]]) -> dict[str, float]:
    """Seconds per stage from possibly overlapping spans: where several are active, the time
    goes to one of them (usage is 1 while a span is active, so every active stage is at its
    peak; ties go to compute, sync, preprocess, load in that order)."""
    points = []
    for name, a, b in spans:
        if b > a:
            points.append((a, 1, name))
            points.append((b, -1, name))
    points.sort(key=lambda p: (p[0], p[1]))
    active: dict[str, int] = {}
    out = dict.fromkeys(STAGES, 0.0)
    last = None
    for t, delta, name in points:
        if last is not None and active:
            owner = min(active, key=lambda k: _TIE_ORDER.get(k, 9))
            out[owner] = out.get(owner, 0.0) + (t - last)
        active[name] = active.get(name, 0) + delta
        if active[name] == 0:
            del active[name]
        last = t
    return out


def stage_profile(rec: Recorder, warmup: int = 5, iterations: Optional[int] = None, worker: int = 0) -> StageProfile:
    """The mean per-iteration stage times of ``rec`` after ``warmup`` iterations.

    Raises:
        ConfigError: fewer than ``warmup + 1`` iterations were recorded.
    """
    its = rec.iterations[warmup:]
    if iterations is not None:
        its = its[:iterations]
    if not its:
        raise ConfigError(f"the profile needs more than {warmup} iterations; only {rec.completed} recorded "
                          "(run more steps or lower the warm-up)")
    n = len(its)
    stages = {s: sum(it.get(s, 0.0) for it in its) / n for s in STAGES}
    device = False
    if rec.cuda:
        dev = rec.device_times()[warmup:warmup + n]
        if dev:
            device = True
            for s in ("compute", "sync"):
                stages[s] = sum(d.get(s, 0.0) for d in dev) / len(dev)
    return StageProfile(worker=worker, iterations=n, warmup=warmup, iteration_seconds=sum(stages.values()),
                        stages=stages, device=device)


def size_histogram(sizes: Sequence[int]) -> dict[str, int]:
    """Tensor count per size class (bytes): <4KiB, <64KiB, <1MiB, <16MiB, >=16MiB."""
    edges = [(4 << 10, "<4KiB"), (64 << 10, "<64KiB"), (1 << 20, "<1MiB"), (16 << 20, "<16MiB")]
    out = {label: 0 for _, label in edges}
    out[">=16MiB"] = 0
    for s in sizes:
        for edge, label in edges:
            if s < edge:
                out[label] += 1
                break
        else:
            out[">=16MiB"] += 1
    return out


class CommStats:
    """Collectives seen by a hook: thread-safe counters (the hook runs on the comm thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.collectives = 0
        self.bytes = 0
        self.seconds = 0.0
        self.iterations = 0

    def record(self, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.collectives += 1
            self.bytes += nbytes
            self.seconds += seconds

    def step(self) -> None:
        with self._lock:
            self.iterations += 1


def comm_profile(stats: CommStats, tensor_bytes: Sequence[int], worker: int = 0) -> CommProfile:
    its = max(1, stats.iterations)
    total = int(sum(tensor_bytes))
    largest = int(max(tensor_bytes)) if tensor_bytes else 0
    return CommProfile(
        worker=worker, iterations=stats.iterations,
        collectives_per_iteration=stats.collectives / its, bytes_per_iteration=stats.bytes / its,
        seconds_per_collective=stats.seconds / stats.collectives if stats.collectives else 0.0,
        seconds_per_iteration=stats.seconds / its, tensor_count=len(tensor_bytes), total_bytes=total,
        largest_bytes=largest, skew=largest / total if total else 0.0, size_histogram=size_histogram(tensor_bytes))


class ProfileComplete(SystemExit):
    """Raised from the training loop once a profiling run has its iterations (exit status 0)."""

    def __init__(self, path: str) -> None:
        super().__init__(0)
        self.path = path


_COMM: list = []  # objects with .profile(worker) -> CommProfile (registered by framework hooks)


def register_comm(source) -> None:
    """Include ``source.profile(worker)`` in a profiling run's report."""
    _COMM.append(source)


def build_report(rec: Recorder, warmup: int, iterations: int, worker: int) -> ProfileReport:
    """Both profiles of this worker: stages from ``rec``, comm from the last registered hook."""
    comm = _COMM[-1].profile(worker) if _COMM else None  # the most recently attached model
    return ProfileReport(stage=stage_profile(rec, warmup, iterations, worker), comm=comm)


def _chain(rec: Recorder, fn) -> None:
    prev = rec.on_iteration
    if prev is None:
        rec.on_iteration = fn
    else:
        def both(completed: int) -> None:
            prev(completed)
            fn(completed)
        rec.on_iteration = both


def _send(client, job_id: str, report: ProfileReport) -> bool:
    from ..errors import ElasticTrainError

    try:
        client.report_profile(job_id, report)
        return True
    except ElasticTrainError as exc:  # profiling must never fail the training run
        print(f"elastictrain: warning: profile of worker {report.stage.worker} not sent to the coordinator: {exc}",
              file=sys.stderr, flush=True)
        return False


def report_when_ready(client, job_id: str, rec: Recorder, warmup: int = 5, iterations: int = 20,
                      worker: int = 0) -> threading.Event:
    """Send ``rec``'s profile to the coordinator once ``warmup + iterations`` iterations are
    recorded; the HTTP call runs on a daemon thread, so the training loop never waits on it.
    Returns an event set once the report was sent (or failed, with a warning on stderr)."""
    if warmup < 0 or iterations < 1:
        raise ConfigError(f"profile window needs warmup >= 0 and iterations >= 1, got {warmup} and {iterations}")
    sent = threading.Event()

    def done(completed: int) -> None:
        if completed != warmup + iterations:
            return
        report = build_report(rec, warmup, iterations, worker)

        def post() -> None:
            try:
                _send(client, job_id, report)
            finally:
                sent.set()

        threading.Thread(target=post, name="et-profile-report", daemon=True).start()

    _chain(rec, done)
    return sent


def arm_from_env(rec: Recorder) -> None:
    """Make ``rec`` end a profiling run (``ET_PROFILE_ITERATIONS``) when it has its iterations."""
    n = os.environ.get("ET_PROFILE_ITERATIONS")
    if not n:
        return
    try:
        iterations, warmup = int(n), int(os.environ.get("ET_PROFILE_WARMUP", "5"))
    except ValueError:
        raise ConfigError(f"ET_PROFILE_ITERATIONS / ET_PROFILE_WARMUP must be integers, got {n!r}") from None
    out = os.environ.get("ET_PROFILE_OUT", "profile")
    worker = int(os.environ.get("RANK", "0"))

    def done(completed: int) -> None:
        if completed < warmup + iterations:
            return
        report = build_report(rec, warmup, iterations, worker)
        path = f"{out}.{worker}.json"
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(msgspec.json.encode(report))
        os.replace(tmp, path)
        url = os.environ.get("ET_COORDINATOR")
        if url:
            from .client import CoordinatorClient

            client = CoordinatorClient(url, retry_for=10.0)
            try:
                _send(client, os.environ.get("ET_JOB_ID", "default"), report)
            finally:
                client.close()
        raise ProfileComplete(path)

    _chain(rec, done)


def load_report(path: str) -> ProfileReport:
    with open(path, "rb") as f:
        return msgspec.json.decode(f.read(), type=ProfileReport)


def report_json(report: ProfileReport) -> str:
    return json.dumps(msgspec.to_builtins(report), indent=2, sort_keys=True)
