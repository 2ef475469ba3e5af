"""etrun --oom-policy accumulate: a DDP job (2 workers) runs out of (simulated) GPU memory at step
25; etrun restarts it from its step-20 checkpoint with the accumulation doubled on every rank
(ET_ACCUMULATE=2, micro-batches of 32 instead of 64), and it finishes: every sample trained once,
with the global batch of a run that never ran out. At
--max-accumulate the job fails with that reason. (No GPU here: the job raises torch's own
OutOfMemoryError where a CUDA allocation would.)"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, "examples", "torch_oom_accumulate.py")


def etrun(tmp, name, *extra, limit="0"):
    out = os.path.join(tmp, f"{name}.json")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "elastictrain.launcher.cli", "--standalone", "--nproc-per-node", "2",
                        "--max-restarts", "3", *extra, JOB, "--steps", "40", "--gpu-memory-samples", limit,
                        "--oom-from", "25", "--ckpt-dir", os.path.join(tmp, f"ckpt-{name}"), "--out", out],
                       capture_output=True, text=True, timeout=240, env=env, cwd=tmp)
    result = json.load(open(out)) if os.path.exists(out) else None
    return r, result


def test_out_of_gpu_memory_halves_the_micro_batch_and_keeps_the_global_batch(tmp_path):
    r, base = etrun(str(tmp_path), "plain")
    assert r.returncode == 0, r.stderr[-3000:]
    r, res = etrun(str(tmp_path), "oom", "--oom-policy", "accumulate", limit="32")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "out of GPU memory" in r.stderr and "accumulates 2 micro-batches" in r.stderr, r.stderr[-3000:]
    assert res["runs"] == ["accumulate=1@0", "accumulate=2@20"], res  # resumed from its checkpoint
    # the global batch did not change (2 x 64 samples, as without the failure; 32-sample micro-batches
    # would have made it 64), and each sample was trained once. Shards go to whichever rank asks, so
    # at the end of the epoch a rank may train a shard (2 steps) alone: 40 full steps, up to 2 more.
    for run in (base, res):
        assert (run["global_batch"], run["min"], run["max"]) == (128, 1, 1), (res, base)
        assert 40 <= run["steps"] <= 42, (res, base)


def test_without_the_policy_or_past_max_accumulate_the_job_fails(tmp_path):
    r, res = etrun(str(tmp_path), "fail", limit="32")  # --oom-policy fail: restarts, fails again, gives up
    assert r.returncode != 0 and res is None and "OutOfMemoryError" in r.stderr
    r, res = etrun(str(tmp_path), "cap", "--oom-policy", "accumulate", "--max-accumulate", "1", limit="32")
    assert r.returncode != 0 and res is None
    assert "--max-accumulate 1): the job fails" in r.stderr, r.stderr[-3000:]
