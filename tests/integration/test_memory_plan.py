"""A resource plan's per-worker memory limit, live: under ``--policy autoscale`` the coordinator
plans each job's memory limit from the largest resident memory its workers report (2x, at least
1 GiB), writes it to the event log, and the job's next start (here its first resize) runs under
it: the node daemon passes it to etrun, which hands it to every worker (ET_MEMORY_LIMIT)."""

import os
import subprocess
import sys

import pytest

from elastictrain.launcher.local_cluster import LocalCluster as Cluster

pytest.importorskip("torch")

WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                      "torch_cluster_job.py")


@pytest.mark.slow  # make test-slow (14 s; the plan's rules are in the autoscale policy's unit tests)
def test_the_plan_sets_a_memory_limit_that_the_next_start_runs_under(tmp_path):
    with Cluster(tmp_path, "autoscale", "--rate-window", "3", nodes=1, slots=2) as c:
        cmd = [WORKER, "--ckpt-dir", os.path.join(c.tmp, "ckpt"), "--out", os.path.join(c.tmp, "mem.json"),
               "--samples", "20000", "--epochs", "1", "--batch", "32", "--cpu-work", "5", "--shard-size", "500",
               "--step-sleep", "0.01", "--ckpt-every", "50"]
        jid = c.submit("mem", 2, cmd, min_gpus=1, env={"ET_MONITOR_PERIOD": "0.5", "ET_MONITOR_BATCH": "1"})
        c.wait_all(1, timeout=300)
        events = c.events()
        shown = subprocess.run([sys.executable, "-m", "elastictrain", "status", "--job", jid], env=c.env(),
                               capture_output=True, text=True, timeout=60).stdout
        st = c.client.cluster_status()
    assert st.jobs[0].status == "finished", c.tail()
    memory = [e.detail for e in events if e.job == jid and e.kind == "plan" and e.detail.get("decision") == "memory"]
    assert memory, [e.detail for e in events if e.job == jid]
    limit = memory[0]["memory_limit"]
    assert limit >= 1 << 30 and limit >= 2 * memory[0]["peak_rss"] > 0, memory
    resizes = [e for e in events if e.job == jid and e.kind == "resize"]
    assert resizes and resizes[0].time > [e for e in events if e.job == jid and e.kind == "plan"
                                          and e.detail.get("decision") == "memory"][0].time, events
    out = c.result("mem")
    assert out["memory_limit"] == str(limit), out  # the run after the resize ran under the plan's limit
    assert (out["min"], out["max"]) == (1, 1), out
    assert f"memory_limit {limit >> 20} MiB per worker" in shown, shown


@pytest.mark.slow  # make test-slow (the default run stays near 15 minutes)
def test_a_job_that_runs_out_under_the_plans_limit_gets_it_doubled_and_keeps_it(tmp_path):
    # at 2 workers, rank 0 needs 1.2 GiB more every 40 steps: the first run (1 worker) never does, so
    # the plan sets 1 GiB; from the resize to 2 it runs out under it; etrun doubles the limit, the
    # coordinator logs an `oom` event and keeps the doubled limit as the job's floor for later runs
    with Cluster(tmp_path, "autoscale", "--rate-window", "3", nodes=1, slots=2) as c:
        cmd = [WORKER, "--ckpt-dir", os.path.join(c.tmp, "ckpt"), "--out", os.path.join(c.tmp, "oom.json"),
               "--samples", "24000", "--epochs", "1", "--batch", "32", "--cpu-work", "5", "--shard-size", "500",
               "--step-sleep", "0.01", "--ckpt-every", "20", "--spike-mib", "1200", "--spike-every", "40",
               "--spike-min-world", "2"]
        jid = c.submit("oom", 2, cmd, min_gpus=1, env={"ET_MONITOR_PERIOD": "0.5", "ET_MONITOR_BATCH": "1"})
        c.wait_all(1, timeout=400)
        events = c.events()
        st = c.client.cluster_status()
    assert st.jobs[0].status == "finished", c.tail()
    planned = [e.detail["memory_limit"] for e in events if e.job == jid and e.kind == "plan"
               and e.detail.get("decision") == "memory"]
    oom = [e.detail for e in events if e.job == jid and e.kind == "oom"]
    assert planned and oom, [(e.kind, e.detail) for e in events if e.job == jid]
    assert oom[0]["memory_limit"] == 2 * planned[0] and "out of memory" in oom[0]["detail"].lower(), oom
    out = c.result("oom")
    assert int(out["memory_limit"]) >= 2 * planned[0], (out, planned)  # the floor held in its last run
    assert (out["min"], out["max"]) == (1, 1), out
