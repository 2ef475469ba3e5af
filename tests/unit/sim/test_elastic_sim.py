"""Elastic jobs in the simulator: a trace gives a job ``min_gpu``/``max_gpu`` and a ``serial``
fraction (Amdahl's law); the simulator runs a resized job at that speed and measures its rate as
a live job's shard cursors would, so autoscaling is simulated on the same policy code: a job that
scales linearly grows to its maximum, one that scales poorly settles where a step stops paying."""

import json

import pytest

from elastictrain.errors import ConfigError
from elastictrain.model import JobSpec
from elastictrain.policies import create
from elastictrain.sim.cluster import ClusterSpec
from elastictrain.sim.engine import Simulator
from elastictrain.sim.traces import TraceError, load_trace


def _jobs():
    # 3,600 s of work on 1 GPU each; "lin" scales linearly, "half" has half its iteration serial
    return [JobSpec(0, 1, 0.0, 3600.0, 1.0, model="lin", min_gpu=1, max_gpu=4),
            JobSpec(1, 1, 0.0, 3600.0, 1.0, model="half", min_gpu=1, max_gpu=4, serial=0.5)]


def test_autoscale_grows_a_linear_job_to_its_maximum_and_stops_a_poor_one_where_a_step_no_longer_pays():
    pol = create("autoscale")
    log: list = []
    res = Simulator(_jobs(), ClusterSpec(1, 1, 8), pol, restart_cost=5.0, decisions=log).run()
    assert pol.history == {"lin": 4}  # the size it settled at, remembered by name once it ended
    assert (pol.plans[1].phase, pol.plans[1].target) == ("settled", 2)  # (the last job: no decision after it)
    # Amdahl with serial 0.5: 1 -> 2 workers gains 33% of a worker (>= 0.3: grow), 2 -> 3 only 25%
    # (back to 2); each measurement takes rate_window (10 s) of training after a 5 s start-up
    end = {j.job_id: j.end_time for j in res.jobs}
    assert end[0] < 3600 / 4 + 100  # nearly all of it at 4 workers
    assert 3600 * 0.75 < end[1] < 3600 * 0.75 + 100  # at 2 workers an iteration takes 0.75 of 1's
    assert sum(1 for _, kind, key, _ in log if kind == "resize" and key == 0) == 3  # 1 -> 2 -> 3 -> 4
    assert sum(1 for _, kind, key, _ in log if kind == "resize" and key == 1) == 3  # 1 -> 2 -> 3 -> 2
    assert [j.resizes for j in res.jobs] == [3, 3]  # (the report's resize column adds these up)


def test_a_rigid_policy_runs_elastic_jobs_at_their_submitted_size():
    res = Simulator(_jobs(), ClusterSpec(1, 1, 8), create("fifo"), restart_cost=5.0).run()
    assert sorted(j.end_time for j in res.jobs) == [3605.0, 3605.0]


def test_elastic_columns_of_a_native_trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("job_id,num_gpu,submit_time,iterations,iteration_time,model,user,stage_times,min_gpu,max_gpu,serial\n"
                 "0,2,0,100,1.0,m,u,,1,8,0.1\n"
                 "1,4,5,100,1.0,m,u,,,,\n")
    a, b = load_trace(str(p))
    assert (a.min_gpu, a.max_gpu, a.serial) == (1, 8, 0.1) and (b.min_gpu, b.max_gpu, b.serial) == (0, 0, 0.0)
    assert a.scaling(2) == 1.0 and a.scaling(4) == pytest.approx((0.1 + 0.9 / 4) / (0.1 + 0.9 / 2))
    assert JobSpec(0, 2, 0.0, 1.0, 1.0).scaling(4) == 0.5  # linear without a serial fraction
    p.write_text("job_id,num_gpu,submit_time,iterations,iteration_time,min_gpu,max_gpu,serial\n"
                 "0,2,0,100,1.0,4,8,0\n")
    with pytest.raises(TraceError, match=r"t.csv:2: .*min_gpu <= num_gpu <= max_gpu"):
        load_trace(str(p))
    p.write_text("job_id,num_gpu,submit_time,iterations,iteration_time,min_gpu,max_gpu,serial\n"
                 "0,2,0,100,1.0,1,8,1.5\n")
    with pytest.raises(TraceError, match=r"t.csv:2: .*serial"):
        load_trace(str(p))
    with pytest.raises(ConfigError, match="serial"):
        JobSpec(0, 2, 0.0, 1.0, 1.0, serial=-0.1)


def test_synth_elastic_changes_only_the_elastic_fields_and_round_trips(tmp_path):
    from elastictrain.sim.synth import synthesize, write_native

    plain, flex = synthesize(400, seed=5, gpus=32), synthesize(400, seed=5, gpus=32, elastic=0.5)
    strip = [(j.job_id, j.num_gpu, j.submit_time, j.iterations, j.iteration_time, j.model, j.user) for j in flex]
    assert strip == [(j.job_id, j.num_gpu, j.submit_time, j.iterations, j.iteration_time, j.model, j.user)
                     for j in plain]
    elastic = [j for j in flex if j.max_gpu]
    assert 150 < len(elastic) < 250 and not any(j.max_gpu or j.serial for j in plain)
    assert all(1 <= j.min_gpu <= j.num_gpu <= j.max_gpu <= 32 and 0 <= j.serial <= 0.3 for j in elastic)
    back = load_trace(write_native(flex, str(tmp_path / "e.csv.gz")))
    assert [(j.min_gpu, j.max_gpu, j.serial) for j in back] == [(j.min_gpu, j.max_gpu, j.serial) for j in flex]
    with pytest.raises(ConfigError, match="--elastic"):
        synthesize(10, elastic=1.5)


def test_a_policy_reads_a_resized_jobs_iteration_time_at_the_size_it_runs():
    """As a live job's measured step time: job 0 (1 GPU, 1..4 workers) runs on 4, so an iteration
    there takes a quarter as long (linear), and "half" (serial 0.5) 0.625 of its time on 1."""
    seen = {}

    class Watch:
        def __init__(self):
            self.inner = create("backfill")
            self.name, self.needs = "backfill", self.inner.needs

        def decide(self, s):
            for j in s.running:
                if not j.starting:
                    seen[j.job_id] = (j.num_gpu, j.iteration_time, j.remaining_time)
            return self.inner.decide(s)

    jobs = _jobs()
    Simulator(jobs + [JobSpec(2, 1, 100.0, 10.0, 1.0)], ClusterSpec(1, 1, 9), Watch(), restart_cost=5.0).run()
    assert seen[0][:2] == (4, 0.25) and seen[1][:2] == (4, pytest.approx((0.5 + 0.5 / 4) / 1.0)), seen
    # its time left at 4 workers when job 2 ends (t=115, after 110 s of training): 3,160 iterations of 0.25 s
    assert seen[0][2] == pytest.approx((3600 - 4 * 110) / 4), seen


def test_simulate_grow_lets_backfill_grow_elastic_jobs_and_without_it_they_keep_their_size(tmp_path):
    from elastictrain.cli import main

    trace = tmp_path / "e.csv"
    # 8 GPUs: job 0 (rigid, 6) runs until 600; elastic job 1 (1..8, 8 at submission) starts on the 2
    # left; with --grow it grows to 8 when job 0 ends (one resize); without, it ends on 2
    trace.write_text("job_id,num_gpu,submit_time,iterations,iteration_time,min_gpu,max_gpu\n"
                     "0,6,0,600,1.0,,\n1,8,1,2000,1.0,1,8\n")
    resizes = []
    for extra in (["--grow"], []):
        assert main(["simulate", "--trace", str(trace), "--cluster", "n1g8", "--policy", "backfill",
                     "--no-progress", "--out", str(tmp_path / "out"), *extra]) == 0
        resizes.append(json.loads((tmp_path / "out" / "summary.json").read_text())[0]["resizes"])
    assert resizes == [1, 0], resizes
