"""Prometheus metrics: ``GET /metrics`` in the text exposition format (version 0.0.4), for the
dashboards and alerts an operator already runs (Kueue and DLRover export theirs the same way).

Gauges read the scheduler's state when scraped: jobs by state, waiting jobs by what they wait
for, each node's slots offered and used, each user's running GPUs and queued jobs, each
project's admitted GPUs and quota, the longest wait in the queue. Counters count since the
coordinator started (Prometheus' ``rate()`` handles a restart): decisions, policy failures and
events by kind. Histograms (:class:`Timings`, since the coordinator started too) time what an
operator's SLOs are about: how long a job waited for each run, how long each run took from its
launch to its first step (by why it started: recovery from a failure, a preemption...), and how
long each scheduling decision took. A coordinator without ``--policy`` exports only
``elastictrain_info``.

Label values are names the coordinator validated (``model.check_name``) or a node's GPU type,
escaped as the format requires.
"""

from __future__ import annotations

from typing import Optional

from ..scheduling import JobStatus

__all__ = ["render", "CONTENT_TYPE", "Histogram", "Timings", "RUN_REASONS"]

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
WAITS = ("policy", "hold", "begin", "dependency", "array", "quota")


#: why a run starts (``JobRecord.resume_reason``; the first run's is ``start``): the label values of
#: the start-up histogram (anything else counts as ``other``: a label's values stay a fixed set)
RUN_REASONS = ("start", "preempt", "failure", "node_lost", "requeue", "straggler", "migrate", "regroup",
               "scale_up", "scale_down")


class Histogram:
    """A Prometheus histogram: cumulative counts of observations at or below each bound, their
    sum and count, per value of one label (``label`` "": none)."""

    def __init__(self, name: str, what: str, bounds: tuple, label: str = "") -> None:
        self.name, self.what, self.bounds, self.label = name, what, tuple(float(b) for b in bounds), label
        self.series: dict[str, list] = {}  # label value -> [counts per bound..., sum, count]

    def observe(self, value: float, label: str = "") -> None:
        if not value >= 0.0:  # (NaN, or a clock that went back: not a duration)
            return
        s = self.series.get(label)
        if s is None:
            s = self.series[label] = [0] * len(self.bounds) + [0.0, 0]
        for i, b in enumerate(self.bounds):
            if value <= b:
                s[i] += 1
        s[-2] += value
        s[-1] += 1

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {self.what}", f"# TYPE {self.name} histogram"]
        for value in sorted(self.series):
            s = self.series[value]
            tag = f'{self.label}="{_label(value)}",' if self.label else ""
            for b, n in zip(self.bounds, s):
                out.append(f'{self.name}_bucket{{{tag}le="{b!r}"}} {n}')
            out.append(f'{self.name}_bucket{{{tag}le="+Inf"}} {s[-1]}')
            tail = f"{{{tag[:-1]}}}" if tag else ""
            out += [f"{self.name}_sum{tail} {float(s[-2])!r}", f"{self.name}_count{tail} {s[-1]}"]
        return out


class Timings:
    """The coordinator's histograms (:func:`render` exports them)."""

    def __init__(self) -> None:
        self.wait = Histogram(
            "elastictrain_job_wait_seconds", "Seconds a job waited for each of its runs: from its submission (or "
            "preemption) to the decision that started it, by start (its first run) or resume.",
            (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400), "kind")
        self.startup = Histogram(
            "elastictrain_run_startup_seconds", "Seconds from a run's launch to its first step (imports, "
            "rendezvous, checkpoint restore), by why it started: start, preempt, failure, node_lost, requeue, "
            "straggler, migrate, regroup, scale_up, scale_down, other.",
            (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600), "reason")
        self.decision = Histogram(
            "elastictrain_scheduler_decision_seconds", "Wall time of each scheduling decision (the policy, the "
            "checks, the actions).", (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))

    def ran(self, reason: str, seconds: float) -> None:
        """A run trained its first step ``seconds`` after its launch; it started for ``reason``."""
        self.startup.observe(seconds, reason if reason in RUN_REASONS else "other")

    def all(self) -> tuple:
        return self.wait, self.startup, self.decision


def _label(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, what: str, samples) -> None:
        """One metric: its HELP and TYPE, then ``samples``: (labels dict, value) pairs."""
        self.lines += [f"# HELP {name} {what}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{text}}} {_num(value)}" if text else f"{name} {_num(value)}")


def _num(value) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def render(version: str, store: str, sched: Optional[object], now: Optional[float] = None,
           freezer: Optional[object] = None) -> str:
    """The exposition text: ``sched`` is the ClusterScheduler (None without ``--policy``);
    ``freezer``: the garbage collector's pacing (coordinator/gc_pacing.py)."""
    out = _Out()
    policy = sched.cfg.policy if sched is not None else ""
    out.family("elastictrain_info", "gauge", "The coordinator's version, store and policy.",
               [({"version": version, "store": store, "policy": policy}, 1)])
    if freezer is not None:
        out.family("elastictrain_gc_frozen_objects", "gauge", "Objects moved out of the garbage collector's sight "
                   "(the loaded state, and what survived each full collection).", [({}, freezer.frozen())])
        out.family("elastictrain_gc_full_collections_total", "counter", "Full garbage collections (each holds "
                   "the event loop).", [({}, freezer.full_collections())])
        out.family("elastictrain_gc_freeze_pause_seconds", "gauge", "How long the last scheduled full collection "
                   "held the event loop.", [({}, freezer.last_pause)])
    if sched is not None:
        _cluster(out, sched, sched.clock.now() if now is None else now)
    return "\n".join(out.lines) + "\n"


def _cluster(out: _Out, sched, now: float) -> None:
    states = dict.fromkeys((s.value for s in JobStatus), 0)
    for s, n in sched.index.ended_states.items():  # (summed as jobs end: a scrape reads no history)
        states[s] = states.get(s, 0) + n
    waits = dict.fromkeys(WAITS, 0)
    queued_by_user: dict[str, int] = {}
    oldest = None
    for rec in sched.index.open():
        states[rec.status] = states.get(rec.status, 0) + 1
        if rec.status in ("queued", "preempted"):
            adm = sched.admission  # (admitted: the policy has not placed it)
            waits[adm.waiting_on(rec)[0] if rec.id in adm.waiting else "policy"] += 1
            queued_by_user[rec.user] = queued_by_user.get(rec.user, 0) + 1
            since = rec.pending_since
            oldest = since if oldest is None or since < oldest else oldest
    out.family("elastictrain_jobs", "gauge", "Jobs the coordinator keeps, by state.",
               [({"state": s}, n) for s, n in states.items()])
    out.family("elastictrain_job_records_packed", "gauge", "Ended jobs whose records are kept packed (all but the "
               f"{sched.records.keep} that ended last; a read by id unpacks one until the next write).",
               [({}, sched.records.packed())])
    out.family("elastictrain_jobs_waiting", "gauge", "Queued or preempted jobs by what they wait for: the policy "
               "(admitted, not placed), a hold, a begin time, a dependency, their array's %N, a quota.",
               [({"reason": r}, n) for r, n in waits.items()])
    out.family("elastictrain_queue_oldest_wait_seconds", "gauge", "How long the longest-waiting job has waited "
               "since it was submitted or preempted (0: none waits).", [({}, max(0.0, now - oldest) if oldest else 0.0)])
    nodes = sched.nodes.by_index
    by_state: dict[str, int] = {}
    for n in nodes:
        by_state[n.state] = by_state.get(n.state, 0) + 1
    out.family("elastictrain_nodes", "gauge", "Node daemons (or engine nodes) by state.",
               [({"state": s}, by_state.get(s, 0)) for s in ("up", "down", "left")])
    infos = [n.info() for n in nodes]
    out.family("elastictrain_node_slots", "gauge", "GPUs (or CPU slots) a node offers.",
               [({"node": i.name, "type": i.gpu_type or i.kind, "state": i.state}, i.slots) for i in infos])
    out.family("elastictrain_node_slots_used", "gauge", "Slots a node's running jobs hold.",
               [({"node": i.name}, i.used) for i in infos])
    out.family("elastictrain_node_cordoned", "gauge", "1 while nothing new is placed on the node.",
               [({"node": i.name}, int(i.cordoned_until > now)) for i in infos])
    out.family("elastictrain_node_maintenance_start_seconds", "gauge",
               "When a node's planned maintenance begins (UNIX time; nodes drain NAME --at), for nodes with one.",
               [({"node": i.name}, i.maint_start) for i in infos if i.maint_start])
    running: dict[str, int] = {}
    for e in sched.table.running.values():
        running[e.user] = running.get(e.user, 0) + e.num_gpu
    out.family("elastictrain_user_gpus_running", "gauge", "GPUs each user's running jobs hold.",
               [({"user": u}, g) for u, g in sorted(running.items())])
    out.family("elastictrain_user_jobs_waiting", "gauge", "Each user's queued or preempted jobs.",
               [({"user": u}, n) for u, n in sorted(queued_by_user.items())])
    used = sched.admission.project_usage()
    projects = sched.projects.projects
    out.family("elastictrain_project_gpus_admitted", "gauge", "GPUs a project's admitted jobs count against its "
               "quota.", [({"project": p}, used.get(p, (0, 0))[0]) for p in projects])
    out.family("elastictrain_project_gpus_quota", "gauge", "A project's GPU quota (projects without one left out).",
               [({"project": p}, q.quota.gpus) for p, q in projects.items() if q.quota.gpus is not None])
    out.family("elastictrain_scheduler_decisions_total", "counter", "Policy decisions since the coordinator started.",
               [({}, sched.sched.decisions)])
    out.family("elastictrain_scheduler_policy_failures_total", "counter", "Decisions the policy failed (the previous "
               "allocation was kept) since the coordinator started.", [({}, sched.sched.failures)])
    out.family("elastictrain_events_total", "counter", "Scheduler events by kind since the coordinator started "
               "(start, preempted, resume, finish, fail, ...; `elastictrain events`).",
               [({"kind": k}, n) for k, n in sorted(sched.events.counts.items())])
    if sched.retention is not None:
        out.family("elastictrain_retention_deleted_total", "counter", "What --retain deleted since the coordinator "
                   "started: events (at most this many), and jobs whose output went.",
                   [({"what": "events"}, sched.retention.events_deleted),
                    ({"what": "job_output"}, sched.retention.logs_deleted)])
    for h in sched.timings.all():
        out.lines += h.lines()
