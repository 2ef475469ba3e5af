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
