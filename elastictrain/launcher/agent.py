"""The ``etrun`` agent: rendezvous through the coordinator, run workers, recover.

One agent runs per node. Its loop: join the next round -> get an assignment -> start the
local workers -> watch them (an exit wakes the agent at once) while polling the
coordinator -> on a worker failure report it and stop the survivors; when the coordinator
says restart (a failure anywhere, a lost or a new agent) stop the workers and join again.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import ipaddress
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from importlib.util import find_spec
from typing import Optional

from ..errors import ConfigError, ElasticTrainError, InterruptedCallError
from ..model import check_name
from ..wire import AgentAction, AgentJoin
from .config import DEFAULT_PRELOAD, LaunchConfig, command_digest, size_text
from .. import PREEMPTED_EXIT_CODE
from .memcg import WorkerCgroup
from .workers import Failure, SparePool, WorkerGroup, reserve_port, reserve_ports

__all__ = ["Agent"]

log = logging.getLogger("etrun")
_SPARE_DELAY_FIRST = 5.0  # seconds after the first generation starts (cold workers import torch)
_SPARE_DELAY = 2.0  # after a restart (warm workers start at once)
_MAX_WORKER_PORTS = 1024  # a node with more local workers offers no per-worker ports (no TF_CONFIG)


def kept_state_dir(cfg: LaunchConfig) -> str:
    """``$ET_STATE_DIR`` (else ``$XDG_STATE_HOME/elastictrain``, else ``~/.local/state/elastictrain``)
    ``/etrun/<run id>-<digest of the working directory and the command>``."""
    root = os.environ.get("ET_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state"), "elastictrain")
    return os.path.join(root, "etrun", f"{cfg.run_id}-{command_digest(cfg.entrypoint, cfg.args, cfg.module)}")


class Agent:
    def __init__(self, cfg: LaunchConfig) -> None:
        self.cfg = cfg
        self.agent_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._signal: Optional[int] = None
        self._stopping = threading.Event()  # set on a stop signal: every retrying call gives up at once
        self._embedded = None
        self._tmp: Optional[str] = None
        self._tmp_kept = False  # the state directory outlives etrun (see _state_dir)
        self.attempt = 0
        self._phases = _Phases()
        self._carry: Optional[WorkerGroup] = None  # survivors waiting for the next generation
        self._wake: Optional[threading.Event] = None
        self._hvd = None  # launcher/horovod_driver.py, with --horovod
        self._slots: Optional[list[int]] = None  # the worker slots of the generation being joined
        self._cgroups: dict[int, WorkerCgroup] = {}  # local rank -> its memory cgroup (--memory-enforce cgroup)
        self._master_port: Optional[socket.socket] = None  # this node's MASTER_PORT, held (workers.reserve_port)
        self._worker_ports: list[socket.socket] = []  # its workers' own ports (TF_CONFIG), held the same way

    # ------------------------------------------------------------------ set-up
    def _state_dir(self) -> str:
        """Where the embedded coordinator keeps its database (the commit records of the job's
        checkpoints) and the workers' token: ``--log-dir/<run id>``, else a directory derived
        from the run id, the working directory and the command, kept after etrun exits, so that
        the same command run again (after etrun itself was killed) finds its commits and resumes."""
        if self.cfg.log_dir:
            d = os.path.join(self.cfg.log_dir, self.cfg.run_id)
            os.makedirs(d, exist_ok=True)
            return d
        if self._tmp is None:
            d = kept_state_dir(self.cfg)
            try:
                os.makedirs(d, mode=0o700, exist_ok=True)
                self._tmp, self._tmp_kept = d, True
            except OSError as exc:
                self._tmp = tempfile.mkdtemp(prefix=f"etrun-{self.cfg.run_id}-")
                log.warning("cannot keep etrun's state in %s (%s); using %s, removed at exit: a relaunch of this "
                            "command will not find its checkpoints' commits (set ET_STATE_DIR or --log-dir)", d,
                            exc.strerror, self._tmp)
        return self._tmp

    def _connect(self):
        from ..runtime.client import CoordinatorClient, token_from_file

        cfg = self.cfg
        if cfg.rdzv_host is not None:
            return self._host_or_join()
        if cfg.coordinator is None:
            from .embedded import EmbeddedCoordinator

            self._embedded = EmbeddedCoordinator(self._state_dir())
            url = self._embedded.start()
            return CoordinatorClient(url, self._embedded.token, retry_for=30.0), url, self._embedded.token_file
        token = token_from_file(cfg.token_file, "--token-file") if cfg.token_file else ""  # "": from the env
        client = CoordinatorClient(cfg.coordinator, token, retry_for=60.0)
        return client, cfg.coordinator, cfg.token_file or os.environ.get("ET_TOKEN_FILE")

    def _host_or_join(self):
        """torchrun's c10d habit: the node that owns ``--rdzv-endpoint`` serves the coordinator
        there (embedded); every other agent, and a second agent on that node, joins it."""
        from ..coordinator.server import write_token_file
        from ..runtime.client import CoordinatorClient, token_from_file

        cfg = self.cfg
        host, port = cfg.rdzv_host
        url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        if cfg.token_file:
            token = token_from_file(cfg.token_file, "--token-file")
        else:  # as torchrun's store: whoever knows the endpoint and the run id may join
            token = os.environ.get("ET_TOKEN") or hashlib.sha256(f"etrun-rdzv\0{cfg.run_id}".encode()).hexdigest()
        if cfg.is_host is not False:
            from .embedded import EmbeddedCoordinator

            for bind in _bind_candidates(host, cfg.is_host):
                try:
                    self._embedded = EmbeddedCoordinator(self._state_dir(), host=bind, port=port, token=token)
                except ConfigError as exc:  # in use (another agent hosts) or not this machine's address
                    if cfg.is_host:
                        raise ConfigError(f"--rdzv-conf is_host=1 but {exc}") from None
                    continue
                self._embedded.start()
                log.info("hosting the rendezvous for job %s on %s:%d", cfg.run_id, bind, port)
                return CoordinatorClient(url, token, retry_for=30.0), url, self._embedded.token_file
        token_file = os.path.join(self._state_dir(), "token")
        write_token_file(token_file, token)
        log.info("joining the rendezvous for job %s at %s", cfg.run_id, url)
        return CoordinatorClient(url, token, retry_for=cfg.join_timeout), url, token_file

    def _on_signal(self, signum, _frame) -> None:
        self._signal = signum
        self._stopping.set()
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        cfg = self.cfg
        old = {s: signal.signal(s, self._on_signal) for s in cfg.signals}
        pool = None
        try:
            # first: the zygote's imports (a second or two) overlap the coordinator's start and the rendezvous
            pool = self._worker_pool()
            client, url, token_file = self._connect()
            client.cancel_event = self._stopping
            self.client = client
            self._memory_cgroups()  # (a machine that cannot is told before anything runs)
            if cfg.horovod:
                from .horovod_driver import HorovodDriver

                host = cfg.master_addr if cfg.coordinator is None else "127.0.0.1"
                # several nodes: each agent names its workers' host apart (two agents may share a host),
                # and the other nodes' agents reach its rendezvous where it joins from
                multi = cfg.max_nodes > 1
                shared = self._host()
                self._hvd = HorovodDriver(host, _is_loopback(host), os.path.join(self._state_dir(), "control"),
                                          wait=max(60.0, cfg.join_timeout / 5),
                                          name=f"{socket.gethostname()}-{self.agent_id[:8]}" if multi else "",
                                          listen=(shared if _is_loopback(shared) else "") if multi else None,
                                          required=cfg.horovod_required)
            while True:
                self._slots, grow = self._hvd.take() if self._hvd is not None else (None, False)
                action = self._rendezvous(grow)
                self._phases.mark("rendezvous")
                if action.action == "exit":
                    return self._exit_code(action)
                if action.action != "run":  # interrupted by a signal while waiting
                    if self._carry is not None:
                        self._carry.stop(cfg.shutdown_grace, signal.SIGTERM)
                        self._carry = None
                    return 128 + (self._signal or signal.SIGTERM)
                code = self._run_generation(action.assignment, url, token_file, pool)
                if code is not None:
                    return code
        except InterruptedCallError:
            sig = self._signal or signal.SIGTERM
            print(f"etrun: stopped by {signal.Signals(sig).name} while the coordinator was unreachable",
                  file=sys.stderr)
            if self._carry is not None:
                self._carry.stop(cfg.shutdown_grace, signal.SIGTERM)
                self._carry = None
            return 128 + sig
        except ElasticTrainError as exc:
            print(f"etrun: error: {exc}", file=sys.stderr)
            return 1
        finally:
            if self._carry is not None:  # survivors kept for a generation that never came
                carry, self._carry = self._carry, None
                self._keep_or_stop(carry, False)
            if pool is not None:
                pool.close()
            self._release_ports()
            if self._hvd is not None:
                self._hvd.close()
            if self._embedded is not None:
                if cfg.rdzv_host is not None:  # the other nodes learn the outcome from this one
                    self._embedded.linger(cfg.run_id, self.agent_id, limit=max(5.0, 3 * cfg.agent_timeout))
                self._embedded.stop()
            if self._tmp is not None and not self._tmp_kept:
                shutil.rmtree(self._tmp, ignore_errors=True)
            for cg in self._cgroups.values():
                cg.remove()
            for s, h in old.items():
                signal.signal(s, h)

    def _worker_pool(self):
        """Where Python workers come from: forked from the zygote (``--zygote on``, Linux), with
        warm spares as its fallback where it cannot run; warm spares alone (``--zygote off``); or
        None (fresh interpreters)."""
        cfg = self.cfg
        spares = cfg.warm_spares if cfg.warm_spares >= 0 else cfg.nproc_per_node
        if not cfg.python_entry or (spares <= 0 and not cfg.zygote):
            return None
        # the top-level name only: find_spec("torch.x") would import torch into the agent
        preload = tuple(m for m in cfg.preload if find_spec(m.partition(".")[0]) is not None)
        if cfg.zygote and cfg.preload == DEFAULT_PRELOAD and not _mentions(cfg.entrypoint, cfg.module, b"torch"):
            preload = ()  # a script that never names torch (TensorFlow's, a plain one): the zygote imports nothing
        if cfg.horovod and _mentions(cfg.entrypoint, cfg.module, b"horovod"):
            # its C++ extension loads in about a second on a small machine: only for a script that names it
            # (--horovod auto is on wherever Horovod is installed; a plain DDP script there need not pay it)
            preload += ("horovod.torch",)
        env = dict(os.environ)
        if cfg.nproc_per_node > 1:
            env.setdefault("OMP_NUM_THREADS", "1")
        spare_pool = SparePool(spares, preload, env) if spares > 0 else None
        if cfg.zygote:
            from .zygote import ZygotePool, available

            why = available()
            if not why:
                return ZygotePool(preload, env, fallback=spare_pool, keep=cfg.zygote_keep)
            log.warning("--zygote on: %s; using warm spares", why)
        return spare_pool

    def _memory_cgroups(self) -> dict:
        """--memory-enforce cgroup: each local worker slot's memory cgroup, at this generation's limit."""
        cfg = self.cfg
        if not cfg.memory_limit or cfg.memory_enforce != "cgroup":
            return {}
        for lr in range(cfg.nproc_per_node):
            cg = self._cgroups.get(lr)
            if cg is None:
                self._cgroups[lr] = WorkerCgroup.create(f"etrun-{os.getpid()}-{lr}", cfg.memory_limit)
            else:
                cg.set_limit(cfg.memory_limit)
        return dict(self._cgroups)

    def _host(self) -> str:
        """The address this agent joins from: where the other nodes reach its node (MASTER_ADDR when
        it is node rank 0; its Horovod rendezvous on several nodes)."""
        cfg = self.cfg
        if cfg.local_addr:
            return cfg.local_addr
        if cfg.rdzv_host is not None:  # every node on loopback: the workers meet there too
            return "127.0.0.1" if _is_loopback(cfg.rdzv_host[0]) else socket.gethostname()
        return cfg.master_addr if cfg.coordinator is None else socket.gethostname()

    def _release_ports(self) -> None:
        """Close the held MASTER_PORT and worker ports (a new rendezvous picks new ones)."""
        if self._master_port is not None:
            self._master_port.close()
            self._master_port = None
        for p in self._worker_ports:
            p.close()
        self._worker_ports = []

    def _rendezvous(self, grow: bool = False) -> AgentAction:
        cfg = self.cfg
        host = self._host()
        n = cfg.nproc_per_node if self._slots is None else len(self._slots)
        # held until the next rendezvous: if this node hosts rank 0, its TCPStore listens there, and
        # each worker's TensorFlow server on its own port
        self._release_ports()
        self._master_port = reserve_port()
        self._worker_ports = reserve_ports(n) if n <= _MAX_WORKER_PORTS else []
        join = AgentJoin(self.agent_id, host, n, self._master_port.getsockname()[1], cfg.min_nodes, cfg.max_nodes,
                         cfg.max_restarts, cfg.agent_timeout, cfg.node_rank, cfg.last_call, cfg.run,
                         [p.getsockname()[1] for p in self._worker_ports], grow=grow,
                         node=node_name(), horovod_port=self._hvd.rdzv.port if self._hvd is not None else 0)
        action = self.client.agent_join(cfg.run_id, join)
        deadline = time.monotonic() + cfg.join_timeout
        while action.action == "wait":
            if self._signal is not None:
                return AgentAction("stopped")
            if time.monotonic() > deadline:
                raise ConfigError(f"rendezvous timed out after {cfg.join_timeout:.0f} s ({action.detail}); "
                                  f"start the other agents, or lower the minimum of --nnodes")
            time.sleep(min(0.05, cfg.poll_interval))
            action = self.client.agent_poll(cfg.run_id, self.agent_id, 0)
            if action.action == "restart":  # the coordinator forgot us (it restarted): join again
                action = self.client.agent_join(cfg.run_id, join)
        return action

    def _run_generation(self, a, url: str, token_file: Optional[str], pool: Optional[SparePool]) -> Optional[int]:
        """Run one generation; None means: join the next round."""
        cfg = self.cfg
        attempt_dir = os.path.join(self._state_dir(), f"attempt_{self.attempt}")
        self.attempt += 1
        slots = self._slots
        n = cfg.nproc_per_node if slots is None else len(slots)
        log.info("generation %d: node %d/%d, ranks %d..%d of %d (%s)", a.generation, a.node_rank, a.nnodes,
                 a.rank_offset, a.rank_offset + n - 1, a.world_size, a.reason)
        carry, self._carry = self._carry, None
        control = os.path.join(self._state_dir(), "control")
        extra = self._hvd.open(a, slots if slots is not None else list(range(n))) if self._hvd is not None else None
        group = WorkerGroup(cfg, a, attempt_dir, url, token_file, pool, control_root=control, extra_env=extra,
                            slots=slots, cgroups=self._memory_cgroups())
        if self._hvd is not None:
            self._hvd.group = group
        group.start(carry)
        if self._hvd is not None:
            self._hvd.started(a, group, shrunk=slots is not None)
        if group.carried:
            log.info("generation %d: local rank(s) %s continue in their own process (in-process recovery)",
                     a.generation, ",".join(map(str, group.carried)))
        self._phases.started(a.generation)
        self._wake = group.changed
        if pool is not None:
            # top up the spares once the new workers are past their own start-up: on a small
            # machine the spares' imports would otherwise slow the workers they are meant to help
            pool.fill_later(_SPARE_DELAY_FIRST if self.attempt == 1 else _SPARE_DELAY)
        poller = _Poller(self.client, cfg.run_id, self.agent_id, a.generation,
                         min(_LONG_POLL, cfg.agent_timeout / 3), group.changed)
        try:
            return self._watch(group, a, poller)
        finally:
            poller.stop()

    def _watch(self, group: WorkerGroup, a, poller: "_Poller") -> Optional[int]:
        cfg = self.cfg
        while True:
            # woken at once by a worker's exit (a blocking wait per worker), the coordinator's
            # answer to the long poll, or a signal; the timeout is only a safety net
            group.changed.wait(cfg.monitor_interval)
            group.changed.clear()
            if self._signal is not None:
                return self._shutdown(group, a)
            state = group.state()
            if self._hvd is not None and self._hvd.shrunk and state == "running" and \
                    self._hvd.should_grow(group, a, cfg.nproc_per_node):
                self._keep_or_stop(group, True)  # the survivors join the full-size generation
                return None
            if state == "failed":
                failure = group.first_failure()
                self._phases.detected(failure.at if failure else None)
                if failure is not None and failure.oom_kill:
                    log.warning("rank %d was %s", failure.rank, failure.message.partition("; ")[2] or failure.message)
                doubled = 0
                if cfg.memory_limit and failure is not None and (_out_of_memory(failure) or failure.oom_kill == "worker"):
                    if not self._raise_memory_limit(failure):  # already at the largest allowed
                        return self._fail_at_limit(group, a, failure, "out of memory at --max-memory-limit",
                                                   "out of memory at --max-memory-limit: the job fails")
                    doubled = self.cfg.memory_limit
                accumulate = 0
                if cfg.oom_policy == "accumulate" and failure is not None and _gpu_out_of_memory(failure):
                    accumulate = 2 * max(1, a.accumulate)
                    if accumulate > cfg.max_accumulate:
                        return self._fail_at_limit(group, a, failure, "out of GPU memory at --max-accumulate",
                                                   f"out of GPU memory with {a.accumulate} micro-batches per step "
                                                   f"(--max-accumulate {cfg.max_accumulate}): the job fails")
                    log.warning("out of GPU memory: rank %d; the next generation accumulates %d micro-batches "
                                "per step (ET_ACCUMULATE; each micro-batch halves, the global batch stays)",
                                failure.rank, accumulate)
                # tell the coordinator first: the other nodes learn of it from their long polls
                # while this one stops its survivors
                keep = group.keepable()  # survivors that opted in stay; decided before the report
                action = self.client.agent_report(cfg.run_id, self.agent_id, a.generation, "failed",
                                                  _one_line(failure), accumulate, doubled)
                self._phases.mark("report")
                keep = keep and action.action != "exit"
                self._keep_or_stop(group, keep)
                if keep and self._hvd is not None:
                    self._hvd.after_failure(group)
                _print_failure(failure, a, cfg, action)
                return self._exit_code(action) if action.action == "exit" else None
            if state == "succeeded":
                action = self.client.agent_report(cfg.run_id, self.agent_id, a.generation, "succeeded")
                group.stop(0)
                return 0
            if state == "preempted":
                group.stop(0)
                # the workers stopped at an agreed step: the whole job is preempted, unless another
                # node left (a drain): then the coordinator asks this one to re-form smaller
                action = self.client.agent_poll(cfg.run_id, self.agent_id, a.generation)
                if action.action == "restart":
                    log.info("generation %d: the workers checkpointed because a node left; re-forming (%s)",
                             a.generation, action.detail)
                    return None
                self.client.agent_report(cfg.run_id, self.agent_id, a.generation, "preempted",
                                         "workers exited with the preempted code")
                return PREEMPTED_EXIT_CODE
            action = poller.take()
            if action is not None:
                if action.action == "restart":
                    self._phases.detected(None)
                    log.info("generation %d: restart asked by the coordinator (%s)", a.generation, action.detail)
                    self._keep_or_stop(group, group.keepable())
                    return None
                if action.action == "exit":
                    self._keep_or_stop(group, False)
                    return self._exit_code(action)

    def _keep_or_stop(self, group: WorkerGroup, keep: bool) -> None:
        """Keep the live workers for the next generation (they opted in to in-process recovery),
        or stop them: SIGTERM, --restart-grace, and up to --shutdown-grace for a persist in flight."""
        if keep:
            self._carry = group
            return
        group.stop(self.cfg.restart_grace, persist_grace=self.cfg.shutdown_grace)
        self._phases.mark("stop")

    def _fail_at_limit(self, group: WorkerGroup, a, failure: Failure, report: str, why: str) -> int:
        """An OOM plan is at its largest allowed step: this node leaves and the job fails with ``why``."""
        self.client.agent_report(self.cfg.run_id, self.agent_id, a.generation, "leaving", report)
        self._keep_or_stop(group, False)
        _print_failure(failure, a, self.cfg, AgentAction("exit", status="failed"), why)
        return 1

    def _raise_memory_limit(self, f: Failure) -> bool:
        """Double --memory-limit for the next generation (up to --max-memory-limit); False if it
        is there already."""
        cfg = self.cfg
        if cfg.memory_limit >= cfg.max_memory_limit:
            print(f"etrun: job failed: rank {f.rank} ran out of memory at the largest allowed limit, "
                  f"{size_text(cfg.memory_limit)} (--max-memory-limit)", file=sys.stderr)
            return False
        new = min(2 * cfg.memory_limit, cfg.max_memory_limit)
        log.warning("out of memory: rank %d hit its %s limit; the next generation runs with %s per worker "
                    "(--memory-limit doubled, up to %s)", f.rank, size_text(cfg.memory_limit), size_text(new),
                    size_text(cfg.max_memory_limit))
        self.cfg = dataclasses.replace(cfg, memory_limit=new)
        return True

    def _shutdown(self, group: WorkerGroup, a) -> int:
        sig = self._signal or signal.SIGTERM
        name = signal.Signals(sig).name
        try:  # first tell the coordinator: the other nodes re-form without this one (not a failure)
            self.client.agent_report(self.cfg.run_id, self.agent_id, a.generation, "leaving", f"etrun got {name}")
        except ElasticTrainError as exc:
            log.warning("could not tell the coordinator that this node leaves: %s", exc)
        forward = signal.SIGTERM if sig in _STOP_SIGNALS else sig  # workers checkpoint on SIGTERM
        print(f"etrun: got {name}; leaving the job: forwarding {signal.Signals(forward).name} to the workers, "
              f"{self.cfg.shutdown_grace:.0f} s to checkpoint before SIGKILL", file=sys.stderr)
        group.stop(self.cfg.shutdown_grace, forward)
        if group.state() == "preempted":  # every worker exited, with the preempted code among them
            return PREEMPTED_EXIT_CODE
        return 128 + sig

    @staticmethod
    def _exit_code(action: AgentAction) -> int:
        if action.status == "succeeded":
            return 0
        if action.status == "preempted":
            return PREEMPTED_EXIT_CODE
        print(f"etrun: job {action.status}: {action.detail}", file=sys.stderr)
        return 1


def node_name() -> str:
    """The cluster node this agent runs on, as its node daemon or engine named it
    (``ET_NODE_NAME``); "" when unset or not a valid node name (then it is only not reported)."""
    name = os.environ.get("ET_NODE_NAME", "")
    if name:
        try:
            check_name("node", name)
        except ConfigError as exc:
            log.warning("ET_NODE_NAME=%r is not a node name (%s); not reported", name[:200], exc)
            return ""
    return name


def _mentions(entrypoint: str, module: bool, word: bytes) -> bool:
    """Whether the script names ``word`` (torch, or our torch integration; horovod) anywhere in its
    source; True when it cannot be read (a module entrypoint, a missing file): then the preload holds."""
    if module:
        return True
    try:
        with open(entrypoint, "rb") as f:
            return word in f.read(4 << 20)
    except OSError:
        return True


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_LONG_POLL = 5.0  # seconds the coordinator may hold an agent's poll while nothing changes


class _Poller:
    """Long-polls the coordinator while a generation runs, from its own thread and connection;
    an answer other than "run" (restart, exit) is kept for the agent, which is woken at once."""

    def __init__(self, client, job: str, agent: str, generation: int, wait: float, wake: threading.Event) -> None:
        from ..runtime.client import CoordinatorClient

        self._client = CoordinatorClient(client.addresses, client.token, timeout=client.timeout, retry_for=client.retry_for,
                                         cancel=client.cancel_event)
        self._job, self._agent, self._gen, self._wait, self._wake = job, agent, generation, wait, wake
        self._action: Optional[AgentAction] = None
        self._error: Optional[BaseException] = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="etrun-poll", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            failures = 0
            while not self._stopped.is_set():
                try:
                    action = self._client.agent_poll(self._job, self._agent, self._gen, self._wait)
                except ElasticTrainError as exc:  # e.g. the coordinator gone for longer than retry_for
                    self._error = exc
                    self._wake.set()
                    return
                except Exception:  # noqa: BLE001 - not ours to die of: log, back off, poll on
                    failures += 1
                    log.exception("agent poll failed unexpectedly; polling on")
                    self._stopped.wait(min(10.0, 0.5 * 2 ** min(failures, 5)))
                    continue
                failures = 0
                if self._stopped.is_set():
                    return
                if action.action != "run":
                    self._action = action
                    self._wake.set()
                    return
        finally:
            self._client.close()  # one connection per generation: closed when its poll ends

    def take(self) -> Optional[AgentAction]:
        if self._error is not None:
            raise self._error
        action, self._action = self._action, None
        return action

    def stop(self) -> None:
        self._stopped.set()


class _Phases:
    """Timestamps of one recovery, logged as one line once the next generation's workers start:
    detected (the worker's exit seen), report, stop (survivors gone), rendezvous, spawn."""

    def __init__(self) -> None:
        self._t0: Optional[float] = None
        self._died: Optional[float] = None
        self._marks: list[tuple[str, float]] = []

    def detected(self, died_at: Optional[float]) -> None:
        self._t0, self._died, self._marks = time.time(), died_at, []

    def mark(self, name: str) -> None:
        if self._t0 is not None:
            self._marks.append((name, time.time()))

    def started(self, generation: int) -> None:
        if self._t0 is None:
            return
        self.mark("spawn")
        parts, prev = [], self._t0
        if self._died is not None:
            parts.append(f"detect {self._t0 - self._died:.3f}")
        for name, t in self._marks:
            parts.append(f"{name} {t - prev:.3f}")
            prev = t
        log.info("recovery into generation %d (s): %s; detected at %.6f", generation, ", ".join(parts), self._t0)
        self._t0 = None


_OOM_WORDS = ("memoryerror", "out of memory", "can't allocate memory", "cannot allocate memory",
              "outofmemoryerror", "std::bad_alloc")


_GPU_OOM_WORDS = ("outofmemoryerror", "cuda out of memory", "cuda error: out of memory")


def _failure_says(f: Failure, words: tuple) -> bool:
    text = f"{f.message}\n{f.traceback[-2000:]}".lower()
    return any(w in text for w in words)


def _out_of_memory(f: Failure) -> bool:
    """A worker that failed for lack of memory (under --memory-limit: MemoryError, torch's
    allocator error, CUDA out of memory)."""
    return _failure_says(f, _OOM_WORDS)


def _gpu_out_of_memory(f: Failure) -> bool:
    """A worker that failed for lack of GPU memory (torch's ``OutOfMemoryError``, "CUDA out of memory")."""
    return _failure_says(f, _GPU_OOM_WORDS)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bind_candidates(host: str, forced: Optional[bool]) -> list[str]:
    """Addresses to try listening on for the endpoint ``host``: binding fails with
    EADDRNOTAVAIL where ``host`` is not this machine, and EADDRINUSE where another agent here
    already hosts, so a successful bind is the test of "this node hosts"."""
    try:
        ipaddress.ip_address(host)
        return [host]
    except ValueError:
        pass
    if host == "localhost":
        return ["127.0.0.1"]
    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    if forced or host.lower() in names or host.lower().split(".")[0] in {n.split(".")[0] for n in names}:
        return ["0.0.0.0"]
    try:
        return list(dict.fromkeys(ai[4][0] for ai in socket.getaddrinfo(host, None, socket.AF_INET)))
    except OSError:
        return []


def _one_line(f: Optional[Failure]) -> str:
    if f is None:
        return "unknown failure"
    return f"rank {f.rank} on {f.host} exited with code {f.exit_code}: {f.message}"[:500]


def _print_failure(f: Optional[Failure], a, cfg: LaunchConfig, action: AgentAction,
                   outcome: Optional[str] = None) -> None:
    if f is None:
        return
    when = datetime.datetime.fromtimestamp(f.at).strftime("%Y-%m-%d %H:%M:%S")
    lines = f.traceback.strip().splitlines()[-15:]
    if f.from_output:
        label = (f"  its last {len(lines)} line(s) of stderr before it died:" if lines
                 else "  it wrote nothing to stderr")
    else:
        label = "  its traceback:"
    tb = "\n".join([label] + ["    " + line for line in lines])
    nxt = outcome or (f"restart {a.restart_count + 1}/{cfg.max_restarts}" if action.action != "exit"
                      else f"no restarts left ({cfg.max_restarts} allowed)")
    print(f"etrun: worker failure in generation {a.generation}; {nxt}\n"
          f"  root cause (first observed failure):\n"
          f"    rank {f.rank} (local rank {f.local_rank}) on {f.host}, exit code {f.exit_code}, at {when}\n"
          f"    {f.message}\n{tb}", file=sys.stderr)
