"""``coordinator --priority-preemption`` on real jobs: a coordinator running tiresias-l, one node
daemon with 2 CPU slots, a 2-slot DDP job at priority 0 training; the admin submits a 2-slot job at
``--priority 10`` from the CLI. The low job is preempted (it checkpoints), `status` says why it
waits, the high job runs to its end alone, then the low one resumes; each trained on every sample
exactly once."""

import os

import pytest

from elastictrain.launcher.local_cluster import LocalCluster as Cluster

WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                      "torch_cluster_job.py")


def test_a_higher_priority_job_takes_the_slots_and_the_lower_one_resumes_after_it(tmp_path):
    with Cluster(tmp_path, "tiresias-l", "--priority-preemption", nodes=1, slots=2) as c:
        args = ["--samples", "3000", "--step-sleep", "0.05"]
        low = c.submit("low", 2, [WORKER, "--ckpt-dir", os.path.join(c.tmp, "ckpt-low"), "--out",
                                  os.path.join(c.tmp, "low.json"), *args])
        c.wait(lambda st: any(j.id == low and j.step >= 5 for j in st.jobs), 120, "the low job training")
        out = c.cli("submit", "--gpus", "2", "--name", "high", "--priority", "10", "--", WORKER, "--ckpt-dir",
                    os.path.join(c.tmp, "ckpt-high"), "--out", os.path.join(c.tmp, "high.json"), *args).stdout
        high = out.split()[0]
        c.wait(lambda st: any(j.id == high and j.status == "running" for j in st.jobs), 120, "the high job running")
        why = c.cli("status", low).stdout
        assert "jobs of a priority above its 0 hold 2 (--priority-preemption)" in why, why
        assert f"job {high} (high) of default: running; priority 10" in c.cli("status", high).stdout
        table = c.cli("status").stdout
        assert "prio" in table.split("running:")[1].splitlines()[1], table
        assert c.client.cluster_job(low).status == "preempted"
        c.finish(high, 240)
        c.finish(low, 240)
        kinds = [(e.kind, e.job) for e in c.events()]
        assert ("preempted", low) in kinds and ("preempted", high) not in kinds, kinds
        notes = [e for e in c.events() if e.kind == "plan" and e.job == low]
        assert notes and "priority 10, above its 0" in str(notes[0].detail), notes
        ends = {e.job: i for i, e in enumerate(c.events()) if e.kind == "finish"}
        assert ends[high] < ends[low]
        for name in ("low", "high"):
            r = c.result(name)
            assert r["min"] == r["max"] == 1, f"{name}: every sample must be trained on once: {r}"
