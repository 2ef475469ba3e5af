"""Every worker samples its own resource use in a background thread and reports it, batched.

What one sample holds (:class:`~elastictrain.wire.ResourceSample`): CPU percent of this
process and its children (DataLoader workers), resident memory, bytes read and written, the
training step and the step time over the period (from :meth:`Job.report_step`, which the
checkpointer calls at every save/preempted; call it yourself every step for a finer figure),
and on a GPU: utilization, memory used/total and power from pynvml, and torch's peak allocated
memory. Without a GPU, or without pynvml, the GPU fields are None and ``gpu_absent`` says why.

``ET_MONITOR_PERIOD`` (seconds, default 5; 0 turns it off) sets the sampling period; samples are
sent every ``ET_MONITOR_BATCH`` samples (default 6), so one request per 30 s by default. The cost
is measured by ``benchmarks/profiling_overhead.py`` (``resource_monitor_overhead``).

Hangs: once the worker reported a step, no new step for ``ET_HANG_TIMEOUT`` seconds (default:
5 x the longest step seen, at least 60 s; 0 turns it off) makes the monitor dump every thread's
Python stack to stderr (faulthandler), write the error file naming the frame the main thread is
stuck in, and end the worker with :data:`HANG_EXIT_CODE`; etrun then restarts the group as after
any failure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from typing import Optional

from ..errors import ConfigError, ElasticTrainError
from ..wire import ResourceReport, ResourceSample
from .batch_shares import SharesBook

__all__ = ["ResourceMonitor", "start_from_env", "HANG_EXIT_CODE"]

HANG_EXIT_CODE = 124  # as coreutils' timeout

log = logging.getLogger(__name__)


def _gpu_probe():
    """(pynvml handle, None) for this worker's GPU, or (None, why there is none)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return None, "no GPU visible (CUDA_VISIBLE_DEVICES is empty)"
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None, "pynvml is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:  # noqa: BLE001 - no driver, no device
        return None, f"NVML unavailable: {exc}"
    if count == 0:
        return None, "no GPU on this machine"
    index = int(os.environ.get("LOCAL_RANK", "0")) % count
    if visible:
        ids = [d.strip() for d in visible.split(",") if d.strip()]
        if ids and ids[index % len(ids)].isdigit():
            index = int(ids[index % len(ids)])
    return pynvml.nvmlDeviceGetHandleByIndex(index), None


class ResourceMonitor:
    def __init__(self, client, job: str, worker: int, period: float = 5.0, batch: int = 6,
                 hang_timeout: Optional[float] = None) -> None:
        if not 0.01 <= period <= 3600:
            raise ConfigError(f"the monitor's period must be in [0.01, 3600] s, got {period}")
        if not 1 <= batch <= 1024:
            raise ConfigError(f"the monitor's batch must be in [1, 1024] samples, got {batch}")
        import psutil

        self._client, self._job, self.worker, self.period, self.batch = client, job, worker, period, batch
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # the first call starts the measurement interval
        self._children: dict[int, object] = {}
        self._step: Optional[int] = None
        # (step, when it was reported, busy seconds): the latest report, and the one the last step time ended at
        self._stamp: Optional[tuple] = None
        self._last: Optional[tuple] = None
        # hang watch: None = default (5 x the longest step, >= 60 s), 0 = off
        self.hang_timeout = hang_timeout
        self._changed_at: Optional[float] = None  # monotonic time of the last new step
        self._longest = 0.0
        self._pending: list[ResourceSample] = []
        self.shares = SharesBook()  # the batch shares the coordinator answered with (Job.local_batch)
        self.local_batch: Optional[int] = None  # samples per step this rank last asked for
        self._gpu, self._gpu_absent = _gpu_probe()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="et-monitor", daemon=True)
        self._thread.start()

    def step(self, step: int, busy: Optional[float] = None) -> None:
        """``busy``: the seconds this rank has spent in its non-``sync`` ``et.stage`` spans so far
        (None without spans): its own work, which a peer's slowness does not stretch."""
        if step != self._step:
            now = time.monotonic()
            if self._changed_at is not None and self._step is not None and step > self._step:
                self._longest = max(self._longest, (now - self._changed_at) / (step - self._step))
            self._changed_at = now
            self._stamp = (step, now, busy)  # one assignment: the sampling thread reads them together
        self._step = step

    @contextlib.contextmanager
    def hang_watch_paused(self):
        """See :meth:`Job.hang_watch_paused`; the idle time starts again when the block ends."""
        saved, self.hang_timeout = self.hang_timeout, 0
        try:
            yield
        finally:
            self.hang_timeout = saved
            if self._changed_at is not None:
                self._changed_at = time.monotonic()

    def _hang_limit(self) -> Optional[float]:
        if self.hang_timeout is not None:
            return self.hang_timeout or None
        return max(60.0, 5 * self._longest)

    def check_hang(self) -> None:
        """End the worker, with every thread's stack in its output, if it made no step for too long."""
        limit = self._hang_limit()
        if limit is None or self._changed_at is None:
            return
        idle = time.monotonic() - self._changed_at
        if idle < limit:
            return
        _dump_and_exit(self.worker, self._step, idle, limit)

    def sample(self) -> ResourceSample:
        now = time.time()
        cpu = self._proc.cpu_percent(None)
        rss = self._proc.memory_info().rss
        for child in self._proc.children(recursive=True):  # DataLoader workers count for the job
            c = self._children.get(child.pid)
            try:
                if c is None:
                    self._children[child.pid] = child
                    child.cpu_percent(None)
                else:
                    cpu += c.cpu_percent(None)
                    rss += c.memory_info().rss
            except Exception:  # noqa: BLE001 - it exited meanwhile
                self._children.pop(child.pid, None)
        try:
            io = self._proc.io_counters()
            read, written = float(io.read_bytes), float(io.write_bytes)
        except (AttributeError, OSError):
            read = written = 0.0
        step, step_time, busy_time = self._step, None, None
        stamp = self._stamp  # step time between reports, not samples
        if stamp is not None:
            last = self._last
            if last is not None and stamp[0] > last[0]:
                step_time = (stamp[1] - last[1]) / (stamp[0] - last[0])
                if stamp[2] is not None and last[2] is not None and stamp[2] >= last[2]:
                    busy_time = (stamp[2] - last[2]) / (stamp[0] - last[0])
            if last is None or stamp[0] != last[0]:
                self._last = stamp
        gpu: dict = {"gpu_absent": self._gpu_absent or ""}  # (samples are immutable: built in one go)
        if self._gpu is not None:
            try:
                import pynvml  # type: ignore[import-not-found]

                util = pynvml.nvmlDeviceGetUtilizationRates(self._gpu)
                mem = pynvml.nvmlDeviceGetMemoryInfo(self._gpu)
                gpu.update(gpu_util=float(util.gpu), gpu_mem_used=float(mem.used), gpu_mem_total=float(mem.total),
                           gpu_power_w=pynvml.nvmlDeviceGetPowerUsage(self._gpu) / 1000.0)
            except Exception as exc:  # noqa: BLE001
                gpu["gpu_absent"] = f"NVML query failed: {exc}"[:256]
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                gpu["torch_peak_bytes"] = float(torch.cuda.max_memory_allocated())
        return ResourceSample(now, cpu, float(rss), read, written, step, step_time, busy_time=busy_time,
                              local_batch=self.local_batch, **gpu)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.check_hang()
            try:
                self._pending.append(self.sample())
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                log.debug("resource sample failed: %s", exc)
                continue
            if len(self._pending) >= self.batch:
                self.flush()

    def flush(self) -> None:
        batch, self._pending = self._pending[-1024:], []
        if not batch:
            return
        try:
            self.shares.heard(self._client.report_resources(self._job, ResourceReport(self.worker, batch)).shares)
        except ElasticTrainError as exc:  # advisory: training goes on
            log.debug("resource report failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self.flush()


def _dump_and_exit(worker: int, step: Optional[int], idle: float, limit: float) -> None:
    import faulthandler
    import tempfile

    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        dump = f.read()
    main = f"Thread 0x{threading.main_thread().ident:016x}"
    frame = "an unknown frame"
    lines = dump.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(main) or (line.startswith("Current thread") and
                                     threading.current_thread() is threading.main_thread()):
            if i + 1 < len(lines) and lines[i + 1].strip().startswith("File"):
                frame = lines[i + 1].strip()
            break
    message = (f"hang: rank {worker} made no training step for {idle:.0f} s after step {step} (limit {limit:.0f} s, "
               f"ET_HANG_TIMEOUT); its main thread is stuck in {frame}")
    sys.stderr.write(f"etrun: {message}\nevery thread's stack (most recent call first):\n{dump}")
    sys.stderr.flush()
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        from ..launcher.runner import write_error

        write_error(error_file, message, dump)
    if "torch/distributed" in frame.replace("\\", "/"):
        # waiting in a collective: most likely for the rank that hung, which ends first and
        # so is the failure etrun reports as the root cause
        time.sleep(1.5)
    os._exit(HANG_EXIT_CODE)


def start_from_env(client, job: str, worker: int) -> Optional[ResourceMonitor]:
    """The monitor ``et.init()`` starts: ``ET_MONITOR_PERIOD`` seconds (default 5; 0: none)."""
    try:
        period = float(os.environ.get("ET_MONITOR_PERIOD", "5"))
        batch = int(os.environ.get("ET_MONITOR_BATCH", "6"))
        raw = os.environ.get("ET_HANG_TIMEOUT")
        hang = None if raw in (None, "") else float(raw)
    except ValueError:
        raise ConfigError("ET_MONITOR_PERIOD and ET_HANG_TIMEOUT must be numbers of seconds and ET_MONITOR_BATCH "
                          "an integer") from None
    if hang is not None and not 0 <= hang <= 7 * 86400:
        raise ConfigError(f"ET_HANG_TIMEOUT must be in [0, 604800] s (0: off), got {hang}")
    if period <= 0:
        return None
    try:
        import psutil  # noqa: F401
    except ImportError:
        log.info("psutil is not installed: no resource monitoring")
        return None
    from .client import CoordinatorClient

    bg = CoordinatorClient(client.addresses, client.token, timeout=min(client.timeout, 3.0), retry_for=1.0)
    return ResourceMonitor(bg, job, worker, period, batch, hang)
