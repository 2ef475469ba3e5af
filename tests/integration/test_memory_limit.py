"""OOM plans, DLRover-style: under etrun --memory-limit, a worker that runs out of memory is
restarted with twice the limit and the job finishes with its exactly-once ledger intact; at
--max-memory-limit the job fails and says why."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "examples", "torch_ddp_elastic.py")
ETRUN = [sys.executable, "-m", "elastictrain.launcher.cli"]
HUNGRY = ["--alloc-at-step", "30", "--alloc-mib", "600", "--ckpt-dir", "ck"]


def test_out_of_memory_doubles_the_limit_and_the_job_finishes(tmp_path):
    r = subprocess.run(ETRUN + ["--nproc-per-node", "2", "--max-restarts", "2", "--memory-limit", "512M", DEMO,
                                *HUNGRY], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "can't allocate memory" in r.stderr  # generation 1: rank 1 ran out under 512 MiB
    assert "out of memory: rank 1 hit its 512 MiB limit; the next generation runs with 1 GiB" in r.stderr
    assert "every sample trained on exactly once per epoch: True" in r.stdout, r.stdout[-2000:]


def test_out_of_memory_at_the_largest_limit_fails_the_job(tmp_path):
    r = subprocess.run(ETRUN + ["--nproc-per-node", "2", "--max-restarts", "2", "--memory-limit", "512M",
                                "--max-memory-limit", "512M", DEMO, *HUNGRY], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "rank 1 ran out of memory at the largest allowed limit, 512 MiB (--max-memory-limit)" in r.stderr
    assert "restart 1/2" not in r.stderr  # not retried at the same limit


@pytest.mark.parametrize("flags, message", [
    (["--memory-limit", "lots"], "give a size like 512M"),
    (["--memory-limit", "1M"], "between 64 MiB and 1 PiB"),
    (["--max-memory-limit", "2G"], "needs --memory-limit"),
    (["--memory-limit", "2G", "--max-memory-limit", "1G"], "is below --memory-limit"),
])
def test_memory_flags_are_checked(tmp_path, flags, message):
    r = subprocess.run(ETRUN + flags + [DEMO], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and message in r.stderr, r.stderr[-2000:]


def _cgroups_or_skip(tmp_path):
    """A memory cgroup etrun may make below its own (root, or a delegated subtree), else skip."""
    from elastictrain.errors import ConfigError
    from elastictrain.launcher.memcg import WorkerCgroup

    try:
        cg = WorkerCgroup.create(f"ettest-{os.getpid()}", 1 << 30)
    except (ConfigError, OSError) as exc:
        pytest.skip(f"no memory cgroup to make here: {exc}")
    return cg


def test_a_cgroup_limit_the_kernel_enforces_is_told_apart_and_doubled(tmp_path):
    # --memory-enforce cgroup: each worker in its own memory cgroup of 512 MiB (all its memory
    # counted); rank 1's 600 MiB at step 30 wakes the kernel's OOM killer (SIGKILL, no exception)
    _cgroups_or_skip(tmp_path).remove()
    r = subprocess.run(ETRUN + ["--nproc-per-node", "2", "--max-restarts", "2", "--memory-limit", "512M",
                                "--memory-enforce", "cgroup", DEMO, *HUNGRY], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "killed by signal SIGKILL" in r.stderr and "killed by the kernel's OOM killer: out of memory in its " \
        "memory cgroup (512 MiB, --memory-enforce cgroup), OOM kills 0 -> 1" in r.stderr, r.stderr[-3000:]
    assert "the next generation runs with 1 GiB" in r.stderr
    assert "every sample trained on exactly once per epoch: True" in r.stdout, r.stdout[-2000:]


def test_an_oom_kill_of_the_node_is_named_and_another_kill_is_not(tmp_path):
    # etrun itself in a memory cgroup of 700 MiB, no --memory-limit: the kernel kills the worker
    # that allocates 600 MiB, and etrun says it was the OOM killer, not just "SIGKILL"
    from elastictrain.launcher.memcg import join

    cg = _cgroups_or_skip(tmp_path)
    try:
        cg.set_limit(700 << 20)
        r = subprocess.run(ETRUN + ["--nproc-per-node", "2", "--max-restarts", "0", DEMO, *HUNGRY], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300,
                           preexec_fn=lambda: join(cg.path, os.getpid()) or os._exit(3))
        assert r.returncode != 0, r.stderr[-3000:]
        assert "killed by signal SIGKILL" in r.stderr and "killed by the kernel's OOM killer: out of memory in this " \
            f"node's memory cgroup ({cg.path})" in r.stderr, r.stderr[-3000:]
    finally:
        cg.remove()
    # a worker killed by someone else: SIGKILL, and no word of the OOM killer
    r = subprocess.run(ETRUN + ["--nproc-per-node", "2", "--max-restarts", "0", DEMO, "--crash-at-step", "20",
                                "--crash-by-sigkill", "--ckpt-dir", "ck2"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "killed by signal SIGKILL" in r.stderr, r.stderr[-3000:]
    assert "OOM killer" not in r.stderr
