"""A live cluster's run as a trace (``elastictrain trace export``), so that the simulator can
replay what the cluster ran. Each job: its submit time (seconds after the first submission), its
GPU count, its steps (the steps it ran if it finished, else its ``--steps`` or the steps so far),
its measured seconds per step, its stage profile (what Muri groups on), its name as the model, its
user and its priority. An elastic job (``--min-gpus`` below its GPUs) is one in the trace too: its
``num_gpu`` is its last run's worker count (where its seconds per step were measured), within
``min_gpu..max_gpu``, and it scales linearly there (no serial fraction is measured). A job that
only ran inside interleaving groups has no time of its own measured: its stage profile's stages,
one after another, stand for it. Jobs with neither are left
out (the caller is told which). The nodes: the cluster as ``simulate --cluster`` takes it
(:func:`cluster_form`) and the times nodes were lost (:func:`outages_from_events`, ``--outage``)."""

from __future__ import annotations

import math
import re

from ..model import JobSpec

__all__ = ["jobs_to_trace", "first_submit", "outages_from_events", "cluster_form"]


def _usable(jobs) -> tuple[list, list[str]]:
    """(job, steps, seconds per step) of each job that has both, and the ids of the others."""
    usable, left_out = [], []
    for j in jobs:
        steps = j.step if j.status == "finished" else (j.steps or j.step)
        it = j.iteration_time or sum(j.stage_times)  # a job that only ran grouped: its stages in a row
        if not it or it <= 0 or steps <= 0:
            left_out.append(j.id)
        else:
            usable.append((j, steps, it))
    return usable, left_out


def jobs_to_trace(jobs) -> tuple[list[JobSpec], list[str]]:
    """``jobs``: ``ClusterJobInfo`` records. Returns (the trace's jobs, ids left out); the
    trace's time 0 is :func:`first_submit` of the same records."""
    usable, left_out = _usable(jobs)
    if not usable:
        return [], left_out
    t0 = first_submit(jobs)
    out = []
    for i, (j, steps, it) in enumerate(sorted(usable, key=lambda x: (x[0].submit_time, x[0].id))):
        lo = hi = 0
        size = j.gpus
        if 0 < j.min_gpus < j.gpus:  # elastic: measured at its last run's workers, may run on min..gpus
            lo, hi = j.min_gpus, j.gpus
            size = j.workers if lo <= j.workers <= hi else hi
        out.append(JobSpec(i, size, round(j.submit_time - t0, 3), float(steps), float(it), j.name,
                           tuple(j.stage_times), user=j.user, priority=j.priority, gpu_type=j.gpu_type,
                           project=j.project, min_gpu=lo, max_gpu=hi))
    return out, left_out


def first_submit(jobs) -> float:
    """The trace's time 0 on the coordinator's clock: the first submission among the jobs
    :func:`jobs_to_trace` keeps (it keeps at least one)."""
    return min(j.submit_time for j, _, _ in _usable(jobs)[0])


def outages_from_events(events, nodes, t0: float) -> list[tuple[int, float, float]]:
    """The nodes' outages as ``simulate --outage`` takes them: (node index, start, end) in seconds
    after ``t0``, from the event log (``events``: ``EventInfo``, in order; ``nodes``: ``NodeInfo``).
    A node is out from ``node_down`` or ``node_left`` to its next ``node_up`` (``inf`` if it has not
    come back); one that first registered after ``t0`` is out from 0 until then. Cordons are not
    outages (a cordoned node keeps its jobs). Outages that end by ``t0`` are left out."""
    index = {n.name: n.index for n in nodes}
    since: dict[str, float] = {}  # node -> when it went out
    seen: set = set()
    out = []
    for e in events:
        if e.node not in index:
            continue
        if e.kind == "node_up":
            start = since.pop(e.node, None)
            if start is None and e.node not in seen:
                start = -math.inf  # it first registered now: out from the trace's start
            seen.add(e.node)
            if start is not None and e.time > t0:
                out.append((index[e.node], max(0.0, round(start - t0, 3)), round(e.time - t0, 3)))
        elif e.kind in ("node_down", "node_left"):
            seen.add(e.node)
            since.setdefault(e.node, e.time)
    for name, start in since.items():
        out.append((index[name], max(0.0, round(start - t0, 3)), math.inf))
    return sorted(o for o in out if o[2] > o[1])


def cluster_form(nodes) -> str:
    """The nodes (``NodeInfo``, in index order) as ``simulate --cluster`` takes them: ``nNgG``, or
    ``type:NxG+...`` for GPU types in runs of equal nodes; '' if neither can say it."""
    nodes = sorted(nodes, key=lambda n: n.index)
    if not nodes:
        return ""
    if len({n.slots for n in nodes}) == 1 and len({n.gpu_type for n in nodes}) == 1:
        return f"n{len(nodes)}g{nodes[0].slots}"
    runs: list = []
    for n in nodes:
        if runs and runs[-1][0] == n.gpu_type and runs[-1][2] == n.slots:
            runs[-1][1] += 1
        else:
            runs.append([n.gpu_type, 1, n.slots])
    if len({r[0] for r in runs}) != len(runs) or not all(re.fullmatch(r"[A-Za-z0-9_]+", r[0]) for r in runs):
        return ""
    return "+".join(f"{t}:{k}x{g}" for t, k, g in runs)
