"""A real cluster on one machine: a coordinator process running a policy and node daemon
processes with CPU slots, on loopback (``make demo-cluster``, the cluster tests, benchmarks).

    with LocalCluster(tmp, "tiresias-l", "--thresholds", "10") as c:
        job = c.submit("train", gpus=2, command=["train.py", "--epochs", "3"])
        c.wait_all(1)
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from typing import Optional

from ..coordinator.process import CoordinatorProcess
from ..runtime.client import CoordinatorClient
from ..wire import JobSubmit
from .node import stop_node_zygotes

__all__ = ["LocalCluster", "max_slots_in_use", "ENDED"]

ENDED = ("finished", "failed", "cancelled")


class LocalCluster:
    """``nodes`` daemons of ``slots`` CPU slots each, and a coordinator running ``policy``, with
    their state and logs in ``tmp``. Every process is stopped by :meth:`stop`.

    ``slurm_conf``: run the jobs through that Slurm instead (``--backend slurm``, partition
    ``partition``); its nodes are the cluster's, and no node daemon is started. ``ray_address``:
    through that Ray cluster (``--backend ray``; ``nodes`` is then how many Ray nodes it has).
    ``node_credentials``: each daemon gets a node credential of its own (``nodes add``), not the
    admin token. ``python``: the interpreter the daemons (and so the jobs) run; under Slurm, the
    runs' (``--slurm-python``)."""

    def __init__(self, tmp, policy: str, *policy_args: str, nodes: int = 2, slots: int = 2,
                 node_timeout: float = 6.0, slurm_conf: Optional[str] = None, partition: str = "low",
                 node_credentials: bool = False, python: str = sys.executable,
                 ray_address: Optional[str] = None, node_types: tuple = ()) -> None:
        self.tmp = str(tmp)
        os.makedirs(self.tmp, exist_ok=True)
        self.engine = "slurm" if slurm_conf else "ray" if ray_address else "nodes"
        self.ray_address = ray_address
        engine = ("--backend", "slurm", "--slurm-partition", partition, "--slurm-python", python) if slurm_conf \
            else ("--backend", "ray", "--ray-address", ray_address) if ray_address else ()
        self.coordinator = CoordinatorProcess(os.path.join(self.tmp, "coord.db"), os.path.join(self.tmp, "token"),
                                              log_file=os.path.join(self.tmp, "coordinator.log"),
                                              extra_args=("--policy", policy, "--interval", "1",
                                                          "--node-timeout", str(node_timeout), *engine,
                                                          *policy_args),
                                              env={"SLURM_CONF": slurm_conf} if slurm_conf else None)
        self.names = [f"n{i + 1}" for i in range(nodes)]
        self.slots = slots
        self.node_types = dict(zip(self.names, node_types))  # node -> the GPU type it reports (--gpu-type)
        self.node_credentials, self.python = node_credentials, python
        self.node_tokens: dict[str, str] = {}  # node -> its token file
        self.daemons: dict = {}
        self.client = None

    def start(self) -> "LocalCluster":
        self.coordinator.start()
        self.client = CoordinatorClient(self.coordinator.url, self.coordinator.token, timeout=10.0, retry_for=30.0)
        for name in self.names if self.engine == "nodes" else ():
            self.start_node(name)
        self.wait(lambda st: sum(n.state == "up" for n in st.nodes) == len(self.names), 60, "nodes registered")
        return self

    def env(self) -> dict:
        env = dict(os.environ, ET_COORDINATOR=self.coordinator.url, ET_TOKEN_FILE=self.coordinator.token_file,
                   ET_STEP_REPORT_INTERVAL="0.5")
        env.pop("ET_TOKEN", None)
        return env

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """``elastictrain ARGS`` against this cluster (as a user types it, in ``tmp``); ``check``:
        fail, with its stderr, unless it exits 0."""
        r = subprocess.run([sys.executable, "-m", "elastictrain", *args], env=self.env(), cwd=self.tmp,
                           capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise AssertionError(f"elastictrain {' '.join(args)} exited {r.returncode}: {r.stderr[-2000:]}")
        return r

    def start_node(self, name: str) -> None:
        env = self.env()
        if self.node_credentials:
            if name not in self.node_tokens:
                from ..coordinator.server import write_token_file

                path = os.path.join(self.tmp, f"node-{name}.token")
                write_token_file(path, self.client.add_node(name).token)
                self.node_tokens[name] = path
            env["ET_TOKEN_FILE"] = self.node_tokens[name]
        log = open(os.path.join(self.tmp, f"{name}.log"), "ab")
        self.daemons[name] = subprocess.Popen(
            [self.python, "-m", "elastictrain", "node", "--slots", str(self.slots), "--name", name,
             "--state-dir", os.path.join(self.tmp, f"state-{name}"), "--warm-spares", "0", "--poll-wait", "2",
             *(("--gpu-type", self.node_types[name]) if name in self.node_types else ())],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp)
        log.close()

    def kill_node(self, name: str) -> None:
        p = self.daemons[name]
        p.kill()
        p.wait()

    def submit(self, name: str, gpus: int, command: list[str], steps: Optional[int] = None,
               grace: float = 20.0, min_gpus: Optional[int] = None, user: str = "default",
               env: Optional[dict] = None) -> str:
        """Queue ``command`` (a script and its arguments, run in ``tmp``) for ``user``; returns the
        job id. ``min_gpus``: an elastic job of ``min_gpus..gpus`` workers; ``env``: more variables."""
        info = self.client.submit(JobSubmit(list(command), self.tmp, name=name, gpus=gpus, min_gpus=min_gpus,
                                            steps=steps, grace=grace,
                                            env={"OMP_NUM_THREADS": "1", "ET_STEP_REPORT_INTERVAL": "0.5", **(env or {})},
                                            user=user))
        return info.id

    def result(self, name: str) -> dict:
        with open(os.path.join(self.tmp, f"{name}.json")) as f:
            return json.load(f)

    def __enter__(self) -> "LocalCluster":
        try:
            return self.start()
        except BaseException:  # a cluster that did not come up stops what it started
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait(self, cond, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while True:
            try:
                st = self.client.cluster_status()
                if cond(st):
                    return st
            except Exception:  # the coordinator may be restarting
                st = None
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; status: {st}\n"
                                     + self.tail())
            time.sleep(0.25)

    def wait_all(self, n: int, timeout: float = 240.0):
        return self.wait(lambda st: len(st.jobs) == n and all(j.status in ENDED for j in st.jobs), timeout,
                         f"all {n} jobs to end")

    def output(self, job: str) -> str:
        """Everything the coordinator keeps of ``job``'s output, as text."""
        out, after = [], 0
        while True:
            page = self.client.job_logs(job, after)
            if not page.chunks:
                return "".join(out)
            out += [c.data.decode(errors="replace") for c in page.chunks]
            after = page.next

    def events(self) -> list:
        out, after = [], 0
        while True:
            page = self.client.events(after)
            out += page.events
            if not page.events:
                return out
            after = page.next

    def finish(self, job: str, timeout: float):
        """Wait until ``job`` ends; fail (with the logs' tails) unless it finished. Returns its status."""
        self.wait(lambda st: any(j.id == job and j.status in ENDED for j in st.jobs), timeout, f"job {job} to end")
        st = self.client.cluster_job(job)
        assert st.status == "finished", (st.status, st.reason, self.tail())
        return st

    def coordinator_log(self, wait_for: str = "", timeout: float = 30.0) -> str:
        """The coordinator's whole log (:meth:`tail` keeps the last lines of each log); with
        ``wait_for``, once it contains that text (fails after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            with open(os.path.join(self.tmp, "coordinator.log"), errors="replace") as f:
                text = f.read()
            if wait_for in text:
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"the coordinator's log never said {wait_for!r}:\n" + self.tail())
            time.sleep(0.2)

    def tail(self) -> str:
        text = []
        for path in sorted(glob.glob(os.path.join(self.tmp, "*.log"))):
            with open(path, errors="replace") as f:
                text.append(f"--- {os.path.basename(path)}\n" + "".join(f.readlines()[-25:]))
        return "\n".join(text)

    def stop(self) -> None:
        for p in self.daemons.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.daemons.values():
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for path in glob.glob(os.path.join(self.tmp, "state-*", "tasks", "*.pid")):  # leftovers, if any
            try:
                with open(path) as f:
                    os.killpg(int(f.read()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        for name in self.daemons:  # the zygotes a daemon killed with -9 could not stop (each stops its own)
            stop_node_zygotes(os.path.join(self.tmp, f"state-{name}"))
        if self.client is not None:
            self.client.close()
        self.coordinator.stop()
        if self.engine == "slurm":  # the runs still in Slurm are ours to stop too
            self.cancel_slurm_jobs()
        if self.engine == "ray":  # and those still on Ray (detached: they outlive the coordinator)
            self.release_ray_runs()

    def release_ray_runs(self) -> None:
        state = os.path.join(self.tmp, "ray-runs")
        if os.path.exists(os.path.join(state, "coordinator-id")):
            subprocess.run([sys.executable, "-m", "elastictrain.engines.ray_engine", self.ray_address, state],
                           capture_output=True, timeout=60, env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))

    def cancel_slurm_jobs(self) -> None:
        try:
            with open(os.path.join(self.tmp, "slurm-runs", "coordinator-id")) as f:
                comment = "elastictrain:" + f.read().strip()
            env = dict(os.environ, **self.coordinator.env_extra)
            out = subprocess.run(["squeue", "--json"], env=env, capture_output=True, text=True, timeout=30).stdout
            ids = [str(j["job_id"]) for j in json.loads(out).get("jobs", []) if j.get("comment") == comment
                   and j.get("job_state") not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")]
            if ids:
                subprocess.run(["scancel", "--signal=KILL", "--full", *ids], env=env, capture_output=True, timeout=30)
                subprocess.run(["scancel", *ids], env=env, capture_output=True, timeout=30)
        except (OSError, ValueError, subprocess.SubprocessError):
            pass


def max_slots_in_use(events, slots: int) -> dict:
    """Replay the launch/exit events: the most slots each node had in use at once."""
    used, most = {}, {}
    for e in events:
        if e.kind == "launch":
            used[e.node] = used.get(e.node, 0) + e.detail["slots"]
        elif e.kind == "exit":
            used[e.node] = used.get(e.node, 0) - e.detail["slots"]
        if e.node:
            most[e.node] = max(most.get(e.node, 0), used.get(e.node, 0))
    return most
