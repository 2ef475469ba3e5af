"""A live cluster's jobs as a trace (``elastictrain trace export``), so that the simulator can
replay what the cluster ran: each job's submit time (seconds after the first submission), its GPU
count, its steps (the steps it ran if it finished, else its ``--steps`` or the steps so far),
its measured seconds per step, its stage profile (what Muri groups on), its name as the model
its user and its priority. A job that only ran inside interleaving groups has no time of its own measured: its
stage profile's stages, one after another, stand for it. Jobs with neither are left out (the
caller is told which)."""

from __future__ import annotations

from ..model import JobSpec

__all__ = ["jobs_to_trace"]


def jobs_to_trace(jobs) -> tuple[list[JobSpec], list[str]]:
    """``jobs``: ``ClusterJobInfo`` records. Returns (the trace's jobs, ids left out)."""
    usable, left_out = [], []
    for j in jobs:
        steps = j.step if j.status == "finished" else (j.steps or j.step)
        it = j.iteration_time or sum(j.stage_times)  # a job that only ran grouped: its stages in a row
        if not it or it <= 0 or steps <= 0:
            left_out.append(j.id)
        else:
            usable.append((j, steps, it))
    if not usable:
        return [], left_out
    t0 = min(j.submit_time for j, _, _ in usable)
    out = []
    for i, (j, steps, it) in enumerate(sorted(usable, key=lambda x: (x[0].submit_time, x[0].id))):
        out.append(JobSpec(i, j.gpus, round(j.submit_time - t0, 3), float(steps), float(it), j.name,
                           tuple(j.stage_times), user=j.user, priority=j.priority))
    return out, left_out
