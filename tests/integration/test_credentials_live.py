"""Credentials in a live cluster: node daemons with node credentials of their own, a user made
with the CLI, and a job whose run gets its own worker credential; while it runs, no token is on
any process's command line or in any process's environment, and afterwards none is in a log,
the event log or `status --json`."""

import glob
import json
import os
import pwd
import stat
import subprocess
import sys
import time

from elastictrain import CoordinatorClient
from elastictrain.launcher.local_cluster import LocalCluster
from elastictrain.wire import JobSubmit

SCRIPT = """
import json, os, sys, time
print("worker sees", sorted(k for k in os.environ if k.startswith("ET_")), flush=True)
with open("worker-env.json.tmp", "w") as f:  # its own environment (a fork's /proc/PID/environ is its zygote's)
    json.dump({"pid": os.getpid(), "env": {k: v for k, v in os.environ.items() if k.startswith("ET_TOKEN")}}, f)
os.replace("worker-env.json.tmp", "worker-env.json")
time.sleep(float(sys.argv[1]))
print("done", flush=True)
"""


def _cli(c, *args, token_file=None):
    env = dict(os.environ, ET_COORDINATOR=c.coordinator.url, ET_TOKEN_FILE=token_file or c.coordinator.token_file)
    env.pop("ET_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "elastictrain", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def _proc_files(name: str):
    for path in glob.glob(f"/proc/[0-9]*/{name}"):
        try:
            with open(path, "rb") as f:
                yield path, f.read()
        except OSError:  # gone, or not ours to read
            continue


def test_no_credential_leaks_into_command_lines_environments_logs_events_or_status(tmp_path):
    me = pwd.getpwuid(os.geteuid()).pw_name
    with LocalCluster(tmp_path, "fifo", nodes=1, slots=1, node_credentials=True) as c:
        with open(tmp_path / "sleepy.py", "w") as f:
            f.write(SCRIPT)
        alice_file = str(tmp_path / "alice.token")
        # a user for this machine's own account (a daemon that is not root runs only its own)
        args = ["users", "add", "alice", "--unix-user", me, "--token-out", alice_file]
        r = _cli(c, *args, *(["--allow-root"] if os.geteuid() == 0 else []))
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE(os.stat(alice_file).st_mode) == 0o600
        with open(alice_file) as f:
            alice = f.read().strip()
        with CoordinatorClient(c.coordinator.url, alice, timeout=10.0, retry_for=10.0) as ac:
            jid = ac.submit(JobSubmit(["sleepy.py", "10"], str(tmp_path), name="sleepy", max_restarts=0,
                                      env={"OMP_NUM_THREADS": "1"})).id
        c.wait(lambda st: any(j.id == jid and j.status == "running" for j in st.jobs), 60, "the job to run")
        run_tokens = []
        deadline = time.monotonic() + 30
        while not run_tokens and time.monotonic() < deadline:
            run_tokens = glob.glob(str(tmp_path / "state-n1" / "jobs" / jid / "run*" / "token"))
            time.sleep(0.2)
        assert run_tokens, "the run's credential file"
        assert stat.S_IMODE(os.stat(run_tokens[0]).st_mode) == 0o600
        tokens = {"admin": c.coordinator.token, "alice": alice}
        with open(c.node_tokens["n1"]) as f:
            tokens["node"] = f.read().strip()
        with open(run_tokens[0]) as f:
            tokens["worker"] = f.read().strip()
        assert len(set(tokens.values())) == 4
        # wait for the worker itself, then look at every process
        deadline = time.monotonic() + 30
        while not (tmp_path / "worker-env.json").exists():
            assert time.monotonic() < deadline, "the job's worker process"
            time.sleep(0.2)
        worker = json.loads((tmp_path / "worker-env.json").read_text())
        assert os.path.exists(f"/proc/{worker['pid']}"), "the worker is alive while every process is read"
        seen = 0
        for what in ("cmdline", "environ"):
            for path, data in _proc_files(what):
                seen += 1
                for who, token in tokens.items():
                    assert token.encode() not in data, f"{who}'s token in {path}"
        assert seen > 20
        assert "ET_TOKEN" not in worker["env"]
        assert worker["env"]["ET_TOKEN_FILE"] == run_tokens[0]  # its run's own, not the node's
        c.wait_all(1, 90)
        assert c.client.cluster_job(jid).status == "finished"
        # the worker's credential ends with its run
        status = _cli(c, "status", "--json")
        assert status.returncode == 0, status.stderr
        events = "".join(e.__repr__() for e in c.events())
        texts = {"status --json": status.stdout, "events": events}
        for path in glob.glob(str(tmp_path / "**" / "*.log"), recursive=True) + \
                glob.glob(str(tmp_path / "**" / "*.out"), recursive=True):
            with open(path, errors="replace") as f:
                texts[path] = f.read()
        assert any("worker sees" in t for t in texts.values())  # the job's output was among them
        for where, text in texts.items():
            for who, token in tokens.items():
                assert token not in text, f"{who}'s token in {where}"
