"""Chaos soak (slow): kill -9 random workers of the demo, over and over, with saves that fall on
epoch ends (two saves at one step), and check every run's ledger says exactly once.

Run with ``make test-slow``. It is the audit's chaos run, made repeatable: 100+ kills in all.
"""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "torch_ddp_elastic.py")


def _busy_workers(pid: int) -> list:
    """The etrun worker processes that are training now (warm spares and the zygote idle: they use
    no CPU)."""
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    before = {}
    for p in procs:
        try:  # one that exited meanwhile (a zombie) is skipped, not the whole list
            cmd = " ".join(p.cmdline())  # a fresh runner, or a fork of etrun's zygote (the zygote itself idles)
            if "elastictrain.launcher.runner" in cmd or "elastictrain.launcher.zygote" in cmd:
                before[p] = sum(p.cpu_times()[:2])
        except psutil.Error:
            pass
    kids = list(before)
    time.sleep(0.3)
    busy = []
    for p in kids:
        try:
            if sum(p.cpu_times()[:2]) - before[p] > 0.05:
                busy.append(p)
        except psutil.Error:
            pass
    return busy


def _chaos_run(tmp_path, rng: random.Random, ckpt_every: int, kills: int) -> tuple[int, str]:
    # 20,000 samples, batch 50, 2 ranks: 200 steps per epoch, so every ckpt_every that divides 200
    # saves an epoch's last step twice
    cmd = [sys.executable, "-m", "elastictrain.launcher.cli", "--nproc-per-node", "2", "--max-restarts", "100",
           SCRIPT, "--samples", "20000", "--epochs", "40", "--batch-size", "50", "--shard-size", "100",
           "--ckpt-every", str(ckpt_every), "--ckpt-dir", str(tmp_path / f"ck{ckpt_every}")]
    out = open(tmp_path / f"out{ckpt_every}.txt", "w+")
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    done = 0
    deadline = time.monotonic() + 400
    try:
        time.sleep(3.0)
        while proc.poll() is None and done < kills and time.monotonic() < deadline:
            ws = _busy_workers(proc.pid)
            if ws:
                try:
                    rng.choice(ws).send_signal(signal.SIGKILL)
                    done += 1
                except psutil.NoSuchProcess:
                    pass
            time.sleep(rng.uniform(0.8, 2.5))
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out.seek(0)
    return done, out.read()


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_hundred_kills_keep_every_sample_once(tmp_path):
    rng = random.Random(36)
    total = 0
    for ckpt_every in (1, 5, 10, 20, 25, 40, 50):
        kills, log = _chaos_run(tmp_path, rng, ckpt_every, kills=15)
        total += kills
        assert "every sample trained on exactly once per epoch: True" in log, \
            f"--ckpt-every {ckpt_every}, {kills} kills:\n{log[-4000:]}"
    assert total >= 100, f"only {total} kills landed"
