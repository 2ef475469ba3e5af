"""Measured progress: a worker's training step, sent to the coordinator in the background.

The scheduler estimates a job's iteration time and remaining work from these reports (see
:mod:`elastictrain.coordinator.scheduler`). :meth:`StepReporter.step` only stores a number;
a daemon thread sends it every ``interval`` seconds when it changed, so reporting costs the
training loop nothing measurable. A coordinator that does not answer is retried next time.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

from ..errors import ElasticTrainError

__all__ = ["StepReporter"]

log = logging.getLogger(__name__)


class StepReporter:
    def __init__(self, client, job_id: str, worker: int, interval: float = 2.0,
                 generation: Optional[int] = None) -> None:
        self._client, self._job, self._worker, self.interval = client, job_id, worker, interval
        self._generation = generation
        self._step: Optional[int] = None
        self._sent: Optional[int] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def step(self, step: int) -> None:
        """Record the current step (cheap: call it every step)."""
        self._step = step
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._send()  # the first one at once: the scheduler learns the job started training
                    self._thread = threading.Thread(target=self._loop, name="et-steps", daemon=True)
                    self._thread.start()

    def flush(self) -> None:
        """Send the latest step now (e.g. before exiting)."""
        self._send()

    def _send(self) -> None:
        step = self._step
        if step is None or step == self._sent:
            return
        try:
            self._client.report_step(self._job, self._worker, step, self._generation)
            self._sent = step
        except ElasticTrainError as exc:  # progress is advisory: training goes on
            log.debug("step report failed: %s", exc)

    def _loop(self) -> None:
        while True:
            time.sleep(self.interval)
            self._send()
