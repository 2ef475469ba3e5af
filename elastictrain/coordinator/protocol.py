"""The coordinator's HTTP connections: uvicorn's httptools protocol with the limits a port that
anyone can reach needs, before any token is checked.

* **Header timeout**: a request's head (request line and headers) must arrive within
  ``header_timeout`` seconds of its first byte (a new connection's clock starts at once); a
  client that trickles it (slowloris) gets 408 and is disconnected.
* **Body timeout**: the body must arrive within ``body_timeout`` seconds of the head.
* **Header size**: more than ``max_header`` bytes of head get 431 and a disconnect; nothing more
  is read or buffered.
* **Connections**: at ``max_connections`` open at once, a new connection evicts the one that has
  waited longest on an unfinished request head (a slow client), so real clients, whose heads
  arrive at once, keep being served; if none is waiting on its head, the new connection is
  closed as soon as it is accepted (uvicorn's ``limit_concurrency`` answers 503 beyond it too).
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


def guarded_protocol(limits: Limits):
    """An ``http`` protocol class for ``uvicorn.Config`` that enforces ``limits``."""

    waiting: dict = {}  # connections reading a request head, oldest first (dicts keep order)

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _guard: Optional[asyncio.TimerHandle] = None
        _in_head = True  # until the current request's headers are complete
        _head_bytes = 0
        _tail = b""  # the last bytes of the head so far (its blank line may straddle two reads)

        def connection_made(self, transport) -> None:  # type: ignore[override]
            if len(self.connections) >= limits.max_connections:
                victim = next(iter(waiting), None)
                if victim is None:
                    _rate_limited("connection refused: %d connections are open (the limit)", limits.max_connections)
                    self.transport = transport
                    transport.abort()
                    return
                _rate_limited("at %d connections: evicting the ones slowest to send their request head",
                              limits.max_connections)
                victim._reject(408, "request head not received in time (server at its connection limit)")
            super().connection_made(transport)
            self._head()

        def connection_lost(self, exc) -> None:
            self._cancel_guard()
            waiting.pop(self, None)
            super().connection_lost(exc)

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
