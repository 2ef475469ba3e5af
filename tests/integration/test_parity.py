"""The simulator held to the cluster: a small workload runs live (real node daemons, real
processes) and, from its exported trace (`elastictrain trace export`: submit times, sizes,
measured seconds per step, stage profiles), in the simulator with the same policy and the
restart cost and interleaving slowdown the live run measured. Both must make the same decisions (starts, preemptions,
regroups, with their groups) in the same order for every job, each within TOLERANCE seconds of
its counterpart; the first divergence is printed when they do not."""

import os
import statistics
import subprocess
import sys
import time

import pytest

from elastictrain.launcher.local_cluster import LocalCluster as Cluster
from elastictrain.policies.api import create
from elastictrain.policies.tiers import PriorityTiers
from elastictrain.sim.cluster import load_cluster
from elastictrain.sim.engine import Simulator
from elastictrain.sim.parity import compare, live_decisions, normalize, sim_decisions
from elastictrain.sim.traces import load_trace
from elastictrain.wire import JobSubmit

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MURI_JOB = os.path.join(ROOT, "examples", "torch_muri_job.py")
TOLERANCE = 6.0  # seconds: a decision that depends on a finish carries the run's drift (startups, checkpoints)


def restart_cost(events, first: bool = False) -> float:
    """Median seconds from a run's start (or resume, regroup...) to its first training step, per
    job: the simulator charges a group's start the sum of its members' costs, where live the
    members of a group start together (one process), so a member's share of a group start is
    its gap over the group's size. The median, not the mean: the node daemon's first task makes
    the zygote it keeps (Python's and torch's imports, about 2 s here) and every later start
    forks from it (about 0.3 s); the simulator charges every start one figure, and the typical
    start is the one to charge."""
    began, gaps = {}, []
    for e in events:
        if e.kind in ("start", "resume", "regroup", "migrate", "resize"):
            began[e.job] = (e.time, max(1, len(e.detail.get("group") or ())))
        elif e.kind == "first_step" and e.job in began:
            t, size = began.pop(e.job)
            gaps.append((e.time - t) / size)
    if not gaps:
        return 2.0
    return max(gaps) if first else statistics.median(gaps)


def replay(c, policy, cluster, options, events, protect_startup=True, first_start_cost=False, tiers=False):
    trace = os.path.join(c.tmp, "live.csv")
    out = subprocess.run([sys.executable, "-m", "elastictrain", "trace", "export", "--out", trace], env=c.env(),
                         cwd=c.tmp, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    log: list = []
    cost = restart_cost(events, first_start_cost)
    chosen = PriorityTiers(lambda: create(policy, **options)) if tiers else create(policy, **options)
    Simulator(load_trace(trace), load_cluster(cluster), chosen, restart_cost=cost,
              decisions=log, protect_startup=protect_startup).run()
    return sim_decisions(log), cost


def check(c, policy, cluster, options, protect_startup=True, first_start_cost=False, tiers=False):
    events = c.events()
    live = live_decisions(events, c.client.cluster_jobs().jobs)
    sim, cost = replay(c, policy, cluster, options, events, protect_startup, first_start_cost, tiers)
    diverged = compare(live, sim, TOLERANCE)
    shown = "\n".join(f"  live {a!s:<48} sim {b!s}" for a, b in zip(
        normalize(live, TOLERANCE) + [""] * 40, normalize(sim, TOLERANCE) + [""] * 40) if a or b)
    assert diverged is None, f"{policy}: first divergence: {diverged}\n(restart cost {cost:.2f} s)\n{shown}"
    return live


def submit_muri(c, name, steps, stages, **kw):
    args = [MURI_JOB, "--steps", str(steps), "--load-ms", str(stages[0]), "--cpu-ms", str(stages[1]),
            "--compute-ms", str(stages[2]), "--ckpt-dir", os.path.join(c.tmp, f"ckpt-{name}"),
            "--out", os.path.join(c.tmp, f"{name}.json")]
    given = {"load": stages[0] / 1000, "preprocess": stages[1] / 1000, "compute": stages[2] / 1000}
    return c.client.submit(JobSubmit(args, c.tmp, name=name, gpus=kw.get("gpus", 1), steps=steps, grace=20.0,
                                     env={"OMP_NUM_THREADS": "1"}, stage_times=given,
                                     user=kw.get("user", "default"), priority=kw.get("priority", 0))).id


def test_tiresias_l_live_and_simulated_make_the_same_decisions(tmp_path):
    with Cluster(tmp_path, "tiresias-l", "--thresholds", "12", nodes=1, slots=2) as c:
        submit_muri(c, "long", 500, (20, 0, 20), gpus=2)
        time.sleep(9)  # the long job crosses 12 GPU-seconds (Q0 -> Q1) at about 6 s of service
        submit_muri(c, "short-a", 80, (20, 0, 20))
        submit_muri(c, "short-b", 120, (20, 0, 20))
        c.wait_all(3, timeout=300)
        live = check(c, "tiresias-l", "n1g2", {"thresholds": (12.0,)})
        assert [s.kind for s in live].count("preempt") >= 1  # the workload exercises a preemption


def test_priority_tiers_live_and_simulated_make_the_same_decisions(tmp_path):
    # srtf alone would let the long low job run on (the high one is longer still): priority preempts it
    with Cluster(tmp_path, "srtf", "--priority-preemption", nodes=1, slots=2) as c:
        submit_muri(c, "low", 300, (20, 0, 20), gpus=2)
        time.sleep(6)
        submit_muri(c, "high", 400, (20, 0, 20), gpus=2, priority=5)
        submit_muri(c, "small", 60, (20, 0, 20), priority=0)
        c.wait_all(3, timeout=300)
        live = check(c, "srtf", "n1g2", {}, tiers=True)
        assert [(s.kind, s.job) for s in live if s.kind == "preempt"], live


def test_muri_s_live_and_simulated_make_the_same_decisions(tmp_path):
    # finish_hold 0 on both sides: whether a job's time left is under its restart cost, the hold's
    # test, is decided within a fraction of a second at these jobs' ends, where the two sides'
    # progress differs by more than that. Start-ups are protected on both sides (the default).
    with Cluster(tmp_path, "muri-s", "--finish-hold", "0", nodes=2, slots=1) as c:
        for name, stages in (("io", (60, 0, 8)), ("gpu1", (4, 0, 60)), ("io2", (55, 0, 6)), ("gpu2", (4, 0, 55))):
            submit_muri(c, name, 250, stages)
            time.sleep(1.0)  # each arrival is its own decision, live as in the simulator
        st = c.wait_all(4, timeout=300)
        # the groups' measured slowdown over eq. 3 (the simulator's Muri model otherwise assumes the
        # paper's GPU overheads, 1.31x for a pair, where this executor measures a few percent)
        ratios = [float(j.info["group_iteration_time"]) / float(j.info["group_predicted"]) for j in st.jobs
                  if int(j.info.get("group_steps", "0")) >= 30]
        assert ratios, [j.info for j in st.jobs]
        m = sum(ratios) / len(ratios)
        # every start charged the slowest (the first ones, which make the node's zygote): live, no
        # job trained alone before its group formed 1 s later; charged the median, the simulator's
        # did, ended a moment before its mate, and the simulator regrouped the mate for that moment
        live = check(c, "muri-s", "n2g1", {"sticky": True, "overhead": (1.0, m, m, m), "finish_hold": 0.0},
                     first_start_cost=True)
        assert any(s.group for s in live)  # groups formed
