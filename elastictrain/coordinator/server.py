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
from dataclasses import dataclass
from typing import Optional

import uvicorn

from ..errors import ConfigError
from .app import MAX_BODY, Coordinator, CoordinatorApp
from .store import open_store

__all__ = ["ServerConfig", "serve", "build_server", "load_or_create_token"]

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


def load_or_create_token(token_file: Optional[str], use_env: bool = True) -> str:
    """The bearer token: ``$ET_TOKEN`` (unless ``use_env`` is False), else the token file, else a
    new random token written to the token file (mode 0600).

    Raises:
        ConfigError: no token is given anywhere and there is no file to write one to, or the
            file is empty.
    """
    env = os.environ.get("ET_TOKEN") if use_env else None
    if env:
        return env.strip()
    if token_file is None:
        raise ConfigError("the coordinator needs a token: pass --token-file F (created with a random "
                          "token if missing) or set ET_TOKEN")
    try:
        with open(token_file) as f:
            token = f.read().strip()
    except FileNotFoundError:
        token = secrets.token_urlsafe(32)
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token
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
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port "
                          "(0 picks a free one)") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def build_server(cfg: ServerConfig, coordinator: Coordinator, token: str) -> tuple[uvicorn.Server, socket.socket, str]:
    """A bound, not yet serving uvicorn server for ``coordinator``; returns (server, socket, url)."""
    sock = _bind(cfg.host, cfg.port)
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    app = CoordinatorApp(coordinator, token, max_body=cfg.max_body, public_read=cfg.public_read)
    config = uvicorn.Config(app, loop="uvloop" if _has("uvloop") else "asyncio",
                            http="httptools" if _has("httptools") else "h11", lifespan="on",
                            access_log=False, log_level=cfg.log_level, timeout_keep_alive=75,
                            server_header=False, date_header=False)
    return uvicorn.Server(config), sock, url


def serve(cfg: ServerConfig) -> None:
    """Serve until SIGTERM or SIGINT. Writes ``{"url", "pid"}`` to ``cfg.ready_file`` once listening."""
    token = load_or_create_token(cfg.token_file)
    coordinator = Coordinator(open_store(cfg.db, sync=cfg.sync), cluster=cfg.cluster)
    try:
        server, sock, url = build_server(cfg, coordinator, token)

        async def main() -> None:
            task = asyncio.ensure_future(server.serve(sockets=[sock]))
            while not server.started and not task.done():
                await asyncio.sleep(0.005)
            if server.started:
                log.info("coordinator listening on %s (db %s%s)", url, cfg.db,
                         f", policy {coordinator.cluster.cfg.policy}" if coordinator.cluster else "")
                if cfg.ready_file:
                    tmp = cfg.ready_file + ".tmp"
                    with open(tmp, "w") as f:
                        json.dump({"url": url, "pid": os.getpid()}, f)
                    os.replace(tmp, cfg.ready_file)
            await task

        asyncio.run(main())
    finally:
        coordinator.close()


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True
