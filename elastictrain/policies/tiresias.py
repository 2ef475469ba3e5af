"""Tiresias: discretized 2D-LAS (Tiresias-L) and discretized 2D-Gittins (Tiresias-G).

Both rank jobs by their attained *2D* service (GPUs x time), in K priority queues split at
GPU-second ``thresholds``: a job starts in Q0 and moves down as its service crosses each
threshold. Queues are served in order; a job that does not fit is skipped (the next ones may
run). Within a queue, Tiresias-L serves first-come-first-served by position in the queue (a
running job keeps its place ahead of waiting ones); Tiresias-G orders by the Gittins index of
the job's attained service, computed from a distribution of job GPU-times (for example
``yarn-gput1000.csv``), highest first.

PROMOTEKNOB (``promote_knob``): a waiting job whose waiting time since it last ran reaches
``promote_knob`` x its service moves back to Q0 with its service counter reset (0 disables).
"""

from __future__ import annotations

import bisect
import math
from typing import Optional, Sequence

import numpy as np

from ..errors import ConfigError
from .api import ClusterSnapshot, Decision, Restored, register
from .placement import any_node, holds, make_placer, only, type_mask

__all__ = ["Tiresias", "gittins_table"]


class _Q:
    """A job's place in the queues: remembered by key; its service is read from each snapshot."""

    __slots__ = ("queue", "offset", "waited_from", "gpus")

    def __init__(self, gpus: int) -> None:
        self.queue, self.offset, self.waited_from, self.gpus = 0, 0.0, None, gpus


class Tiresias:
    """Args:
        thresholds: GPU-seconds where Q0 ends, Q1 ends, ... (K-1 values for K queues). The
            default (3250, 7200) gives the 3 queues of Tiresias's reference simulator.
        promote_knob: PROMOTEKNOB; 0 disables promotion.
        gittins: None for 2D-LAS; else job GPU-time samples for 2D-Gittins.
        delta: the Gittins service quantum in GPU-seconds.
        placement: default ``count`` (the reference simulators count GPUs; ``skew`` is the
            paper's consolidation by PACKLIMIT).

    The queues are kept as ordered lists and updated from the snapshot's changes (arrivals,
    completions, running jobs), so a decision costs O(running + jobs visited), not O(all).
    """

    #: a run's first step is no reason to decide: nobody's service changes at that instant, and the
    #: wake-up for its demotion counts from when the first step is due (``JobView.ready_at``), so
    #: the simulator, which knows that, need not decide again then (sim/engine.py; live, where it
    #: is not known, the coordinator decides at every first step anyway). 2D-LAS decides the same
    #: with or without those decisions. Under 2D-Gittins a running job's key also changes as its
    #: service crosses the table's samples, which no wake-up marks: any decision point may re-order
    #: a queue, a first step no more than another moment, so Gittins keys are re-read at arrivals,
    #: ends and demotions (as before first steps were events; results move by about 0.1%)
    first_step_events = False

    def __init__(self, thresholds: Sequence[float] = (3250, 7200), promote_knob: float = 0.0,
                 placement: str = "count", packlimit: float = 0.5, gittins: Optional[Sequence[float]] = None,
                 delta: float = 3250.0, sticky: bool = False) -> None:
        if list(thresholds) != sorted(thresholds) or any(t <= 0 for t in thresholds):
            raise ConfigError(f"tiresias thresholds must be positive and increasing, got {thresholds}")
        self.thresholds = tuple(float(t) for t in thresholds)
        self.knob, self.placement, self.packlimit, self.sticky = promote_knob, placement, packlimit, sticky
        self.needs = frozenset({"skew"}) if placement == "skew" else frozenset()
        self.table = gittins_table(gittins, delta) if gittins is not None else None
        # the same table as plain lists: a bisect per lookup instead of a call into numpy
        self._table_lists = (self.table[0].tolist(), self.table[1].tolist()) if self.table is not None else None
        self.name = "tiresias-g" if gittins is not None else "tiresias-l"
        self._state: dict = {}  # job key -> _Q
        self._queues: list[list] = [[] for _ in range(len(self.thresholds) + 1)]
        self._sizes: list[dict] = [{} for _ in self._queues]  # per queue: GPUs -> jobs of that size
        self._gkey: dict = {}  # 2D-Gittins: job key -> its sort key (changes only while it runs)
        # ... and the service at which that key changes next (the next sample of the table above
        # it): until then a running job's key is kept, not looked up again at every decision
        self._gnext: dict = {}
        # 2D-Gittins keeps each queue sorted by key: a job whose key or queue changed since the last
        # decision is re-inserted by bisection (a decision sorts nothing; keys of waiting jobs are fixed)
        self._gdirty: set = set()

    def _move(self, jid, q: _Q, level: int) -> None:
        self._queues[q.queue].remove(jid)
        self._count(q.queue, q.gpus, -1)
        q.queue = level
        self._queues[level].append(jid)
        self._count(level, q.gpus, 1)
        if self.table is not None:
            self._gdirty.add(jid)

    def _enter(self, j) -> _Q:
        q = self._state[j.job_id] = _Q(j.num_gpu)
        self._queues[0].append(j.job_id)
        self._count(0, j.num_gpu, 1)
        if self.table is not None:
            self._gdirty.add(j.job_id)
        return q

    def _count(self, level: int, gpus: int, d: int) -> None:
        sizes = self._sizes[level]
        n = sizes.get(gpus, 0) + d
        if n:
            sizes[gpus] = n
        else:
            sizes.pop(gpus, None)

    def decide(self, s: ClusterSnapshot) -> Decision:
        state, queues, th = self._state, self._queues, self.thresholds
        for jid in s.ended:
            q = state.pop(jid, None)
            if q is not None:
                queues[q.queue].remove(jid)
                self._count(q.queue, q.gpus, -1)
                self._gkey.pop(jid, None)
                self._gnext.pop(jid, None)
                self._gdirty.discard(jid)
        for j in s.arrived:  # new jobs enter Q0 in arrival order (a repeated arrival is ignored)
            if j.job_id not in state:
                self._enter(j)
        gittins = self.table is not None
        gkey, gnext, dirty = self._gkey, self._gnext, self._gdirty
        for j in s.running:  # only running jobs gain service: demote them (and renew their Gittins key)
            jid = j.job_id
            q = state.get(jid) or self._enter(j)
            if q.gpus != j.num_gpu:  # an elastic job resized
                self._count(q.queue, q.gpus, -1)
                q.gpus = j.num_gpu
                self._count(q.queue, q.gpus, 1)
            service = j.attained_gpu - q.offset
            level = bisect.bisect_right(th, service)
            if level != q.queue:
                self._move(jid, q, level)
            if gittins and service >= gnext.get(jid, -1.0):
                gkey[jid] = self._gittins_key(jid, j)
                dirty.add(jid)
        if len(state) != len(s.jobs):  # jobs this policy never saw arrive (e.g. rebuilt after a restart)
            for j in s.jobs:
                if j.job_id not in state:
                    self._enter(j)
        if self.knob > 0:
            self._promote(s)
        if gittins and dirty:  # a waiting job's service, hence its Gittins key, does not change
            self._resort(s)
        placer = make_placer(s, self.placement, self.packlimit, self.sticky)
        run: dict = {}
        job = s.by_key.get
        place, sticky = placer.place, self.sticky
        # counting GPUs only, a running job is handed back its own placement: it stays where it is
        # (jobs here never share GPUs), and the mechanism need not resolve it again
        counting = self.placement == "count" and not sticky
        typed: list = []  # (counting) jobs that need a GPU type, in the order visited
        for k, queue in enumerate(queues):
            if placer.total_free == 0 or not queue:
                continue
            placed, skipped = [], []
            n = 0
            left = dict(self._sizes[k])  # sizes of the jobs not visited yet
            smallest = min(left, default=0)
            for jid in queue:
                if placer.total_free < smallest or placer.total_free == 0:
                    break  # no job left in this queue is small enough for the GPUs still free
                n += 1
                g = state[jid].gpus
                c = left[g] - 1
                if c:
                    left[g] = c
                else:
                    del left[g]
                    if g == smallest:
                        smallest = min(left, default=0)
                j = job(jid)
                if j is None:  # known but not runnable now (being stopped): keeps its place
                    skipped.append(jid)
                    continue
                if counting:  # Placer.place inlined: simulations visit millions of jobs here
                    size = j.num_gpu
                    if size > placer.total_free:
                        skipped.append(jid)
                        continue
                    placer.total_free -= size
                    run[jid] = j.placement if j.running else ((-1, size),)
                    if j.gpu_type:  # placed on its type's nodes once the running jobs kept are known
                        typed.append(j)
                    placed.append(jid)
                    continue
                where = place(j.num_gpu, j.skew, j.placement if j.running else (), j.gpu_type)
                if where is None:
                    skipped.append(jid)
                else:
                    run[jid] = where
                    placed.append(jid)
            # 2D-LAS: waiting jobs go behind the running ones of their queue, keeping their order
            # (only the visited head is rewritten: a long queue is not copied at every decision);
            # 2D-Gittins: the queue stays in key order
            if not gittins:
                queue[:n] = placed + skipped
        if typed:
            _place_typed(typed, run, s)
        return Decision(run, self._wakeup(s, run))

    def _resort(self, s: ClusterSnapshot) -> None:
        """Put the jobs whose Gittins key or queue changed back in key order: each is taken out
        and re-inserted by bisection, or a queue with many of them is sorted whole."""
        gkey, state, dirty = self._gkey, self._state, self._gdirty
        per_queue: dict = {}
        for jid in dirty:
            if jid not in gkey:  # new, or promoted (its service restarted): a new key
                gkey[jid] = self._gittins_key(jid, s.by_key.get(jid))
            per_queue.setdefault(state[jid].queue, []).append(jid)
        dirty.clear()
        key = gkey.__getitem__
        for level, jids in per_queue.items():
            queue = self._queues[level]
            if 8 * len(jids) >= len(queue):
                queue.sort(key=key)
                continue
            for jid in jids:
                queue.remove(jid)
            for jid in jids:
                bisect.insort(queue, jid, key=key)

    def _gittins_key(self, jid, j) -> tuple:
        if j is None:
            self._gnext[jid] = -1.0  # looked up again once it runs
            return (0.0, float("inf"), jid)
        xs, gi = self._table_lists
        i = bisect.bisect_right(xs, j.attained_gpu - self._state[jid].offset)
        self._gnext[jid] = xs[i] if i < len(xs) else math.inf
        return (-gi[min(i, len(gi) - 1)], j.submit_time, jid)

    def _promote(self, s: ClusterSnapshot) -> None:
        now = s.now
        for k in range(1, len(self._queues)):
            for jid in list(self._queues[k]):
                q = self._state[jid]
                j = s.job(jid)
                if j is None:
                    continue
                if j.running:
                    q.waited_from = None
                    continue
                if q.waited_from is None:
                    q.waited_from = now
                if now - q.waited_from >= self.knob * (j.attained_gpu - q.offset) / j.num_gpu:
                    q.offset, q.waited_from = j.attained_gpu, None
                    self._move(jid, q, 0)
                    self._gkey.pop(jid, None)  # its service restarts from 0: a new key
                    self._gnext.pop(jid, None)

    def _wakeup(self, s: ClusterSnapshot, run: dict) -> Optional[float]:
        best = math.inf
        th, state, now, job = self.thresholds, self._state, s.now, s.by_key.__getitem__
        last = len(th)
        for jid in run:
            q = state[jid]
            if q.queue < last:
                j = job(jid)
                begins = now
                if j.starting:  # no service accrues until its first step: from when that is due, if known
                    begins = j.ready_at
                    if begins is None:  # (live: a decision comes at its first step)
                        continue
                t = begins + (th[q.queue] - (j.attained_gpu - q.offset)) / j.num_gpu
                if t < best:
                    best = t
        if self.knob > 0:
            for k in range(1, len(self._queues)):
                for jid in self._queues[k]:
                    q = self._state[jid]
                    j = s.job(jid)
                    if jid not in run and j is not None:
                        since = q.waited_from if q.waited_from is not None else s.now
                        best = min(best, since + self.knob * (j.attained_gpu - q.offset) / j.num_gpu)
        return None if best == math.inf else max(best, s.now + 1e-6)

    def annotate(self, key) -> dict:
        """What status shows for a job: its queue (Q0 is served first)."""
        q = self._state.get(key)
        return {} if q is None else {"queue": f"Q{q.queue}"}

    def export_state(self) -> dict:
        """The queues (order matters) and promotion offsets, to survive a coordinator restart."""
        return {"queues": [list(q) for q in self._queues],
                "offset": {str(k): q.offset for k, q in self._state.items() if q.offset}}

    def import_state(self, data: dict, jobs, rename: Optional[dict] = None) -> None:
        """Restore :meth:`export_state` for the keys in ``jobs`` (views); other keys are dropped.
        ``rename``: the ids the jobs have where this instance runs (a forecast), by exported id."""
        now = Restored(jobs, rename)
        self._state.clear()
        self._queues = [[] for _ in range(len(self.thresholds) + 1)]
        self._sizes = [{} for _ in self._queues]
        self._gkey, self._gnext, self._gdirty = {}, {}, set()
        for level, keys in enumerate(data.get("queues", [])[:len(self._queues)]):
            for k in keys:
                j, jid = now.view(k), now.id(k)
                if j is not None and jid not in self._state:
                    q = self._state[jid] = _Q(j.num_gpu)
                    q.queue, q.offset = level, float(data.get("offset", {}).get(str(k), 0.0))
                    self._queues[level].append(jid)
                    self._count(level, q.gpus, 1)
                    if self.table is not None:
                        self._gdirty.add(jid)

    def _gittins(self, attained: float) -> float:
        xs, gi = self._table_lists
        return gi[min(bisect.bisect_right(xs, attained), len(gi) - 1)]


def gittins_table(samples: Sequence[float], delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Gittins index G(a) = P(S - a <= delta | S > a) / E[min(S - a, delta) | S > a] at each sample.

    Returns (sorted samples, index of an attained service just below each sample).
    """
    xs = np.sort(np.asarray(samples, dtype=float))
    if len(xs) == 0 or delta <= 0:
        raise ConfigError("2D-Gittins needs a non-empty duration distribution and delta > 0")
    gi = np.zeros(len(xs) + 1)
    for k in range(len(xs)):
        a = xs[k - 1] if k else 0.0  # attained service in [xs[k-1], xs[k])
        rest = xs[k:] - a
        p = np.count_nonzero(rest <= delta) / len(rest)
        e = np.minimum(rest, delta).mean()
        gi[k] = p / e if e > 0 else 0.0
    return xs, gi


def _tiresias_g(distribution=None, **options) -> Tiresias:
    """``distribution``: a CSV path with a ``duration`` column (job GPU-seconds), or the samples."""
    if distribution is None:
        raise ConfigError("tiresias-g needs a job GPU-time distribution: pass --distribution PATH (a CSV with a "
                          "'duration' column, e.g. traces/tiresias/yarn-gput1000.csv)")
    if isinstance(distribution, str):
        import csv

        from ..sim.traces import open_text

        try:
            with open_text(distribution) as f:
                distribution = [float(r["duration"]) for r in csv.DictReader(f)]
        except OSError as exc:
            raise ConfigError(f"--distribution {distribution}: {exc.strerror}; give a CSV file with a 'duration' "
                              "column, e.g. traces/tiresias/yarn-gput1000.csv") from None
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"--distribution {distribution}: needs a 'duration' column of numbers ({exc})") from None
    return Tiresias(gittins=distribution, **options)


_OPTS = ("thresholds", "promote_knob", "placement", "packlimit", "sticky")
register("tiresias-l", lambda **kw: Tiresias(**kw), _OPTS)
register("tiresias-g", _tiresias_g, _OPTS + ("distribution", "delta"))


def _place_typed(typed: list, run: dict, s: ClusterSnapshot) -> None:
    """Counting GPUs, the jobs that need a GPU type go on real nodes of that type: a running one
    stays where it runs, the others take the GPUs of their type that the rest of ``run`` leaves
    (counted as a pool, a type's GPUs may be short: such a job waits this decision)."""
    free = list(s.gpus_per_node)
    mine = {j.job_id for j in typed}
    for key, where in run.items():
        if key not in mine:
            for n, g in where:
                if n >= 0:
                    free[n] -= g
    for j in typed:
        mask = type_mask(j.gpu_type, s.node_types)
        where = j.placement if j.running and holds(j.placement, only(free, mask), j.num_gpu) else \
            any_node(j.num_gpu, free, None, mask)
        if where is None:
            del run[j.job_id]
            continue
        run[j.job_id] = where
        for n, g in where:
            free[n] -= g

