"""Horovod under ``etrun``: the environment Horovod's gloo controller reads and the rendezvous it
calls, served by the agent (what ``horovodrun --gloo`` does with its own driver).

Horovod's gloo controller (``horovod/common/gloo/gloo_context.cc``) reads its rank, size, local and
cross ranks and the rendezvous address from ``HOROVOD_*`` variables, then builds three gloo contexts
(global, local to the host, across hosts) through an HTTP key-value store: ``PUT/GET/DELETE
/<scope>/<key>``, a scope being ``global``, ``local_<host>`` or ``cross_<local rank>``. When every
member of a scope has said it is done (``DELETE``), the scope is cleared.

Elastic Horovod (``hvd.elastic.run``, ``HOROVOD_ELASTIC=1``) adds two calls: a worker registers its
notification service (``PUT /worker_addresses/<host>:<local rank>``), and after a failure each
survivor asks for its place in the next membership round (``GET /rank_and_size/<host>:<local
rank>``, answered ``rank,size,local_rank,local_size,cross_rank,cross_size``, or ``-1`` for a worker
that is no longer in the job). The agent answers that from the generation the coordinator formed,
holding the request until that generation exists. A worker that registered is one that recovers in
process, so the agent keeps it across its peer's failure (as it keeps workers that opted in through
``elastictrain_torch.elastic.run``) and replaces only the one that died.

A job on several nodes: every agent serves its own workers (their ``rank_and_size`` and
``worker_addresses`` calls), and passes the gloo scopes (``global``, ``local_*``, ``cross_*``) on to
node rank 0's agent, named by the generation (``g<N>~<scope>``), so that every worker of the job
meets in one store, and a node that starts a generation before node 0 does cannot lose its keys to
node 0 clearing the last one's. Survivors are not kept on several nodes: a failure restarts every
node's workers (as torchrun does), because telling the other nodes' workers that workers were
added needs their notification services, which only their own agent knows.

Horovod's clients (its C++ gloo store and its Python elastic driver) send no credentials, so the
store authenticates the *peer* instead: a connection from this machine is served only if its socket
belongs to this agent's own user (looked up in ``/proc/net/tcp``, as ``ss -e`` does), and one from
another machine only if it comes from a host of the job's current generation. It holds at most
``MAX_BYTES`` in all and serves at most ``MAX_HANDLERS`` connections at once (more are closed at
once); it listens only for the job's lifetime.
"""

from __future__ import annotations

import http.client
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

__all__ = ["HorovodRendezvous", "Slot", "horovod_env", "MAX_VALUE", "RANK_AND_SIZE", "WORKER_ADDRESSES"]

log = logging.getLogger("etrun")

RANK_AND_SIZE = "rank_and_size"
WORKER_ADDRESSES = "worker_addresses"
MAX_VALUE = 16 << 20  # bytes in one PUT (a gloo address is ~100 bytes; pickled worker addresses ~1 KB)
MAX_KEYS = 100_000  # keys held at once, over all scopes
MAX_BYTES = 64 << 20  # value bytes held at once, over all scopes
MAX_HANDLERS = 64  # connections served at once (one thread each)
_READ_TIMEOUT = 10.0  # seconds a client has to send its request


@dataclass(frozen=True)
class Slot:
    """One worker's place in a generation, as Horovod names it."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    def response(self) -> bytes:
        return ",".join(map(str, (self.rank, self.size, self.local_rank, self.local_size, self.cross_rank,
                                  self.cross_size))).encode("ascii")


REMOVED = b"-1,-1,-1,-1,-1,-1"


def horovod_env(slot: Slot, hostname: str, addr: str, port: int, *, elastic: bool, iface: Optional[str]) -> dict:
    """The variables ``horovodrun --gloo`` sets for one worker (``horovod/runner/gloo_run.py``)."""
    env = {
        "HOROVOD_HOSTNAME": hostname, "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
    }
    if iface:
        env["HOROVOD_GLOO_IFACE"] = iface
    if elastic:
        env["HOROVOD_ELASTIC"] = "1"
    return env


class HorovodRendezvous:
    """The key-value store and membership answers Horovod's gloo workers call (module docstring).

    Args:
        host: the address to listen on.
        hostname: the ``HOROVOD_HOSTNAME`` of this agent's workers (the key of their requests).
        wait: seconds a ``rank_and_size`` request is held for the next generation before the
            worker is told it is no longer in the job.
        on_register: called with the local rank of a worker that registered for elastic
            notifications (it recovers in process).
    """

    def __init__(self, host: str, hostname: str, *, wait: float = 120.0,
                 on_register: Optional[Callable[[int], None]] = None) -> None:
        self.hostname, self.wait = hostname, wait
        self._on_register = on_register
        self._lock = threading.Condition()
        self._kv: dict[str, dict[str, bytes]] = {}
        self._done: dict[str, set[str]] = {}
        self._sizes: dict[str, int] = {}
        self._generation = 0
        # workers are known by their slot (etrun's local rank); Horovod names them by the local
        # rank it last gave them, which changes when the job shrinks or grows
        self._slots: dict[int, Slot] = {}  # slot -> its place in the current generation
        self._hvd_lr: dict[int, int] = {}  # slot -> the local rank Horovod last gave it
        self._answered: dict[int, int] = {}  # slot -> the generation it last got (or started in)
        self._addresses: dict[int, bytes] = {}  # slot -> its notification service (pickled by Horovod)
        self.waiting = 0  # rank_and_size requests held for the next generation
        self._closed = False
        self._bytes = 0  # value bytes held
        self.remote_hosts: set[str] = set()  # addresses of the generation's other hosts
        self.multi = False  # the current generation spans several nodes (gloo scopes named by generation)
        self._leader: Optional[tuple[str, int]] = None  # node rank 0's store, where this one is not it
        handler = type("_Handler", (_Handler,), {"rdzv": self})
        self._httpd = _Server((host, 0), handler, self)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="et-horovod-rdzv", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ agent side
    def begin(self, generation: int, slots: dict[int, Slot], *, multi: bool = False,
              leader: Optional[tuple[str, int]] = None) -> None:
        """A new generation, before its workers start: the place of each slot of this host in it.
        The store is cleared (on several nodes, ``multi``: of older generations' scopes), and
        survivors waiting for their place get it. ``leader``: node rank 0's store, which keeps the
        gloo scopes (None: this one)."""
        with self._lock:
            self._generation = generation
            self._slots = dict(slots)
            self.multi, self._leader = multi, leader
            for scope in list(self._kv):
                if not multi or _generation_of(scope) < generation:
                    self._bytes -= sum(len(v) for v in self._kv.pop(scope).values())
            self._done.clear()
            self._sizes.clear()
            for s in slots.values() if not multi else ():  # (several nodes: scopes go with their generation)
                self._sizes["global"] = s.size
                self._sizes[f"local_{self.hostname}"] = s.local_size
                self._sizes[f"cross_{s.local_rank}"] = s.cross_size
            self._lock.notify_all()

    def started(self, generation: int, fresh: set[int]) -> None:
        """The slots started fresh in ``generation``: their environment names it already, so
        their next request for a place waits for a newer one."""
        with self._lock:
            for slot in fresh:
                self._answered[slot] = generation
                self._hvd_lr[slot] = self._slots[slot].local_rank
                self._addresses.pop(slot, None)

    def elastic(self, slots: list[int]) -> bool:
        """Whether every worker in ``slots`` registered for Horovod's elastic notifications (runs
        ``hvd.elastic.run``), so it can go on alone and be told when workers are added."""
        with self._lock:
            return bool(slots) and all(s in self._addresses for s in slots)

    def notify_added(self, slots: list[int]) -> int:
        """Tell the workers in ``slots`` that workers were added (Horovod's ``HostsUpdatedRequest``
        to each one's notification service): at their next ``state.commit()`` they stop, and
        their ``reset`` asks for their place in the next generation. Returns how many were told."""
        from horovod.runner.common.util import codec
        from horovod.runner.elastic.worker import HostUpdateResult, WorkerNotificationClient

        told, stamp = 0, int(time.time() * 1000)
        for slot in slots:
            value = self._addresses.get(slot)
            if value is None:
                continue
            try:
                addresses, key = codec.loads_base64(value)
                WorkerNotificationClient(addresses, key, 0).notify_hosts_updated(stamp, HostUpdateResult.added)
                told += 1
            except Exception as exc:  # noqa: BLE001 - a worker that cannot be told finds out at its next failure
                log.warning("horovod: could not notify slot %d of the new workers: %s", slot, exc)
        return told

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)

    # ------------------------------------------------------------------ requests
    def _shared(self, scope: str) -> tuple[str, Optional[tuple[str, int]]]:
        """Where a gloo scope of this agent's workers lives: its name (on several nodes, with the
        generation) and the store that keeps it (None: this one)."""
        if not self.multi or scope in (RANK_AND_SIZE, WORKER_ADDRESSES) or "~" in scope:
            return scope, None
        return f"g{self._generation}~{scope}", self._leader

    def get(self, scope: str, key: str) -> Optional[bytes]:
        if scope == RANK_AND_SIZE:
            return self._rank_and_size(key)
        scope, leader = self._shared(scope)
        if leader is not None:
            return _forward(leader, "GET", scope, key)
        with self._lock:
            return self._kv.get(scope, {}).get(key)

    def put(self, scope: str, key: str, value: bytes) -> Optional[tuple[int, str]]:
        """Store a value; returns an error (HTTP status, message), or None."""
        scope, leader = self._shared(scope)
        if leader is not None:
            return _forward(leader, "PUT", scope, key, value)
        with self._lock:
            if sum(len(v) for v in self._kv.values()) >= MAX_KEYS:
                return 413, f"the store holds {MAX_KEYS} keys already"
            old = self._kv.get(scope, {}).get(key)
            held = self._bytes - (len(old) if old is not None else 0) + len(value)
            if held > MAX_BYTES:
                return 413, f"the store holds at most {MAX_BYTES} bytes of values"
            self._bytes = held
            self._kv.setdefault(scope, {})[key] = value
            slot = self._slot(key) if scope == WORKER_ADDRESSES else None
            if slot is not None:
                self._addresses[slot] = value
        if slot is not None and self._on_register is not None:
            self._on_register(slot)
        return None

    def delete(self, scope: str, key: str) -> None:
        scope, leader = self._shared(scope)
        if leader is not None:
            _forward(leader, "DELETE", scope, key)
            return
        if "~" in scope:  # (several nodes: a member done with a scope; it goes when its generation does)
            return
        with self._lock:
            if scope in self._sizes:  # a member is done with the scope; the last one clears it
                done = self._done.setdefault(scope, set())
                done.add(key)
                if len(done) >= self._sizes[scope]:
                    gone = self._kv.pop(scope, None) or {}
                    self._bytes -= sum(len(v) for v in gone.values())
                    self._done.pop(scope, None)
            else:
                old = self._kv.get(scope, {}).pop(key, None)
                if old is not None:
                    self._bytes -= len(old)
                if scope in self._kv and not self._kv[scope]:
                    del self._kv[scope]

    def _slot(self, key: str) -> Optional[int]:
        """The slot of the worker Horovod calls ``<host>:<local rank>`` (under the lock): the one
        that last got that local rank."""
        host, _, lr = key.rpartition(":")
        if host != self.hostname or not lr.isdigit():
            return None
        found = [s for s, x in self._hvd_lr.items() if x == int(lr)]
        return max(found, key=lambda s: (self._answered.get(s, 0), s)) if found else None

    def _rank_and_size(self, key: str) -> bytes:
        """Hold a survivor's request until a generation newer than its last one is formed."""
        deadline = time.monotonic() + self.wait
        with self._lock:
            slot = self._slot(key)
            if slot is None:
                return REMOVED
            self.waiting += 1
            try:
                while not self._closed:
                    if self._generation > self._answered.get(slot, 0):
                        place = self._slots.get(slot)
                        self._answered[slot] = self._generation
                        if place is None:
                            self._hvd_lr.pop(slot, None)
                            return REMOVED
                        self._hvd_lr[slot] = place.local_rank
                        log.info("horovod: local rank %d recovers in process as rank %d of %d (generation %d)",
                                 slot, place.rank, place.size, self._generation)
                        return place.response()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._lock.wait(min(left, 1.0))
            finally:
                self.waiting -= 1
        log.warning("horovod: local rank %d asked for its place in the next generation, none came in %.0f s", slot,
                    self.wait)
        return REMOVED


def _generation_of(scope: str) -> int:
    """The generation a multi-node scope (``g<N>~<scope>``) belongs to; 0 for any other."""
    head, sep, _ = scope.partition("~")
    return int(head[1:]) if sep and head[:1] == "g" and head[1:].isdigit() else 0


def _forward(leader: tuple[str, int], method: str, scope: str, key: str, value: bytes = b""):
    """``method`` on node rank 0's store. GET: the value, or None (not there yet, or the store is
    unreachable: the worker's gloo client asks again); PUT: an error (status, message), or None."""
    conn = http.client.HTTPConnection(leader[0], leader[1], timeout=_READ_TIMEOUT)
    try:
        conn.request(method, f"/{scope}/{key}", body=value if method == "PUT" else None)
        r = conn.getresponse()
        body = r.read(MAX_VALUE + 1)
    except OSError as exc:
        log.warning("horovod: node rank 0's rendezvous at %s:%d did not answer %s %s: %s", leader[0], leader[1],
                    method, scope, exc)
        return (503, f"node rank 0's rendezvous is unreachable: {exc}") if method == "PUT" else None
    finally:
        conn.close()
    if method == "GET":
        return body if r.status == 200 else None
    if method == "PUT" and r.status != 200:
        return r.status, body.decode("utf-8", "replace") or f"node rank 0's rendezvous answered {r.status}"
    return None


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most MAX_HANDLERS at once, each peer checked before it is served."""

    daemon_threads = True

    def __init__(self, address, handler, rdzv: "HorovodRendezvous") -> None:
        self._rdzv = rdzv
        self._handlers = threading.BoundedSemaphore(MAX_HANDLERS)
        super().__init__(address, handler)

    def verify_request(self, request, client_address) -> bool:
        if not _peer_allowed(request, client_address, self._rdzv.remote_hosts):
            log.warning("Horovod rendezvous: refused a connection from %s (not this user's process, nor a host of "
                        "the job)", client_address[0])
            return False
        if not self._handlers.acquire(blocking=False):
            log.warning("Horovod rendezvous: %d connections are being served; refused one more", MAX_HANDLERS)
            return False
        return True

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._handlers.release()

    def handle_error(self, request, client_address) -> None:  # a client that went away: not ours to log loudly
        log.debug("Horovod rendezvous: a request from %s failed", client_address[0], exc_info=True)


def _peer_allowed(sock, peer, remote_hosts: set) -> bool:
    """A peer on this machine must be a process of this user; a remote one a host of the job."""
    owner = _local_socket_uid(sock.getsockname(), peer)
    if owner is not None:
        return owner == os.getuid()
    return peer[0] in remote_hosts


def _local_socket_uid(ours, peer) -> Optional[int]:
    """The uid owning the socket at ``peer`` if it is on this machine (its connection to ``ours``
    is listed in /proc/net/tcp*), else None."""
    def hexaddr(addr) -> Optional[str]:
        ip, port = addr[0], addr[1]
        try:
            if ":" in ip:
                raw = socket.inet_pton(socket.AF_INET6, ip)
                words = [raw[i:i + 4][::-1].hex().upper() for i in range(0, 16, 4)]
                return "".join(words) + f":{port:04X}"
            return socket.inet_aton(ip)[::-1].hex().upper() + f":{port:04X}"
        except OSError:
            return None

    want_local, want_remote = hexaddr(peer), hexaddr(ours)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if len(cols) > 7 and cols[1] == want_local and cols[2] == want_remote:
                        return int(cols[7])
        except OSError:
            continue
    return None


class _Handler(BaseHTTPRequestHandler):
    rdzv: HorovodRendezvous
    timeout = _READ_TIMEOUT
    protocol_version = "HTTP/1.1"

    def _path(self) -> Optional[tuple[str, str]]:
        parts = self.path.split("/")
        if len(parts) != 3 or parts[0] or not parts[1] or not parts[2] or len(self.path) > 1024:
            self._reply(400, b"expected /<scope>/<key>")
            return None
        return parts[1], parts[2]

    def _reply(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - the http.server names
        p = self._path()
        if p is None:
            return
        value = self.rdzv.get(*p)
        if value is None:
            self._reply(404)
        else:
            self._reply(200, value)

    def do_PUT(self) -> None:  # noqa: N802
        p = self._path()
        if p is None:
            return
        try:
            n = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._reply(411, b"Content-Length required")
            return
        if not 0 <= n <= MAX_VALUE:
            self._reply(413, f"a value is at most {MAX_VALUE} bytes".encode())
            return
        try:
            value = self.rfile.read(n)
        except OSError:
            self._reply(408)
            return
        if len(value) != n:
            self._reply(400, b"body shorter than Content-Length")
            return
        err = self.rdzv.put(p[0], p[1], value)
        self._reply(err[0] if err else 200, err[1].encode() if err else b"")

    def do_DELETE(self) -> None:  # noqa: N802
        p = self._path()
        if p is None:
            return
        self.rdzv.delete(*p)
        self._reply(200)

    def log_message(self, fmt: str, *args) -> None:  # requests are not logged
        pass
