"""The coordinator schedules live jobs: a real coordinator with a policy, two node daemons with
2 CPU slots each, and six real DDP training jobs (gloo, loopback) of different lengths, some
submitted while others run. Each job keeps an exactly-once ledger of its samples."""

import glob
import os
import time

import pytest

from elastictrain.launcher.local_cluster import LocalCluster as Cluster
from elastictrain.launcher.local_cluster import max_slots_in_use

WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                      "torch_cluster_job.py")

# (name, gpus, epochs, samples): long jobs first, short ones arrive while they run
LONG = [("long-a", 2, 8, 1200), ("long-b", 2, 8, 1200)]
SHORT = [("short-a", 1, 1, 400), ("short-b", 2, 1, 400)]
LATE = [("mid-a", 1, 2, 400), ("mid-b", 1, 1, 800)]
ALL = LONG + SHORT + LATE


def submit(c: Cluster, name: str, gpus: int, epochs: int, samples: int) -> str:
    """One training job whose ledger lands in ``<name>.json``."""
    return c.submit(name, gpus, [WORKER, "--ckpt-dir", os.path.join(c.tmp, f"ckpt-{name}"), "--out",
                                 os.path.join(c.tmp, f"{name}.json"), "--epochs", str(epochs), "--samples",
                                 str(samples), "--step-sleep", "0.05"])


def _run_workload(c: Cluster, during=None, first_queue: float = 20.0, long_epochs: int = 0) -> dict:
    """``long_epochs``: the long jobs' epochs, when they must outlast a larger first queue."""
    ids = {}
    for name, gpus, epochs, samples in LONG:
        ids[name] = submit(c, name, gpus, long_epochs or epochs, samples)
    # the long jobs run first, and use up Tiresias' first queue (20 GPU-seconds here): the short
    # jobs that come next fit in theirs with room to spare, even on a slow machine
    c.wait(lambda st: sum(j.attained_gpu > first_queue + 4 and j.step > 3 for j in st.jobs) == 2, 120,
           "the long jobs to train past the first queue")
    for name, gpus, epochs, samples in SHORT:
        ids[name] = submit(c, name, gpus, epochs, samples)
    if during is not None:
        during(c, ids)
    time.sleep(2)
    for name, gpus, epochs, samples in LATE:
        ids[name] = submit(c, name, gpus, epochs, samples)
    c.wait_all(len(ALL), timeout=200)  # under pytest-timeout (300 s), so a failure shows status and logs
    return ids


def _check_common(c: Cluster, ids: dict, workload=ALL) -> tuple[dict, list]:
    st = c.client.cluster_status()
    jobs = {j.name: j for j in st.jobs}
    assert all(j.status == "finished" for j in jobs.values()), {n: (j.status, j.reason) for n, j in jobs.items()}
    for name, _, epochs, _ in workload:
        r = c.result(name)
        assert r["min"] == r["max"] == 1, f"{name}: every sample must be trained on once per epoch: {r}"
    events = c.events()
    most = max_slots_in_use(events, c.slots)
    assert most and all(v <= c.slots for v in most.values()), f"more slots in use than a node has: {most}"
    # a job never has two runs alive at once (nothing runs twice), and every exit follows a launch
    alive: dict = {}  # job -> run -> tasks launched and not exited
    for e in events:
        if e.kind not in ("launch", "exit"):
            continue
        runs = alive.setdefault(e.job, {})
        run = e.detail["run"]
        if e.kind == "launch":
            others = [r for r, n in runs.items() if n > 0 and r != run]
            assert not others, f"job {e.job} launched run {run} while run(s) {others} were alive"
            runs[run] = runs.get(run, 0) + 1
        else:
            assert runs.get(run, 0) > 0, f"exit of a task never launched: {e}"
            runs[run] -= 1
    return jobs, events


@pytest.fixture
def cluster_factory(tmp_path):
    made = []

    def make(policy, *args, **kw):
        c = Cluster(tmp_path, policy, *args, **kw).start()
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


# on Slurm the scenario takes about a minute: it runs in make test-slow (the default run keeps
# Slurm's own tests, test_slurm_engine.py, and stays under 15 minutes)
@pytest.fixture(params=["nodes", pytest.param("slurm", marks=pytest.mark.slow),
                        pytest.param("ray", marks=pytest.mark.ray)])
def engine_cluster(request, cluster_factory):
    """The same scenario on every engine: our node daemons, a real Slurm and a real Ray (one contract)."""
    kit = None
    if request.param == "nodes":
        make = lambda policy, *args: cluster_factory(policy, *args)  # noqa: E731
    elif request.param == "ray":
        kit = request.getfixturevalue("ray_cluster")
        make = lambda policy, *args: cluster_factory(policy, *args, ray_address=kit.address)  # noqa: E731
    else:
        kit = request.getfixturevalue("slurm")
        make = lambda policy, *args: cluster_factory(policy, *args, slurm_conf=kit.conf)  # noqa: E731
    make.engine, make.kit = request.param, kit
    return make


def _slurm_never_ran_a_job_twice(c: Cluster, kit) -> None:
    """From Slurm's own records: no two Slurm jobs (runs) of one of our jobs overlapped."""
    import json

    with open(os.path.join(c.tmp, "slurm-runs", "coordinator-id")) as f:
        comment = "elastictrain:" + f.read().strip()
    spans: dict = {}
    for j in json.loads(kit.run("squeue", "--json"))["jobs"]:
        if j.get("comment") == comment and j.get("start_time"):
            job = j["name"].rsplit(".r", 1)[0]
            spans.setdefault(job, []).append((j["start_time"], j["end_time"], j["job_id"]))
    assert spans, "no Slurm jobs seen"
    for job, runs in spans.items():
        runs.sort()
        for (s1, e1, a), (s2, e2, b) in zip(runs, runs[1:]):
            assert s2 >= e1, f"{job}: Slurm jobs {a} and {b} ran at once ({s1}-{e1}, {s2}-{e2})"


def test_tiresias_preempts_long_jobs_for_short_ones_and_resumes_them_exactly_once(engine_cluster):
    # Tiresias' first queue in GPU-seconds, the same on every engine: a start through Slurm (sbatch,
    # its scheduling pass, srun) costs seconds more than a node daemon's, but start-up is not
    # service (it was: this queue had to be 32 on Slurm)
    first = 20
    c = engine_cluster("tiresias-l", "--thresholds", str(first))
    # off the node daemons the long jobs train longer: workers forked from etrun's zygote start so
    # fast that 8 epochs were done before the short jobs came
    ids = _run_workload(c, first_queue=first, long_epochs=0 if engine_cluster.engine == "nodes" else 14)
    jobs, events = _check_common(c, ids)
    if engine_cluster.engine == "slurm":
        _slurm_never_ran_a_job_twice(c, engine_cluster.kit)
    if engine_cluster.engine == "ray":  # every run went through Ray, and none is left there
        assert {e.node for e in events if e.kind == "launch"} <= {n.name for n in c.client.cluster_status().nodes}
        assert all(e.node.startswith("ray-") for e in events if e.kind == "launch")
        assert not [a for a in engine_cluster.kit.named_actors() if a["namespace"].startswith("elastictrain")]
        assert c.client.job_logs(ids["short-a"]).chunks, "the run's output reached the coordinator"
    preempted = {e.job for e in events if e.kind == "preempted"}
    resumed = {e.job for e in events if e.kind == "resume"}
    assert preempted and preempted <= resumed, (preempted, resumed)
    for name, job in jobs.items():
        if job.id in resumed:
            reasons = c.result(name)["reasons"]
            assert any(r.startswith("preempt@") and int(r.split("@")[1]) > 0 for r in reasons), \
                f"{name} resumed but not from its checkpoint: {reasons}"
    if engine_cluster.engine == "nodes":  # the node daemons keep a zygote between tasks: a resume forks at once
        logs = glob.glob(os.path.join(c.tmp, "state-*", "jobs", "*", "run[2-9]", "etrun.log"))
        assert any("forking workers from the kept zygote" in open(p, errors="replace").read() for p in logs), logs
    # 2D-LAS: the short jobs, submitted after the long ones had run a while, finish first
    end = {n: j.end_time for n, j in jobs.items()}
    assert max(end["short-a"], end["short-b"]) < min(end["long-a"], end["long-b"]), end
    assert all(j.attained_gpu > 0 for j in jobs.values())


@pytest.mark.slow  # make test-slow (the default run stays under 15 minutes)
def test_fifo_never_preempts(cluster_factory):
    c = cluster_factory("fifo")
    ids = _run_workload(c)
    jobs, events = _check_common(c, ids)
    assert not [e for e in events if e.kind in ("preempt", "preempted", "requeue")]
    starts = sorted((e.seq, e.job) for e in events if e.kind == "start")
    assert [job for _, job in starts] == [ids[n] for n, *_ in ALL], "FIFO starts jobs in submission order"


@pytest.mark.slow  # make test-slow: the default run stays under 15 minutes
def test_coordinator_kill_9_loses_nothing(cluster_factory):
    c = cluster_factory("tiresias-l", "--thresholds", "20")

    def crash(c, ids):
        c.wait(lambda st: any(j.name.startswith("short") and j.status == "running" and j.step > 2 for j in st.jobs),
               120, "a short job to train")
        c.coordinator.kill()  # kill -9: no chance to write anything
        time.sleep(3)  # the agents keep training through the outage
        c.coordinator.start()

    ids = _run_workload(c, crash)
    jobs, events = _check_common(c, ids)
    # the jobs that ran through the outage were re-adopted: their run went on, nothing relaunched it
    for e in events:
        if e.kind == "launch":
            assert sum(1 for x in events if x.kind == "launch" and x.job == e.job and x.node == e.node
                       and x.detail["run"] == e.detail["run"]) == 1


@pytest.mark.slow  # make test-slow (24 s; node loss is also in test_cluster_scheduler.py's unit tests)
def test_node_daemon_kill_9_requeues_its_jobs_from_their_checkpoints(cluster_factory):
    c = cluster_factory("tiresias-l", "--thresholds", "20", node_timeout=4.0)

    # the long jobs alone (the queueing scenario is test_tiresias_preempts_...): one trains on n2
    ids = {name: submit(c, name, gpus, epochs, samples) for name, gpus, epochs, samples in LONG}
    st = c.wait(lambda st: any(j.status == "running" and j.step > 2 and any(p.node == "n2" for p in j.placement)
                               for j in st.jobs), 120, "a job training on n2")
    victims = [j.id for j in st.jobs if j.status == "running" and any(p.node == "n2" for p in j.placement)]
    c.kill_node("n2")
    c.wait(lambda st: any(n.name == "n2" and n.state == "down" for n in st.nodes) or
           all(j.status != "running" or not any(p.node == "n2" for p in j.placement)
               for j in st.jobs if j.id in victims), 60, "n2's jobs to be requeued")
    c.start_node("n2")  # it comes back and registers again
    c.wait_all(len(LONG), timeout=200)
    jobs, events = _check_common(c, ids, LONG)
    assert [e for e in events if e.kind == "requeue" or (e.kind == "preempted" and e.detail.get("codes"))]
    assert [e for e in events if e.kind == "node_up" and e.node == "n2"]
