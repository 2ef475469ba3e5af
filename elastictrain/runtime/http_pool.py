"""Keep-alive HTTP/1.1 connections to one coordinator, on the standard library's ``http.client``.

The client's transport: no third-party HTTP stack, so ``import elastictrain_torch`` (in every
worker, and in the zygote that forks them) and ``etrun`` do not pay for one (``requests`` took
about 80 ms of a worker's start). Connections are kept per address and shared by threads: a
call takes an idle one (or opens one), and gives it back once the whole reply is read.

A connection the coordinator closed while it sat idle (its keep-alive timeout) is noticed before
it is reused (its socket reads as ready: end of file) and dropped, so a call does not fail on it.
Every failure in transport is one exception, :class:`TransportError`: a refused or reset
connection, a timeout, a reply cut off mid-body. Proxies (``HTTP_PROXY``) are not used: the
coordinator is reached directly, as torchrun's store is. ``https://`` uses the system's trust
store (``SSL_CERT_FILE`` names another). A child forked from a process holding a pool (a
DataLoader worker) opens connections of its own: its parent's kept ones stay the parent's.
"""

from __future__ import annotations

import http.client
import os
import select
import socket
import threading
from typing import Optional
from urllib.parse import urlsplit

__all__ = ["HttpPool", "Reply", "TransportError", "check_address"]

_MAX_IDLE = 8  # connections kept idle per address (one per thread that calls at once is enough)


class TransportError(Exception):
    """The request did not get a whole reply: the connection failed, timed out or was cut off."""


class Reply:
    __slots__ = ("status", "headers", "content")

    def __init__(self, status: int, headers: http.client.HTTPMessage, content: bytes) -> None:
        self.status, self.headers, self.content = status, headers, content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class HttpPool:
    """Idle keep-alive connections by address (``http://host:port``), safe to share by threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}
        self._pid = os.getpid()

    def request(self, method: str, url: str, body: Optional[bytes], headers: dict,
                connect_timeout: float, timeout: float) -> Reply:
        """One request; ``url`` is the address and the path (``http://h:p/v1/health``).

        Raises:
            TransportError: no whole reply came (the connection is closed, not kept).
        """
        origin, path = _split(url)
        conn = self._take(origin)
        try:
            if conn is None:
                conn = _open(origin, connect_timeout)
            conn.sock.settimeout(timeout)
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            content = resp.read()
            reply = Reply(resp.status, resp.msg, content)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            # OSError: refused, reset, timed out (socket.timeout), TLS; HTTPException: a bad or cut-short reply
            if conn is not None:
                conn.close()
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        if resp.will_close:
            conn.close()
        else:
            self._give(origin, conn)
        return reply

    def close(self) -> None:
        """Close every idle connection (after a failure: the others to that address may be
        half-dead too). One in use stays with its call and is kept if its reply comes whole."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for c in conns:
                c.close()

    def _take(self, origin: str) -> Optional[http.client.HTTPConnection]:
        if self._pid != os.getpid():  # a forked child (a DataLoader worker): its parent's connections stay theirs
            self._after_fork()
        while True:
            with self._lock:
                conns = self._idle.get(origin)
                conn = conns.pop() if conns else None
            if conn is None or not _dropped(conn):
                return conn
            conn.close()

    def _after_fork(self) -> None:
        """In a child forked from the process that made this pool: the idle connections are the
        parent's (two processes writing one connection would mix their requests), and the lock may
        have been held by a thread that does not exist here. Both are replaced; the child's copies
        of the sockets are closed (the parent's stay open)."""
        idle = self._idle
        self._lock, self._idle, self._pid = threading.Lock(), {}, os.getpid()
        for conns in idle.values():
            for c in conns:
                if c.sock is not None:
                    c.sock.close()

    def _give(self, origin: str, conn: http.client.HTTPConnection) -> None:
        if self._pid != os.getpid():  # (taken before a fork, given back in the child)
            conn.close()
            return
        with self._lock:
            conns = self._idle.setdefault(origin, [])
            if len(conns) < _MAX_IDLE:
                conns.append(conn)
                return
        conn.close()


def check_address(url: str) -> str:
    """"" where ``url`` is an address a request can go to, else what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return "it must start with http:// or https://"
    if not parts.hostname:
        return "it names no host"
    try:
        parts.port
    except ValueError as exc:
        return f"its port is not valid ({exc})"
    return ""


def _split(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return f"{parts.scheme}://{parts.netloc}", path


def _open(origin: str, connect_timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(origin)
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(parts.hostname, parts.port,
                                                                        timeout=connect_timeout)
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=connect_timeout)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """An idle connection whose socket reads as ready has been closed by the server (or is broken)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True
