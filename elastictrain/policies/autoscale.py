"""Auto-scaling of elastic jobs on measured throughput, DLRover-style: sample, optimize, adjust.

A pure policy on the same contract as the schedulers: it sees each job's measured throughput
(``JobView.rate``: data samples/s from the shard cursors, over the latest ``rate_window``
seconds of the current run, at ``num_gpu`` workers) and decides every elastic job's worker
count within its ``min_gpu..max_gpu``. Jobs are admitted first come, first served (a job that
does not fit is skipped, as best-effort FIFO does); rigid jobs run at their size.

* **Sample.** A new elastic job starts at the size its script settled at last time (the
  finished jobs of the same name, ``JobView.model``), else at its minimum.
* **Optimize.** Once the rate at the current size is measured (``rate_window`` seconds of
  training since the run's first step), the job grows by ``step`` workers if the cluster has
  them free. After a step from ``a`` to ``b`` workers the step's *marginal efficiency* is
  ``(rate_b - rate_a) / (rate_a / a * (b - a))``: what each added worker contributed, as a
  fraction of what an average worker contributed at ``a`` (1 = linear scaling). The job keeps
  growing while that is at least ``threshold`` (0.3, the figure DLRover's comparison used for
  its auto-scaling heuristic), and otherwise goes back to ``a`` and settles there.
* **Adjust.** A settled job whose rate stays more than ``drop`` (20%) below its level at that
  size (a slow average of its measurements) for a whole ``rate_window``, with no size change,
  and at least ``cooldown`` seconds (300) after it settled, is checked again: it shrinks by one step, and stays smaller (and keeps shrinking) while the
  step it undid was worth less than ``threshold``, else it returns to the larger size. Within the
  ``drop`` band the settled size stands, and the ``cooldown`` bounds how often a noisy rate can
  set off a check (as Kubernetes' autoscaler stabilizes scale-downs over 5 minutes): each check
  costs restarts.

* **Yield.** When a waiting job does not fit, settled jobs give back workers whose last step's
  measured marginal efficiency is below ``yield_threshold`` (0.7): those workers add less than
  70% of an average worker's throughput, where the waiting job's first workers would add all of
  theirs. The least efficient step is given back first, one step per job and decision, never
  below a job's minimum, and only as much as the waiting job needs.

* **Memory.** Each job's per-worker memory limit is planned from the largest resident memory its
  workers reported (``JobView.peak_memory``): ``memory_headroom`` (2) times that, rounded up to
  64 MiB, at least 1 GiB (``Decision.limits``). It changes when the measurement moves it by more
  than a quarter, applies from the job's next start (etrun ``--memory-limit``, which doubles it
  after an out-of-memory failure, as DLRover's OOM plan does), and a new job starts with the limit
  its name last ran under. ``memory_headroom=0`` plans no limits.

Every resize is a restart of the job's run at a checkpoint boundary (the coordinator stops the
run, the workers save and commit their data cursor, a new run starts at the new size), so the
data stays exactly-once. Each choice is returned as a note (``Decision.notes``), which the
coordinator writes to its event log as a ``plan`` event with the measured rates.

In the simulator a trace's elastic job has the rate its Amdahl scaling gives (sim/backend.py);
the policy asks to decide again when a measurement completes (``Decision.wakeup``), as the
simulator decides only at events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..errors import ConfigError
from .api import ClusterSnapshot, Decision, JobView, register
from .placement import any_node, only, type_mask

__all__ = ["AutoScale", "marginal_efficiency"]

HISTORY = 10_000  # job names whose settled size is remembered
MEMORY_FLOOR = 1 << 30  # the smallest per-worker memory limit planned
MEMORY_ROUND = 64 << 20


def marginal_efficiency(a: int, rate_a: float, b: int, rate_b: float) -> float:
    """What each worker added (or removed) between sizes ``a`` and ``b`` contributed, as a
    fraction of an average worker's contribution at the smaller size (1.0 = linear scaling)."""
    lo, hi, r_lo, r_hi = (a, b, rate_a, rate_b) if a < b else (b, a, rate_b, rate_a)
    if lo < 1 or hi <= lo or r_lo <= 0:
        raise ConfigError(f"need 1 <= smaller size < larger size and a positive rate, got {a}, {b}, {rate_a}")
    return (r_hi - r_lo) / (r_lo / lo * (hi - lo))


@dataclass
class _Plan:
    target: int
    phase: str = "measure"  # measure -> (resize, measure)* -> settled
    came_from: Optional[int] = None  # the size before the step being measured
    rates: dict = field(default_factory=dict)  # size -> rate measured there
    ref: float = 0.0  # the settled size's throughput (a slow average of its measurements)
    low_since: Optional[float] = None  # when its throughput fell below (1 - drop) x ref
    settled_at: float = 0.0  # when it last settled (a re-check waits for the cooldown from then)
    model: str = ""
    memory: int = 0  # the per-worker memory limit planned (bytes; 0: none yet)


class AutoScale:
    """Auto-scaling of elastic jobs (see the module docstring).

    Args:
        threshold: the least marginal efficiency (0..1) for which a step of ``step`` workers pays.
        rate_window: seconds of training at one size a measurement covers.
        drop: a settled job is checked again when its rate falls by more than this fraction.
        step: workers added or removed per step.
        cooldown: seconds after settling during which a settled size is not checked again.
    """

    name = "autoscale"
    needs = ()

    def __init__(self, threshold: float = 0.3, rate_window: float = 10.0, drop: float = 0.2, step: int = 1,
                 yield_threshold: float = 0.7, memory_headroom: float = 2.0, cooldown: float = 300.0) -> None:
        if not 0.0 <= cooldown <= 86_400.0:
            raise ConfigError(f"cooldown must be in [0, 86400] seconds, got {cooldown!r}")
        self.cooldown = float(cooldown)
        self._now = 0.0
        self._wake: Optional[float] = None  # this decision's wake-up (a measurement completes then)
        if not 0.0 < threshold <= 1.0:
            raise ConfigError(f"threshold must be in (0, 1], got {threshold!r}")
        if not 0.0 <= yield_threshold <= 1.0:
            raise ConfigError(f"yield_threshold must be in [0, 1] (0: never yield), got {yield_threshold!r}")
        self.yield_threshold = yield_threshold
        if not (memory_headroom == 0.0 or 1.0 <= memory_headroom <= 16.0):
            raise ConfigError(f"memory_headroom must be 0 (no limits) or in [1, 16], got {memory_headroom!r}")
        self.memory_headroom = float(memory_headroom)
        if not 1.0 <= rate_window <= 3600.0:
            raise ConfigError(f"rate_window must be in [1, 3600] seconds, got {rate_window!r}")
        if not 0.0 < drop < 1.0:
            raise ConfigError(f"drop must be in (0, 1), got {drop!r}")
        if not (isinstance(step, int) and 1 <= step <= 64):
            raise ConfigError(f"step must be an integer in [1, 64], got {step!r}")
        self.threshold, self.rate_window, self.drop, self.step = threshold, float(rate_window), drop, step
        self.plans: dict = {}  # job key -> _Plan
        self.history: dict[str, int] = {}  # job name -> the size its last finished run settled at
        self.memory_history: dict[str, int] = {}  # job name -> the memory limit its last run had

    # ------------------------------------------------------------------ memory across restarts
    def export_state(self) -> dict:
        return {"history": dict(self.history), "memory_history": dict(self.memory_history)}

    def import_state(self, state: dict, jobs, rename: Optional[dict] = None) -> None:
        self.history = {str(k): int(v) for k, v in dict(state.get("history", {})).items()}
        self.memory_history = {str(k): int(v) for k, v in dict(state.get("memory_history", {})).items()}

    def annotate(self, key) -> dict:
        """The plan of job ``key`` as ``status`` shows it."""
        p = self.plans.get(key)
        if p is None:
            return {}
        return {"plan": p.phase, "plan_workers": p.target,
                "measured": ", ".join(f"{n}: {r:.1f}/s" for n, r in sorted(p.rates.items())) or "not yet"}

    # ------------------------------------------------------------------ decide
    def decide(self, s: ClusterSnapshot) -> Decision:
        for key in s.ended:
            p = self.plans.pop(key, None)
            if p is not None and p.phase == "settled" and p.model:
                _remember(self.history, p.model, p.target)
            if p is not None and p.memory and p.model:
                _remember(self.memory_history, p.model, p.memory)
        self._now = s.now
        self._wake = None
        free = s.total_gpus
        notes: list = []
        node_free = list(s.gpus_per_node)  # (for jobs that need a GPU type: only its nodes serve them)
        for j in s.running:
            free -= j.num_gpu
            for n, g in j.placement:
                if 0 <= n < len(node_free):
                    node_free[n] -= g
        run, workers = {}, {}
        for j in s.jobs:
            if not j.running:
                continue
            p = self._plan(j)
            if j.elastic:
                self._optimize(s, j, p, free, notes)
                if j.gpu_type and p.target > j.num_gpu and p.target - j.num_gpu > _typed_free(s, j, node_free):
                    p.target = j.num_gpu  # its type's nodes have no room to grow into
                free -= p.target - j.num_gpu
            size = p.target if j.elastic else j.num_gpu
            if size == j.num_gpu:
                run[j.job_id] = j.placement
            else:
                run[j.job_id] = ((-1, size),)
                workers[j.job_id] = size
        waiting = [j for j in s.jobs if not j.running]
        for j in waiting:  # first come, first served; a job that does not fit waits
            p = self._plan(j)
            size = p.target if j.elastic else j.num_gpu
            if size > free:
                free += self._yield(s, size - free, run, workers, notes, j.job_id)
            if size <= free:
                where = ((-1, size),)
                if j.gpu_type:  # placed on its type's nodes now (a count of the cluster's GPUs says nothing there)
                    where = any_node(size, node_free, None, type_mask(j.gpu_type, s.node_types))
                    if where is None:
                        continue
                    for n, g in where:
                        node_free[n] -= g
                free -= size
                run[j.job_id] = where
                if j.elastic:
                    workers[j.job_id] = size
        limits = {}
        for j in s.jobs:
            p = self.plans.get(j.job_id)
            if p is not None and self._memory(j, p, notes):
                limits[j.job_id] = p.memory
        return Decision(run, self._wake, workers=workers, notes=tuple(notes), limits=limits)

    def _wake_at(self, t: float) -> None:
        """Decide again at ``t`` (a measurement completes then), even if no job arrives or ends."""
        if t > self._now and (self._wake is None or t < self._wake):
            self._wake = t

    def _memory(self, j: JobView, p: _Plan, notes: list) -> int:
        """The job's per-worker memory limit: ``memory_headroom`` x its measured peak (see the
        module docstring); 0 while there is neither a measurement nor a remembered limit."""
        if not self.memory_headroom or j.peak_memory <= 0:
            return p.memory
        want = max(MEMORY_FLOOR, -(-int(j.peak_memory * self.memory_headroom) // MEMORY_ROUND) * MEMORY_ROUND)
        if p.memory and abs(want - p.memory) <= p.memory / 4:
            return p.memory
        notes.append((j.job_id, {"decision": "memory", "memory_limit": want, "was": p.memory,
                                 "peak_rss": int(j.peak_memory), "headroom": self.memory_headroom,
                                 "why": f"its workers peaked at {j.peak_memory / 2**20:.0f} MiB resident: "
                                        f"{want >> 20} MiB per worker from its next start"}))
        p.memory = want
        return want

    def _yield(self, s: ClusterSnapshot, need: int, run: dict, workers: dict, notes: list, waiter) -> int:
        """Settled jobs give back their least efficient steps for a waiting job; the GPUs freed."""
        steps = []
        for j in s.running:
            p = self.plans.get(j.job_id)
            size, lo = j.num_gpu, j.min_gpu or j.num_gpu
            if p is None or p.phase != "settled" or p.target != size or size - self.step < lo or \
                    size not in p.rates or size - self.step not in p.rates or p.rates[size - self.step] <= 0:
                continue
            eff = marginal_efficiency(size - self.step, p.rates[size - self.step], size, p.rates[size])
            if eff < self.yield_threshold:
                steps.append((eff, j, p))
        freed = 0
        for eff, j, p in sorted(steps, key=lambda e: e[0]):
            if freed >= need:
                break
            size = j.num_gpu - self.step
            p.target, p.ref, p.low_since = size, p.rates[size], None
            run[j.job_id], workers[j.job_id] = ((-1, size),), size
            freed += self.step
            notes.append((j.job_id, {"decision": "yield", "workers": size, "at": j.num_gpu,
                                     "why": f"job {waiter} waits; the step {size}->{j.num_gpu} adds only "
                                            f"{eff:.0%} of an average worker", "marginal_efficiency": round(eff, 3),
                                     "yield_threshold": self.yield_threshold}))
        return freed

    def _plan(self, j: JobView) -> _Plan:
        p = self.plans.get(j.job_id)
        if p is None:
            lo, hi = j.min_gpu or j.num_gpu, j.max_gpu or j.num_gpu
            start = min(max(self.history.get(j.model, lo), lo), hi) if j.elastic else j.num_gpu
            p = self.plans[j.job_id] = _Plan(start, model=j.model, memory=self.memory_history.get(j.model, 0))
        return p

    def _optimize(self, s: ClusterSnapshot, j: JobView, p: _Plan, free: int, notes: list) -> None:
        """One look at a running elastic job: measure, then grow, step back, settle or re-check."""
        size = j.num_gpu
        if size != p.target or j.rate <= 0 or j.rate_window < self.rate_window:
            if size == p.target and j.rate > 0:  # measured long enough then
                self._wake_at(s.now + self.rate_window - j.rate_window)
            return  # restarting at its new size, or not measured long enough yet
        lo, hi, r = j.min_gpu or size, j.max_gpu or size, j.rate
        if p.phase == "settled":
            if r >= (1 - self.drop) * p.ref:
                p.low_since = None
                p.ref = 0.9 * p.ref + 0.1 * r if p.ref > 0 else r
            elif s.now - p.settled_at < self.cooldown:
                p.low_since = None  # settled too recently to be checked again: noise, or a passing slowdown
            elif p.low_since is None:
                p.low_since = s.now
                self._wake_at(s.now + self.rate_window)
            elif s.now - p.low_since < self.rate_window:
                self._wake_at(p.low_since + self.rate_window)
            elif size - self.step >= lo:  # a whole window low
                p.rates, p.low_since = {size: r}, None
                self._go(j, p, size - self.step, "measure", notes, f"throughput fell {1 - r / p.ref:.0%} below "
                         f"its level at {size} workers for {self.rate_window:g} s: checking {size - self.step}",
                         rate=r, level=p.ref)
            return
        p.rates[size] = r
        a = p.came_from
        if a is None or a not in p.rates:  # the first measurement
            if size + self.step <= hi and free >= self.step:
                self._go(j, p, size + self.step, "measure", notes, "measured; trying one step more", rate=r)
            else:
                self._settle(j, p, size, notes, "measured; no larger size allowed or free", rate=r)
            return
        eff = marginal_efficiency(a, p.rates[a], size, r)
        detail = {"rate": r, "from_workers": a, "from_rate": p.rates[a], "marginal_efficiency": round(eff, 3),
                  "threshold": self.threshold}
        if size > a:  # grew
            if eff < self.threshold:
                self._settle(j, p, a, notes, f"the step {a}->{size} did not pay: going back", **detail)
            elif size + self.step <= hi and free >= self.step:
                self._go(j, p, size + self.step, "measure", notes, f"the step {a}->{size} paid: one more", **detail)
            else:
                self._settle(j, p, size, notes, f"the step {a}->{size} paid; no larger size allowed or free",
                             **detail)
        else:  # shrank after a drop
            if eff >= self.threshold:
                self._settle(j, p, a, notes, f"the step {size}->{a} pays: going back", **detail)
            elif size - self.step >= lo:
                self._go(j, p, size - self.step, "measure", notes, f"the step {size}->{a} did not pay: one less",
                         **detail)
            else:
                self._settle(j, p, size, notes, f"the step {size}->{a} did not pay; at the minimum", **detail)

    def _go(self, j: JobView, p: _Plan, size: int, phase: str, notes: list, why: str, **detail) -> None:
        p.came_from, p.target, p.phase = j.num_gpu, size, phase
        notes.append((j.job_id, {"decision": "resize", "workers": size, "at": j.num_gpu, "why": why,
                                 **_rounded(detail)}))

    def _settle(self, j: JobView, p: _Plan, size: int, notes: list, why: str, **detail) -> None:
        p.target, p.phase, p.came_from = size, "settled", None
        p.ref, p.low_since, p.settled_at = p.rates.get(size, 0.0), None, self._now
        notes.append((j.job_id, {"decision": "settle", "workers": size, "at": j.num_gpu, "why": why,
                                 **_rounded(detail)}))


def _remember(book: dict, name: str, value: int) -> None:
    """``book[name] = value``, newest last; the oldest names go past HISTORY."""
    book.pop(name, None)
    book[name] = value
    while len(book) > HISTORY:
        del book[next(iter(book))]


def _rounded(d: dict) -> dict:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in d.items()}


register("autoscale", lambda **kw: AutoScale(**kw),
         ("threshold", "rate_window", "drop", "step", "yield_threshold", "memory_headroom", "cooldown"))


def _typed_free(s: ClusterSnapshot, j: JobView, node_free: list) -> int:
    """Free GPUs on the nodes of the GPU type ``j`` needs."""
    return sum(f for f in only(node_free, type_mask(j.gpu_type, s.node_types)) if f > 0)

