"""In-process recovery under etrun, with real workers on gloo: a worker is SIGKILLed again and
again (alternating ranks); each time the other worker keeps its process (same pid in the next
generation), only the dead one is replaced, the job finishes, every sample is trained on exactly
once per epoch and both ranks end with the same parameters. The default run kills 3 times; the
slow one 20 times in a row."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "torch_inprocess_recovery.py")


def _rows(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) == 5:
                    rows.append((float(p[0]), int(p[1]), int(p[2]), int(p[3]), int(p[4])))
    except FileNotFoundError:
        pass
    return rows


def _story(err: str) -> str:
    """etrun's account of each generation, a line each, short enough to survive a CI log's cuts."""
    words = ("generation", "failure", "rror", "lost", "restart", "timed out", "hang", "stuck")
    lines = [line.strip()[:160] for line in err.splitlines() if any(w in line for w in words)]
    return "\n".join(dict.fromkeys(lines))


def _kill_repeatedly(tmp_path, kills: int, epochs: int, timeout: float):
    events = tmp_path / "events"
    p = subprocess.Popen([sys.executable, "-m", "elastictrain.launcher.cli", "--nproc-per-node", "2",
                          "--max-restarts", str(kills + 2), SCRIPT, "--samples", "2048", "--epochs", str(epochs),
                          "--step-sleep", "0.01", "--events", str(events)], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    survivors = []  # (rank that survived, its pid before, generation before)
    try:
        deadline = time.monotonic() + timeout
        gen = 1
        for i in range(kills):
            while True:  # both ranks trained 15 steps in this generation: it has settled
                assert p.poll() is None, p.communicate()[1][-3000:]
                assert time.monotonic() < deadline, f"kill {i}: generation {gen} made no progress"
                rows = [r for r in _rows(events) if r[2] == gen]
                counts = {rank: sum(1 for r in rows if r[1] == rank) for rank in (0, 1)}
                if min(counts.values()) >= 15:
                    break
                time.sleep(0.02)
            pids = {r[1]: r[3] for r in rows}
            victim = i % 2
            survivors.append((1 - victim, pids[1 - victim], gen))
            os.kill(pids[victim], signal.SIGKILL)
            while not any(r[2] > gen for r in _rows(events)):
                assert p.poll() is None, p.communicate()[1][-3000:]
                assert time.monotonic() < deadline, f"kill {i}: no generation after {gen}"
                time.sleep(0.02)
            gen = max(r[2] for r in _rows(events))
        out, err = p.communicate(timeout=max(10.0, deadline - time.monotonic()))
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 0, err[-3000:]
    # every process prints its rank, pid and generation each time training (re)starts in it,
    # also when the last kill came so late that no step was left to train
    starts = {(int(g), int(r)): int(p) for r, p, g in re.findall(r"\[inproc\] rank (\d) pid (\d+) generation (\d+)",
                                                                 out)}
    for rank, pid, gen in survivors:  # the survivor went on in its own process
        assert starts.get((gen + 1, rank)) == pid, f"rank {rank} pid {pid} after generation {gen}; starts " \
            f"{sorted(starts.items())}\n{_story(err)}"
    assert "every sample trained on exactly once per epoch: True" in out, out[-3000:]
    digests = re.findall(r"rank (\d) pid \d+ final-params-sha256: ([0-9a-f]{64})", out)
    assert len(digests) == 2 and digests[0][1] == digests[1][1], out[-3000:]
    assert err.count("recovering in process") >= kills, _story(err)
    assert err.count("continue in their own process") == kills, _story(err)


def test_survivors_recover_in_process(tmp_path):
    _kill_repeatedly(tmp_path, kills=3, epochs=8, timeout=150)


@pytest.mark.slow
def test_twenty_kills_in_a_row_recover_in_process(tmp_path):
    _kill_repeatedly(tmp_path, kills=20, epochs=60, timeout=600)
