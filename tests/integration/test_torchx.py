"""``torchx run -s elastictrain``: TorchX's own CLI submits a ``dist.torchrun`` app to a live
coordinator with a real node daemon; the job trains every sample once under etrun, and ``torchx
status``, ``log``, ``list`` and ``cancel`` read and act on it."""

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("torchx", reason="TorchX is not installed: `make install` (the dev extra) installs it")
pytest.importorskip("torch")

from elastictrain.launcher.local_cluster import LocalCluster  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "examples", "torch_cluster_job.py")


def torchx(c, *args, check=True, timeout=120):
    r = subprocess.run([sys.executable, "-m", "torchx.cli.main", *args], env=c.env(), cwd=c.tmp, capture_output=True,
                       text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"torchx {' '.join(args)} exited {r.returncode}: {r.stderr[-3000:]}")
    return r


def test_torchx_runs_a_ddp_app_on_the_coordinator_and_reads_and_cancels_it(tmp_path):
    with LocalCluster(tmp_path, "fifo", nodes=1, slots=2) as c:
        _run_read_cancel(c)


def _run_read_cancel(c):
    app = ["dist.torchrun", "-j", "1x2", "--script", WORKER, "--", "--ckpt-dir", "ck", "--out", "out.json",
           "--samples", "400", "--step-sleep", "0.02"]
    dry = torchx(c, "run", "--dryrun", "-s", "elastictrain", *app).stdout
    assert f"POST {c.coordinator.url}/v1/cluster/jobs" in dry and '"gpus": 2' in dry, dry
    handle = torchx(c, "run", "-s", "elastictrain", "--wait", *app, timeout=240).stdout.strip().splitlines()[-1]
    assert handle.startswith("elastictrain://") and handle.endswith("/1"), handle
    status = torchx(c, "status", handle).stdout
    assert "State: SUCCEEDED" in status and "torch_cluster_job" in status, status
    job = c.client.cluster_job("1")
    assert job.status == "finished" and job.workers == 2 and job.command[0] == WORKER
    with open(os.path.join(c.tmp, "out.json")) as f:
        out = json.load(f)
    assert out["min"] == out["max"] == 1 and out["world"] == 2, out  # every sample's ledger count: once
    log = torchx(c, "log", handle).stdout
    assert "[default0]:[train] done" in log and "[default1]:" in log, log[-2000:]
    # a second app, cancelled while it waits or runs
    long = app[:-1] + ["10"]  # --step-sleep 10: it would take long
    handle2 = torchx(c, "run", "-s", "elastictrain", *long).stdout.strip().splitlines()[-1]
    torchx(c, "cancel", handle2)
    deadline = time.monotonic() + 60
    while "State: CANCELLED" not in (s := torchx(c, "status", handle2).stdout) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "State: CANCELLED" in s, s
    listed = torchx(c, "list", "-s", "elastictrain").stdout
    assert "/1 " in listed and "SUCCEEDED" in listed and "CANCELLED" in listed, listed
    # an app it cannot run: refused before anything is submitted, with the reason
    bad = torchx(c, "run", "-s", "elastictrain", "utils.sh", "echo", "hi", check=False)
    assert bad.returncode != 0 and "runs Python training scripts under etrun" in bad.stderr, bad.stderr[-2000:]
    assert len(c.client.cluster_jobs().jobs) == 2
