"""Job arrays (coordinator/arrays.py, Slurm's --array): the spec, the tasks' ids, names and
environment, the %N limit through the admission gate, and --after on a whole array."""

import pytest

from elastictrain.coordinator.arrays import MAX_ARRAY, parse_array
from elastictrain.errors import ConfigError
from elastictrain.wire import JobSubmit

from .test_cluster_scheduler import World


def test_the_spec_is_slurms():
    assert parse_array("0-3") == ([0, 1, 2, 3], 0)
    assert parse_array("1,3,5") == ([1, 3, 5], 0)
    assert parse_array("0-10:5,7%2") == ([0, 5, 7, 10], 2)
    assert parse_array("4") == ([4], 0)
    for bad in ("", "a-b", "3-1", "0-3%0", "0-3%x", "0-4:0", "-1", "0-2000000", "1,,2"):
        with pytest.raises(ConfigError, match="--array .* is not understood: write --array as Slurm does"):
            parse_array(bad)
    with pytest.raises(ConfigError, match=f"more than {MAX_ARRAY} tasks"):
        parse_array(f"0-{MAX_ARRAY}")


def test_an_arrays_tasks_run_at_most_n_at_once_and_after_waits_for_them_all(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=1, slots=4)
    sub = JobSubmit(["sweep.py"], str(tmp_path), name="sweep", array="0-3%2")
    tasks = [j.id for j in w.s.submit_array(sub).jobs]
    base = tasks[0].split("_")[0]
    assert tasks == [f"{base}_{i}" for i in range(4)]
    assert [w.s.records[t].name for t in tasks] == [f"sweep_{i}" for i in range(4)]
    assert w.s.records[tasks[3]].env == {"ET_ARRAY_JOB_ID": base, "ET_ARRAY_TASK_ID": "3", "ET_ARRAY_TASK_COUNT": "4"}
    report = w.s.submit(JobSubmit(["report.py"], str(tmp_path), after=[base])).id
    assert w.s.records[report].after == [f"{t}:ok" for t in tasks]
    w.s.tick()
    w.run_all()
    assert [w.status(t) for t in tasks] == ["running", "running", "queued", "queued"]  # 4 free slots, %2
    assert "array " + base + " runs at most 2 tasks at once" in w.s.job(tasks[2]).reason
    for t in tasks[:2]:
        w.exit(t, 0)
    w.s.tick()
    w.run_all()
    assert [w.status(t) for t in tasks] == ["finished", "finished", "running", "running"]
    assert w.status(report) == "queued"
    for t in tasks[2:]:
        w.exit(t, 0)
    w.s.tick()
    assert w.status(report) == "running"
    with pytest.raises(ConfigError, match="POST /v1/cluster/arrays"):
        w.s.submit(sub)
    with pytest.raises(ConfigError, match="give the array's task indices"):
        w.s.submit_array(JobSubmit(["sweep.py"], str(tmp_path)))
