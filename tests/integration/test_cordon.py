"""Cordoned nodes on a live cluster (a coordinator running a policy, node daemons with CPU
slots): an administrator's cordon keeps new work off a node while what runs there goes on, a
drain also moves the node's jobs elsewhere from their checkpoints, and a straggler inside a
scheduled job gets its node cordoned and the job placed again without it."""

import os

import pytest

from elastictrain.errors import BadRequestError, NotFoundError
from elastictrain.launcher.local_cluster import LocalCluster as Cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "examples", "torch_cluster_job.py")
MURI_JOB = os.path.join(ROOT, "examples", "torch_muri_job.py")


def _nodes_of(c: Cluster, job: str) -> set:
    return {n.name for n in c.client.cluster_status().nodes if job in n.jobs}


@pytest.mark.slow  # make test-slow (21 s in make test; the real-Slurm drain test and the unit tests stay)
def test_a_cordoned_node_takes_no_new_job_and_keeps_its_running_one(tmp_path):
    with Cluster(tmp_path, "fifo", nodes=2, slots=1) as c:
        first = c.submit("first", 1, [WORKER, "--ckpt-dir", "ck-first", "--out", "first.json", "--epochs", "50",
                                      "--step-sleep", "0.2"], grace=5.0)  # (the cluster's stop waits no longer)
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(first) == "running", 120, "the first job to run")
        home = _nodes_of(c, first).pop()
        other = ({"n1", "n2"} - {home}).pop()
        out = c.cli("nodes", "cordon", home, "--for", "600", "--reason", "GPU 0 throttles").stdout
        assert f"node {home}: cordoned for" in out and "1 job(s) keep running" in out, out
        # a new job cannot go to the cordoned node: it takes the other, and a third one waits
        second = c.submit("second", 1, [WORKER, "--ckpt-dir", "ck-second", "--out", "second.json", "--epochs", "50",
                                        "--step-sleep", "0.2"], grace=5.0)
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(second) == "running", 120, "the second job to run")
        assert _nodes_of(c, second) == {other}
        third = c.submit("third", 1, [WORKER, "--ckpt-dir", "ck-third", "--out", "third.json", "--steps", "5"])
        status = c.cli("status").stdout
        assert f"node {home} is cordoned (nothing new is placed there): GPU 0 throttles" in status, status
        assert "cordoned" in status.split(home, 1)[1].splitlines()[0], status
        # the cordoned node drains: once its job ends, it offers nothing, so the third job waits
        assert c.cli("cancel", first).stdout.strip() == f"job {first} cancelled"
        c.wait(lambda st: not any(first in n.jobs for n in st.nodes), 60, "the first job's task to exit")
        st = c.client.cluster_status()
        assert {j.id: j.status for j in st.jobs}[third] in ("queued", "preempted"), st
        # lifted: the third job runs there
        assert c.cli("nodes", "uncordon", home).stdout.strip() == f"node {home}: not cordoned"
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(third) in ("running", "finished"), 120,
               "the third job to start on the uncordoned node")
        # a drain: the second job checkpoints and resumes on the other node (once the third is done)
        out = c.cli("nodes", "drain", other, "--for", "600").stdout
        assert "its jobs are requeued" in out, out
        c.wait(lambda st: _nodes_of(c, second) == {home}, 120, "the drained job to resume on the other node")
        events = [e for e in c.events() if e.kind in ("node_cordoned", "node_uncordoned")]
        assert [(e.kind, e.node) for e in events] == [("node_cordoned", home), ("node_uncordoned", home),
                                                      ("node_cordoned", other)], events
        assert events[0].detail["why"] == "GPU 0 throttles" and events[0].detail["seconds"] == 600
        # bad input: a clear refusal, nothing changed
        r = c.cli("nodes", "cordon", home, "--for", "-5", check=False)
        assert r.returncode == 2 and "--for must be 1 to 2592000 seconds" in r.stderr, r.stderr
        for bad in (1e12, -1.0, float("nan"), float("inf")):
            with pytest.raises(BadRequestError, match="seconds"):
                c.client.cordon(home, bad)
        with pytest.raises(NotFoundError, match="not registered"):
            c.client.cordon("no-such-node", 60)
        assert [n.name for n in c.client.cluster_status().nodes if n.cordoned_until] == [other]  # (the drain's)


@pytest.mark.slow  # make test-slow (about 25 s: two runs of a 2-node DDP job)
def test_a_straggler_in_a_scheduled_job_gets_its_node_cordoned_and_the_job_runs_elsewhere(tmp_path):
    # 2 one-slot nodes run a 2-node job; a third joins as room to move to. From step 40 the ranks
    # on n1 compute 3x slower: the coordinator flags them from their own work per step, cordons n1
    # and requeues the job, which resumes from its checkpoint on n2 and n3. Every sample once.
    steps = 200
    with Cluster(tmp_path, "fifo", "--straggler-cooldown", "300", nodes=2, slots=1) as c:
        job = c.submit("strag", 2, [MURI_JOB, "--steps", str(steps), "--load-ms", "2", "--compute-ms", "40",
                                    "--straggle-at", "40", "--straggle-node", "n1", "--ckpt-every", "20",
                                    "--ckpt-dir", os.path.join(c.tmp, "ckpt"), "--out", os.path.join(c.tmp, "out.json")],
                       env={"ET_MONITOR_PERIOD": "1", "ET_MONITOR_BATCH": "1"})
        c.wait(lambda st: _nodes_of(c, job) == {"n1", "n2"}, 120, "the job to run on n1 and n2")
        c.start_node("n3")
        c.finish(job, 300)
        events = c.events()
        flags = [e for e in events if e.kind == "straggler"]
        assert flags and flags[0].detail["node"] == "n1", [e.detail for e in flags]
        assert flags[0].detail["action"].startswith("node n1 cordoned for 300 s"), flags[0].detail
        assert [e.node for e in events if e.kind == "node_cordoned"] == ["n1"]
        requeued = [e for e in events if e.kind == "requeue" and e.job == job]
        assert requeued and requeued[0].detail["node"] == "n1", requeued
        later = [e.node for e in events if e.kind == "launch" and e.job == job and e.seq > requeued[0].seq]
        assert sorted(later) == ["n2", "n3"], later  # the next run went elsewhere
        res = c.result("out")
        assert (res["min"], res["max"]) == (1, 1), res  # every sample trained exactly once
        assert any(r.startswith("straggler@") for r in res["reasons"]), res
        n1 = next(n for n in c.client.cluster_status().nodes if n.name == "n1")
        assert n1.cordoned_until > 0 and "a straggler of job" in n1.cordon_why, n1
