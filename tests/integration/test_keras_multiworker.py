"""Keras under etrun: several workers train one model (TF_CONFIG from the generation,
MultiWorkerMirroredStrategy), uneven dynamic shares end together, a preemption stops every worker
at the same step, and the output reads like a plain ``model.fit``."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("tensorflow")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "keras_checkpoint_resume.py")
ETRUN = [sys.executable, "-m", "elastictrain.launcher.cli"]


def _digests(out):
    return dict(re.findall(r"rank (\d) done at step \d+; final-params-sha256: ([0-9a-f]{64})", out))


@pytest.mark.slow  # make test-slow (24 s; keras_checkpoint_resume.py's preemption stays in the default run)
def test_two_workers_train_one_model_across_a_preemption(tmp_path):
    # 2,100 samples in shards of 200: 11 shards per epoch, so one worker gets more than the other
    args = ["--rdzv-id", "kmw", "--log-dir", "L", "--nproc-per-node", "2", SCRIPT, "--ckpt-dir", "C",
            "--samples", "2100"]
    progress = tmp_path / "progress"
    p = subprocess.Popen(ETRUN + args + ["--step-sleep", "0.02", "--progress-file", str(progress)], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def step():
        try:
            text = progress.read_text().strip()
        except FileNotFoundError:
            return 0
        return int(text) if text.isdigit() else 0

    deadline = time.monotonic() + 180
    while step() < 40:
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1][-3000:]
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    out1, err1 = p.communicate(timeout=120)
    assert p.returncode == 75, err1[-3000:]
    saved = re.findall(r"preempted: saved at step (\d+)", out1)
    assert len(saved) == 2 and saved[0] == saved[1], out1  # both workers stopped at the same step

    r = subprocess.run(ETRUN + args, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    digests = _digests(r.stdout)
    assert set(digests) == {"0", "1"} and digests["0"] == digests["1"], r.stdout  # one model, not two
    assert r.stdout.count(f"resumed from step-{int(saved[0]):09d}") == 2, r.stdout
    assert "every sample of every epoch trained: True" in r.stdout, r.stdout
    for losses in re.findall(r"loss by epoch \[([^\]]*)\]", r.stdout):
        assert "nan" not in losses and losses, r.stdout  # a worker's empty last batches don't poison its logs
    # the job's loss, as one process's fit reports it, on every worker (each printed its own), and the
    # History of the resumed run holds every epoch, those before the preemption too (issue 32.8)
    runs = re.findall(r"rank (\d): trained epochs \[([^\]]*)\], loss by epoch \[([^\]]*)\]", r.stdout)
    assert len(runs) == 2 and runs[0][1:] == runs[1][1:], r.stdout
    epochs = [int(e) for e in runs[0][1].split(",")]
    assert epochs == list(range(len(epochs))) and len(runs[0][2].split(",")) == len(epochs), r.stdout
    assert "UserWarning" not in r.stderr, r.stderr[-3000:]


def test_keras_output_reads_like_fit(tmp_path):
    r = subprocess.run(ETRUN + ["--rdzv-id", "kout", "--log-dir", "L", SCRIPT, "--ckpt-dir", "C", "--epochs", "3",
                                "--verbose", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.findall(r"Epoch (\d/\d)", r.stdout) == ["1/3", "2/3", "3/3"], r.stdout[-3000:]
    assert "Unknown" not in r.stdout  # the bar knows each epoch's length from the coordinator's counts
    assert "trained epochs [0, 1, 2]" in r.stdout  # one History for the whole run
    assert "UserWarning" not in r.stderr, r.stderr[-3000:]


def test_worker_env_carries_tf_config_from_the_generation():
    from elastictrain.wire import Assignment

    a = Assignment(3, 1, 2, 2, 4, "10.0.0.1", 29500, 0, "start", 0,
                   ["10.0.0.1:4000", "10.0.0.1:4001", "10.0.0.2:4100", "10.0.0.2:4101"])
    env = _env_for(a, local_rank=1)
    assert json.loads(env["TF_CONFIG"]) == {"cluster": {"worker": list(a.workers)},
                                            "task": {"type": "worker", "index": 3}}
    assert env["RANK"] == "3" and env["WORLD_SIZE"] == "4"
    without = Assignment(3, 1, 2, 2, 4, "10.0.0.1", 29500, 0, "start", 0)
    assert "TF_CONFIG" not in _env_for(without, local_rank=1)


def _env_for(a, local_rank):
    from elastictrain.launcher.cli import config_from_args, get_args_parser
    from elastictrain.launcher.workers import worker_env

    cfg = config_from_args(get_args_parser().parse_args(["--nproc-per-node", "2", "--nnodes", "2",
                                                         "--rdzv-endpoint", "127.0.0.1:1", "train.py"]))
    return worker_env(cfg, a, local_rank, "http://127.0.0.1:1", None, "/tmp/err.json", base={})
