"""Placement: sticky placers keep running jobs where they are (a move is a restart on a real cluster)."""

from elastictrain.policies.api import ClusterSnapshot, JobView
from elastictrain.policies.placement import make_placer


def _snap(jobs, gpus=(4, 4)):
    return ClusterSnapshot(0.0, tuple(jobs), gpus, len(gpus), running=tuple(j for j in jobs if j.running))


def test_sticky_keeps_a_running_job_and_newcomers_avoid_its_gpus():
    running = JobView("old", 2, 0.0, running=True, placement=((0, 2),))
    big = JobView("big", 4, 1.0)
    s = _snap([big, running])  # the newcomer comes first in the policy's order (e.g. SRTF)
    plain = make_placer(s, "consolidated").fill([big, running])
    sticky = make_placer(s, "consolidated", sticky=True).fill([big, running])
    assert plain["big"] == ((0, 4),) and plain["old"] == ((1, 2),), "first fit moves the running job"
    assert sticky["big"] == ((1, 4),) and sticky["old"] == ((0, 2),), "sticky avoids its GPUs instead"


def test_sticky_falls_back_to_held_gpus_when_nothing_else_fits():
    running = JobView("old", 4, 0.0, running=True, placement=((0, 4),))
    big = JobView("big", 8, 1.0)
    s = _snap([big, running])
    where = make_placer(s, "consolidated", sticky=True).fill([big, running])
    assert where == {"big": ((0, 4), (1, 4))}  # the big job preempts the running one: same as without
