"""Issue 32.4: etrun and ``elastictrain node`` stop within a second or two on SIGINT/SIGTERM while
the coordinator is unreachable (their retry loops used to ignore the signal for 60 and 120 s)."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _stops_promptly(cmd, sig, tmp_path) -> float:
    env = dict(os.environ, ET_TOKEN="t", ET_COORDINATOR=_dead_url())
    p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(2.0)  # well into its retries
        assert p.poll() is None, p.stdout.read()
        t0 = time.monotonic()
        p.send_signal(sig)
        p.wait(timeout=30)
        return time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_etrun_stops_promptly(tmp_path, sig):
    took = _stops_promptly([sys.executable, "-m", "elastictrain.launcher.cli", "--nproc-per-node", "1",
                            os.path.join(ROOT, "examples", "torch_ddp_elastic.py")], sig, tmp_path)
    assert took < 3.0, f"etrun took {took:.1f} s to stop"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_node_daemon_stops_promptly(tmp_path, sig):
    took = _stops_promptly([sys.executable, "-m", "elastictrain", "node", "--name", "n1", "--slots", "1"], sig,
                           tmp_path)
    assert took < 3.0, f"the node daemon took {took:.1f} s to stop"
