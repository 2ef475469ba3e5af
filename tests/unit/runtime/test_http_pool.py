"""The client's transport (runtime/http_pool.py) against small real HTTP servers: connections are
kept and shared, one the server closed while idle is not used again, and nothing in a worker's
import path pulls in a third-party HTTP stack."""

import http.server
import os
import subprocess
import sys
import threading
import time

import msgspec
import pytest

from elastictrain import CoordinatorClient
from elastictrain.errors import ConfigError
from elastictrain.runtime.http_pool import HttpPool, TransportError, check_address

OK = msgspec.msgpack.encode({"status": "ok"})


class Counting(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    peers: set = set()
    seen = 0

    def do_GET(self):
        Counting.seen += 1
        Counting.peers.add(self.client_address)
        self.send_response(200)
        self.send_header("Content-Length", str(len(OK)))
        self.end_headers()
        self.wfile.write(OK)

    def log_message(self, *a):
        pass


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    Counting.peers, Counting.seen = set(), 0
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_calls_share_one_kept_connection(server):
    c = CoordinatorClient(_url(server), "t", retry_for=5)
    for _ in range(20):
        assert c.health().status == "ok"
    assert Counting.seen == 20
    assert len(Counting.peers) == 1  # one TCP connection for all 20
    c.close()


def test_threads_calling_at_once_each_get_a_whole_reply(server):
    c = CoordinatorClient(_url(server), "t", retry_for=5)
    errors = []

    def calls():
        try:
            for _ in range(25):
                assert c.health().status == "ok"
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=calls) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert Counting.seen == 100
    assert 1 <= len(Counting.peers) <= 4  # at most one connection per thread calling at once
    c.close()


def test_a_connection_the_server_closed_while_idle_is_not_reused():
    """The coordinator closes keep-alive connections idle too long: the next call must open a
    new one at once, not fail on the dead one (and back off before retrying)."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    accepted = []

    def serve():
        for _ in range(2):
            conn, _ = srv.accept()
            accepted.append(1)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(OK) + OK)
            conn.close()  # keep-alive promised, then closed while the client holds it idle

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    pool = HttpPool()
    url = f"http://127.0.0.1:{srv.getsockname()[1]}/v1/health"
    try:
        assert pool.request("GET", url, None, {}, 2.0, 5.0).content == OK
        time.sleep(0.2)  # the server's close reaches the client
        assert pool.request("GET", url, None, {}, 2.0, 5.0).content == OK  # one attempt, a new connection
        assert len(accepted) == 2
    finally:
        pool.close()
        srv.close()


def test_refused_and_timed_out_are_transport_errors():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    pool = HttpPool()
    with pytest.raises(TransportError, match="ConnectionRefused"):
        pool.request("GET", f"http://127.0.0.1:{port}/", None, {}, 1.0, 1.0)
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(1)  # accepts (the kernel does), never answers
    try:
        with pytest.raises(TransportError, match="timed out"):
            pool.request("GET", f"http://127.0.0.1:{mute.getsockname()[1]}/", None, {}, 1.0, 0.3)
    finally:
        mute.close()


@pytest.mark.parametrize("url,why", [
    ("ftp://h:1", "http:// or https://"), ("http://:7707", "no host"), ("http://h:99999", "port"),
    ("http://h:port", "port"),
])
def test_a_bad_address_is_a_config_error_at_once(url, why):
    assert why in check_address(url)
    with pytest.raises(ConfigError, match="coordinator address"):
        CoordinatorClient(url, "t")


def test_a_worker_import_pulls_in_no_third_party_http_stack():
    """``import elastictrain_torch`` and etrun's own modules run in every worker and in the zygote
    before any worker starts: they stay off requests/urllib3 (about 80 ms to import)."""
    code = ("import sys, elastictrain, elastictrain.launcher.agent, elastictrain.runtime.client\n"
            "try:\n    import elastictrain_torch\nexcept ImportError:\n    pass\n"
            "bad = sorted(m for m in ('requests', 'urllib3') if m in sys.modules)\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_forked_child_opens_its_own_connection_and_the_parent_keeps_its_own(server):
    """A DataLoader worker forked from a process whose client holds a kept connection: were both to
    use it, their requests would mix on one socket. The child opens its own; the parent's still works."""
    c = CoordinatorClient(_url(server), "t", retry_for=5)
    assert c.health().status == "ok"  # a connection is kept, idle
    pid = os.fork()
    if pid == 0:  # the child: one call, then out without running the parent's cleanup
        code = 1
        try:
            code = 0 if c.health().status == "ok" else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert c.health().status == "ok"  # the parent's kept connection was not closed by the child
    assert Counting.seen == 3 and len(Counting.peers) == 2  # the child's own, and the parent's one
    c.close()
