"""The scheduler on a real Slurm (``coordinator --backend slurm``): what Slurm itself does to our
jobs (an outside requeue, an outside cancel), a heterogeneous placement, a coordinator killed
with -9 that adopts the Slurm jobs still running, a slurmd killed under a job, and the dry run's
batch script. The Tiresias scenario runs on Slurm and on the node daemons alike in
``test_cluster.py`` (the default run); the slower scenarios here run in ``make test-slow``."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from elastictrain.launcher.local_cluster import LocalCluster

pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "examples", "torch_cluster_job.py")


def _job(c, name, gpus, epochs=2, samples=800, **kw):
    return c.submit(name, gpus, [WORKER, "--ckpt-dir", os.path.join(c.tmp, f"ckpt-{name}"), "--out",
                                 os.path.join(c.tmp, f"{name}.json"), "--epochs", str(epochs), "--samples",
                                 str(samples), "--step-sleep", "0.05"], **kw)


def _slurm_jobs(kit) -> list:
    return json.loads(kit.run("squeue", "--json"))["jobs"]


def _ours(kit, job: str, c) -> list:
    """The Slurm jobs of ``job`` of cluster ``c``'s coordinator (job ids repeat across tests)."""
    with open(os.path.join(c.tmp, "slurm-runs", "coordinator-id")) as f:
        comment = "elastictrain:" + f.read().strip()
    return [j for j in _slurm_jobs(kit) if j["name"].startswith(f"et.{job}.r") and j.get("comment") == comment]


def _active(kit, job: str, c) -> list:
    return [j for j in _ours(kit, job, c) if j["job_state"] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")]


@pytest.fixture
def cluster(tmp_path, slurm):
    c = LocalCluster(tmp_path, "fifo", slurm_conf=slurm.conf).start()
    yield c
    c.stop()


def _wait_training(c, job, step=5, timeout=120):
    c.wait(lambda st: any(j.id == job and j.status == "running" and j.step >= step for j in st.jobs), timeout,
           f"job {job} to train")


@pytest.mark.slow  # make test-slow: the default run keeps the Tiresias scenario on Slurm
def test_an_outside_requeue_resumes_the_job_from_its_checkpoint_once(cluster, slurm):
    job = _job(cluster, "rq", 2, epochs=3)
    _wait_training(cluster, job, step=15)
    (first,) = _active(slurm, job, cluster)
    slurm.run("scontrol", "requeue", str(first["job_id"]))  # an admin's requeue, as Slurm's own preemption
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:  # never two copies of the job running in Slurm at once
        assert len([j for j in _active(slurm, job, cluster) if j["job_state"] == "RUNNING"]) <= 1
        st = cluster.client.cluster_job(job)
        if st.status in ("finished", "failed", "cancelled"):
            break
        time.sleep(0.5)
    st = cluster.client.cluster_job(job)
    assert st.status == "finished", (st.status, st.reason, cluster.tail())
    r = cluster.result("rq")
    assert r["min"] == r["max"] == 1, r
    assert any(x.startswith("requeue@") and int(x.split("@")[1]) > 0 for x in r["reasons"]), r["reasons"]
    kinds = [e.kind for e in cluster.events() if e.job == job]
    assert "requeue" in kinds, kinds


def test_an_outside_scancel_cancels_the_job(cluster, slurm):
    job = _job(cluster, "sc", 1, epochs=20)
    _wait_training(cluster, job)
    (first,) = _active(slurm, job, cluster)
    slurm.run("scancel", str(first["job_id"]))
    cluster.wait(lambda st: any(j.id == job and j.status == "cancelled" for j in st.jobs), 60, "the job cancelled")
    time.sleep(3)
    assert not _active(slurm, job, cluster)
    assert cluster.client.cluster_job(job).status == "cancelled"  # not requeued, not failed


def test_a_job_needing_a_gpu_type_runs_on_the_slurm_nodes_of_that_gres_type(tmp_path, slurm):
    """n1's GRES is gpu:a100:2, n2's gpu:v100:2: the coordinator reads the types from sinfo, and a
    job submitted with --gres gpu:v100:2 gets a batch job pinned to n2 (and one with a100, to n1).
    With --slurm-accounts, the job charged to project vision (-A) is Slurm's account vision. The
    cluster is two partitions (--slurm-partition one,two: n1 and n2): each run goes to its node's."""
    c = LocalCluster(tmp_path, "fifo", "--slurm-accounts", slurm_conf=slurm.conf, partition="one,two").start()
    try:
        c.wait(lambda st: sorted(n.gpu_type for n in st.nodes) == ["a100", "v100"], 30, "the GRES types")
        with open(os.path.join(c.tmp, "nap.py"), "w") as f:
            f.write("import time\ntime.sleep(1.0)\n")
        c.cli("projects", "set", "vision", "--users", c.client.whoami().name)
        v = c.cli("submit", "--gres", "gpu:v100:2", "-A", "vision", "--", "nap.py").stdout.strip()
        a = c.cli("submit", "--gpu-type", "a100", "--", "nap.py").stdout.strip()
        c.wait(lambda st: all({j.id: j.status for j in st.jobs}.get(k) == "finished" for k in (v, a)), 120,
               "both jobs to finish on Slurm")
        ran = {k: {j["nodes"] for j in _ours(slurm, k, c)} for k in (v, a)}  # (squeue keeps ended jobs 300 s)
        assert ran == {v: {"n2"}, a: {"n1"}}, ran
        accounts = {k: {j["account"] for j in _ours(slurm, k, c)} for k in (v, a)}
        assert accounts[v] == {"vision"} and "vision" not in accounts[a], accounts
        partitions = {k: {j["partition"] for j in _ours(slurm, k, c)} for k in (v, a)}
        assert partitions == {v: {"two"}, a: {"one"}}, partitions
    finally:
        c.stop()


def test_a_partition_without_gpus_runs_jobs_on_its_cpus(tmp_path, slurm):
    """Partition ``cpu`` (node n3: 4 CPUs, no GRES). Without ``--engine-cpus-per-worker`` the
    coordinator says it has no GPUs and how to schedule its CPUs; with 2 CPUs per worker n3 offers
    2 worker slots, and a 2-worker job runs there as one Slurm job asking 4 CPUs, no GRES, with
    every sample trained on exactly once."""
    bare = LocalCluster(tmp_path / "bare", "fifo", slurm_conf=slurm.conf, partition="cpu")
    bare.coordinator.start()
    try:
        assert "partition 'cpu' (no node has gpu GRES" in bare.coordinator_log("--engine-cpus-per-worker N", 30)
    finally:
        bare.stop()
    c = LocalCluster(tmp_path / "cpu", "fifo", "--slurm-cpus-per-worker", "2", slurm_conf=slurm.conf,
                     partition="cpu", nodes=1)
    c.start()
    try:
        (node,) = c.client.cluster_status().nodes
        assert (node.name, node.slots, node.kind) == ("n3", 2, "slot")
        c.finish(_job(c, "cpu", 2), 120)
        r = c.result("cpu")
        assert r["min"] == r["max"] == 1, r  # every sample once
        (script,) = [os.path.join(d, "job.sh") for d, _, files in os.walk(os.path.join(c.tmp, "slurm-runs"))
                     if "job.sh" in files]
        with open(script) as f:
            lines = f.read().splitlines()
        assert "#SBATCH --nodelist=n3" in lines and "#SBATCH --cpus-per-task=4" in lines, lines
        assert not any("--gres" in line for line in lines), lines
    finally:
        c.stop()


@pytest.mark.slow  # make test-slow: the default run keeps the Tiresias scenario on Slurm
def test_unequal_gpus_per_node_run_as_one_heterogeneous_slurm_job(tmp_path, slurm):
    c = LocalCluster(tmp_path, "fifo", slurm_conf=slurm.conf).start()
    try:
        filler = _job(c, "fill", 1, epochs=30)  # takes one GPU of n1: a 3-GPU job must span both nodes
        _wait_training(c, filler)
        job = _job(c, "het", 3, epochs=1, samples=600)
        c.wait(lambda st: any(j.id == job and j.status == "finished" for j in st.jobs), 150, "the 3-GPU job")
        script = open(os.path.join(tmp_path, "slurm-runs", "slurm", job, "run1", "job.sh")).read()
        assert "#SBATCH hetjob" in script and "--het-group=0" in script and "--het-group=1" in script, script
        r = c.result("het")
        assert r["world"] == 3 and r["min"] == r["max"] == 1, r
        c.client.cancel(filler)
    finally:
        c.stop()


@pytest.mark.slow  # make test-slow: the default run keeps the Tiresias scenario on Slurm
def test_a_restarted_coordinator_adopts_the_slurm_jobs_still_running(cluster, slurm):
    job = _job(cluster, "adopt", 2, epochs=4)
    _wait_training(cluster, job, step=10)
    (before,) = _active(slurm, job, cluster)
    cluster.coordinator.kill()  # kill -9: the Slurm job goes on without us
    time.sleep(2)
    cluster.coordinator.start()
    cluster.wait(lambda st: any(j.id == job and j.status == "finished" for j in st.jobs), 200, "the job to finish")
    runs = {j["job_id"] for j in _ours(slurm, job, cluster)}
    assert runs == {before["job_id"]}, f"a second Slurm job was started: {runs}"  # adopted, not started again
    r = cluster.result("adopt")
    assert r["min"] == r["max"] == 1, r
    # the output shipped before the restart is kept once: the adopted run's shipping went on from there
    said = [ln for ln in cluster.output(job).splitlines() if "[train] generation" in ln]
    assert said and len(said) == len(set(said)), said


@pytest.mark.slow  # make test-slow: the default run keeps the Tiresias scenario on Slurm
def test_a_slurmd_killed_under_a_running_job_requeues_it_elsewhere(cluster, slurm):
    job = _job(cluster, "nf", 2, epochs=4)
    _wait_training(cluster, job, step=10)
    (first,) = _active(slurm, job, cluster)
    node = first["nodes"]
    os.kill(slurm.slurmd_pid(node), signal.SIGKILL)  # the node's daemon dies: Slurm stops hearing from it
    try:
        cluster.wait(lambda st: any(j.id == job and j.status == "finished" for j in st.jobs), 240, "the job to finish")
        r = cluster.result("nf")
        assert r["min"] == r["max"] == 1, r
        ev = [e for e in cluster.events() if e.job == job and e.kind in ("requeue", "exit", "resume")]
        assert any(e.kind == "resume" for e in ev), ev  # resumed as a new run, from its checkpoint
        assert any(x.startswith(("node_lost@", "requeue@")) for x in r["reasons"]), r["reasons"]
    finally:
        slurm.start_slurmd(node)


def test_a_drained_slurm_node_keeps_its_job_running_and_takes_no_new_one(cluster, slurm):
    # an admin drains the node under a running job: Slurm lets the job finish, and so does the
    # coordinator (it cordons the node), placing the next job on the other node; RESUME lifts it
    job = _job(cluster, "dr", 2, epochs=3)
    _wait_training(cluster, job, step=5)
    (first,) = _active(slurm, job, cluster)
    node = first["nodes"]
    other = ({"n1", "n2"} - {node}).pop()
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=maintenance")
    try:
        cluster.wait(lambda st: any(n.name == node and n.cordoned_until for n in st.nodes), 30,
                     f"{node} to be cordoned")
        second = _job(cluster, "dr2", 2, epochs=1)
        st = cluster.wait(lambda st: any(second in n.jobs for n in st.nodes), 120, "the second job to be placed")
        assert [n.name for n in st.nodes if second in n.jobs] == [other]
        deadline = time.monotonic() + 60
        running = []
        while not running and time.monotonic() < deadline:
            running = [j for j in _ours(slurm, second, cluster) if j["job_state"] in ("RUNNING", "COMPLETED")]
            time.sleep(0.2)
        assert [j["nodes"] for j in running] == [other], _ours(slurm, second, cluster)  # where Slurm ran it
        cluster.finish(job, 240)
        cluster.finish(second, 240)
        assert cluster.result("dr")["min"] == cluster.result("dr")["max"] == 1
        kinds = [e.kind for e in cluster.events() if e.job == job]
        assert "requeue" not in kinds and "preempt" not in kinds, kinds  # it ran on, on the drained node
        st = cluster.client.cluster_status()
        n = next(n for n in st.nodes if n.name == node)
        assert n.state == "up" and "slurm says the node is drain" in n.cordon_why, n
    finally:
        slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
    cluster.wait(lambda st: not any(n.name == node and n.cordoned_until for n in st.nodes), 30,
                 f"{node}'s cordon to be lifted")
    ev = [(e.kind, e.node, e.detail.get("by")) for e in cluster.events() if e.kind.startswith("node_")
          and e.kind.endswith("cordoned")]
    assert ev == [("node_cordoned", node, "engine"), ("node_uncordoned", node, None)], ev


def test_dry_run_prints_the_batch_script():
    r = subprocess.run([sys.executable, "-m", "elastictrain", "submit", "--dry-run", "--backend", "slurm",
                        "--slurm-partition", "gpu", "--nodes", "n1:2,n2:1", "--name", "train", "--workdir",
                        os.path.join(ROOT, "examples"), "--", "torch_ddp_elastic.py", "--epochs", "3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    s = r.stdout
    assert s.startswith("#!/bin/bash") and "#SBATCH --partition=gpu" in s and "#SBATCH --requeue" in s
    assert "#SBATCH --nodelist=n1" in s and "#SBATCH --gres=gpu:2" in s and "#SBATCH hetjob" in s
    assert "exec srun" in s and "--rdzv-id train" in s and "torch_ddp_elastic.py --epochs 3" in s
