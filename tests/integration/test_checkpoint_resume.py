"""A job preempted with SIGTERM and resumed ends bitwise equal to an uninterrupted one (CPU, same seed),
for PyTorch and for Keras, through etrun with its embedded coordinator (state kept under --log-dir)."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ETRUN = [sys.executable, "-m", "elastictrain.launcher.cli"]


def run(args, cwd, timeout=240):
    r = subprocess.run(ETRUN + args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def digest(out):
    m = re.search(r"final-params-sha256: ([0-9a-f]{64})", out)
    assert m, out[-2000:]
    return m.group(1)


@pytest.mark.parametrize("example, module", [("torch_checkpoint_resume.py", "torch"),
                                             ("keras_checkpoint_resume.py", "tensorflow")])
def test_preempted_and_resumed_equals_uninterrupted(tmp_path, example, module):
    pytest.importorskip(module)
    script = os.path.join(ROOT, "examples", example)
    code, out, err = run(["--rdzv-id", "straight", "--log-dir", "L1", script, "--ckpt-dir", "A"], tmp_path)
    assert code == 0, err[-3000:]
    straight = digest(out)

    progress = tmp_path / "progress"
    p = subprocess.Popen(ETRUN + ["--rdzv-id", "pre", "--log-dir", "L2", script, "--ckpt-dir", "B",
                                  "--step-sleep", "0.02", "--progress-file", str(progress)],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    def step():
        try:
            text = progress.read_text().strip()  # read once: the file is replaced while we poll
        except FileNotFoundError:
            return 0
        return int(text) if text.isdigit() else 0

    deadline = time.monotonic() + 120
    while step() < 40:
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1][-3000:]
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    out1, err1 = p.communicate(timeout=120)
    assert p.returncode == 75, err1[-3000:]
    assert "preempted: saved at step" in out1

    code, out2, err2 = run(["--rdzv-id", "pre", "--log-dir", "L2", script, "--ckpt-dir", "B"], tmp_path)
    assert code == 0, err2[-3000:]
    assert "resumed from step-" in out2
    assert digest(out2) == straight
