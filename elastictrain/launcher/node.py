"""``elastictrain node``: one daemon per machine that runs the tasks the coordinator places on it.

It registers the machine's GPUs (found with pynvml, ``nvidia-smi`` or torch), or ``--slots N`` on a
CPU-only machine, then long-polls the coordinator: each poll reports the state of its tasks and
their new output, and the reply lists the tasks it must run. The daemon never listens on a port
and runs nothing but what the coordinator it was pointed at (with its token) assigns.

A task is one run of one job on this machine: an ``etrun`` agent (the same launcher users run,
so restarts, warm spares, per-rank logs and exactly-once data work as under ``etrun``) started
with ``--nproc-per-node <slots>``, the job's rendezvous id, and ``CUDA_VISIBLE_DEVICES`` set to
the GPUs it was given. A task that is no longer listed gets SIGTERM: etrun forwards it to the
workers, which checkpoint within the job's grace period and exit with the preempted code.

The etrun agents die with the daemon (``PR_SET_PDEATHSIG``: a ``kill -9`` of the daemon sends
them SIGTERM, so their workers checkpoint). A restarted daemon first waits for any agent of
its previous life still exiting, then registers again. SIGTERM or SIGINT to the daemon drains
the node: its tasks are stopped (and checkpoint), their exits reported, then it leaves.
"""

from __future__ import annotations

import glob
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Optional

from ..errors import ConfigError, ElasticTrainError, InterruptedCallError
from ..wire import LogChunk, NodeLeave, NodePoll, NodeRegister, Task, TaskState
from ..runtime.client import write_token_file
from .parent_death import set_pdeathsig
from .run_as import RunAsError, chown_for, resolve, task_base_env
from .task_command import etrun_command, task_env

__all__ = ["NodeConfig", "NodeDaemon", "detect_gpus"]

log = logging.getLogger("elastictrain.node")
_CHUNK = 65536
_KILL_AFTER = 15.0  # seconds past a task's grace before its process group gets SIGKILL


@dataclass(frozen=True)
class NodeConfig:
    coordinator: str
    token_file: Optional[str]
    name: str
    slots: int
    kind: str = "gpu"  # gpu | slot
    gpu_type: str = ""
    state_dir: str = "elastictrain-node"
    poll_wait: float = 5.0
    warm_spares: int = -1  # passed to etrun (-1: its default)
    zygote: Optional[str] = None  # etrun's --zygote (None: keep for our own account's jobs, else on)

    def __post_init__(self) -> None:
        if not 1 <= self.slots <= 65536:
            raise ConfigError(f"--slots/--gpus must be in [1, 65536], got {self.slots}")
        if not 0.0 <= self.poll_wait <= 30.0:
            raise ConfigError(f"--poll-wait must be in [0, 30] seconds, got {self.poll_wait}")


def detect_gpus() -> tuple[int, str]:
    """(count, type name) of this machine's NVIDIA GPUs; (0, "") when there are none."""
    try:
        import pynvml  # type: ignore

        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) if n else ""
            return n, name.decode() if isinstance(name, bytes) else name
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no pynvml, no driver: try the command line tool
        pass
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    lines = [line for line in out.splitlines() if line.startswith("GPU ")]
    if lines:
        return len(lines), lines[0].split(":", 1)[1].split("(")[0].strip()
    try:  # last: torch, where it is installed (slower to import, but it knows)
        import importlib.util

        if importlib.util.find_spec("torch") is not None:
            import torch

            if torch.cuda.is_available():
                return torch.cuda.device_count(), torch.cuda.get_device_name(0)
    except Exception:  # a broken CUDA install: no GPU we can use
        pass
    return 0, ""


class _Task:
    def __init__(self, spec: Task, proc: subprocess.Popen, pidfile: str, logfile) -> None:
        self.spec, self.proc, self.pidfile, self.logfile = spec, proc, pidfile, logfile
        self.key = (spec.job, spec.run)
        self.code: Optional[int] = None
        self.detail = ""
        self.tail: deque = deque(maxlen=40)
        self.stop_at: Optional[float] = None  # when SIGTERM was sent
        self.reported = False  # its exit was in a poll that got an answer


def node_zygote_dir(state_dir: str) -> str:
    """Where the kept zygotes of a daemon's own-account tasks listen (``ET_ZYGOTE_DIR``): a
    directory of this daemon alone, named after its state directory (short: a socket's path is
    at most 107 bytes), so that the daemon can stop them when it leaves, or when it starts again
    after a kill -9, without touching a zygote its user keeps for anything else."""
    import hashlib

    digest = hashlib.sha256(os.path.abspath(state_dir).encode()).hexdigest()[:12]
    return f"/tmp/et-node-{os.getuid()}-{digest}"


def stop_node_zygotes(state_dir: str) -> int:
    """Stop the kept zygotes of the daemon with this state directory (and their workers), and
    remove their directory; returns how many there were."""
    import shutil

    from .zygote_keep import private_dir, stop_all

    d = node_zygote_dir(state_dir)
    if not private_dir(d, os.getuid()):  # not ours (/tmp is shared): not ours to read or remove
        return 0
    n = stop_all(directory=d)
    shutil.rmtree(d, ignore_errors=True)
    return n


class NodeDaemon:
    def __init__(self, cfg: NodeConfig) -> None:
        from ..runtime.client import CoordinatorClient, token_from_file

        self.cfg = cfg
        token = token_from_file(cfg.token_file, "--token-file") if cfg.token_file else ""
        self.client = CoordinatorClient(cfg.coordinator, token, timeout=10.0, retry_for=120.0)
        self.reporter = CoordinatorClient(cfg.coordinator, token, timeout=10.0, retry_for=120.0)
        self.instance = uuid.uuid4().hex[:16]
        self.tasks: dict[tuple, _Task] = {}
        self._lock = threading.Lock()
        self._logs: list[LogChunk] = []
        self._wake = threading.Event()
        self._stop: Optional[int] = None
        self._stopping = threading.Event()  # set with _stop: wakes every back-off at once
        self.client.cancel_event = self.reporter.cancel_event = self._stopping  # and ends every retrying call
        self._reply = None
        self._seen: set = set()
        self._enforce: Optional[str] = None  # how a plan's memory limit is enforced here (probed once)
        self._zygote_dir: Optional[str] = None  # ET_ZYGOTE_DIR of our own account's tasks (kept zygotes)
        os.makedirs(os.path.join(cfg.state_dir, "tasks"), exist_ok=True)

    def _make_zygote_dir(self) -> Optional[str]:
        """The private directory for the zygotes our tasks keep, made at the first such task (and
        removed, with them, when this daemon leaves); "" where it cannot be made."""
        d = node_zygote_dir(self.cfg.state_dir)
        try:
            os.mkdir(d, 0o700)
            self._zygote_dir = d
        except OSError as exc:  # etrun then uses its user's default directory
            self._zygote_dir = ""
            log.warning("cannot make %s for the kept zygotes (%s); tasks keep them in their user's default "
                        "directory", d, exc.strerror or exc)
        return self._zygote_dir

    def _memory_enforce(self) -> str:
        """``cgroup`` where this daemon may make memory cgroups (the kernel then counts a worker's
        whole memory), else ``rlimit`` (its data segment)."""
        if self._enforce is None:
            from ..errors import ConfigError
            from .memcg import WorkerCgroup

            try:
                WorkerCgroup.create(f"etnode-probe-{os.getpid()}", 1 << 30).remove()
                self._enforce = "cgroup"
            except (ConfigError, OSError) as exc:
                log.info("memory limits are enforced as RLIMIT_DATA here (%s)", exc)
                self._enforce = "rlimit"
        return self._enforce

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._wait_for_orphans()
            stop_node_zygotes(self.cfg.state_dir)  # those of a previous life of this daemon (killed with -9)
            try:
                self._register()
            except InterruptedCallError:
                return 128 + (self._stop or signal.SIGTERM)
            poller = threading.Thread(target=self._poll_loop, name="et-node-poll", daemon=True)
            poller.start()
            while self._stop is None:
                self._wake.wait(0.5)
                self._wake.clear()
                try:
                    self._step()
                except InterruptedCallError:
                    break  # a signal came while the coordinator was unreachable: drain
                except ElasticTrainError:
                    raise
                except Exception:  # noqa: BLE001 - a bug in one step must not take the node's jobs down
                    log.exception("node step failed; going on")
                    self._stopping.wait(1.0)
            return self._drain()
        except ElasticTrainError as exc:
            print(f"elastictrain node: error: {exc}", file=sys.stderr)
            return 1
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if self._zygote_dir:  # after the drain: no task of ours uses them
                stop_node_zygotes(self.cfg.state_dir)

    def _on_signal(self, signum, _frame) -> None:
        self._stop = signum
        self._stopping.set()
        self._wake.set()

    def _register(self) -> None:
        cfg = self.cfg
        info = self.client.node_register(cfg.name, NodeRegister(cfg.slots, self.instance, cfg.kind, cfg.gpu_type,
                                                                socket.gethostname()))
        log.info("node %s registered with %d %s(s) at %s (index %d)", cfg.name, info.slots, cfg.kind,
                 cfg.coordinator, info.index)

    def _poll_loop(self) -> None:
        failures = 0
        while self._stop is None:
            try:
                reply = self._poll(self.client, self.cfg.poll_wait)
            except Exception as exc:  # noqa: BLE001 - this loop must outlive anything a poll can raise
                failures += 1
                if isinstance(exc, ElasticTrainError):
                    log.error("poll failed: %s", exc)
                else:
                    log.exception("poll failed unexpectedly; polling on")
                self._stopping.wait(min(10.0, 0.5 * 2 ** min(failures, 5)))
                continue
            failures = 0
            with self._lock:
                self._reply = reply
            self._wake.set()

    def _poll(self, client, wait: float):
        with self._lock:
            states, sent = self._states(), [t for t in self.tasks.values() if t.code is not None]
            logs, self._logs = self._logs, []
        try:
            reply = client.node_poll(self.cfg.name, NodePoll(self.instance, states, logs, wait))
        except ElasticTrainError:
            with self._lock:
                self._logs = logs + self._logs  # nothing is lost: sent again next time
            raise
        with self._lock:
            for t in sent:
                t.reported = True
        return reply

    def _states(self) -> list[TaskState]:
        out = []
        for t in self.tasks.values():
            if t.code is None:
                out.append(TaskState(t.spec.job, t.spec.run, "running"))
            else:
                out.append(TaskState(t.spec.job, t.spec.run, "exited", max(-255, min(255, t.code)), t.detail[-60000:]))
        return out

    def _step(self) -> None:
        exited = self._reap()
        with self._lock:
            reply, self._reply = self._reply, None
            for key in [k for k, t in self.tasks.items() if t.reported]:
                self._forget(self.tasks.pop(key))
        if exited:  # tell the coordinator now, not at the end of the long poll
            try:
                reply = self._poll(self.reporter, 0.0)
            except ElasticTrainError as exc:
                log.error("could not report exits: %s", exc)
        if reply is not None:
            if reply.action == "register":
                log.warning("the coordinator does not know this daemon (it restarted, or the node was declared lost); "
                            "registering again")
                self._register()
            else:
                self._reconcile(reply.tasks)
        self._enforce_grace()

    def _reconcile(self, wanted: list[Task]) -> None:
        keys = {(t.job, t.run) for t in wanted}
        for spec in wanted:
            if (spec.job, spec.run) not in self._seen:  # a run is started once; a stale reply cannot restart it
                self._seen.add((spec.job, spec.run))
                self._start(spec)
        for key, t in self.tasks.items():
            if key not in keys and t.code is None and t.stop_at is None:
                log.info("stopping task %s run %d (no longer placed here)", *key)
                t.stop_at = time.monotonic()
                _signal(t.proc, signal.SIGTERM, group=False)

    def _enforce_grace(self) -> None:
        now = time.monotonic()
        for t in self.tasks.values():
            if t.code is None and t.stop_at is not None and now - t.stop_at > t.spec.grace + _KILL_AFTER:
                log.warning("task %s run %d did not exit %.0f s after SIGTERM; killing it", *t.key,
                            t.spec.grace + _KILL_AFTER)
                _signal(t.proc, signal.SIGKILL, group=True)

    # ------------------------------------------------------------------ tasks
    def _start(self, spec: Task) -> None:
        cfg = self.cfg
        try:
            acct = resolve(spec.run_as, spec.allow_root, cfg.name)
        except RunAsError as exc:
            self._failed(spec, 126, f"refused: {exc}")
            return
        run_dir = os.path.abspath(os.path.join(cfg.state_dir, "jobs", spec.job, f"run{spec.run}"))
        os.makedirs(run_dir, exist_ok=True)
        token_file = None
        if spec.token:  # the run's own credential, readable by its account alone
            token_file = os.path.join(run_dir, "token")
            write_token_file(token_file, spec.token)
        # the daemon's own file, opened before the directory is the task account's
        logfile = os.fdopen(os.open(os.path.join(run_dir, "etrun.log"),
                                    os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644), "ab")
        for path in (run_dir, *((token_file,) if token_file else ())):
            chown_for(path, acct)
        enforce = None
        if spec.memory_limit:  # a task as another account cannot make cgroups: its data segment then
            enforce = "rlimit" if acct.switch else self._memory_enforce()
        zygote = cfg.zygote or ("on" if acct.switch else "keep")
        cmd = etrun_command(spec, cfg.coordinator, log_dir=run_dir, token_file=token_file,
                            warm_spares=cfg.warm_spares, memory_enforce=enforce, zygote=zygote)
        env = task_base_env(acct)
        env.update(task_env(spec, cfg.name))
        if zygote == "keep" and not acct.switch:
            d = self._make_zygote_dir() if self._zygote_dir is None else self._zygote_dir
            if d:
                env["ET_ZYGOTE_DIR"] = d  # ours: stopped when this daemon leaves
        if cfg.kind == "gpu":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
        switch = {"user": acct.uid, "group": acct.gid, "extra_groups": list(acct.groups)} if acct.switch else {}
        workdir = spec.workdir

        def as_task() -> None:  # in the child, after the switch to the task's account
            os.chdir(workdir)  # the account itself must be able to enter it
            set_pdeathsig()

        try:
            proc = subprocess.Popen(cmd, cwd="/", env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=as_task, **switch)
        except (OSError, subprocess.SubprocessError) as exc:
            logfile.close()
            why = exc.strerror if isinstance(exc, OSError) else "it does not exist or the account may not enter it"
            self._failed(spec, 127, f"cannot start the job as {acct.name} in {workdir}: {why}")
            return
        pidfile = os.path.join(cfg.state_dir, "tasks", f"{spec.job}-{spec.run}.pid")
        with open(pidfile, "w") as f:
            f.write(str(proc.pid))
        t = _Task(spec, proc, pidfile, logfile)
        self.tasks[t.key] = t
        threading.Thread(target=self._pump, args=(t,), name=f"et-node-out-{spec.job}", daemon=True).start()
        log.info("started job %s run %d on %d slot(s) %s (pid %d)", spec.job, spec.run, spec.slots, spec.gpus, proc.pid)

    def _failed(self, spec: Task, code: int, detail: str) -> None:
        log.error("job %s run %d: %s", spec.job, spec.run, detail)
        t = _Task(spec, None, "", None)
        t.code, t.detail = code, detail
        self.tasks[t.key] = t
        self._wake.set()

    def _pump(self, t: _Task) -> None:
        for line in iter(t.proc.stdout.readline, b""):
            t.logfile.write(line)
            t.logfile.flush()
            t.tail.append(line)
            self._add_log(t, line)  # (goes out with the next poll: a quiet job's last lines are not held back)
        t.proc.stdout.close()
        t.proc.wait()
        self._wake.set()

    def _add_log(self, t: _Task, data: bytes) -> None:
        with self._lock:
            last = self._logs[-1] if self._logs else None
            if last is not None and (last.job, last.run) == t.key and len(last.data) + len(data) <= _CHUNK:
                self._logs[-1] = LogChunk(last.job, last.run, last.data + data)  # lines of a poll go as one chunk
                return
            for i in range(0, len(data), _CHUNK):
                self._logs.append(LogChunk(t.spec.job, t.spec.run, data[i:i + _CHUNK]))
            if len(self._logs) > 64:  # the coordinator is slow to take them: keep the newest
                del self._logs[:len(self._logs) - 64]

    def _reap(self) -> bool:
        exited = False
        for t in self.tasks.values():
            if t.code is None and t.proc is not None and t.proc.poll() is not None:
                t.code = t.proc.returncode
                t.detail = b"".join(t.tail).decode(errors="replace")
                exited = True
                log.info("job %s run %d exited with code %d", t.spec.job, t.spec.run, t.code)
        return exited

    def _forget(self, t: _Task) -> None:
        if t.logfile is not None:
            t.logfile.close()
        if t.pidfile:
            try:
                os.unlink(t.pidfile)
            except FileNotFoundError:
                pass

    # ------------------------------------------------------------------ start-up and shutdown
    def _wait_for_orphans(self) -> None:
        """Agents of this daemon's previous life that still exit (they got SIGTERM when it died)
        hold GPUs; registering again waits for them."""
        for path in glob.glob(os.path.join(self.cfg.state_dir, "tasks", "*.pid")):
            try:
                with open(path) as f:
                    pid = int(f.read().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and _alive(pid) and b"elastictrain.launcher.cli" in _cmdline(pid):
                log.warning("waiting for pid %d, a task of this node's previous daemon, to exit", pid)
                deadline = time.monotonic() + 120.0
                os.kill(pid, signal.SIGTERM)
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.2)
                if _alive(pid):
                    os.killpg(pid, signal.SIGKILL)
            os.unlink(path)

    def _drain(self) -> int:
        name = signal.Signals(self._stop).name if self._stop else "stop"
        log.warning("got %s: stopping every task (they checkpoint), then leaving the cluster", name)
        for t in self.tasks.values():
            if t.code is None and t.proc is not None:
                t.stop_at = time.monotonic()
                _signal(t.proc, signal.SIGTERM, group=False)
        deadline = time.monotonic() + max([t.spec.grace for t in self.tasks.values()] or [0.0]) + _KILL_AFTER
        while any(t.code is None for t in self.tasks.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
            self._reap()
        for t in self.tasks.values():
            if t.code is None and t.proc is not None:
                _signal(t.proc, signal.SIGKILL, group=True)
                t.proc.wait()
        self._reap()
        try:
            self._poll(self.reporter, 0.0)
            self.reporter.node_leave(self.cfg.name, NodeLeave(self.instance))
        except ElasticTrainError as exc:
            log.error("could not tell the coordinator that this node leaves: %s", exc)
        for t in self.tasks.values():
            self._forget(t)
        return 0


def _signal(proc: Optional[subprocess.Popen], sig: int, group: bool) -> None:
    if proc is None:
        return
    try:
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
