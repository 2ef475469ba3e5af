"""Slurm's multifactor priority with backfill (policies/multifactor.py)."""

import random

import pytest

from elastictrain.errors import ConfigError
from elastictrain.model import JobSpec
from elastictrain.policies import create
from elastictrain.sim.cluster import ClusterSpec
from elastictrain.sim.engine import Simulator

ONLY = {"age": 0, "fairshare": 0, "size": 0, "qos": 0}


def run(jobs, policy, cluster=ClusterSpec(1, 1, 2)):
    r = Simulator(jobs, cluster, policy).run()
    return {j.job_id: j for j in r.jobs}


def random_jobs(seed, n=150, users=("ana", "ben", "cy")):
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / 40)
        jobs.append(JobSpec(i, rng.choice([1, 1, 2, 4, 8]), round(t, 3), rng.choice([30, 200, 900, 3000]), 1.0,
                            user=rng.choice(users)))
    return jobs


@pytest.mark.parametrize("seed", range(3))
def test_with_age_alone_it_is_backfill_in_submission_order(seed):
    jobs = random_jobs(seed)
    a = run(jobs, create("multifactor", weights=dict(ONLY, age=1000)), ClusterSpec(1, 2, 4))
    b = run(jobs, create("backfill"), ClusterSpec(1, 2, 4))
    assert {k: (j.start_time, j.end_time) for k, j in a.items()} == {k: (j.start_time, j.end_time) for k, j in b.items()}


def test_a_user_who_used_less_than_its_share_goes_first():
    # ana fills the queue first (six 1-GPU jobs of 1000 s on 2 GPUs); ben's two come later
    jobs = [JobSpec(i, 1, float(i), 1000, 1.0, user="ana") for i in range(6)]
    jobs += [JobSpec(10, 1, 10.0, 1000, 1.0, user="ben"), JobSpec(11, 1, 11.0, 1000, 1.0, user="ben")]
    fifo = run(jobs, create("backfill"))
    fair = run(jobs, create("multifactor"))
    assert fifo[10].start_time == 3000.0 and fifo[11].start_time == 3001.0
    # at the first ends (1000 s) ana has used 2000 GPU-s and ben none: ben's jobs go first
    assert fair[10].start_time == 1000.0 and fair[11].start_time == 1001.0, (fair[10], fair[11])



def test_tickets_are_the_shares_usage_is_measured_against():
    # 3 GPUs: ana, ben and cy each use one GPU from 0 (ana's and ben's for 1000 s); at 1000 the two
    # free GPUs take one of the 2-GPU jobs ana and then ben submitted: equal usage, so the one whose
    # tickets are the larger share goes first (equal tickets: the older, ana's)
    jobs = [JobSpec(0, 1, 0.0, 1000, 1.0, user="ana"), JobSpec(1, 1, 0.0, 1000, 1.0, user="ben"),
            JobSpec(2, 1, 0.0, 5000, 1.0, user="cy"), JobSpec(3, 2, 1.0, 100, 1.0, user="ana"),
            JobSpec(4, 2, 2.0, 100, 1.0, user="ben")]
    equal = run(jobs, create("multifactor"), ClusterSpec(1, 1, 3))
    assert equal[3].start_time == 1000.0 and equal[4].start_time == 1100.0, equal
    more = run(jobs, create("multifactor", tickets={"ben": 3}), ClusterSpec(1, 1, 3))
    assert more[4].start_time == 1000.0 and more[3].start_time == 1100.0, more


def test_size_and_qos_order_the_queue():
    # 2 GPUs held until 100; then a 2-GPU job, a 1-GPU one and a 1-GPU one at --priority 500 wait
    jobs = [JobSpec(0, 2, 0.0, 100, 1.0), JobSpec(1, 1, 1.0, 100, 1.0), JobSpec(2, 2, 2.0, 100, 1.0),
            JobSpec(3, 1, 3.0, 100, 1.0, priority=500)]
    big = run(jobs, create("multifactor", weights=dict(ONLY, size=1000)))
    assert big[2].start_time == 100.0, big  # the largest first
    small = run(jobs, create("multifactor", weights=dict(ONLY, size=1000), favor_small=True))
    assert small[1].start_time == 100.0 and small[3].start_time == 100.0, small
    qos = run(jobs, create("multifactor", weights=dict(ONLY, qos=1000)))
    assert qos[3].start_time == 100.0 and qos[1].start_time == 100.0 and qos[2].start_time == 200.0, qos


def test_status_shows_each_factor_weighted():
    jobs = [JobSpec(0, 2, 0.0, 100, 1.0, user="ana"), JobSpec(1, 1, 10.0, 100, 1.0, user="ben", priority=1000)]
    pol = create("multifactor", max_age=100)
    seen = []

    class Peek:
        name, needs, first_step_events = pol.name, pol.needs, pol.first_step_events

        def decide(self, s):
            d = pol.decide(s)
            seen.append((s.now, pol.annotate(1), pol.factors(1)))
            return d

    Simulator(jobs, ClusterSpec(1, 1, 2), Peek()).run()
    now, info, f = next(x for x in seen if x[0] == 10.0)
    # age 0 (just submitted), fair share 2**0 (ben used nothing; ana's usage is hers), size 1/2, qos 1
    assert f == (pytest.approx(10000 + 500 + 1000), 0.0, 1.0, 0.5, 1.0), f
    assert info["priority"] == "11500 (age 0, fairshare 10000, size 500, qos 1000)", info
    assert info["reservation"] == "1 GPUs (backfill)"


def test_fairshare_reports_shares_usage_and_factor_as_sshare():
    jobs = [JobSpec(0, 1, 0.0, 1000, 1.0, user="ana"), JobSpec(1, 1, 5.0, 10, 1.0, user="ben")]
    pol = create("multifactor", tickets={"ben": 3})
    Simulator(jobs, ClusterSpec(1, 1, 1), pol).run()
    got = pol.fairshare()  # at the last decision (ana's end): ana used it all, ben holds 3 of 4 tickets
    assert got["ana"] == (0.25, pytest.approx(1.0), pytest.approx(2 ** -4)), got
    assert got["ben"][0] == 0.75 and got["ben"][1] == pytest.approx(0.0, abs=1e-12), got


def test_usage_survives_a_restart():
    jobs = [JobSpec(i, 1, float(i), 1000, 1.0, user="ana") for i in range(4)]
    pol = create("multifactor")
    Simulator(jobs, ClusterSpec(1, 1, 2), pol).run()
    state = pol.export_state()
    assert state["usage"][0][0] == "ana" and state["usage"][0][1] > 3000
    fresh = create("multifactor")
    fresh.import_state(state, [])
    assert fresh.export_state() == state
    with pytest.raises(ValueError):
        fresh.import_state({"usage": [["ana", -1.0]], "last": 0.0}, [])


def test_under_priority_tiers_usage_is_one_whatever_the_priority():
    from elastictrain.policies.tiers import PriorityTiers

    # 1 GPU: ana's priority-5 job holds it from 0 to 1000; then ana's and ben's priority-0 jobs wait
    # (ana's first): ana's GPU time at priority 5 counts in her fair share at priority 0, so ben's goes
    # first, as Slurm counts an association's usage under every QOS
    jobs = [JobSpec(0, 1, 0.0, 1000, 1.0, user="ana", priority=5), JobSpec(1, 1, 10.0, 100, 1.0, user="ana"),
            JobSpec(2, 1, 11.0, 100, 1.0, user="ben")]
    tiers = PriorityTiers(lambda: create("multifactor"))
    got = run(jobs, tiers, ClusterSpec(1, 1, 1))
    assert got[2].start_time == 1000.0 and got[1].start_time == 1100.0, got
    share = tiers.fairshare()  # (the priority-5 tier's instance is gone: its usage stayed)
    assert share["ana"][1] > 0.9 and share["ana"][2] < share["ben"][2], share
    state = tiers.export_state()
    assert {p: sorted(a for a, _ in t["usage"]) for p, t in state["tiers"].items()} == {"0": ["ana", "ben"]}


@pytest.mark.parametrize("kw, match", [
    ({"weights": {"age": -1}}, "priority weight age=-1"),
    ({"weights": {"luck": 1}}, "the factors are age, fairshare, size, qos"),
    ({"weights": {"qos": True}}, "priority weight qos=True"),
    ({"half_life": 0}, "half_life must be a number of seconds from 1"),
    ({"max_age": float("nan")}, "max_age must be"),
    ({"tickets": {"ana": 0}}, "tickets must be positive"),
    ({"reservations": 0}, "reservations must be"),
])
def test_bad_options_are_refused_with_the_range(kw, match):
    with pytest.raises(ConfigError, match=match):
        create("multifactor", **kw)
