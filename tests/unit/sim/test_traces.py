import os

import pytest

from elastictrain.model import JobSpec
from elastictrain.sim.cluster import load_cluster
from elastictrain.sim.traces import TraceError, load_trace

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "data")
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))), "traces")


def test_tiresias_csv_in_seconds():
    jobs = load_trace(os.path.join(DATA, "60_job.csv"))
    assert len(jobs) == 60 and jobs[0].job_id == 0
    assert abs(jobs[0].duration - 164) < 1e-6  # duration column, seconds


def test_muri_csv_in_milliseconds(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("job_id,num_gpu,submit_time,iterations,model_name,batch_size,duration,interval,iteration_time,"
                 "resource_time_0,resource_time_1,resource_time_2,priority\n"
                 "7,8,2000,100,vgg16,16,21400,0,214,82,75,66,0\n")
    (j,) = load_trace(str(p))
    assert (j.job_id, j.num_gpu, j.submit_time, j.iteration_time) == (7, 8, 2.0, 0.214)
    assert j.stage_times == (0.082, 0.075, 0.066)


@pytest.mark.parametrize("text, words", [
    ("", ["header lacks column(s) job_id"]),
    ("job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n", ["has no jobs"]),
    ("job_id,num_gpu\n1,2\n", [":1:", "header lacks column(s) submit_time, iterations"]),
    ("job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n1,1,0,1,m,1,0\n1,1,0,1,m,1,0\n",
     ["job_id 1 appears twice"]),
])
def test_empty_and_broken_files_say_what_is_wrong(tmp_path, text, words):
    p = tmp_path / "x.csv"
    p.write_text(text)
    with pytest.raises(TraceError) as exc:
        load_trace(str(p), "tiresias")
    for w in words:
        assert w in str(exc.value)
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="b.csv"):
        load_trace(str(binary), "tiresias")


def test_native_format(tmp_path):
    p = tmp_path / "n.csv"
    p.write_text("job_id,num_gpu,submit_time,iterations,iteration_time,model,user,stage_times\n"
                 "1,2,5,10,0.5,bert,alice,0.1;0.4\n")
    (j,) = load_trace(str(p))
    assert (j.user, j.stage_times, j.duration) == ("alice", (0.1, 0.4), 5.0)


def test_native_priorities_round_trip(tmp_path):
    from elastictrain.sim.synth import synthesize, write_native
    from elastictrain.sim.traces import _native_checked, _native_fast

    jobs = [JobSpec(j.job_id, j.num_gpu, j.submit_time, j.iterations, j.iteration_time, j.model, j.stage_times, j.user,
                    priority=j.job_id % 3 - 1) for j in synthesize(50, seed=3, gpus=16)]
    p = write_native(jobs, str(tmp_path / "p.csv"))
    assert load_trace(p) == _native_checked(p) == _native_fast(p) == jobs
    plain = write_native(synthesize(5, seed=3, gpus=16), str(tmp_path / "q.csv"))
    assert "priority" not in open(plain).readline()  # (the column only where a job has one)


def test_native_fast_reading_equals_the_checked_one(tmp_path):
    from elastictrain.sim.synth import synthesize, write_native
    from elastictrain.sim.traces import _native_checked, _native_fast

    p = write_native(synthesize(300, seed=2, gpus=32), str(tmp_path / "s.csv"))
    fast = _native_fast(p)
    assert fast is not None and fast == _native_checked(p) and len(fast) == 300
    # what the tight loop does not take (a GPU count written 2.0, a blank line) goes the checked way, same result
    q = tmp_path / "odd.csv"
    q.write_text("job_id,num_gpu,submit_time,iterations,iteration_time,model,user,stage_times\n"
                 "1,2.0,5,10,0.5,bert,alice,0.1;0.4\n\n2,1,3,4,1,,,\n")
    assert _native_fast(str(q)) is None
    assert [(j.job_id, j.num_gpu, j.submit_time, j.stage_times) for j in load_trace(str(q))] == \
        [(2, 1, 3.0, ()), (1, 2, 5.0, (0.1, 0.4))]


TIRESIAS = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
NATIVE = "job_id,num_gpu,submit_time,iterations,iteration_time,model,user,stage_times\n"


@pytest.mark.parametrize("text, words", [
    (TIRESIAS + "3,two,0,10,vgg16,5,0", ["'num_gpu'", "'two'"]),
    (TIRESIAS + "3,1,0,,vgg16,5,0", ["'iterations'", "missing"]),
    (TIRESIAS + "3,0,0,10,vgg16,5,0", ["'num_gpu'", "'0'", ">= 1"]),
    (TIRESIAS + "3,1.5,0,10,vgg16,5,0", ["'num_gpu'", "whole number"]),
    (TIRESIAS + "3,1,-4,10,vgg16,5,0", ["'submit_time'", "'-4'", ">= 0"]),
    (TIRESIAS + "3,1,nan,10,vgg16,5,0", ["'submit_time'", "'nan'", "finite"]),
    (TIRESIAS + "3,1,0,inf,vgg16,5,0", ["'iterations'", "finite"]),
    (TIRESIAS + "3,1,0,10,vgg16,0,0", ["'duration'", "> 0"]),
    (TIRESIAS + "3,1,0,10,vgg16,1e300,0", ["'duration'", "below 1e15"]),
    (NATIVE + "1,2,5,10,0.5,bert,alice,0.1;x", ["'stage_times'", "'x'", "not a number"]),
    (NATIVE + "1,2,5,10,0.5,bert,alice,0.1;-2", ["'stage_times'", "'-2'", ">= 0"]),
    (NATIVE + "1,2,5,10,0.5,bert,alice,nan", ["'stage_times'", "finite"]),
    (NATIVE + "1,2,5,0,0.5,bert,alice,", ["'iterations'", "> 0"]),
    (NATIVE + "1,2,5,10", ["'iteration_time'", "missing"]),
    (NATIVE[:-1] + ",priority\n1,2,5,10,0.5,bert,alice,,high", ["'priority'", "'high'"]),
    (NATIVE[:-1] + ",priority\n1,2,5,10,0.5,bert,alice,,2000", ["priority must be an integer from -1000 to 1000"]),
])
def test_bad_rows_name_file_line_column_value(tmp_path, text, words):
    p = tmp_path / "x.csv"
    p.write_text(text + "\n")
    with pytest.raises(TraceError) as exc:
        load_trace(str(p))
    for w in ["x.csv:2", *words]:
        assert w in str(exc.value)


def test_gavel_trace_gzipped_with_its_throughput_table():
    path = os.path.join(SHIPPED, "gavel", "msr_seed0", "0e4a51.trace.gz")
    jobs = load_trace(path)
    assert jobs and all(j.iteration_time > 0 and j.num_gpu >= 1 for j in jobs)


def test_cluster_specs(tmp_path):
    assert load_cluster("n8g8").total_gpus == 64
    p = tmp_path / "c.csv"
    p.write_text("num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n2,4,8,92,520\n")
    c = load_cluster(str(p))
    assert (c.nodes, c.total_gpus) == (8, 64)


def test_trace_synth_is_deterministic_philly_like_and_loads(tmp_path, capsys):
    from elastictrain.cli import main

    out = tmp_path / "s.csv.gz"
    assert main(["trace", "synth", "--jobs", "500", "--seed", "3", "--out", str(out), "--gpus", "32"]) == 0
    assert "wrote" in capsys.readouterr().out
    jobs = load_trace(str(out))
    assert len(jobs) == 500 and all(1 <= j.num_gpu <= 32 for j in jobs)
    assert {j.user for j in jobs} == {f"user{i}" for i in range(8)} and any(j.stage_times for j in jobs)
    again = tmp_path / "again.csv.gz"
    main(["trace", "synth", "--jobs", "500", "--seed", "3", "--out", str(again), "--gpus", "32"])
    assert [(j.num_gpu, j.submit_time, j.iterations) for j in load_trace(str(again))] == \
        [(j.num_gpu, j.submit_time, j.iterations) for j in jobs]
    assert main(["trace", "synth", "--jobs", "0", "--out", str(out)]) == 2
    assert "--jobs must be in" in capsys.readouterr().err


def test_simulate_checks_every_policy_first_and_runs_them_in_parallel(tmp_path, capsys):
    from elastictrain.cli import main

    trace = os.path.join(SHIPPED, "tiresias", "60_job.csv")
    assert main(["simulate", "--trace", trace, "--cluster", "n2g4", "--policy", "srtf,nope", "--no-progress"]) == 2
    assert "'nope' is not registered" in capsys.readouterr().err  # before srtf ran
    assert main(["simulate", "--trace", trace, "--cluster", "n2g4", "--policy", "tiresias-g", "--distribution",
                 "/nonexistent.csv", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--distribution /nonexistent.csv" in err and "Traceback" not in err
    assert main(["simulate", "--trace", trace, "--cluster", "n2g4", "--policy", "srtf,srsf,fifo", "--parallel", "2",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert all(p in out for p in ("srtf", "srsf", "yarn-cs"))  # fifo is YARN-CS
