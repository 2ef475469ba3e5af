"""Two coordinators on one PostgreSQL: the leader is killed (kill -9) mid-epoch while a DDP job
under etrun (2 workers) and a cluster-mode job on node daemons train; the standby takes over and
both jobs finish with every sample trained on exactly once. And a leader paused past its lease
(SIGSTOP, SIGCONT) writes nothing after it lost the lead, and exits."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests

from elastictrain import CoordinatorClient
from elastictrain.coordinator.process import CoordinatorProcess
from elastictrain.wire import JobSubmit
from tests.conftest import new_database

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DDP = os.path.join(ROOT, "examples", "torch_ddp_elastic.py")
LEASE = 2.0


def _pair(tmp_path, url, *extra):
    args = ("--lease", str(LEASE), "--policy", "fifo", "--interval", "1", "--node-timeout", "8", *extra)
    a = CoordinatorProcess(url, str(tmp_path / "token"), log_file=str(tmp_path / "a.log"), extra_args=args)
    b = CoordinatorProcess(url, str(tmp_path / "token"), log_file=str(tmp_path / "b.log"), extra_args=args)
    a.start()
    _wait_leader(a.url, a.token, 20)
    b.start()
    return a, b


def _wait_leader(url, token, timeout):
    """Seconds until ``url`` answers as the leader."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            r = requests.get(url + "/v1/jobs", headers={"Authorization": "Bearer " + token}, timeout=2)
            if r.status_code == 200:
                return time.monotonic() - t0
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} did not lead within {timeout} s")


def test_the_standby_takes_over_and_both_jobs_finish_exactly_once(tmp_path, postgres):
    url = new_database(postgres)
    a, b = _pair(tmp_path, url)
    both = f"{a.url},{b.url}"
    env = dict(os.environ, ET_COORDINATOR=both, ET_TOKEN_FILE=a.token_file, OMP_NUM_THREADS="1",
               ET_STEP_REPORT_INTERVAL="0.5")
    env.pop("ET_TOKEN", None)
    procs = []
    try:
        # a cluster-mode job on two node daemons that know both coordinators
        for name in ("n1", "n2"):
            log = open(tmp_path / f"{name}.log", "wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "elastictrain", "node", "--slots", "1", "--name", name, "--state-dir",
                 str(tmp_path / f"state-{name}"), "--warm-spares", "0", "--poll-wait", "2"],
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path)))
            log.close()
        client = CoordinatorClient(both, a.token, timeout=10.0, retry_for=60.0)
        deadline = time.monotonic() + 60
        while sum(n.state == "up" for n in client.cluster_status().nodes) < 2:
            assert time.monotonic() < deadline, "node daemons did not register"
            time.sleep(0.2)
        args = ["--samples", "48000", "--epochs", "2", "--shard-size", "400", "--ckpt-every", "20"]
        jid = client.submit(JobSubmit([DDP, *args, "--ckpt-dir", str(tmp_path / "ckpt-cluster")], str(tmp_path),
                                      name="cluster-ddp", gpus=2, max_restarts=5, env={"OMP_NUM_THREADS": "1"})).id
        # an etrun DDP job with 2 workers against both coordinators
        etrun_log = open(tmp_path / "etrun.log", "wb")
        etrun = subprocess.Popen([sys.executable, "-m", "elastictrain.launcher.cli", "--nproc-per-node", "2",
                                  "--max-restarts", "5", "--rdzv-id", "ddp-etrun", "--coordinator", both, DDP, *args,
                                  "--ckpt-dir", str(tmp_path / "ckpt-etrun")],
                                 env=env, stdout=etrun_log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
        procs.append(etrun)
        # mid-epoch: both jobs have trained some steps and committed a checkpoint
        deadline = time.monotonic() + 120
        while True:
            job = client.cluster_job(jid)
            text = (tmp_path / "etrun.log").read_text(errors="replace")
            try:
                etrun_commits = client.commits("ddp-etrun", "train").commits
            except Exception:  # noqa: BLE001 - its dataset is not registered yet
                etrun_commits = []
            if job.step >= 60 and len(etrun_commits) >= 2:
                break
            assert time.monotonic() < deadline and job.status == "running", (job, text[-2000:])
            time.sleep(0.3)
        assert etrun.poll() is None and client.cluster_job(jid).status == "running"  # both mid-epoch
        a.kill()  # the leader's machine is gone
        took = _wait_leader(b.url, a.token, 30)
        print(f"takeover: {took:.2f} s after kill -9 of the leader (lease {LEASE:.0f} s)")
        assert took < LEASE + 5
        assert etrun.wait(240) == 0, (tmp_path / "etrun.log").read_text(errors="replace")[-3000:]
        deadline = time.monotonic() + 240
        while client.cluster_job(jid).status not in ("finished", "failed", "cancelled"):
            assert time.monotonic() < deadline, client.cluster_job(jid)
            time.sleep(0.5)
        assert client.cluster_job(jid).status == "finished", client.cluster_job(jid)
        text = (tmp_path / "etrun.log").read_text(errors="replace")
        assert "every sample trained on exactly once per epoch: True" in text, text[-2000:]
        logs = b"".join(k.data for k in client.job_logs(jid).chunks).decode(errors="replace")
        for _ in range(20):
            if "exactly once per epoch" in logs:
                break
            time.sleep(0.5)
            logs = b"".join(k.data for k in client.job_logs(jid).chunks).decode(errors="replace")
        assert "every sample trained on exactly once per epoch: True" in logs, logs[-2000:]
        events = [e.kind for e in client.events(0).events]
        assert "leader" in events
        client.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                p.kill()
        a.kill()
        b.stop()


def test_a_paused_leader_writes_nothing_after_it_lost_the_lead(tmp_path, postgres):
    url = new_database(postgres)
    a, b = _pair(tmp_path, url)
    try:
        with CoordinatorClient(a.url, a.token, retry_for=10.0) as c:
            c.create_job("before", 1, 1)
        a.proc.send_signal(signal.SIGSTOP)
        took = _wait_leader(b.url, a.token, 30)  # the standby leads once the lease ran out
        answers = {}

        def late_write():  # accepted by the paused process's socket; served when it wakes
            try:
                r = requests.post(a.url + "/v1/jobs", json={"job": "after"}, timeout=20,
                                  headers={"Authorization": "Bearer " + a.token})
                answers["status"] = r.status_code
            except requests.RequestException as exc:
                answers["status"] = type(exc).__name__

        t = threading.Thread(target=late_write)
        t.start()
        time.sleep(0.5)
        a.proc.send_signal(signal.SIGCONT)
        t.join(30)
        assert a.proc.wait(20) == 3  # it learned it was deposed, and exited
        assert answers["status"] != 200, answers
        with CoordinatorClient(b.url, a.token, retry_for=10.0) as c:
            jobs = [j.job for j in c.jobs()]
        assert "before" in jobs and "after" not in jobs
        assert "leadership lost" in (tmp_path / "a.log").read_text()
        print(f"takeover after SIGSTOP: {took:.2f} s; the woken leader answered {answers['status']} and exited 3")
    finally:
        a.kill()
        b.stop()
