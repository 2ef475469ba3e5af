"""Node outages in the simulator: a node lost from START to END seconds, as a live coordinator
shows it (0 GPUs); the jobs on it are preempted, the policies decide without it, and it comes back."""

import math
import subprocess
import sys

import pytest

from elastictrain.errors import ConfigError
from elastictrain.model import JobSpec
from elastictrain.policies import create
from elastictrain.sim.cluster import ClusterSpec
from elastictrain.sim.engine import Simulator


class Recorded:
    """The policy, and every decision's time, GPUs offered and placements."""

    def __init__(self, inner):
        self.inner, self.name, self.seen = inner, inner.name, []

    def decide(self, s):
        d = self.inner.decide(s)
        self.seen.append((s.now, s.gpus_per_node, dict(d.run)))
        return d


def jobs(n=24):
    return [JobSpec(i, [1, 2, 4][i % 3], 100.0 * i, 2000 + 500 * (i % 5), 1.0, user=f"u{i % 3}") for i in range(n)]


@pytest.mark.parametrize("name", ["srtf", "tiresias-l", "gandiva-ts", "gandiva-fair", "muri-l", "yarn-cs"])
def test_a_lost_node_runs_nothing_until_it_is_back_and_its_jobs_are_preempted(name):
    cluster = ClusterSpec(1, 4, 4)
    policy = Recorded(create(name))
    r = Simulator(jobs(), cluster, policy, restart_cost=5.0, outages=[(1, 1000.0, 6000.0)]).run()
    assert sorted(j.job_id for j in r.jobs) == list(range(24))
    assert r.extra["outage_preemptions"] > 0  # (node 1 was busy at 1,000 s)
    during = [(t, caps, run) for t, caps, run in policy.seen if 1000.0 <= t < 6000.0]
    assert during and all(caps[1] == 0 for _, caps, _ in during)
    assert all(n != 1 for _, _, run in during for where in run.values() for n, _ in where)
    after = [caps for t, caps, _ in policy.seen if t >= 6000.0]
    assert after and all(caps[1] == 4 for caps in after)
    # the same run without the outage: no preemption by it, and the jobs end sooner on the whole
    free = Simulator(jobs(), cluster, create(name), restart_cost=5.0).run()
    assert free.extra["outage_preemptions"] == 0
    assert sum(j.jct for j in free.jobs) < sum(j.jct for j in r.jobs)


def test_a_node_lost_for_good_and_outages_checked(tmp_path):
    from elastictrain.sim.synth import write_native

    cluster = ClusterSpec(1, 2, 4)
    r = Simulator(jobs(8), cluster, create("srtf"), outages=[(0, 0.0, math.inf)]).run()
    assert len(r.jobs) == 8  # every job fits on the node left
    # jobs too big for what is left are set aside with the reason, the rest goes on: one that ran on
    # the node (preempted), one waiting then, one arriving later; the others finish
    big = [JobSpec(0, 8, 0.0, 100, 1.0), JobSpec(1, 8, 1.0, 100, 1.0), JobSpec(2, 8, 10.0, 100, 1.0),
           JobSpec(3, 2, 2.0, 100, 1.0), JobSpec(4, 4, 12.0, 100, 1.0)]
    r = Simulator(big, cluster, create("srtf"), outages=[(0, 5.0, math.inf)]).run()
    assert sorted(j.job_id for j in r.jobs) == [3, 4] and r.extra["outage_preemptions"] == 1
    assert [(k, why) for k, why in r.extra["rejected"]] == [
        (0, "needs 8 GPUs but node(s) 0 are lost for good and the nodes left have 4"),
        (1, "needs 8 GPUs but node(s) 0 are lost for good and the nodes left have 4"),
        (2, "needs 8 GPUs but node(s) 0 are lost for good and the nodes left have 4")]
    trace = write_native(big, str(tmp_path / "t.csv"))
    out = subprocess.run([sys.executable, "-m", "elastictrain", "simulate", "--trace", trace, "--cluster", "n2g4",
                          "--policy", "srtf", "--outage", "0:5:inf", "--no-progress"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "srtf: job 2 never runs: needs 8 GPUs but node(s) 0 are lost for good" \
        in out.stderr, out.stderr
    for outages, says in (([(2, 0.0, 1.0)], "node index from 0 to 1"), ([(0, 5.0, 5.0)], "0 <= start < end"),
                          ([(0, -1.0, 5.0)], "0 <= start < end"), ([(0, 0.0, 10.0), (0, 5.0, 20.0)], "overlap"),
                          ([(0, "x", 1.0)], "give \\(node, start, end\\)"), ([(True, 0.0, 1.0)], "node index")):
        with pytest.raises(ConfigError, match=says):
            Simulator(jobs(8), cluster, create("srtf"), outages=outages)


def test_simulate_takes_outages_on_the_command_line(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
                     + "".join(f"{i},2,{i * 10},100,resnet18,{600 + i},0\n" for i in range(8)))

    def simulate(*extra):
        return subprocess.run([sys.executable, "-m", "elastictrain", "simulate", "--trace", str(trace), "--cluster",
                               "n2g4", "--policy", "srtf", "--no-progress", *extra], capture_output=True, text=True,
                              timeout=120)

    ok = simulate("--outage", "1:30:600", "--outage", "0:2000:inf", "--checkpoint-every", "300")
    assert ok.returncode == 0 and "srtf" in ok.stdout, ok.stderr
    assert "jobs preempted by node outages, " in ok.stdout and "s of work lost with them" in ok.stdout
    bad = simulate("--outage", "1:30")
    assert bad.returncode != 0 and "write NODE:START:END" in bad.stderr


@pytest.mark.parametrize("charge", ["on_start", "every_event"])
def test_a_job_lost_with_its_node_goes_back_to_its_last_checkpoint(charge):
    """With checkpoint_every, the work since the run's last checkpoint is lost with the node (as a
    live job resumes from its last checkpoint); without it, nothing is lost."""
    cluster = ClusterSpec(1, 2, 4)
    job = [JobSpec(0, 4, 0.0, 1000, 1.0)]  # 1,000 s of work, on node 0 (the first that fits)
    kept = Simulator(job, cluster, create("srtf"), charge=charge, outages=[(0, 250.0, 300.0)]).run()
    assert kept.jobs[0].end_time == pytest.approx(1000.0) and kept.jobs[0].preemptions == 1
    assert kept.extra["outage_lost_seconds"] == 0.0
    lost = Simulator(job, cluster, create("srtf"), charge=charge, outages=[(0, 250.0, 300.0)],
                     checkpoint_every=100.0).run()
    assert lost.extra["outage_lost_seconds"] == pytest.approx(50.0)  # checkpoints at 100 and 200 s
    assert lost.jobs[0].end_time == pytest.approx(1050.0)  # resumed at once on node 1
    with pytest.raises(ConfigError, match="checkpoint_every must be"):
        Simulator(job, cluster, create("srtf"), checkpoint_every=0.0)


@pytest.mark.parametrize("name", ["gandiva-ts", "srtf", "tiresias-l", "gandiva-fair", "muri-l"])
def test_a_node_back_mid_slice_is_used_at_once(name):
    # two 1-GPU jobs, node 1 lost until 100 s: the second job starts when it is back, not at the next slice
    two = [JobSpec(0, 1, 0.0, 5000, 1.0, user="a"), JobSpec(1, 1, 0.0, 5000, 1.0, user="b")]
    r = Simulator(two, ClusterSpec(1, 2, 1), create(name), outages=[(1, 0.0, 100.0)]).run()
    first, second = sorted(j.start_time for j in r.jobs)
    assert first == 0.0 and second <= 100.0  # (gandiva-fair slices the one GPU at 60 s already)


class Running(Recorded):
    """The policy, and at every decision the GPUs offered and where the jobs run (what took place)."""

    def decide(self, s):
        self.seen.append((s.now, s.gpus_per_node, {j.job_id: j.placement for j in s.running}))
        return self.inner.decide(s)


@pytest.mark.parametrize("name", ["fifo", "yarn-cs", "backfill", "multifactor", "srtf", "gandiva-ts"])
def test_a_cordoned_node_keeps_its_jobs_and_takes_nothing_new(name):
    # `nodes cordon NAME --at`: from 1,000 to 6,000 s node 1 offers only what its running jobs hold, so
    # it empties as they end; nothing is preempted for it; a policy that preempts or moves a job there
    # cannot give its GPUs to another (refused, as live); all its GPUs are offered again after it
    policy = Running(create(name))
    log = []
    r = Simulator(jobs(), ClusterSpec(1, 4, 4), policy, restart_cost=5.0, cordons=[(1, 1000.0, 6000.0)],
                  decisions=log).run()
    assert sorted(j.job_id for j in r.jobs) == list(range(24)) and r.extra["outage_preemptions"] == 0
    during = [(caps, run) for t, caps, run in policy.seen if 1000.0 < t < 6000.0]
    on1 = lambda run: {k for k, where in run.items() if any(n == 1 for n, _ in where)}  # noqa: E731
    before = [run for t, _, run in policy.seen if t <= 1000.0][-1]  # (as the cordon begins)
    offered = [caps[1] for caps, _ in during]
    held = sum(g for k in on1(before) for n, g in before[k] if n == 1)
    assert during and offered[0] <= held
    if name in ("backfill", "multifactor"):  # they know of it (ClusterSnapshot.windows): nothing runs into it
        assert not on1(before) and not any(offered)
    else:
        assert on1(before) and offered[-1] < held  # it empties as its jobs end (or are preempted)
    assert offered == sorted(offered, reverse=True)
    for caps, run in during:
        assert on1(run) <= on1(before) and sum(g for where in run.values() for n, g in where if n == 1) <= caps[1]
    after = [caps for t, caps, _ in policy.seen if t >= 6000.0]
    assert after and all(caps[1] == 4 for caps in after)
    starts = {}
    for t, kind, key, _ in log:
        if kind == "start":
            starts.setdefault(key, t)
    assert starts == {j.job_id: j.start_time for j in r.jobs}  # (a start refused is not logged as one)
    drained = Simulator(jobs(), ClusterSpec(1, 4, 4), create(name), restart_cost=5.0,
                        planned=[(1, 1000.0, 6000.0)]).run()
    # a drain (--maintenance) requeues them instead (backfill and multifactor ran none into it)
    assert (drained.extra["outage_preemptions"] > 0) == bool(on1(before))
