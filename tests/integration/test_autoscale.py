"""Auto-scaling live: a coordinator with ``--policy autoscale``, one node daemon with 4 CPU slots,
and a CPU-bound elastic DDP job of 1..4 workers (gloo, loopback) on this machine's cores. The
plan must settle where one more worker stops paying (the core count here), not at 4; every
resize is a checkpointed restart, and the job's exactly-once ledger holds across them."""

import os
import subprocess
import sys

import pytest

from elastictrain.launcher.local_cluster import LocalCluster as Cluster

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                      "torch_cluster_job.py")
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.mark.skipif(CORES >= 4 or CORES < 2, reason="needs 2 or 3 cores, so that a size below 4 stops paying")
def test_a_cpu_bound_job_settles_where_one_more_worker_stops_paying(tmp_path):
    with Cluster(tmp_path, "autoscale", "--rate-window", "5", nodes=1, slots=4) as c:
        cmd = [WORKER, "--ckpt-dir", os.path.join(c.tmp, "ckpt"), "--out", os.path.join(c.tmp, "scale.json"),
               "--samples", "100000", "--epochs", "4", "--batch", "64", "--cpu-work", "60", "--shard-size", "1000",
               "--step-sleep", "0", "--ckpt-every", "200"]
        jid = c.submit("scale", 4, cmd, min_gpus=1)
        c.wait(lambda st: st.jobs[0].status == "running" and any(
            e.kind == "plan" and e.detail.get("decision") == "settle" for e in c.events()), 600, "the plan to settle")
        shown = subprocess.run([sys.executable, "-m", "elastictrain", "status", "--job", jid], env=c.env(),
                               capture_output=True, text=True, timeout=60).stdout
        c.wait_all(1, timeout=600)
        events = c.events()
        st = c.client.cluster_status()
        plans = subprocess.run([sys.executable, "-m", "elastictrain", "events", "--job", jid, "--kind", "plan"],
                               env=c.env(), capture_output=True, text=True, timeout=60).stdout
    job = st.jobs[0]
    assert job.status == "finished", c.tail()
    plan = [e.detail for e in events if e.job == jid and e.kind == "plan"]
    resizes = [e.detail["workers"] for e in events if e.job == jid and e.kind == "resize"]
    settle = [p for p in plan if p["decision"] == "settle"]
    assert settle, f"the plan never settled: {plan}"
    workers = settle[0]["workers"]
    assert 2 <= workers <= CORES, f"settled at {workers} workers on {CORES} cores: {plan}"
    assert resizes[:2] == [2, 3], resizes  # it grew while a step paid ...
    assert settle[0]["from_workers"] == workers and settle[0]["marginal_efficiency"] < 0.3  # ... and stepped back
    assert f"workers: 1:4 (this run: {workers})" in shown and "plan settled" in shown, shown
    assert plans.count(" plan ") == len(plan) and "marginal_efficiency=" in plans, plans
    out = c.result("scale")
    assert out["min"] == 1 and out["max"] == 1, out  # every sample exactly once across the resizes
    assert len(out["reasons"]) >= 1 + len(resizes)
