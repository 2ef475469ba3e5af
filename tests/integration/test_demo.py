"""The README's demo, shortened: etrun + embedded coordinator + DDP + a crash + resume."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_demo_recovers_and_sees_every_sample_once_per_epoch(tmp_path):
    cmd = [sys.executable, "-m", "elastictrain.launcher.cli", "--nproc-per-node", "2", "--max-restarts", "2",
           os.path.join(ROOT, "examples", "torch_ddp_elastic.py"), "--samples", "3000", "--epochs", "2",
           "--ckpt-every", "10", "--crash-at-step", "15", "--ckpt-dir", str(tmp_path / "ckpt")]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "root cause" in r.stderr and "exit code 13" in r.stderr
    assert "resumed from step-000000010-g1 at step 10" in r.stdout
    assert "every sample trained on exactly once per epoch: True" in r.stdout


@pytest.mark.slow  # make test-slow: the default run stays under 15 minutes
def test_cluster_demo_preempts_and_resumes_with_every_sample_once(tmp_path):
    """``make demo-cluster``: coordinator + two node daemons + three DDP jobs, one preempted."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "cluster_demo.py"), str(tmp_path / "demo")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("every sample trained on exactly once per epoch: True") == 3
    assert "preempt@" in r.stdout and "preempted and resumed: job(s) " in r.stdout
    assert "queue=Q1" in r.stdout and "preempted" in r.stdout


def test_epoch_ends_that_fall_on_a_save_keep_every_sample_once(tmp_path):
    """The audit's reproduction: a save at every step, so every epoch's end saves its step twice
    (the README's loop). A second part of one checkpoint used to replace the first."""
    cmd = [sys.executable, "-m", "elastictrain.launcher.cli", "--nproc-per-node", "2", "--max-restarts", "1",
           os.path.join(ROOT, "examples", "torch_ddp_elastic.py"), "--samples", "2000", "--epochs", "3",
           "--batch-size", "50", "--shard-size", "100", "--ckpt-every", "1", "--crash-at-step", "50",
           "--ckpt-dir", str(tmp_path / "D")]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "exit code 13" in r.stderr  # the crash happened, and the job resumed from a checkpoint
    assert "every sample trained on exactly once per epoch: True (ledger min 3, max 3" in r.stdout, r.stdout[-2000:]


def test_the_same_command_resumes_after_etrun_itself_is_killed(tmp_path):
    """Issue 32.1: etrun killed with SIGKILL (an OOM kill of the launcher, a reboot); the same
    command run again resumes from the newest committed checkpoint, exactly once."""
    import signal
    import time

    cmd = [sys.executable, "-m", "elastictrain.launcher.cli", "--nproc-per-node", "2", "--max-restarts", "1",
           os.path.join(ROOT, "examples", "torch_ddp_elastic.py"), "--samples", "20000", "--epochs", "8",
           "--batch-size", "50", "--ckpt-every", "20", "--ckpt-dir", "ckpt"]
    first = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len([d for d in os.listdir(tmp_path / "ckpt")
                                                   if d.startswith("step-")] if (tmp_path / "ckpt").exists()
                                                  else []) < 2:
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # etrun and its workers, all at once
        first.wait()
    r = subprocess.run(cmd, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step-" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert "every sample trained on exactly once per epoch: True" in r.stdout
