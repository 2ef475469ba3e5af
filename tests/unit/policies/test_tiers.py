"""Priority tiers (policies/tiers.py): a higher priority takes GPUs from lower ones, each tier is
decided by its own instance of the policy, and with one tier the policy decides alone."""

import random

import pytest

from elastictrain.model import JobSpec
from elastictrain.policies import create
from elastictrain.policies.api import ClusterSnapshot, JobView
from elastictrain.policies.tiers import PriorityTiers
from elastictrain.sim.cluster import ClusterSpec
from elastictrain.sim.engine import Simulator

from .test_invariants import OPTIONS, Checked, Stopping, random_trace

POLICIES = ["yarn-cs", "fifo-be", "srtf", "srsf", "tiresias-l", "tiresias-g", "gandiva-ts", "gandiva-fair-notrade",
            "gandiva-fair-global", "gandiva-fair", "muri-s", "muri-l", "autoscale"]


def tiers(name):
    return PriorityTiers(lambda: create(name, **OPTIONS.get(name, {})))


def by_id(result):
    return {r.job_id: r for r in result.jobs}


@pytest.mark.parametrize("name", POLICIES)
def test_a_higher_priority_job_preempts_a_lower_one_which_resumes_after_it(name):
    jobs = [JobSpec(1, 2, 0.0, 1000, 1.0), JobSpec(2, 2, 10.0, 2000, 1.0, priority=5)]
    r = by_id(Simulator(jobs, ClusterSpec(1, 1, 2), tiers(name)).run())
    assert (r[2].start_time, r[2].end_time) == (10.0, 2010.0)  # at once, and alone to its end
    assert r[1].preemptions >= 1 and r[1].end_time >= 3000.0
    if name in ("yarn-cs", "fifo-be", "srtf", "srsf", "gandiva-ts", "gandiva-fair"):  # (not least-attained-first)
        plain = by_id(Simulator(jobs, ClusterSpec(1, 1, 2), create(name, **OPTIONS.get(name, {}))).run())
        assert plain[2].end_time > 2010.0  # the policy alone makes it wait, or share


def with_priorities(jobs, seed, levels=(-1, 0, 0, 3)):
    rng = random.Random(seed)
    return [JobSpec(j.job_id, j.num_gpu, j.submit_time, j.iterations, j.iteration_time, j.model, j.stage_times,
                    priority=rng.choice(levels)) for j in jobs]


@pytest.mark.parametrize("name", ["yarn-cs", "srtf", "tiresias-l", "gandiva-ts", "gandiva-fair", "muri-l"])
@pytest.mark.parametrize("level", [0, 7])
def test_with_one_tier_the_policy_decides_alone_bit_for_bit(name, level):
    jobs = with_priorities(random_trace(3, n=60), 0, levels=(level,))
    cluster = ClusterSpec(2, 2, 4)
    a = Simulator(jobs, cluster, tiers(name), restart_cost=5.0).run()
    b = Simulator(jobs, cluster, create(name, **OPTIONS.get(name, {})), restart_cost=5.0).run()
    key = [(r.job_id, r.start_time, r.end_time, r.preemptions) for r in sorted(a.jobs, key=lambda r: r.job_id)]
    assert key == [(r.job_id, r.start_time, r.end_time, r.preemptions) for r in sorted(b.jobs, key=lambda r: r.job_id)]
    assert a.events == b.events


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("seed", [1, 2])
def test_tiers_keep_every_invariant_and_every_job_finishes(name, seed):
    cluster = ClusterSpec(2, 2, 4)
    jobs = with_priorities(random_trace(seed), seed)
    for wrap in (lambda p: p, Stopping):  # also while preempted jobs stop, as live
        policy = Checked(tiers(name), cluster)
        result = Simulator(jobs, cluster, wrap(policy), restart_cost=5.0).run()
        assert sorted(r.job_id for r in result.jobs) == [j.job_id for j in jobs], "a job never finished"
        assert policy.decisions > 0


class NoneWaitsForALowerTier:
    """Checks, at every decision, that no job waits while a job of a lower priority runs (1-GPU
    jobs on 1-GPU nodes under a work-conserving policy: any running job's GPU would hold it)."""

    def __init__(self, inner):
        self.inner, self.name, self.checked = inner, inner.name, 0

    def decide(self, s):
        d = self.inner.decide(s)
        waiting = [j.priority for j in s.jobs if j.job_id not in d.run]
        running = [j.priority for j in s.jobs if j.job_id in d.run]
        if waiting and running:
            assert max(waiting) <= min(running), (s.now, waiting, running)
            self.checked += 1
        return d


@pytest.mark.parametrize("name", ["srtf", "fifo-be", "gandiva-ts", "tiresias-l"])
def test_no_job_waits_while_a_lower_priority_one_runs(name):
    rng = random.Random(7)
    jobs, t = [], 0.0
    for i in range(120):
        t += rng.expovariate(1 / 40)
        jobs.append(JobSpec(i, 1, t, rng.randint(20, 600), 1.0, priority=rng.choice((0, 1, 2))))
    check = NoneWaitsForALowerTier(tiers(name))
    result = Simulator(jobs, ClusterSpec(1, 4, 1), check, restart_cost=2.0).run()
    assert len(result.jobs) == len(jobs) and check.checked > 20


def test_a_start_goes_to_free_gpus_rather_than_preempt_a_lower_job():
    # node 0 is full of a low job; node 1 has 2 of 4 GPUs held by another; a high 2-GPU job arrives.
    # The policy alone (first fit over what its tier sees: everything free) would pick node 0.
    jobs = [JobSpec(1, 4, 0.0, 1000, 1.0), JobSpec(2, 2, 0.0, 1000, 1.0), JobSpec(3, 2, 10.0, 100, 1.0, priority=1)]
    r = by_id(Simulator(jobs, ClusterSpec(1, 2, 4), tiers("fifo-be")).run())
    assert r[1].preemptions == r[2].preemptions == 0 and r[3].start_time == 10.0
    # with no free GPU left, it preempts: the job on the node it is placed on
    jobs.append(JobSpec(4, 2, 20.0, 100, 1.0, priority=1))
    r = by_id(Simulator(jobs, ClusterSpec(1, 2, 4), tiers("fifo-be")).run())
    assert r[4].start_time == 20.0 and r[1].preemptions + r[2].preemptions == 1


def view(key, gpus, priority=0, running=(), **kw):
    return JobView(key, gpus, 0.0, priority=priority, running=bool(running), placement=tuple(running), **kw)


def snap(now, jobs, caps, arrived=(), ended=()):
    return ClusterSnapshot(now, tuple(jobs), tuple(caps), 1, tuple(arrived), tuple(ended),
                           tuple(j for j in jobs if j.running))


def test_any_node_placements_are_resolved_and_a_preempted_job_gets_a_note():
    pol = PriorityTiers(lambda: create("fifo-be", placement="count"))
    low = view("a", 2, 0, running=((1, 2),))
    high = view("b", 2, 1)
    d = pol.decide(snap(0.0, [low, high], [2, 2], arrived=[low, high]))
    assert d.run == {"b": ((0, 2),), "a": ((1, 2),)}  # "b" to the free node, "a" kept where it runs
    d = pol.decide(snap(1.0, [low, high, view("c", 2, 2)], [2, 2]))
    assert d.run["c"] == ((0, 2),) and d.run["b"] == ((1, 2),) and "a" not in d.run
    assert [n for n in d.notes if n[0] == "a" and "priority 1, above its 0" in n[1]["why"]]


def test_a_tier_whose_jobs_ended_is_forgotten_and_a_priority_change_moves_a_job():
    pol = PriorityTiers(lambda: create("srtf"))
    a, b = view("a", 1, 0), view("b", 1, 4)
    pol.decide(snap(0.0, [a, b], [1], arrived=[a, b]))
    assert sorted(pol._tiers) == [0, 4]
    d = pol.decide(snap(1.0, [a], [1], ended=["b"]))
    assert d.run == {"a": ((0, 1),)} and sorted(pol._tiers) == [0]
    d = pol.decide(snap(2.0, [view("a", 1, 2, running=((0, 1),))], [1]))  # its priority changed: a new tier
    assert d.run == {"a": ((0, 1),)} and sorted(pol._tiers) == [2]


def test_tickets_and_policy_memory_reach_every_tier():
    pol = PriorityTiers(lambda: create("gandiva-fair"))
    pol.set_tickets({"alice": 3.0})
    jobs = [view("a", 1, 0, user="alice"), view("b", 1, 1, user="alice")]
    pol.decide(snap(0.0, jobs, [1, 1], arrived=jobs))
    assert all(p.tickets == {"alice": 3.0} for p in pol._tiers.values()) and len(pol._tiers) == 2
    t = PriorityTiers(lambda: create("tiresias-l"))
    t.decide(snap(0.0, jobs, [1, 1], arrived=jobs))
    state = t.export_state()
    assert sorted(state["tiers"]) == ["0", "1"]
    fresh = PriorityTiers(lambda: create("tiresias-l"))
    fresh.import_state(state, jobs)
    assert fresh.export_state() == state
    with pytest.raises(KeyError):  # state saved without tiers: the coordinator relearns
        fresh.import_state(create("tiresias-l").export_state(), jobs)


def test_simulate_priority_preemption_from_a_native_trace(tmp_path):
    import subprocess
    import sys

    from elastictrain.sim.run import SimConfig, simulate
    from elastictrain.sim.synth import synthesize, write_native

    jobs = synthesize(200, seed=4, gpus=16, load=1.2, priorities=(0, 0, 0, 5))
    plain = synthesize(200, seed=4, gpus=16, load=1.2)  # the same trace but for the priorities
    shape = [(j.submit_time, j.num_gpu, j.duration) for j in jobs]
    assert shape == [(j.submit_time, j.num_gpu, j.duration) for j in plain]
    path = write_native(jobs, str(tmp_path / "p.csv"))

    def high(tiered):  # the priority-5 jobs' average JCT and queueing delay
        (r,) = simulate(SimConfig(path, "n2g8", ["srtf"], priority_preemption=tiered), progress=False)
        js = [j for j in r.jobs if j.priority == 5]
        assert len(js) == 49
        return sum(j.jct for j in js) / len(js), sum(j.queueing_delay for j in js) / len(js)

    (jct, queued), (jct0, queued0) = high(True), high(False)
    assert jct < 0.9 * jct0 and queued < 0.1 * queued0, (jct, jct0, queued, queued0)
    out = subprocess.run([sys.executable, "-m", "elastictrain", "simulate", "--trace", path, "--cluster", "n2g8",
                          "--policy", "srtf,tiresias-l", "--priority-preemption", "--no-progress"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for policy in ("srtf", "tiresias-l"):
        for p, n in ((5, 49), (0, 151)):
            assert f"{policy}: priority {p}: {n} jobs, average JCT" in out.stdout, out.stdout
