"""The scheduler on a real Ray cluster (``coordinator --backend ray``): a Ray node killed under a
running job, and a coordinator killed with -9 that adopts the runs still on Ray. The Tiresias
scenario (preemption and resume, exactly-once ledgers) runs on Ray beside the node daemons and
Slurm in ``test_cluster.py``. Ray is optional: these skip without it (``make test-ray``)."""

import os
import time

import pytest

from elastictrain.launcher.local_cluster import LocalCluster

pytestmark = pytest.mark.ray
pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "examples", "torch_cluster_job.py")


def _job(c, name, gpus, epochs=2, samples=800, **kw):
    return c.submit(name, gpus, [WORKER, "--ckpt-dir", os.path.join(c.tmp, f"ckpt-{name}"), "--out",
                                 os.path.join(c.tmp, f"{name}.json"), "--epochs", str(epochs), "--samples",
                                 str(samples), "--step-sleep", "0.05"], **kw)


@pytest.fixture
def cluster(tmp_path, ray_cluster):
    c = LocalCluster(tmp_path, "fifo", ray_address=ray_cluster.address).start()
    yield c
    c.stop()


def _running(c, job, step):
    return c.wait(lambda st: any(j.id == job and j.status == "running" and j.step >= step for j in st.jobs), 120,
                  f"job {job} to train")


def _ours(kit, c) -> list:
    with open(os.path.join(c.tmp, "ray-runs", "coordinator-id")) as f:
        ns = "elastictrain-" + f.read().strip()
    return sorted(a["name"] for a in kit.named_actors() if a["namespace"] == ns)


def test_a_ray_node_killed_under_a_running_job_requeues_it_on_another(cluster, ray_cluster):
    job = _job(cluster, "lost", 2, epochs=4)
    st = _running(cluster, job, 10)
    (placed,) = [j for j in st.jobs if j.id == job]
    node = placed.placement[0].node
    victim = ray_cluster.node_of(node)
    try:
        ray_cluster.kill(victim)  # the node is lost: its raylet, its actors, etrun and the workers
        cluster.wait(lambda st: any(j.id == job and j.status == "finished" for j in st.jobs), 240, "the job to finish")
        r = cluster.result("lost")
        assert r["min"] == r["max"] == 1, r  # every sample once per epoch, through the loss
        ev = [e for e in cluster.events() if e.job == job]
        launched = {e.node for e in ev if e.kind == "launch"}
        assert node in launched and len(launched) == 2, launched  # resumed on the other node
        assert any(e.kind == "resume" for e in ev), [e.kind for e in ev]
        assert any(x.startswith(("node_lost@", "requeue@", "preempt@")) and int(x.split("@")[1]) > 0
                   for x in r["reasons"]), r["reasons"]  # from its checkpoint, not from the start
        assert any(n.name == node and n.state != "up" for n in cluster.client.cluster_status().nodes)
        assert not _ours(ray_cluster, cluster)  # nothing of the job left on Ray
    finally:
        if victim not in ray_cluster.procs:  # it comes back, as a new Ray node, for the next tests
            ray_cluster.start_worker(victim)
            ray_cluster.wait_nodes(3, 90)


def test_a_restarted_coordinator_adopts_the_runs_still_on_ray(cluster, ray_cluster):
    job = _job(cluster, "adopt", 2, epochs=4)
    _running(cluster, job, 10)
    before = _ours(ray_cluster, cluster)
    assert before and all(a.startswith(f"et.{job}.r") for a in before), before
    cluster.coordinator.kill()  # kill -9: the Ray run goes on without us (its actors are detached)
    time.sleep(2)
    assert _ours(ray_cluster, cluster) == before
    cluster.coordinator.start()
    cluster.wait(lambda st: any(j.id == job and j.status == "finished" for j in st.jobs), 200, "the job to finish")
    launches = [e for e in cluster.events() if e.job == job and e.kind == "launch"]
    assert {e.detail["run"] for e in launches} == {1}, launches  # adopted, never launched again
    r = cluster.result("adopt")
    assert r["min"] == r["max"] == 1, r
    # the output shipped before the restart is kept once: the adopted run's shipping went on from there
    said = [ln for ln in cluster.output(job).splitlines() if "[train] generation" in ln]
    assert said and len(said) == len(set(said)), said
    assert not _ours(ray_cluster, cluster)


def test_a_ray_cluster_without_gpus_runs_jobs_on_its_cpus(tmp_path):
    """A Ray cluster of one node with 4 CPUs and no GPU. Without ``--engine-cpus-per-worker`` the
    coordinator says it has no GPUs and names the option; with 2 CPUs per worker the node offers 2
    worker slots, and a 2-worker job runs in a placement group of one {"CPU": 4} bundle, every
    sample trained on exactly once."""
    from tests.integration.ray_kit import RayKit, missing

    if missing():
        pytest.skip(missing())
    kit = RayKit(gpus=0, workers=()).start()
    try:
        bare = LocalCluster(tmp_path / "bare", "fifo", ray_address=kit.address, nodes=1)
        bare.coordinator.start()
        try:
            assert "has no GPUs" in bare.coordinator_log("--engine-cpus-per-worker N", 60)
        finally:
            bare.stop()
        c = LocalCluster(tmp_path / "cpu", "fifo", "--engine-cpus-per-worker", "2", ray_address=kit.address, nodes=1)
        c.start()
        try:
            (node,) = c.client.cluster_status().nodes
            assert (node.slots, node.kind) == (2, "slot")
            c.finish(_job(c, "cpu", 2), 180)
            r = c.result("cpu")
            assert r["min"] == r["max"] == 1, r  # every sample once
        finally:
            c.stop()
    finally:
        kit.stop()
