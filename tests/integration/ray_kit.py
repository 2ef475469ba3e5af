"""A real Ray cluster on this host for the tests: a head without GPUs and two more nodes, ``w1``
and ``w2``, with 2 fake GPUs each (declared with ``--num-gpus``), so the jobs run only on nodes
a test may kill (killing the head would end the cluster, not lose a node). Each node is a ``ray
start --block`` in a session of its own, so that a node can be killed alone (its raylet, object
store and workers) and everything stopped by process group, never with ``ray stop`` (which stops
every Ray on the machine).

Ray is optional (``make test-ray`` installs it): the tests that use this skip without it. The
head's health checks are quickened (1 s, 3 misses) so a killed node is declared dead in seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

RAY_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
           "RAY_health_check_failure_threshold": "3", "RAY_USAGE_STATS_ENABLED": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing() -> str:
    """Why Ray cannot run here ("" when it can)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (make test-ray installs it: pip install 'elastictrain[ray]')"
    if not shutil.which("ray", path=os.path.dirname(sys.executable)):
        return "the ray command is not beside this Python"
    return ""


class RayKit:
    def __init__(self, gpus: int = 2, workers: tuple = ("w1", "w2")) -> None:
        self.root = tempfile.mkdtemp(prefix="etray-", dir="/tmp")  # short: Ray's socket paths are capped
        self.gpus, self.workers = gpus, workers
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.ray = os.path.join(os.path.dirname(sys.executable), "ray")

    def _start(self, name: str, args: list, gpus: int) -> None:
        log = open(os.path.join(self.root, f"{name}.log"), "ab")
        env = dict(os.environ, **RAY_ENV)
        env.pop("ET_TOKEN", None)
        self.procs[name] = subprocess.Popen(
            [self.ray, "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1", "--num-cpus=4",
             f"--num-gpus={gpus}", *args],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=self.root)
        log.close()

    def start(self) -> "RayKit":
        self._start("head", ["--head", f"--port={self.port}", f"--temp-dir={self.root}/t",
                             f"--ray-client-server-port={_free_port()}", f"--dashboard-port={_free_port()}",
                             "--include-dashboard=false", f"--dashboard-agent-listen-port={_free_port()}",
                             f"--metrics-export-port={_free_port()}"], 0)
        self.wait_nodes(1, 60)
        for i, name in enumerate(self.workers):  # one at a time: two joining at once time out on 2 cores
            self.start_worker(name)
            self.wait_nodes(2 + i, 90)
        return self

    def start_worker(self, name: str) -> None:
        """Start node ``name`` (again: after a kill it joins as a new Ray node, with a new id)."""
        self._start(name, [f"--address={self.address}", f"--dashboard-agent-listen-port={_free_port()}",
                           f"--metrics-export-port={_free_port()}"], self.gpus)

    def node_of(self, ray_node_name: str) -> str:
        """Which of our node processes runs the Ray node we call ``ray_node_name`` (``ray-<id>``)."""
        import psutil

        prefix = ray_node_name[len("ray-"):]
        for name, p in self.procs.items():
            try:
                for child in psutil.Process(p.pid).children(recursive=True):
                    if any(a.startswith("--node_id=" + prefix) for a in child.cmdline()):
                        return name
            except psutil.Error:
                continue
        raise AssertionError(f"no node process runs {ray_node_name}")

    def alive_nodes(self) -> list:
        """The alive nodes, from a short-lived driver of its own (the test process stays no driver)."""
        code = ("import json, ray; ray.init(address=%r, log_to_driver=False, configure_logging=False);"
                "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive']]))" % self.address)
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20,
                                 env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
        except subprocess.TimeoutExpired:
            return []
        if out.returncode != 0:
            return []
        import json

        return json.loads(out.stdout.strip().splitlines()[-1])

    def named_actors(self) -> list:
        """Every named actor alive on the cluster, all namespaces: ``[{"name", "namespace"}]``."""
        code = ("import json, ray; ray.init(address=%r, log_to_driver=False, configure_logging=False);"
                "print(json.dumps(ray.util.list_named_actors(all_namespaces=True)))" % self.address)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
        assert out.returncode == 0, out.stderr[-2000:]
        import json

        return json.loads(out.stdout.strip().splitlines()[-1])

    def wait_nodes(self, n: int, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"ray {name} exited {p.returncode}: " + self.tail(name))
            nodes = self.alive_nodes()
            if len(nodes) >= n:
                return nodes
            time.sleep(0.5)
        raise RuntimeError(f"Ray did not reach {n} alive nodes in {timeout:.0f} s: " + self.tail("head"))

    def kill(self, name: str) -> None:
        """``kill -9`` of a node: its session (raylet, object store) and every process under it (its
        workers and what they started, in sessions of their own), as when the machine is lost."""
        import psutil

        p = self.procs.pop(name)
        try:
            under = psutil.Process(p.pid).children(recursive=True)
        except psutil.Error:
            under = []
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for c in under:
            try:
                c.kill()
            except psutil.Error:
                pass
        p.wait()

    def tail(self, name: str) -> str:
        try:
            with open(os.path.join(self.root, f"{name}.log"), errors="replace") as f:
                return "".join(f.readlines()[-20:])
        except OSError:
            return ""

    def stop(self) -> None:
        for name in [n for n in self.procs if n != "head"] + (["head"] if "head" in self.procs else []):
            self.kill(name)
        shutil.rmtree(self.root, ignore_errors=True)
