"""Client retry behaviour against small real HTTP servers that misbehave on purpose."""

import http.server
import threading

import msgspec
import pytest

from elastictrain import CoordinatorClient
from elastictrain.errors import CoordinatorUnavailableError, NotFoundError


class Flaky(http.server.BaseHTTPRequestHandler):
    plan: list = []
    seen = 0

    def do_GET(self):
        Flaky.seen += 1
        status = Flaky.plan.pop(0) if Flaky.plan else 200
        body = (msgspec.msgpack.encode({"status": "ok"}) if status == 200 else
                msgspec.msgpack.encode({"error": "not_found", "reason": "nope"}) if status == 404 else b"oops")
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def flaky():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    Flaky.seen = 0
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_5xx_is_retried_until_it_succeeds(flaky):
    Flaky.plan = [503, 500, 502]
    assert CoordinatorClient(flaky, "t", retry_for=10).health().status == "ok"
    assert Flaky.seen == 4


def test_4xx_is_raised_at_once(flaky):
    Flaky.plan = [404]
    with pytest.raises(NotFoundError, match="nope"):
        CoordinatorClient(flaky, "t", retry_for=10).health()
    assert Flaky.seen == 1


def test_persistent_5xx_ends_in_unavailable(flaky):
    Flaky.plan = [503] * 1000
    with pytest.raises(CoordinatorUnavailableError, match="last: HTTP 503"):
        CoordinatorClient(flaky, "t", retry_for=0.5).health()


@pytest.mark.parametrize("cut", ["short_body", "chunked", "reset"])
def test_a_reply_cut_off_mid_body_is_retried(cut):
    """A coordinator killed while answering leaves a reply cut short: the call is retried
    like any transport failure (it raised requests.ChunkedEncodingError after one attempt)."""
    import socket

    good = msgspec.msgpack.encode({"status": "ok"})
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    served = []

    def serve():
        while len(served) < 3:
            conn, _ = srv.accept()
            conn.recv(65536)
            served.append(1)
            if len(served) < 3:
                if cut == "short_body":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + good[:3])
                elif cut == "chunked":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n" + good[:3])
                else:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(good) + good)
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    c = CoordinatorClient(f"http://127.0.0.1:{srv.getsockname()[1]}", None, timeout=2.0, retry_for=10.0)
    try:
        assert c.health().status == "ok"
        assert len(served) == 3
    finally:
        c.close()
        srv.close()


def test_a_listings_filters_go_in_its_query_and_an_unknown_one_is_refused():
    from elastictrain.runtime.client import _listing

    q = _listing(10, "", None, None, {"user": ["alice", "bob"], "state": "PD,R", "project": None, "name": "a b"})
    assert q == "?ended=10&user=alice,bob&state=PD,R&name=a%20b"
    with pytest.raises(TypeError, match="unknown job filter 'users': the filters are user, state, project, name"):
        _listing(None, "", None, None, {"users": "alice"})


def test_a_listings_page_goes_after_its_query():
    from elastictrain.runtime.client import _page

    assert _page("?ended=10", 500, "") == "?ended=10&limit=500"
    assert _page("", 500, "12_3") == "?limit=500&after=12_3"
    assert _page("?ended=all", None, "") == "?ended=all"
