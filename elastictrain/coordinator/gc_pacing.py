"""Python's cyclic garbage collector in a coordinator with a long history.

A coordinator keeps every job's record, and each record holds a dozen containers the collector
tracks (30,000 jobs: about 400,000 objects). A full collection walks them all (about 120 ms there,
on this project's 2-core test machine), and requests that allocate (a listing, a status page
refresh) bring one every few seconds under load: meanwhile the event loop answers no client, so a
worker's shard lease waits that long. Records are long-lived and hold no garbage, so
:class:`Freezer` moves what survives out of the collector's sight (``gc.freeze``):

* once the state is loaded;
* after each full collection the interpreter makes by itself (what survived it is long-lived;
  the freeze itself costs nothing), so the next one walks only what is newer;
* every ``every`` seconds, after one full collection over everything (what was frozen put back
  first): an in-flight request's objects frozen with the rest and dropped since as cyclic
  garbage are collected then, never kept longer than that.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Optional

__all__ = ["Freezer", "REFREEZE"]

log = logging.getLogger(__name__)

REFREEZE = 3600.0  # seconds between full collections over everything (each then freezes what survived)


class Freezer:
    """Full collections on a schedule, each followed by ``gc.freeze``, and the survivors of the
    interpreter's own full collections frozen (see the module docstring)."""

    def __init__(self, every: float = REFREEZE) -> None:
        if not every > 0:
            raise ValueError(f"every must be > 0 seconds, not {every!r}")
        self.every = every
        self.passes = 0  # full passes (freeze) made
        self.survivors = 0  # times the survivors of the interpreter's own full collections were frozen
        self.last_pause = 0.0  # seconds the last pass held the process (its full collection)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._due = False
        self._frozen: Optional[int] = None  # gc.get_freeze_count() since the last freeze (None: not counted)

    def freeze(self) -> float:
        """One full collection over everything, then freeze what is left; returns its pause."""
        t = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._frozen = None
        self.last_pause = time.perf_counter() - t
        self.passes += 1
        return self.last_pause

    async def run(self) -> None:
        """A full pass every ``every`` seconds (until cancelled)."""
        while True:
            await asyncio.sleep(self.every)
            if self.freeze() > 1.0:
                log.warning("a full garbage collection held the coordinator for %.2f s", self.last_pause)

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Freeze the survivors of each full collection the interpreter makes, on ``loop``."""
        self._loop = loop
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def uninstall(self) -> None:
        """Stop, and give everything frozen back to the collector (an embedding process goes on)."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._loop = None
        gc.unfreeze()
        self._frozen = None

    def _on_gc(self, phase: str, info: dict) -> None:
        # (called inside the collector, on whichever thread collected: the freeze waits for the loop)
        if phase == "stop" and info["generation"] == 2 and not self._due and self._loop is not None:
            self._due = True
            try:
                self._loop.call_soon_threadsafe(self._freeze_survivors)
            except RuntimeError:  # the loop is closed
                self._due = False

    def _freeze_survivors(self) -> None:
        self._due = False
        gc.freeze()
        self._frozen = None
        self.survivors += 1

    def frozen(self) -> int:
        """Objects the collector does not walk now. (Counting them walks them all, 400,000 for
        30,000 jobs' records: a scrape counts only after a freeze, which alone changes it.)"""
        if self._frozen is None:
            self._frozen = gc.get_freeze_count()
        return self._frozen

    @staticmethod
    def full_collections() -> int:
        """Full (generation 2) collections this process has made, its own passes included."""
        return gc.get_stats()[2]["collections"]
