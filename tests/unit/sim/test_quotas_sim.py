"""``simulate --quota-gpus/--quota-jobs``: the coordinator's admission rule (coordinator/quotas.py)
in the simulator: a user's jobs wait outside the policy's view until its admitted jobs fit."""

import pytest

from elastictrain.coordinator.quotas import Quota
from elastictrain.errors import ConfigError
from elastictrain.model import JobSpec
from elastictrain.policies import create
from elastictrain.sim.cluster import ClusterSpec
from elastictrain.sim.engine import Simulator


def _jobs():
    jobs = [JobSpec(i, 1, 0.0, 100, 1.0, user="ann") for i in range(4)]  # 4 x 100 s, all at once
    jobs += [JobSpec(10, 2, 0.0, 100, 1.0, user="bob")]
    jobs += [JobSpec(11, 1, 50.0, 100, 1.0, user="ann", priority=5)]  # later, but first in ann's queue
    return jobs


def _run(quota, policy="fifo"):
    log = []
    r = Simulator(_jobs(), ClusterSpec(1, 1, 8), create(policy), quota=quota, decisions=log).run()
    return {j.job_id: j for j in r.jobs}, r, log


def test_a_users_jobs_run_within_its_quota_and_their_wait_counts():
    free, _, _ = _run(None)
    assert all(j.start_time == 0.0 for k, j in free.items() if k != 11)  # 8 GPUs: everyone at once
    held, r, log = _run(Quota(gpus=2))
    starts = sorted((j.start_time, k) for k, j in held.items())
    assert [k for t, k in starts if t == 0.0] == [0, 1, 10]  # ann: 2 of her 4; bob: his own quota
    assert held[11].start_time == pytest.approx(100.0)  # priority 5: admitted before ann's jobs 2 and 3
    assert held[2].start_time == pytest.approx(100.0) and held[3].start_time == pytest.approx(200.0)
    assert held[3].jct == pytest.approx(300.0) and held[3].pending_time == pytest.approx(200.0)
    running = {}
    for t, kind, job, _ in log:  # ann never holds more than 2 GPUs at once
        if kind == "start":
            running[job] = 1
        elif kind in ("finish", "preempt"):
            running.pop(job, None)
        assert sum(1 for k in running if k != 10) <= 2, (t, running)
    assert not r.extra["rejected"] and r.extra["unfinished"] == 0


def test_a_job_quota_and_a_job_bigger_than_the_quota():
    held, _, _ = _run(Quota(jobs=1))
    assert sorted(j.start_time for k, j in held.items() if k < 10) == pytest.approx([0.0, 200.0, 300.0, 400.0])
    jobs, r, _ = _run(Quota(gpus=1))
    assert 10 not in jobs and r.extra["rejected"] == [(10, "needs 2 GPUs but a user's quota is 1")]


def test_simulate_checks_the_quota_flags(tmp_path):
    from elastictrain.sim.run import SimConfig, simulate
    from elastictrain.sim.synth import synthesize, write_native

    trace = str(tmp_path / "t.csv")
    write_native(synthesize(30, seed=3, gpus=16, load=0.9), trace)
    with pytest.raises(ConfigError, match="--quota-gpus/--quota-jobs: a quota's gpus must be"):
        simulate(SimConfig(trace, "n2g8", ["fifo"], quota_gpus=-1), progress=False)
    (free,) = simulate(SimConfig(trace, "n2g8", ["tiresias-l"]), progress=False)
    (held,) = simulate(SimConfig(trace, "n2g8", ["tiresias-l"], quota_gpus=8, quota_jobs=2), progress=False)
    assert len(held.jobs) == len(free.jobs) == 30
    assert sum(j.pending_time for j in held.jobs) > sum(j.pending_time for j in free.jobs)
