"""The simulator never hangs: property-based traces (some with node outages) for every policy, the
one-job trace that used to livelock, the watchdog, and jobs that can never run."""

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastictrain.model import JobSpec
from elastictrain.policies import create, registered
from elastictrain.policies.api import Decision
from elastictrain.sim.cluster import ClusterSpec
from elastictrain.sim.engine import SimulationStalled, Simulator
from elastictrain.sim.run import SimConfig, simulate

OPTIONS = {"tiresias-g": {"distribution": [100.0, 500.0, 2000.0, 8000.0]}}
POLICIES = [p for p in registered() if not p.startswith(("test-", "noop"))]
PROFILES = [(), (0.5, 0.3, 0.2), (0.1, 0.8, 0.1), (0.3, 0.1, 0.6)]
EXAMPLES = int(os.environ.get("ET_FUZZ_EXAMPLES", "8"))


@st.composite
def workloads(draw):
    nodes, per_node = draw(st.integers(1, 3)), draw(st.integers(1, 8))
    total = nodes * per_node
    burst = draw(st.lists(st.floats(0, 1e7), min_size=1, max_size=3))  # identical submit times
    jobs = []
    for i in range(draw(st.integers(1, 25))):
        submit = draw(st.one_of(st.sampled_from(burst), st.floats(0, 1e7)))  # up to 1e10 ms
        gpus = draw(st.integers(1, total + 2))  # some never fit
        iterations = draw(st.one_of(st.just(1.0), st.integers(1, 10_000).map(float), st.floats(1e-3, 1e4)))
        it = draw(st.one_of(st.just(1e-3), st.floats(1e-3, 100.0)))  # down to 1 ms per iteration
        jobs.append(JobSpec(i, gpus, submit, iterations, it, draw(st.sampled_from(["resnet18", "vgg16", "bert"])),
                            draw(st.sampled_from(PROFILES)), draw(st.sampled_from(["a", "b"]))))
    charge = draw(st.sampled_from(["on_start", "every_event"]))
    cost = draw(st.sampled_from([0.0, 0.5, "muri"]))
    outages = []  # a node lost for a while (at most one outage per node; each ends)
    for node in draw(st.lists(st.integers(0, nodes - 1), max_size=2, unique=True)):
        start = draw(st.one_of(st.sampled_from(burst), st.floats(0, 1e7)))
        outages.append((node, start, start + draw(st.floats(1e-3, 1e6))))
    checkpoint = draw(st.one_of(st.none(), st.floats(1e-2, 1e5)))  # (the work an outage loses)
    return ClusterSpec(1, nodes, per_node), jobs, charge, cost, (outages, checkpoint)


def _run(name, cluster, jobs, charge, cost, failures):
    policy = create(name, **OPTIONS.get(name, {}))
    outages, checkpoint = failures
    return Simulator(jobs, cluster, policy, charge=charge, restart_cost=cost, interval=None, outages=outages,
                     checkpoint_every=checkpoint).run()


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(w=workloads())
def test_every_policy_terminates_finishes_what_fits_and_never_overcommits(name, w):
    _holds(name, w)


@pytest.mark.slow
@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=int(os.environ.get("ET_FUZZ_EXAMPLES_SLOW", "150")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads())
def test_every_policy_holds_on_many_more_random_traces(name, w):
    _holds(name, w)


def _holds(name, w):
    cluster, jobs, charge, cost, failures = w
    t0 = time.perf_counter()
    r = _run(name, cluster, jobs, charge, cost, failures)
    assert time.perf_counter() - t0 < 30, "a small trace must simulate in well under a second"
    done = {j.job_id for j in r.jobs}
    rejected = {jid: why for jid, why in r.extra["rejected"]}
    assert done | set(rejected) == {j.job_id for j in jobs} and not done & set(rejected)
    for j in jobs:
        if j.job_id in rejected:
            assert f"needs {j.num_gpu} GPUs" in rejected[j.job_id]
    assert all(used <= cluster.total_gpus for _, used in r.utilization)
    for rec in r.jobs:
        assert rec.end_time >= rec.start_time >= rec.submit_time
    again = _run(name, cluster, jobs, charge, cost, failures)  # deterministic: same input, same output
    assert [(j.job_id, j.start_time, j.end_time, j.preemptions) for j in again.jobs] == \
        [(j.job_id, j.start_time, j.end_time, j.preemptions) for j in r.jobs]


@pytest.mark.parametrize("name", POLICIES)
def test_a_one_iteration_job_late_in_a_long_trace_finishes(tmp_path, name):
    """The regression: one short job submitted 8.5e6 s in used to livelock the event loop."""
    p = tmp_path / "late.csv"
    p.write_text("job_id,num_gpu,submit_time,iterations,model_name,batch_size,duration,interval,iteration_time,"
                 "resource_time_0,resource_time_1,resource_time_2,priority\n"
                 "0,1,8485391000,1,resnet18,128,1000,48000,779,711,110,0,0\n")
    t0 = time.perf_counter()
    (r,) = simulate(SimConfig(str(p), "n1g8", [name], policy_options=OPTIONS.get(name, {})), progress=False)
    assert time.perf_counter() - t0 < 1.0
    assert len(r.jobs) == 1 and r.jobs[0].end_time > 8485391.0


def test_the_watchdog_names_the_time_when_nothing_progresses():
    class Sleepy:
        """Never starts anything and always wants to decide again right now."""

        name = "sleepy"

        def decide(self, s):
            return Decision({}, wakeup=s.now)

    with pytest.raises(SimulationStalled, match=r"stalled at t=5\.0.* no progress .*sleepy"):
        Simulator([JobSpec(0, 1, 5.0, 10, 1.0)], ClusterSpec(1, 1, 1), Sleepy()).run()


def test_jobs_that_can_never_run_are_rejected_with_the_reason_and_the_rest_runs():
    jobs = [JobSpec(0, 2, 0.0, 10, 1.0), JobSpec(1, 9, 0.0, 10, 1.0)]
    r = Simulator(jobs, ClusterSpec(1, 2, 4), create("srtf")).run()
    assert [j.job_id for j in r.jobs] == [0]
    assert r.extra["rejected"] == [(1, "needs 9 GPUs but the cluster has 8 GPUs")]
    from elastictrain.sim.cluster import heterogeneous_cluster

    hetero = heterogeneous_cluster({"v100": (1, 4), "k80": (1, 4)})
    r = Simulator([JobSpec(0, 6, 0.0, 10, 1.0), JobSpec(1, 4, 0.0, 10, 1.0)], hetero, create("gandiva-fair")).run()
    assert [j.job_id for j in r.jobs] == [1] and "one GPU type" in r.extra["rejected"][0][1]


def test_thrashing_stops_with_the_fix_named():
    """Gandiva-fair slicing 4 jobs on 2 GPUs every 10 s, when each (re)start costs 10 s: no job
    ever works, while simulated time runs on. The engine stops and names the fix; with a 2-s
    restart cost (what a live run of the same jobs measured) the same trace finishes."""
    from elastictrain.sim.engine import THRASH_LIMIT

    jobs = [JobSpec(i, 1, 0.001 * i, 1200.0, 0.055, user="alice" if i < 2 else "bob") for i in range(4)]
    with pytest.raises(SimulationStalled, match=rf"{THRASH_LIMIT} events in a row .* no job did any work .*"
                                                r"gandiva-fair.*restart cost per start \(10 s\).*--quantum"):
        Simulator(jobs, ClusterSpec(1, 1, 2), create("gandiva-fair", quantum=10.0), restart_cost=10.0).run()
    r = Simulator(jobs, ClusterSpec(1, 1, 2), create("gandiva-fair", quantum=10.0), restart_cost=2.0).run()
    assert len(r.jobs) == 4
