"""`etrun --group`: real DDP jobs (gloo on loopback, 2 ranks) interleaved in one process per
rank finish with the same parameters as when run alone, keep their own shards, and a failing
job leaves the group while the others finish."""

import os
import re
import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ETRUN = [sys.executable, "-m", "elastictrain.launcher.cli"]
JOB = os.path.join(ROOT, "examples", "torch_group_job.py")


def etrun(args, cwd, env=None, timeout=240):
    p = subprocess.run(ETRUN + args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout, p.stderr


def digests(out):
    """{seed: {rank: digest}}"""
    found = {}
    for seed, rank, d in re.findall(r"\[group-job seed=(\d+) rank=(\d+)\] final-params-sha256: ([0-9a-f]{64})", out):
        found.setdefault(int(seed), {})[int(rank)] = d
    return found


def group_args(jobs):
    args = []
    for i, job in enumerate(jobs):
        args += ([":"] if i else []) + [JOB, *job]
    return args


@pytest.mark.parametrize("jobs", [
    [["--seed", "1", "--io-ms", "6"], ["--seed", "2", "--io-ms", "0", "--compute", "4"]],
    [["--seed", "1", "--io-ms", "6"], ["--seed", "2", "--compute", "4"], ["--seed", "3", "--steps", "20"]],
], ids=["two", "three"])
def test_interleaved_jobs_end_as_they_do_alone(tmp_path, jobs):
    alone = {}
    for i, job in enumerate(jobs):
        code, out, err = etrun(["--nproc-per-node", "2", "--rdzv-id", f"alone{i}", JOB, *job], tmp_path)
        assert code == 0, err[-3000:]
        alone.update(digests(out))
    code, out, err = etrun(["--nproc-per-node", "2", "--rdzv-id", "grouped", "--group", *group_args(jobs)], tmp_path)
    assert code == 0, err[-3000:]
    grouped = digests(out)
    assert grouped == alone and len(grouped) == len(jobs)
    assert all(len(set(by_rank.values())) == 1 and len(by_rank) == 2 for by_rank in grouped.values())
    assert out.count(": ok (") == 2 * len(jobs)  # one line per job per rank
    # every line a job prints carries the job's name
    assert all(re.match(r"\[torch_group_job(-\d)?\] ", line) for line in out.splitlines() if "[group-job" in line)


def test_a_failing_job_leaves_the_group_and_the_others_finish(tmp_path):
    jobs = [["--seed", "1"], ["--seed", "2", "--fail-at", "5"], ["--seed", "3"]]
    code, out, err = etrun(["--nproc-per-node", "2", "--rdzv-id", "g", "--group", *group_args(jobs)], tmp_path)
    assert code != 0  # the group reports the failure ...
    got = digests(out)
    assert set(got) == {1, 3} and all(len(v) == 2 for v in got.values())  # ... after the others finished
    assert out.count("job torch_group_job-2: FAILED after 5 iterations: RuntimeError: injected failure at step 5") == 2
    assert "job torch_group_job-2: RuntimeError: injected failure" in err  # etrun's root-cause report


def test_a_job_failing_on_one_rank_is_cancelled_on_the_others(tmp_path):
    jobs = [["--seed", "1", "--steps", "40"], ["--seed", "2", "--fail-at", "5", "--fail-rank", "1"]]
    code, out, err = etrun(["--nproc-per-node", "2", "--rdzv-id", "g1", "--group", *group_args(jobs)], tmp_path,
                           env={"ET_GROUP_TIMEOUT": "30"})
    assert code != 0
    assert set(digests(out)) == {1} and len(digests(out)[1]) == 2
    assert "FAILED after 5 iterations: RuntimeError: injected failure at step 5 on rank 1" in out
    # rank 0's copy of the job learns of it through the store (or its collective times out)
    assert re.search(r"job torch_group_job-2: FAILED after \d+ iterations: (JobCancelled: job torch_group_job-2 "
                     r"failed on another rank|RuntimeError: .*)", out.replace(
                         "FAILED after 5 iterations: RuntimeError: injected failure at step 5 on rank 1", ""))


def test_grouped_jobs_take_exactly_once_shards_of_their_own_datasets(tmp_path, coordinator, client):
    jobs = [["--seed", "1", "--shards", "600", "--steps", "25"], ["--seed", "2", "--shards", "400", "--steps", "15"]]
    code, out, err = etrun(["--nproc-per-node", "2", "--coordinator", coordinator.url, "--token-file",
                            coordinator.token_file, "--rdzv-id", "gs", "--group", *group_args(jobs)], tmp_path)
    assert code == 0, err[-3000:]
    samples = {1: Counter(), 2: Counter()}
    for seed, rank, rest in re.findall(r"\[group-job seed=(\d+) rank=(\d+)\] samples: ([0-9 ]*)", out):
        samples[int(seed)].update(int(x) for x in rest.split())
    assert samples[1] == Counter(range(600)) and samples[2] == Counter(range(400))  # every sample once
    assert sorted(client.job("gs").datasets) == ["torch_group_job-2.train", "torch_group_job.train"]


def test_bad_groups_are_refused_with_the_fix(tmp_path):
    code, _, err = etrun(["--group", JOB], tmp_path)
    assert code == 2 and "interleaves 2 to 4 scripts, got 1" in err
    code, _, err = etrun(["--group", JOB, ":", ":", JOB], tmp_path)
    assert code == 2 and "an empty job between ':' separators" in err
    # a script that creates the default process group itself is told what to call instead
    prof = os.path.join(ROOT, "examples", "torch_stages_profile.py")
    code, out, err = etrun(["--rdzv-id", "bad", "--group", prof, "--steps", "3", ":", JOB, "--steps", "3"], tmp_path)
    assert code != 0 and "use elastictrain_torch.init_process_group()" not in err  # the words below, exactly
    assert "get its process group from elastictrain_torch.init_process_group()" in out + err
    assert "job torch_group_job: ok" in out


def test_a_preempted_group_resumes_each_job_with_its_own_generator_and_ends_as_uninterrupted(tmp_path):
    """Each job checkpoints its own generator (rng=gen) and draws noise from it every step: a
    resume that lost it, or that restored the process's shared global generators instead, would
    end with other parameters."""
    import signal
    import time

    def jobs(run):
        return [["--seed", "1", "--steps", "60", "--io-ms", "20", "--noise", "0.5", "--ckpt", str(tmp_path / run / "a")],
                ["--seed", "2", "--steps", "40", "--io-ms", "20", "--noise", "0.5", "--compute", "2",
                 "--ckpt", str(tmp_path / run / "b")]]

    code, out, err = etrun(["--nproc-per-node", "2", "--rdzv-id", "whole", "--group", *group_args(jobs("whole"))],
                           tmp_path)
    assert code == 0, err[-3000:]
    whole = digests(out)
    assert set(whole) == {1, 2} and "resumed" not in out
    log = open(tmp_path / "cut.log", "w+")
    p = subprocess.Popen(ETRUN + ["--nproc-per-node", "2", "--rdzv-id", "cut", "--group", *group_args(jobs("cut"))],
                         cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120  # until both jobs saved a checkpoint (at step 5, of 60 and 40)
        while time.monotonic() < deadline and not all(any((tmp_path / "cut" / d).rglob("step-*")) for d in "ab"):
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=120) == 75
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    log.seek(0)
    first = log.read()
    assert first.count("preempted: saved at step") == 4, first[-3000:]  # each job, each rank
    code, out, err = etrun(["--nproc-per-node", "2", "--rdzv-id", "cut2", "--group", *group_args(jobs("cut"))],
                           tmp_path)
    assert code == 0, err[-3000:]
    assert out.count("resumed at step") == 4, out[-3000:]
    assert digests(out) == whole
