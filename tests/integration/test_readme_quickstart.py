"""The README's quick start, verbatim: 2 ranks under etrun, a worker killed after the first
checkpoint, and every rank resumes from the same checkpoint, step and data cursor."""

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quickstart() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text[text.index("## Quick start for your training script"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _is_worker(p, etrun_pid: int) -> bool:
    """A worker: forked by etrun's zygote (the zygote itself is etrun's child), or a fresh runner
    (not a warm spare waiting with --preload: killing one ends no worker)."""
    try:
        cmd = " ".join(p.cmdline())
        if "elastictrain.launcher.zygote" in cmd:
            return p.ppid() != etrun_pid
        return "elastictrain.launcher.runner" in cmd and "--preload" not in p.cmdline()
    except psutil.Error:
        return False


def test_the_readme_quick_start_survives_a_killed_worker_and_resumes_every_rank(tmp_path):
    (tmp_path / "train.py").write_text(quickstart())
    etrun = subprocess.Popen([sys.executable, "-m", "elastictrain.launcher.cli", "--nproc-per-node", "2",
                              "--max-restarts", "2", "train.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("checkpoints/step-000000050-*")):  # the first checkpoint is on disk
            assert time.monotonic() < deadline and etrun.poll() is None, "no checkpoint at step 50"
            time.sleep(0.05)
        time.sleep(1.0)  # and committed (its data cursor), a moment later
        workers = [p for p in psutil.Process(etrun.pid).children(recursive=True) if _is_worker(p, etrun.pid)]
        assert len(workers) >= 2
        os.kill(workers[-1].pid, signal.SIGKILL)  # one rank dies without warning
        out, _ = etrun.communicate(timeout=180)
    finally:
        if etrun.poll() is None:
            os.killpg(etrun.pid, signal.SIGKILL)
    assert etrun.returncode == 0, out[-3000:]
    resumed = re.findall(r"rank (\d): resumed from (step-\d+-g\d+) at step (\d+)", out)
    assert sorted(r[0] for r in resumed) == ["0", "1"], out[-3000:]
    assert len({(name, step) for _, name, step in resumed}) == 1, f"the ranks resumed differently: {resumed}"
    done = re.findall(r"rank (\d): done at step (\d+)", out)
    assert sorted(r[0] for r in done) == ["0", "1"] and len({s for _, s in done}) == 1, out[-2000:]


def test_the_readme_quick_start_runs_twice_interleaved_under_etrun_group(tmp_path):
    """Two copies in one etrun --group: each job gets its own process group, datasets and
    checkpoint directory, through the same calls as alone."""
    (tmp_path / "train.py").write_text(quickstart())
    r = subprocess.run([sys.executable, "-m", "elastictrain.launcher.cli", "--nproc-per-node", "2", "--group",
                        "train.py", ":", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert len(re.findall(r"rank \d: done at step \d+", out)) == 4, out[-3000:]
    assert len({p.parent.name for p in tmp_path.glob("checkpoints/*/step-*")}) == 2  # a directory per job


def test_under_etrun_group_every_rank_of_a_job_builds_the_same_data(tmp_path):
    """Issue 32.2: two jobs in one process share its global RNG; the README's dataset
    (``torch.manual_seed(0); x = torch.randn(...)``) must be the same on both ranks of each job."""
    digest = ("\nimport hashlib\nprint(f\"rank {job.rank}: data digest "
              "{hashlib.sha256(x.numpy().tobytes()).hexdigest()[:16]}\", flush=True)\n")
    (tmp_path / "train.py").write_text(quickstart() + digest)
    r = subprocess.run([sys.executable, "-m", "elastictrain.launcher.cli", "--nproc-per-node", "2", "--group",
                        "train.py", ":", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    found = re.findall(r"\[(train(?:-2)?)\] rank (\d): data digest (\w+)", out)
    by_job: dict = {}
    for job, rank, d in found:
        by_job.setdefault(job, {})[rank] = d
    assert sorted(by_job) == ["train", "train-2"] and all(sorted(v) == ["0", "1"] for v in by_job.values()), out[-3000:]
    for job, ranks in by_job.items():
        assert ranks["0"] == ranks["1"], f"job {job}: the ranks built different data ({ranks})"

