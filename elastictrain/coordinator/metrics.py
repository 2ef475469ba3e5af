"""Prometheus metrics: ``GET /metrics`` in the text exposition format (version 0.0.4), for the
dashboards and alerts an operator already runs (Kueue and DLRover export theirs the same way).

Gauges read the scheduler's state when scraped: jobs by state, waiting jobs by what they wait
for, each node's slots offered and used, each user's running GPUs and queued jobs, each
project's admitted GPUs and quota, the longest wait in the queue. Counters count since the
coordinator started (Prometheus' ``rate()`` handles a restart): decisions, policy failures and
events by kind. A coordinator without ``--policy`` exports only ``elastictrain_info``.

Label values are names the coordinator validated (``model.check_name``) or a node's GPU type,
escaped as the format requires.
"""

from __future__ import annotations

from typing import Optional

from ..scheduling import JobStatus

__all__ = ["render", "CONTENT_TYPE"]

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
WAITS = ("policy", "hold", "begin", "dependency", "array", "quota")


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


def render(version: str, store: str, sched: Optional[object], now: Optional[float] = None) -> str:
    """The exposition text: ``sched`` is the ClusterScheduler (None without ``--policy``)."""
    out = _Out()
    policy = sched.cfg.policy if sched is not None else ""
    out.family("elastictrain_info", "gauge", "The coordinator's version, store and policy.",
               [({"version": version, "store": store, "policy": policy}, 1)])
    if sched is not None:
        _cluster(out, sched, sched.clock.now() if now is None else now)
    return "\n".join(out.lines) + "\n"


def _cluster(out: _Out, sched, now: float) -> None:
    states = dict.fromkeys((s.value for s in JobStatus), 0)
    waits = dict.fromkeys(WAITS, 0)
    queued_by_user: dict[str, int] = {}
    oldest = None
    for rec in sched.records.values():
        states[rec.status] = states.get(rec.status, 0) + 1
        if rec.status in ("queued", "preempted"):
            adm = sched.admission  # (admitted: the policy has not placed it)
            waits[adm.waiting_on(rec)[0] if rec.id in adm.waiting else "policy"] += 1
            queued_by_user[rec.user] = queued_by_user.get(rec.user, 0) + 1
            since = rec.pending_since
            oldest = since if oldest is None or since < oldest else oldest
    out.family("elastictrain_jobs", "gauge", "Jobs the coordinator keeps, by state.",
               [({"state": s}, n) for s, n in states.items()])
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
