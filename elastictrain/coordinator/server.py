"""Run the coordinator: ``elastictrain coordinator --host H --port P --db PATH --token-file F``.

uvicorn is the HTTP/1.1 server: mature, maintained, keep-alive, graceful shutdown on
SIGTERM/SIGINT, and with ``httptools`` + ``uvloop`` it parses a request in a few
microseconds, which leaves the single event-loop thread free for our own logic (see
docs/coordinator.md for why one thread and no framework).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import sys
import time
from dataclasses import dataclass
from typing import Optional

import uvicorn

from ..errors import ConfigError
from .stragglers import StragglerWatch
from .app import MAX_BODY, Coordinator, CoordinatorApp
from .protocol import Limits, guarded_protocol, quiet_accept_errors
from .store import open_store
from ..runtime.client import write_token_file

__all__ = ["ServerConfig", "SlurmEngineConfig", "RayEngineConfig", "KubernetesEngineConfig", "serve", "build_server",
           "load_or_create_token", "write_token_file"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 7707
    db: str = "elastictrain.db"
    token_file: Optional[str] = None
    sync: str = "normal"
    ready_file: Optional[str] = None
    max_body: int = MAX_BODY
    log_level: str = "warning"
    public_read: bool = False
    #: cluster mode: the live scheduler's policy and settings (None: no scheduling)
    cluster: Optional[object] = None
    limits: Limits = Limits()
    allow_insecure_token_file: bool = False
    stragglers: tuple = (1.5, 3, 60.0)  # factor, windows, cooldown (coordinator/stragglers.py)
    #: the engine that runs the scheduler's decisions: None (node daemons) or a SlurmEngineConfig
    engine: Optional[object] = None
    #: PostgreSQL (--db postgresql://...): seconds a leader's lease lasts (a standby takes over
    #: within about this long after the leader dies)
    lease: float = 5.0
    #: the address clients reach this coordinator at, named to them by a standby (default: the bound one)
    advertise_url: Optional[str] = None
    #: keep long-lived objects out of the garbage collector's sight (coordinator/gc_pacing.py); off
    #: for a coordinator embedded in etrun (one job, and its process is etrun's)
    gc_freeze: bool = True


@dataclass(frozen=True)
class SlurmEngineConfig:
    """``--backend slurm``: the partition that is the cluster, and how its nodes run etrun."""

    partition: str
    state_dir: Optional[str] = None  # default: <the database's directory>/slurm-runs (shared with the nodes)
    python: Optional[str] = None
    reservation: Optional[str] = None
    coordinator_url: Optional[str] = None  # the URL the compute nodes reach us at (default: the bound one)
    poll_interval: float = 1.0
    cpus_per_worker: int = 0  # a partition without GPUs: its CPUs, this many per worker
    accounts: bool = False  # a job's project is its runs' Slurm account (--account)
    kind = "slurm"


@dataclass(frozen=True)
class RayEngineConfig:
    """``--backend ray``: the Ray cluster whose nodes are the cluster (engines/ray_engine.py)."""

    address: str
    state_dir: Optional[str] = None  # default: <the database's directory>/ray-runs (the runs' output)
    coordinator_url: Optional[str] = None
    poll_interval: float = 1.0
    cpus_per_worker: int = 0  # a cluster without GPUs: its CPUs, this many per worker
    kind = "ray"


@dataclass(frozen=True)
class KubernetesEngineConfig:
    """``--backend kubernetes``: the namespace the runs' pods go to and the image they run."""

    namespace: str
    image: str
    python: Optional[str] = None  # the interpreter in the image (default: python3)
    service_account: Optional[str] = None  # the pods' own service account (default: the namespace's default)
    kueue_queue: Optional[str] = None  # admit each run's pods through this Kueue LocalQueue, as one group
    scheduler_name: Optional[str] = None  # the pods' scheduler (default: the cluster's)
    state_dir: Optional[str] = None
    coordinator_url: Optional[str] = None
    poll_interval: float = 1.0
    cpus_per_worker: int = 0  # a cluster without GPUs: its CPUs, this many per worker
    kueue_per_project: bool = False  # a job of a project through the Kueue LocalQueue named as the project
    kind = "kubernetes"


def load_or_create_token(token_file: Optional[str], use_env: bool = True, allow_insecure: bool = False) -> str:
    """The bearer token: ``$ET_TOKEN`` (unless ``use_env`` is False), else the token file, else a
    new random token written to the token file (mode 0600).

    Raises:
        ConfigError: no token is given anywhere and there is no file to write one to; the file
            is empty, unreadable, in a directory that does not exist, or readable by other users
            (group or others have any permission: pass ``allow_insecure`` to accept it).
    """
    env = os.environ.get("ET_TOKEN") if use_env else None
    if env:
        return env.strip()
    if token_file is None:
        raise ConfigError("the coordinator needs a token: pass --token-file F (created with a random "
                          "token if missing) or set ET_TOKEN")
    try:
        fd = os.open(token_file, os.O_RDONLY)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(token_file))
        if not os.path.isdir(parent):
            raise ConfigError(f"--token-file {token_file}: the directory {parent} does not exist; create it or "
                              "name a file in an existing directory") from None
        token = secrets.token_urlsafe(32)
        try:
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise ConfigError(f"--token-file {token_file}: cannot create it ({exc.strerror})") from None
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token
    except OSError as exc:
        raise ConfigError(f"--token-file {token_file}: cannot read it ({exc.strerror})") from None
    with os.fdopen(fd) as f:
        mode = os.fstat(f.fileno()).st_mode & 0o777
        token = f.read().strip()
    if mode & 0o077 and not allow_insecure:
        raise ConfigError(f"--token-file {token_file} is readable by other users (mode {mode:04o}): anyone who can "
                          f"read it controls the coordinator; run `chmod 600 {token_file}`, or pass "
                          "--allow-insecure-token-file to accept it")
    if mode & 0o077:
        log.warning("token file %s has mode %04o (readable by others); accepted because of "
                    "--allow-insecure-token-file", token_file, mode)
    if not token:
        raise ConfigError(f"token file {token_file} is empty; put a token in it or delete it to get a new one")
    return token


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # uvicorn writes a response's head and body separately; without TCP_NODELAY (inherited by
    # accepted sockets on Linux) Nagle holds the body until the client's delayed ACK: +40 ms.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
        # listen inside the try: with SO_REUSEADDR, two processes racing for one port can both
        # bind it (neither listens yet), and the loser learns it only here (EADDRINUSE)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port "
                          "(0 picks a free one)") from exc
    sock.set_inheritable(True)
    return sock


def build_server(cfg: ServerConfig, coordinator: Coordinator, token: str) -> tuple[uvicorn.Server, socket.socket, str]:
    """A bound, not yet serving uvicorn server for ``coordinator``; returns (server, socket, url)."""
    sock = _bind(cfg.host, cfg.port)
    url = _url_of(sock)
    app = CoordinatorApp(coordinator, token, max_body=cfg.max_body, public_read=cfg.public_read,
                         gc_freeze=cfg.gc_freeze)
    return _uvicorn(cfg, app), sock, url


def _url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def _uvicorn(cfg: ServerConfig, app) -> uvicorn.Server:
    lim = cfg.limits
    config = uvicorn.Config(app, loop="none", http=guarded_protocol(lim), lifespan="on", access_log=False,
                            log_level=cfg.log_level, timeout_keep_alive=lim.keep_alive, backlog=lim.backlog,
                            server_header=False, date_header=False)
    return uvicorn.Server(config)


def event_loop_runner():
    """An ``asyncio.Runner`` on uvloop where it is installed (uvicorn's ``loop="uvloop"`` only
    applies when uvicorn starts the loop itself, which ``serve()`` does not), else asyncio's."""
    factory = None
    if os.environ.get("ET_EVENT_LOOP", "uvloop") != "asyncio" and _has("uvloop"):  # ET_EVENT_LOOP=asyncio: plain
        import uvloop

        factory = uvloop.new_event_loop
    return asyncio.Runner(loop_factory=factory)


def _raise_fd_limit() -> None:
    """Use the hard limit on open files: every connection is a file descriptor."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 20), hard))
    except (ImportError, ValueError, OSError):  # not permitted or not supported: keep the default
        pass


def serve(cfg: ServerConfig) -> None:
    """Serve until SIGTERM or SIGINT. Writes ``{"url", "pid"}`` to ``cfg.ready_file`` once listening."""
    token = load_or_create_token(cfg.token_file, allow_insecure=cfg.allow_insecure_token_file)
    watch = StragglerWatch(*cfg.stragglers)  # (checked before the database is opened)
    if cfg.db.startswith(("postgresql://", "postgres://")):
        from .replicated import serve_replicated

        return serve_replicated(cfg, token, watch)
    coordinator = Coordinator(open_store(cfg.db, sync=cfg.sync), cluster=cfg.cluster, stragglers=watch)
    try:
        server, sock, url = build_server(cfg, coordinator, token)
        if cfg.engine is not None:
            coordinator.engine = _engine(cfg, coordinator, url, token)

        policy = f", policy {coordinator.cluster.cfg.policy}" if coordinator.cluster else ""
        run_server(server, sock, url, cfg, f"db {cfg.db}{policy}")
    finally:
        coordinator.close()


def run_server(server: uvicorn.Server, sock: socket.socket, url: str, cfg: ServerConfig, what: str,
               settled=None, settle_for: float = 0.0) -> None:
    """Serve on ``sock`` until SIGTERM or SIGINT; once listening, log it (``what``) and write
    ``{"url", "pid"}`` to ``cfg.ready_file``. With ``settled`` (a callable), the ready file waits,
    at most ``settle_for`` seconds, until it returns true: a replicated coordinator is ready once
    its first campaign knows whether it leads, so that whoever waited for it is not answered 503."""
    async def main() -> None:
        quiet_accept_errors(asyncio.get_running_loop())
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.005)
        deadline = time.monotonic() + settle_for
        while settled is not None and not settled() and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if server.started:
            log.info("coordinator listening on %s (%s)", url, what)
            if cfg.ready_file:
                with open(cfg.ready_file + ".tmp", "w") as f:
                    json.dump({"url": url, "pid": os.getpid()}, f)
                os.replace(cfg.ready_file + ".tmp", cfg.ready_file)
        await task

    _raise_fd_limit()
    with event_loop_runner() as runner:
        runner.run(main())


def _engine(cfg: ServerConfig, coordinator: Coordinator, url: str, token: str):
    """The engine bridge for ``cfg.engine`` (Slurm, Ray or Kubernetes), connected to the live scheduler.

    Raises:
        ConfigError: no policy (an engine carries out a scheduler's decisions), or no state
        directory where the default one would not be shared.
    """
    from ..engines.bridge import EngineBridge

    e = cfg.engine
    kind = e.kind
    if coordinator.cluster is None:
        raise ConfigError(f"--backend {kind} carries out a scheduler's decisions: give --policy NAME too")
    if e.state_dir is None and "://" in cfg.db and not cfg.db.startswith("sqlite:"):
        raise ConfigError(f"--backend {kind} with --db postgresql://...: give --{kind}-state-dir DIR on a filesystem "
                          "every coordinator shares (the runs' scripts and outputs and the coordinator id)")
    state = os.path.abspath(e.state_dir or os.path.join(os.path.dirname(os.path.abspath(cfg.db)), f"{kind}-runs"))
    os.makedirs(state, exist_ok=True)
    port = url.rpartition(":")[2]
    target = e.coordinator_url or (f"http://{socket.getfqdn()}:{port}" if cfg.host in ("0.0.0.0", "::") else url)
    tag = _coordinator_id(state)
    if kind == "ray":
        from ..engines.ray_engine import RayAdapter

        adapter = RayAdapter(e.address, target, state, tag=tag, cpus_per_worker=e.cpus_per_worker)
        log.info("Ray engine: cluster %s (%s), runs reach the coordinator at %s", e.address, _units(e), target)
    elif kind == "kubernetes":
        from ..engines.kubernetes_engine import KubernetesAdapter

        adapter = KubernetesAdapter(e.namespace, e.image, target, tag=tag, python=e.python or "python3",
                                    service_account=e.service_account, kueue_queue=e.kueue_queue,
                                    kueue_per_project=e.kueue_per_project,
                                    scheduler_name=e.scheduler_name, cpus_per_worker=e.cpus_per_worker)
        log.info("Kubernetes engine: namespace %s, image %s (%s), runs reach the coordinator at %s", e.namespace,
                 e.image, _units(e), target)
    else:
        from ..engines.slurm import SlurmAdapter

        token_file = cfg.token_file
        if token_file is None or os.environ.get("ET_TOKEN"):  # the runs read the token from a file
            token_file = os.path.join(state, "token")
            write_token_file(token_file, token)
        adapter = SlurmAdapter(e.partition, target, state, token_file=token_file, python=e.python or sys.executable,
                               reservation=e.reservation, tag=tag, cpus_per_worker=e.cpus_per_worker,
                               accounts=e.accounts)
        log.info("Slurm engine: partition %s (%s), runs reach the coordinator at %s, scripts in %s", e.partition,
                 _units(e), target, state)
    return EngineBridge(adapter, coordinator.cluster, poll_interval=e.poll_interval)


def _units(e) -> str:
    """What an engine's nodes offer: their GPUs, or their CPUs (``--engine-cpus-per-worker``)."""
    return f"CPUs, {e.cpus_per_worker} per worker" if e.cpus_per_worker else "GPUs"


def _coordinator_id(state_dir: str) -> str:
    """This coordinator's id, kept in ``state_dir`` (made once): it marks the engine's jobs as ours."""
    path = os.path.join(state_dir, "coordinator-id")
    try:
        with open(path) as f:
            cid = f.read().strip()
        if cid:
            return cid
    except FileNotFoundError:
        pass
    cid = secrets.token_hex(6)
    with open(path + ".tmp", "w") as f:
        f.write(cid + "\n")
    os.replace(path + ".tmp", path)
    return cid


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True
