"""One generation's local workers: their environment, processes, output and exit codes."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Callable, Optional

from .. import PREEMPTED_EXIT_CODE
from ..runtime.control import ASSIGNMENT, INPROCESS, PEER_GONE, opted_in, write_assignment
from .config import LaunchConfig, Std, size_text
from .memcg import WorkerCgroup, oom_kills, own_memory_cgroup

__all__ = ["WorkerGroup", "SparePool", "Failure", "worker_env"]

log = logging.getLogger("etrun")
_RUNNER = [sys.executable, "-u", "-m", "elastictrain.launcher.runner"]
_console_lock = threading.Lock()


@dataclass(frozen=True)
class Failure:
    rank: int
    local_rank: int
    host: str
    exit_code: int
    at: float
    message: str
    traceback: str  # the Python traceback, or the worker's last stderr lines (``from_output``)
    from_output: bool = False
    # killed by the kernel's OOM killer: "worker" (in its own memory cgroup, at --memory-limit),
    # "node" (the node's cgroup ran out), "" (not an OOM kill, as far as the cgroups tell)
    oom_kill: str = ""


def _master_addr(host: str) -> str:
    """The rendezvous head's address as torchrun names it: a loopback one is ``localhost``."""
    return "localhost" if host in ("127.0.0.1", "::1") else host


def worker_env(cfg: LaunchConfig, a, local_rank: int, coordinator: str, token_file: Optional[str],
               error_file: str, base: Optional[dict] = None, local_size: Optional[int] = None) -> dict[str, str]:
    """The environment torchrun gives a worker, plus elastictrain's ``ET_*`` variables
    (``local_size``: this node's workers in the generation, if not ``--nproc-per-node``)."""
    env = dict(os.environ if base is None else base)
    env.pop("ET_TOKEN", None)  # the token travels by file only
    rank = a.rank_offset + local_rank
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(a.world_size),
        "LOCAL_WORLD_SIZE": str(local_size or cfg.nproc_per_node), "GROUP_RANK": str(a.node_rank),
        "GROUP_WORLD_SIZE": str(a.nnodes), "ROLE_NAME": cfg.role, "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(a.world_size), "MASTER_ADDR": _master_addr(a.master_addr),
        "MASTER_PORT": str(cfg.master_port or a.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(a.restart_count), "TORCHELASTIC_MAX_RESTARTS": str(cfg.max_restarts),
        "TORCHELASTIC_RUN_ID": cfg.run_id, "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": error_file,
        "TORCHELASTIC_SIGNALS_TO_HANDLE": ",".join(signal.Signals(s).name for s in cfg.signals),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "ET_COORDINATOR": coordinator, "ET_JOB_ID": cfg.run_id, "ET_GENERATION": str(a.generation),
        "ET_RESTART_REASON": a.reason, "ET_PREV_WORLD_SIZE": str(a.prev_world_size),
        "ET_NODE_RANK": str(a.node_rank), "PYTHONUNBUFFERED": "1",
        "ET_ACCUMULATE": str(getattr(a, "accumulate", 1) or 1),
    })
    if token_file:
        env["ET_TOKEN_FILE"] = os.path.abspath(token_file)
    if a.workers:  # tf.distribute.MultiWorkerMirroredStrategy's cluster, from the same generation
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": list(a.workers)},
                                       "task": {"type": "worker", "index": rank}})
    gpus = _visible_gpus(env)
    if cfg.virtual_local_rank:  # torchrun's --virtual-local-rank: each worker sees one device, as 0
        env["LOCAL_RANK"] = "0"
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[local_rank % len(gpus)]
    if cfg.memory_limit:  # (the worker's limit, however it is enforced: see runner.py)
        env["ET_MEMORY_LIMIT"] = str(cfg.memory_limit)
    if cfg.numa_binding:
        env["ET_NUMA_BINDING"], env["ET_GPU_INDEX"] = cfg.numa_binding, str(local_rank)
    if cfg.nproc_per_node > 1 and "OMP_NUM_THREADS" not in (base or os.environ):
        env["OMP_NUM_THREADS"] = "1"
    return env


def _visible_gpus(env: dict[str, str]) -> list[str]:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    from .config import _gpu_count

    return [str(i) for i in range(_gpu_count())]


def reserve_port(host: str = "") -> socket.socket:
    """A free port, held: bound with SO_REUSEADDR and never listening, so that the kernel hands it
    to no other ``bind(0)`` on this host (a busy host binds ephemeral ports all the time: gloo's
    pairs, other jobs) between the rendezvous that names it MASTER_PORT and the moment rank 0's
    TCPStore listens on it; that store binds with SO_REUSEADDR too, so the hold does not stop it.
    The caller closes the socket once the port is no longer wanted."""
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
    except OSError:
        s.close()
        raise
    return s


def reserve_ports(n: int, host: str = "") -> list[socket.socket]:
    """``n`` distinct free ports, each held as :func:`reserve_port` holds one (the workers' own ports:
    TensorFlow's TF_CONFIG names one per worker, and its gRPC server binds it with SO_REUSEADDR
    beside the hold; released, a port could be taken by any ``bind(0)`` on the host before the
    worker's server binds it, and the worker would fail with "Could not start gRPC server")."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            socks.append(reserve_port(host))
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


class SparePool:
    """Interpreters started ahead of need that have already imported ``preload`` (e.g. torch)."""

    def __init__(self, size: int, preload: tuple[str, ...], env: dict[str, str]) -> None:
        self.size, self._env = size, env
        self._cmd = _RUNNER + (["--preload", ",".join(preload)] if preload else [])
        self._spares: deque[subprocess.Popen] = deque()
        self._timer: Optional[threading.Timer] = None
        self._lock = threading.Lock()

    def take(self) -> Optional[subprocess.Popen]:
        with self._lock:
            while self._spares:
                p = self._spares.popleft()
                if p.poll() is None:
                    return p
        return None

    def fill(self) -> None:
        with self._lock:
            while len(self._spares) < self.size:
                self._spares.append(_spawn(self._cmd, self._env))

    def fill_later(self, delay: float) -> None:
        """Top up after ``delay`` seconds, so the imports do not compete with workers starting."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(delay, self.fill)
        self._timer.daemon = True
        self._timer.start()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            for p in self._spares:
                try:
                    p.stdin.close()  # EOF: the spare exits by itself
                except OSError:
                    pass
            for p in self._spares:
                try:
                    p.wait(2)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            self._spares.clear()


def _spawn(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


@dataclass
class _Worker:
    local_rank: int
    rank: int
    proc: subprocess.Popen
    error_file: str
    tail: deque = field(default_factory=lambda: deque(maxlen=40))
    exit_code: Optional[int] = None
    exited_at: float = 0.0
    marker: str = ""  # exists while the worker persists a checkpoint (ET_PERSIST_MARKER)
    cgroup: Optional[WorkerCgroup] = None  # its memory cgroup (--memory-enforce cgroup)
    oom_before: Optional[int] = None  # its memory cgroup's OOM kills when it started
    notify: threading.Event = field(default_factory=threading.Event)  # its group's ``changed``
    threads: list[threading.Thread] = field(default_factory=list)
    files: list[IO[bytes]] = field(default_factory=list)


class WorkerGroup:
    """Start, watch and stop the local workers of one generation.

    ``changed`` is set whenever a worker exits, so the agent reacts at once rather than at
    its next poll.
    """

    def __init__(self, cfg: LaunchConfig, assignment, attempt_dir: str, coordinator: str,
                 token_file: Optional[str], pool: Optional[SparePool], control_root: Optional[str] = None,
                 extra_env: Optional[Callable[[int], dict]] = None, slots: Optional[list[int]] = None,
                 cgroups: Optional[dict[int, WorkerCgroup]] = None) -> None:
        self.cfg, self.a, self.dir = cfg, assignment, attempt_dir
        # the worker slots (local ranks of --nproc-per-node) that run in this generation, in rank
        # order; fewer than all while a Horovod job goes on with its survivors (launcher/horovod.py)
        self.slots = list(range(cfg.nproc_per_node)) if slots is None else list(slots)
        self._extra_env = extra_env  # local rank -> more variables for a worker started fresh (Horovod's)
        self._coordinator, self._token_file, self._pool = coordinator, token_file, pool
        self.workers: list[_Worker] = []
        self.changed = threading.Event()
        self.host = socket.gethostname()
        self.started_at = 0.0
        self._filtered: dict[str, tuple[tuple[bytes, ...], IO[bytes]]] = {}  # stream -> (words, file)
        self._control_root = control_root
        self.carried: list[int] = []  # local ranks whose process survived from the last generation
        self._cgroups = cgroups or {}  # local rank -> its memory cgroup (--memory-enforce cgroup)
        self._node_cgroup = own_memory_cgroup()  # where workers without one of their own run
        self._node_ooms: Optional[int] = None

    def start(self, carry: Optional["WorkerGroup"] = None) -> "WorkerGroup":
        """Start the local workers; with ``carry`` (the previous generation's group, whose live
        workers all opted in to in-process recovery), its live workers are handed their place in
        this generation through their control directory and only the dead ones are replaced."""
        cfg = self.cfg
        self.started_at = time.time()
        self._node_ooms = oom_kills(self._node_cgroup)
        for name, words in (("stdout", cfg.stdout_filters), ("stderr", cfg.stderr_filters)):
            if words:  # torchrun's --duplicate-*-filters: one file per stream for the local workers
                os.makedirs(self.dir, exist_ok=True)
                self._filtered[name] = (tuple(w.encode() for w in words),
                                        open(os.path.join(self.dir, f"filtered_{name}.log"), "ab"))
        old_by_slot = {w.local_rank: w for w in carry.workers} if carry is not None else {}
        for pos, lr in enumerate(self.slots):
            wdir = os.path.join(self.dir, str(lr))
            os.makedirs(wdir, exist_ok=True)
            error_file = os.path.join(wdir, "error.json")
            env = worker_env(cfg, self.a, pos, self._coordinator, self._token_file, error_file,
                             local_size=len(self.slots))
            env["ET_PERSIST_MARKER"] = os.path.join(wdir, "persisting")
            if self._extra_env is not None:
                env.update(self._extra_env(lr))
            ctl = os.path.join(self._control_root, str(lr)) if self._control_root else None
            old = old_by_slot.get(lr)
            if old is not None and ctl and old.proc.poll() is None and opted_in(ctl, old.proc.pid):
                env["ET_CONTROL_DIR"] = ctl
                env["ET_PERSIST_MARKER"] = old.marker  # its checkpointer keeps the path it read
                # and its error file: a survivor that hangs before it reads this assignment (its
                # monitor ends it) writes to the path it has, which is where its failure is looked for
                env["TORCHELASTIC_ERROR_FILE"] = old.error_file
                old.rank, old.notify = self.a.rank_offset + pos, self.changed
                write_assignment(ctl, self.a.generation, env)
                self.workers.append(old)
                self.carried.append(lr)
                if old.exit_code is not None:  # it died between the check and now: seen as a failure
                    self.changed.set()
                continue
            if ctl:
                _reset_control(ctl)
                env["ET_CONTROL_DIR"] = ctl
            cgroup = self._cgroups.get(lr)
            if cgroup is not None:
                env["ET_MEMORY_CGROUP"] = cgroup.path
            oom_before = cgroup.oom_kills() if cgroup is not None else None
            if cfg.no_python:
                proc = _spawn([cfg.entrypoint, *cfg.args], env)
                proc.stdin.close()
            else:
                proc = self._pool.take() if self._pool else None
                if proc is None:
                    proc = _spawn(_RUNNER, env)
                cmd = {"env": env, "cwd": os.getcwd(), "entrypoint": cfg.entrypoint, "args": list(cfg.args),
                       "module": cfg.module}
                proc.stdin.write(json.dumps(cmd).encode() + b"\n")
                proc.stdin.close()
            if cgroup is not None:
                cgroup.join(proc.pid)  # (the runner joins it too, before the script runs)
            w = _Worker(lr, self.a.rank_offset + pos, proc, error_file, marker=env["ET_PERSIST_MARKER"],
                        notify=self.changed, cgroup=cgroup, oom_before=oom_before)
            self._route(w, wdir)
            waiter = threading.Thread(target=self._wait, args=(w,), daemon=True)
            waiter.start()
            self.workers.append(w)
        return self

    def _route(self, w: _Worker, wdir: str) -> None:
        cfg = self.cfg
        red, tee = cfg.redirects.get(w.local_rank, Std.NONE), cfg.tee.get(w.local_rank, Std.NONE)
        shown = cfg.local_ranks_filter is None or w.local_rank in cfg.local_ranks_filter
        prefix = f"[{cfg.role}{w.local_rank}]:".encode() if tee else b""
        for pipe, bit, name, console in ((w.proc.stdout, Std.OUT, "stdout", sys.stdout),
                                         (w.proc.stderr, Std.ERR, "stderr", sys.stderr)):
            f = None
            if (red | tee) & bit:
                f = open(os.path.join(wdir, f"{name}.log"), "ab")
                w.files.append(f)
            to_console = shown and not (red & bit)
            t = threading.Thread(target=_pump, daemon=True,
                                 args=(pipe, console.buffer if to_console else None, f, prefix,
                                       w.tail if bit == Std.ERR else None,
                                       self._filtered[name] + (f"[{cfg.role}{w.local_rank}]:".encode(),)
                                       if name in self._filtered else None))
            t.start()
            w.threads.append(t)

    def _wait(self, w: _Worker) -> None:
        code = w.proc.wait()
        w.exited_at = time.time()
        w.exit_code = code  # seen by the agent at its next wake-up, whoever woke it
        # the last output lines arrive at once unless a child of the worker (a DataLoader worker)
        # still holds its pipes: do not let that delay the agent
        for t in w.threads:
            t.join(0.2)
        w.notify.set()  # the group the worker belongs to now (a survivor moves to the next one)

    # ------------------------------------------------------------------ state
    def state(self) -> str:
        """``running``, ``succeeded``, ``failed`` or ``preempted``."""
        codes = [w.exit_code for w in self.workers]
        if any(c not in (None, 0, PREEMPTED_EXIT_CODE) for c in codes):
            return "failed"
        if all(c is not None for c in codes):
            return "preempted" if PREEMPTED_EXIT_CODE in codes else "succeeded"
        return "running"

    def keepable(self) -> bool:
        """Whether every live worker opted in to in-process recovery (then a peer's failure
        need not stop them)."""
        if not self._control_root:
            return False
        alive = [w for w in self.workers if w.proc.poll() is None]
        gen = self.a.generation
        return bool(alive) and all(opted_in(os.path.join(self._control_root, str(w.local_rank)), w.proc.pid, gen)
                                   for w in alive)

    def first_failure(self) -> Optional[Failure]:
        """The root cause: the earliest failure, except that a worker that only lost a peer
        (its collective failed because another worker died) gives way to one that failed of its
        own within the same moment."""
        time.sleep(0.01)  # a failure and its peers' are milliseconds apart: let the first exits all land
        failed = [self._failure(w) for w in self.workers if w.exit_code not in (None, 0, PREEMPTED_EXIT_CODE)]
        if not failed:
            return None
        first = min(failed, key=lambda f: f.at)
        own = [f for f in failed if not _peer_gone(f) and f.at - first.at < 2.0]
        return min(own, key=lambda f: f.at) if own and _peer_gone(first) else first

    def _failure(self, w: "_Worker") -> Failure:
        message, tb, from_output = "", b"".join(w.tail).decode(errors="replace"), False
        try:
            with open(w.error_file) as f:
                data = json.load(f)["message"]
            message = data.get("message", "") if isinstance(data, dict) else str(data)
            tb = data.get("extraInfo", {}).get("py_callstack", tb) if isinstance(data, dict) else tb
        except (OSError, ValueError, KeyError, TypeError):
            code = w.exit_code
            message = (f"killed by signal {signal.Signals(-code).name}" if code < 0 else
                       f"exited with code {code}") + " (no error file: the worker raised no Python exception)"
            from_output = True
        oom = self._oom_killed(w)
        if oom:
            message = f"{message}; {oom}" if message else oom
        return Failure(w.rank, w.local_rank, self.host, w.exit_code, w.exited_at, message, tb, from_output,
                       "worker" if oom and w.cgroup is not None else "node" if oom else "")

    def _oom_killed(self, w: "_Worker") -> str:
        """Why a worker that died of SIGKILL died, where its memory cgroup's OOM kills went up
        while it ran ("" otherwise: some other kill)."""
        if w.exit_code not in (-signal.SIGKILL, 128 + signal.SIGKILL):
            return ""
        if w.cgroup is not None:
            before, after = w.oom_before, w.cgroup.oom_kills()
            where = f"its memory cgroup ({size_text(self.cfg.memory_limit)}, --memory-enforce cgroup)"
        else:
            before, after = self._node_ooms, oom_kills(self._node_cgroup)
            where = f"this node's memory cgroup ({self._node_cgroup})"
        if before is None or after is None or after <= before:
            return ""
        return f"killed by the kernel's OOM killer: out of memory in {where}, OOM kills {before} -> {after}"

    def stop(self, grace: float, sig: int = signal.SIGTERM, persist_grace: float = 0.0) -> None:
        """Send ``sig`` to every worker's process group; SIGKILL whatever is left after ``grace``,
        except that a worker whose checkpoint is still persisting (its marker file exists) gets up
        to ``persist_grace`` seconds in all to finish it."""
        for w in self.workers:
            if w.exit_code is None:
                _killpg(w.proc, sig)
        start = time.monotonic()
        deadline = start + grace
        for w in self.workers:
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        persisting = [w for w in self.workers if w.proc.poll() is None and os.path.exists(w.marker)]
        if persisting and persist_grace > grace:
            log.info("waiting up to %.0f s for %d worker(s) to finish persisting a checkpoint", persist_grace - grace,
                     len(persisting))
            limit = start + persist_grace
            while time.monotonic() < limit and any(w.proc.poll() is None and os.path.exists(w.marker)
                                                   for w in persisting):
                time.sleep(0.01)
            late = [w.rank for w in persisting if w.proc.poll() is None and os.path.exists(w.marker)]
            if late:
                log.warning("rank(s) %s still persisting a checkpoint after %.0f s: killed; that checkpoint is "
                            "lost (raise --shutdown-grace)", late, persist_grace)
        for w in self.workers:
            _killpg(w.proc, signal.SIGKILL)  # also reaps grandchildren left in the group
            w.proc.wait()
            if w.exit_code is None:  # its waiter thread has not run yet: the status is known here
                w.exited_at, w.exit_code = time.time(), w.proc.returncode
        for w in self.workers:
            for t in w.threads:
                t.join(5)
            for f in w.files:
                f.close()
        for _, f in self._filtered.values():
            f.close()


def _peer_gone(f: Failure) -> bool:
    text = f"{f.message}\n{f.traceback[-1500:]}".lower()
    return any(w in text for w in PEER_GONE)


def _reset_control(directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    for name in (INPROCESS, ASSIGNMENT):
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass


def _killpg(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _pump(pipe: IO[bytes], console: Optional[IO[bytes]], f: Optional[IO[bytes]], prefix: bytes,
          tail: Optional[deque], filtered: Optional[tuple[tuple[bytes, ...], IO[bytes], bytes]] = None) -> None:
    for line in iter(pipe.readline, b""):
        if f is not None:
            f.write(line)
            f.flush()
        if filtered is not None and any(word in line for word in filtered[0]):
            with _console_lock:
                filtered[1].write(filtered[2] + line)
                filtered[1].flush()
        if console is not None:
            with _console_lock:
                console.write(prefix + line)
                console.flush()
        if tail is not None:
            tail.append(line)
    pipe.close()
