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
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Optional

from ..errors import ConfigError, ElasticTrainError
from ..wire import ResourceReport, ResourceSample

__all__ = ["ResourceMonitor", "start_from_env"]

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
    def __init__(self, client, job: str, worker: int, period: float = 5.0, batch: int = 6) -> None:
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
        self._last: Optional[tuple[float, int]] = None
        self._pending: list[ResourceSample] = []
        self._gpu, self._gpu_absent = _gpu_probe()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="et-monitor", daemon=True)
        self._thread.start()

    def step(self, step: int) -> None:
        self._step = step

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
        step, step_time = self._step, None
        if step is not None:
            if self._last is not None and step > self._last[1]:
                step_time = (now - self._last[0]) / (step - self._last[1])
            if self._last is None or step != self._last[1]:
                self._last = (now, step)
        s = ResourceSample(now, cpu, float(rss), read, written, step, step_time, gpu_absent=self._gpu_absent or "")
        if self._gpu is not None:
            try:
                import pynvml  # type: ignore[import-not-found]

                util = pynvml.nvmlDeviceGetUtilizationRates(self._gpu)
                mem = pynvml.nvmlDeviceGetMemoryInfo(self._gpu)
                s.gpu_util, s.gpu_mem_used, s.gpu_mem_total = float(util.gpu), float(mem.used), float(mem.total)
                s.gpu_power_w = pynvml.nvmlDeviceGetPowerUsage(self._gpu) / 1000.0
            except Exception as exc:  # noqa: BLE001
                s.gpu_absent = f"NVML query failed: {exc}"
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                s.torch_peak_bytes = float(torch.cuda.max_memory_allocated())
        return s

    def _run(self) -> None:
        while not self._stop.wait(self.period):
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
            self._client.report_resources(self._job, ResourceReport(self.worker, batch))
        except ElasticTrainError as exc:  # advisory: training goes on
            log.debug("resource report failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self.flush()


def start_from_env(client, job: str, worker: int) -> Optional[ResourceMonitor]:
    """The monitor ``et.init()`` starts: ``ET_MONITOR_PERIOD`` seconds (default 5; 0: none)."""
    try:
        period = float(os.environ.get("ET_MONITOR_PERIOD", "5"))
        batch = int(os.environ.get("ET_MONITOR_BATCH", "6"))
    except ValueError:
        raise ConfigError("ET_MONITOR_PERIOD must be a number of seconds and ET_MONITOR_BATCH an integer") from None
    if period <= 0:
        return None
    try:
        import psutil  # noqa: F401
    except ImportError:
        log.info("psutil is not installed: no resource monitoring")
        return None
    from .client import CoordinatorClient

    bg = CoordinatorClient(client.url, client.token, timeout=min(client.timeout, 3.0), retry_for=1.0)
    return ResourceMonitor(bg, job, worker, period, batch)
