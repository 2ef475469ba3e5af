"""The coordinator's HTTP connections: uvicorn's httptools protocol with the limits a port that
anyone can reach needs, before any token is checked.

* **Header timeout**: a request's head (request line and headers) must arrive within
  ``header_timeout`` seconds of its first byte (a new connection's clock starts at once); a
  client that trickles it (slowloris) gets 408 and is disconnected.
* **Body timeout**: the body must arrive within ``body_timeout`` seconds of the head.
* **Header size**: more than ``max_header`` bytes of head get 431 and a disconnect; nothing more
  is read or buffered.
* **Connections**: at ``max_connections`` open at once, a new connection evicts the one that has
  waited longest on an unfinished request head (a slow client), else the one idle longest on
  keep-alive between requests (its client reconnects when it needs to), so real clients keep
  being served; a connection in the middle of a request (a long poll) is never evicted. If no
  connection can be evicted, the new one is closed as soon as it is accepted.
* **Per client address**: at most ``max_per_client`` connections from one address; beyond it
  the same rule applies among that address's own connections, so one host cannot take the
  whole server.
* Answers to requests without the token close their connection (``app.py``): keep-alive is for
  clients that hold the token.
* **Accept errors** (running out of file descriptors) are logged once a minute, not in a loop.

Keep-alive connections idle for ``keep_alive`` seconds between requests are closed (uvicorn's
own timer). Every limit and its default is listed in docs/coordinator.md ("Limits").
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Optional

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["Limits", "guarded_protocol", "quiet_accept_errors"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_header: int = 64 * 1024
    max_connections: int = 1000
    keep_alive: float = 30.0
    backlog: int = 2048
    max_per_client: int = 800


def guarded_protocol(limits: Limits):
    """An ``http`` protocol class for ``uvicorn.Config`` that enforces ``limits``."""

    waiting: dict = {}  # connections reading a request head, oldest first (dicts keep order)
    idle: dict = {}  # connections idle on keep-alive after an answer, oldest first
    per_client: dict = {}  # client address -> its open connections

    def victim_among(conns) -> Optional["GuardedHttpToolsProtocol"]:
        """The connection to evict: the oldest still sending its head, else the oldest idle one."""
        for pool in (waiting, idle):
            for c in pool:
                if conns is None or c in conns:
                    return c
        return None

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _guard: Optional[asyncio.TimerHandle] = None
        _in_head = True  # until the current request's headers are complete
        _head_bytes = 0
        _tail = b""  # the last bytes of the head so far (its blank line may straddle two reads)
        _peer: Optional[str] = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            peer = transport.get_extra_info("peername")
            addr = peer[0] if isinstance(peer, tuple) and peer else None
            mine = per_client.get(addr, ()) if addr is not None else ()
            if len(mine) >= limits.max_per_client and not self._evict(set(mine), "its client's connection limit"):
                _rate_limited("connection refused: %s has %d connections open (--max-connections-per-client)",
                              addr, limits.max_per_client)
                self.transport = transport
                transport.abort()
                return
            if len(self.connections) >= limits.max_connections and not self._evict(None, "its connection limit"):
                _rate_limited("connection refused: %d connections are open (the limit)", limits.max_connections)
                self.transport = transport
                transport.abort()
                return
            super().connection_made(transport)
            if addr is not None:
                self._peer = addr
                per_client.setdefault(addr, {})[self] = True
            self._head()

        def _evict(self, among, what: str) -> bool:
            victim = victim_among(among)
            if victim is None:
                return False
            _rate_limited("at %s: evicting connections slow to send a request head, then idle ones", what)
            if victim in idle:  # idle between requests: nothing to answer
                if victim.transport is not None:
                    victim.transport.close()
            else:
                victim._reject(408, f"request head not received in time (server at {what})")
            victim._unlist()  # counted out now, not when its connection_lost comes
            return True

        def _unlist(self) -> None:
            """Out of every book: its guard, the waiting and idle pools, its client's connections."""
            self._cancel_guard()
            waiting.pop(self, None)
            idle.pop(self, None)
            conns = per_client.get(self._peer)
            if conns is not None:
                conns.pop(self, None)
                if not conns:
                    del per_client[self._peer]

        def connection_lost(self, exc) -> None:
            self._unlist()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport is not None and not self.transport.is_closing() and \
                    getattr(self, "timeout_keep_alive_task", None) is not None:
                idle.pop(self, None)
                idle[self] = True  # until its next request begins

        def data_received(self, data: bytes) -> None:
            if self._in_head:  # count the head's bytes (up to its blank line; a body may follow at once)
                probe = self._tail + data
                end = probe.find(b"\r\n\r\n")
                size = self._head_bytes + (end + 4 - len(self._tail) if end >= 0 else len(data))
                if size > limits.max_header:  # refused before the parser buffers any more of it
                    self._reject(431, f"request head exceeds {limits.max_header} bytes")
                    return
                self._head_bytes, self._tail = (size, probe[-3:]) if end < 0 else (0, b"")
            super().data_received(data)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            idle.pop(self, None)
            self._head()  # a request starts: its head has header_timeout from its first byte

        def _head(self) -> None:
            self._in_head, self._head_bytes, self._tail = True, 0, b""
            waiting.pop(self, None)
            waiting[self] = True
            self._arm(limits.header_timeout, 408, "request head not received in time")

        def on_headers_complete(self) -> None:
            self._in_head = False
            waiting.pop(self, None)
            self._arm(limits.body_timeout, 408, "request body not received in time")
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._cancel_guard()  # the request is in; answering it takes as long as it takes (long polls)
            super().on_message_complete()

        def _arm(self, seconds: float, status: int, why: str) -> None:
            self._cancel_guard()
            self._guard = self.loop.call_later(seconds, self._reject, status, why)

        def _cancel_guard(self) -> None:
            if self._guard is not None:
                self._guard.cancel()
                self._guard = None

        def _reject(self, status: int, why: str) -> None:
            self._cancel_guard()
            waiting.pop(self, None)
            if self.transport is None or self.transport.is_closing():
                return
            reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status]
            body = why.encode()
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n"
                                 b"connection: close\r\n\r\n%s" % (status, reason, len(body), body))
            self.transport.close()

    return GuardedHttpToolsProtocol


_last: dict = {}


def _rate_limited(msg: str, *args, every: float = 60.0) -> None:
    now = time.monotonic()
    if now - _last.get(msg, -every) >= every:
        _last[msg] = now
        log.warning(msg + " (logged at most once a minute)", *args)


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Log the event loop's accept errors (EMFILE...) once a minute instead of on every retry."""
    default = loop.get_exception_handler()

    def handler(loop, context) -> None:
        msg = str(context.get("message", ""))
        if "accept" in msg or isinstance(context.get("exception"), OSError) and "accept" in repr(context):
            _rate_limited("accepting connections failed: %s", context.get("exception") or msg)
            return
        if default is not None:
            default(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
