"""Memory cgroups: reading the OOM-kill count (v1 and v2 files), and a worker's cgroup limit written
in the order v1 accepts (memsw >= mem)."""

import os

from elastictrain.launcher.memcg import WorkerCgroup, oom_kills, own_memory_cgroup


def test_oom_kills_reads_v2_and_v1_files(tmp_path):
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir()
    v1.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert oom_kills(str(v2)) == 2 and oom_kills(str(v1)) == 5
    assert oom_kills(str(tmp_path)) is None and oom_kills(None) is None  # nothing to read: not known


def test_v1_limits_keep_memsw_at_or_above_mem(tmp_path):
    d = tmp_path / "memory" / "job"
    d.mkdir(parents=True)
    for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "cgroup.procs"):
        (d / name).write_text("9223372036854771712\n")
    cg = WorkerCgroup(str(d))
    cg.v2 = False
    cg.set_limit(512 << 20)
    assert (d / "memory.limit_in_bytes").read_text() == str(512 << 20)
    assert (d / "memory.memsw.limit_in_bytes").read_text() == str(512 << 20)
    assert cg.join(1234) and (d / "cgroup.procs").read_text() == "1234"
    cg.v2 = True
    cg.set_limit(1 << 30)
    assert (d / "memory.max").read_text() == str(1 << 30) and (d / "memory.swap.max").read_text() == "0"


def test_this_process_memory_cgroup_is_found_where_proc_lists_one():
    try:
        listed = open("/proc/self/cgroup").read()
    except OSError:
        listed = ""
    path = own_memory_cgroup()
    v1 = any("memory" in line.split(":")[1].split(",") for line in listed.splitlines() if line.count(":") >= 2)
    if v1:  # cgroup v1 with a memory hierarchy (as on this project's CI machine)
        assert path is not None and os.path.isdir(path) and oom_kills(path) is not None, (listed, path)
    else:
        assert path is None or os.path.exists(os.path.join(path, "memory.events"))
