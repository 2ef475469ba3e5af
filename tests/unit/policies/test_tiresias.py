import numpy as np
import pytest

from elastictrain.model import JobSpec
from elastictrain.policies import create
from elastictrain.policies.tiresias import gittins_table
from elastictrain.sim.cluster import ClusterSpec
from elastictrain.sim.engine import Simulator


def run(jobs, gpus=4, **kw):
    return {r.job_id: r for r in Simulator(jobs, ClusterSpec(1, 1, gpus), create("tiresias-l", **kw)).run().jobs}


def test_las_serves_the_newcomer_first_and_demotes_by_gpu_seconds():
    # job 0 (4 GPUs) crosses 100 GPU-s at 25 s and drops to Q1. Job 1 arrives at 10 s into Q0
    # behind job 0 (first come, first served within a queue), and takes over at the demotion.
    jobs = [JobSpec(0, 4, 0.0, 100, 1.0), JobSpec(1, 4, 10.0, 20, 1.0)]
    r = run(jobs, thresholds=(100,))
    assert r[1].start_time == 25.0 and r[1].end_time == 45.0
    assert r[0].preemptions == 1 and r[0].end_time == 120.0  # 25 s + 20 s waiting + 75 s


def test_promote_knob_brings_a_starving_job_back():
    # job 0 drops to Q1 after 25 s; then short jobs (80 GPU-s, they stay in Q0) keep the GPUs busy
    long = JobSpec(0, 4, 0.0, 1000, 1.0)
    stream = [JobSpec(i, 4, 30.0 + 20 * (i - 1), 20, 1.0) for i in range(1, 41)]
    starved = run([long] + stream, thresholds=(100,))
    promoted = run([long] + stream, thresholds=(100,), promote_knob=1.0)
    # without the knob job 0 gets nothing while the stream lasts; with it, it takes turns
    assert all(starved[i].start_time == starved[i].submit_time for i in range(1, 41))
    assert starved[0].preemptions == 1
    assert promoted[0].preemptions > 3
    assert any(promoted[i].start_time > promoted[i].submit_time for i in range(1, 41))


def test_gittins_index_prefers_jobs_likely_to_finish_soon():
    xs, gi = gittins_table([10, 10, 10, 1000], delta=50)
    # with 10 s attained... a job under 10 s is likely to end within delta: high index
    assert gi[0] > gi[-2]
    assert np.all(np.isfinite(gi))


class _CheckOrder:
    """Wraps Tiresias-G: after every decision each queue must be in Gittins-key order (it keeps
    them sorted incrementally), and the key of every job must be the one computed from scratch."""

    def __init__(self, inner):
        self.inner, self.name, self.needs, self.checked = inner, inner.name, inner.needs, 0

    def decide(self, s):
        d = self.inner.decide(s)
        p = self.inner
        for queue in p._queues:
            assert queue == sorted(queue, key=p._gkey.__getitem__)
        saved = dict(p._gnext)  # (computing a key records when it changes next: put that back)
        for j in s.jobs:
            assert p._gkey[j.job_id] == p._gittins_key(j.job_id, j), j.job_id
        p._gnext.clear()
        p._gnext.update(saved)
        self.checked += 1
        return d


def test_gittins_queues_stay_in_key_order_through_arrivals_demotions_and_promotions():
    rng = np.random.default_rng(7)
    jobs = [JobSpec(i, int(rng.choice([1, 2, 4])), float(rng.integers(0, 400)), int(rng.integers(5, 400)), 1.0)
            for i in range(60)]
    jobs.sort(key=lambda j: j.submit_time)
    policy = _CheckOrder(create("tiresias-g", distribution=[20, 50, 80, 200, 400, 900, 1600], delta=100,
                                thresholds=(200, 800), promote_knob=2.0))
    result = Simulator(jobs, ClusterSpec(1, 1, 4), policy).run()
    assert len(result.jobs) == 60 and policy.checked > 100


@pytest.mark.parametrize("policy", ["tiresias-l", "tiresias-g"])
def test_a_demotion_counts_from_the_first_step_without_a_decision_there(policy):
    # a 30 s start-up: job 0 trains from t=30 and crosses 100 GPU-s at 55 s; job 1 (arrived at
    # 10 s, Q0) takes over then. Tiresias is not asked again at job 0's first step: the wake-up
    # for the demotion comes from when that step was due (JobView.ready_at)
    def sim(first_step_events):
        pol = create(policy, thresholds=(100,), **({"distribution": [50.0, 200.0]} if policy == "tiresias-g" else {}))
        assert pol.first_step_events is False
        pol.first_step_events = first_step_events
        jobs = [JobSpec(0, 4, 0.0, 100, 1.0), JobSpec(1, 4, 10.0, 20, 1.0)]
        return Simulator(jobs, ClusterSpec(1, 1, 4), pol, charge="on_start", restart_cost=30.0, interval=None).run()

    skipped, asked = sim(False), sim(True)
    r = {j.job_id: j for j in skipped.jobs}
    assert r[1].start_time == 55.0 and r[0].preemptions == 1
    assert [(j.start_time, j.end_time) for j in skipped.jobs] == [(j.start_time, j.end_time) for j in asked.jobs]
    assert skipped.events < asked.events  # the first steps (t=30, t=85) were not decision points
