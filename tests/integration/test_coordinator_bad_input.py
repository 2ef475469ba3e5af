"""The coordinator process answers bad input with a 4xx and a reason, and stays healthy."""

import http.client
import json
import socket
import threading
import time

import msgspec
import pytest

from elastictrain import CoordinatorClient, DatasetSpec
from elastictrain.errors import AuthError, BadRequestError, ConflictError, NotFoundError

MP = "application/msgpack"


def raw(coordinator, method, path, body=b"", headers=None, token=True):
    host, port = coordinator.url.split("//")[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    h = {"Content-Type": MP}
    if token:
        h["Authorization"] = f"Bearer {coordinator.token}"
    h.update(headers or {})
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    ctype = r.getheader("content-type")
    decoded = json.loads(data) if ctype == "application/json" else msgspec.msgpack.decode(data)
    return r.status, decoded


@pytest.fixture
def job(client):
    client.create_job("j", 1, 8)
    client.open_generation("j", 0, 2)
    client.register_dataset("j", DatasetSpec("d", 1000, 10))
    return "j"


def assert_healthy(client):
    assert client.health().status == "ok"


@pytest.mark.parametrize("body, word", [
    (b"\xc1\xc1\xc1", "not valid msgpack"),  # reserved byte: garbled
    (msgspec.msgpack.encode({"generation": 1, "worker": 0, "request_id": "x"})[:-3], "not valid msgpack"),
    (msgspec.msgpack.encode({"generation": "one", "worker": 0, "request_id": "x"}), "Expected `int`, got `str`"),
    (msgspec.msgpack.encode({"generation": 1, "worker": 0}), "missing required field `request_id`"),
    (msgspec.msgpack.encode({"generation": 1, "worker": 0, "request_id": "x", "evil": 1}), "unknown field `evil`"),
    (msgspec.msgpack.encode([1, 2, 3]), "Expected `object`, got `array`"),
    (b"", "empty request body"),
])
def test_malformed_bodies_get_400_with_reason(coordinator, client, job, body, word):
    status, err = raw(coordinator, "POST", "/v1/jobs/j/datasets/d/lease", body)
    assert status == 400
    assert err["error"] == "bad_request" and word in err["reason"], err
    assert_healthy(client)


def test_huge_payloads_get_413(coordinator, client, job):
    status, err = raw(coordinator, "POST", "/v1/jobs/j/datasets/d/progress", b"\x00" * (2 << 20))
    assert status == 413 and "limit" in err["reason"]
    # a lying Content-Length is refused before the body is read
    host, port = coordinator.url.split("//")[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/jobs/j/datasets/d/progress HTTP/1.1\r\nHost: x\r\n"
                  b"Authorization: Bearer " + coordinator.token.encode() +
                  b"\r\nContent-Type: application/msgpack\r\nContent-Length: 999999999\r\n\r\n")
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413")
    # a chunked body without length that grows past the limit
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", "/v1/jobs/j/datasets/d/progress")
    conn.putheader("Authorization", f"Bearer {coordinator.token}")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    try:
        for _ in range(40):
            chunk = b"\x00" * 65536
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        conn.send(b"0\r\n\r\n")
        assert conn.getresponse().status == 413
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may close the connection once it answered 413
    conn.close()
    assert_healthy(client)


def test_wrong_types_in_nested_fields(coordinator, client, job):
    body = msgspec.msgpack.encode({"generation": 1, "worker": 0, "updates": [{"shard_id": 0, "lease_id": "x",
                                                                               "offset": 1}]})
    status, err = raw(coordinator, "POST", "/v1/jobs/j/datasets/d/progress", body)
    assert status == 400 and "$.updates[0].lease_id" in err["reason"]
    body = msgspec.msgpack.encode({"generation": 1, "worker": 0, "updates": [{"shard_id": 10**9, "lease_id": 1,
                                                                               "offset": 1}]})
    status, err = raw(coordinator, "POST", "/v1/jobs/j/datasets/d/progress", body)
    assert status == 400 and "outside" in err["reason"]


def test_unknown_routes_methods_and_media(coordinator, client, job):
    assert raw(coordinator, "GET", "/v2/health")[0] == 404
    assert raw(coordinator, "POST", "/v1/jobs/j/datasets/d/explode", b"\x80")[0] == 404
    status, err = raw(coordinator, "GET", "/v1/jobs/nope")
    assert status == 404 and "POST /v1/jobs" in err["reason"]
    status, err = raw(coordinator, "DELETE", "/v1/jobs/j")
    assert status == 405 and "GET" in err["reason"]
    status, err = raw(coordinator, "POST", "/v1/jobs", b"<xml/>", headers={"Content-Type": "text/xml"})
    assert status == 415
    assert raw(coordinator, "GET", "/v1/jobs/j/datasets/zzz")[0] == 404


def test_json_is_accepted_for_curl_users(coordinator, client, job):
    status, body = raw(coordinator, "POST", "/v1/jobs", b'{"job": "k", "min_workers": 1, "max_workers": 2}',
                       headers={"Content-Type": "application/json"})
    assert status == 200 and body["job"] == "k"
    status, body = raw(coordinator, "GET", "/v1/health", headers={"Accept": "application/json"})
    assert status == 200 and body == {"status": "ok"}


def test_tokens(coordinator, client, job):
    status, err = raw(coordinator, "POST", "/v1/jobs", msgspec.msgpack.encode({"job": "x"}), token=False)
    assert status == 401 and "Authorization: Bearer" in err["reason"]
    status, err = raw(coordinator, "POST", "/v1/jobs", msgspec.msgpack.encode({"job": "x"}),
                      headers={"Authorization": "Bearer not-the-token"})
    assert status == 401 and "wrong bearer token" in err["reason"]
    assert raw(coordinator, "GET", "/v1/health", token=False)[0] == 200  # reads need no token
    with pytest.raises(AuthError):
        CoordinatorClient(coordinator.url, "bad").create_job("x")


def test_client_raises_the_servers_error_classes(client, job):
    with pytest.raises(NotFoundError, match="is not registered"):
        client.lease("j", "missing", 1, 0, "r")
    with pytest.raises(ConflictError, match="different spec"):
        client.register_dataset("j", DatasetSpec("d", 999, 10))
    with pytest.raises(ConflictError, match="no generation 5"):
        client.lease("j", "d", 5, 0, "r")
    with pytest.raises(BadRequestError, match=r"\$\.job"):  # refused by the schema, naming the field
        client.create_job("bad/name")


def test_many_workers_race_for_the_last_shard(coordinator, client):
    client.create_job("race", 1, 64)
    client.open_generation("race", 0, 32)
    client.register_dataset("race", DatasetSpec("d", 10, 10))  # exactly one shard
    winners, errors = [], []
    barrier = threading.Barrier(32)

    def grab(rank):
        c = CoordinatorClient(coordinator.url, coordinator.token, retry_for=10)
        try:
            barrier.wait()
            reply = c.lease("race", "d", 1, rank, f"r{rank}")
            if reply.lease is not None:
                winners.append(rank)
            else:
                assert reply.exhausted
        except Exception as exc:  # collected and asserted below
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=grab, args=(r,)) for r in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(winners) == 1
    assert client.dataset("race", "d").doing == 1


def test_client_gives_a_clear_error_when_unreachable():
    from elastictrain.errors import CoordinatorUnavailableError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = CoordinatorClient(f"http://127.0.0.1:{port}", "t", retry_for=0.5)
    t0 = time.monotonic()
    with pytest.raises(CoordinatorUnavailableError, match=f"127.0.0.1:{port}.*elastictrain coordinator"):
        c.health()
    assert time.monotonic() - t0 < 5


def test_client_rides_out_a_coordinator_restart(coordinator, client, job):
    lease = client.lease("j", "d", 1, 0, "a").lease
    coordinator.kill()
    threading.Timer(0.8, coordinator.start).start()
    again = client.lease("j", "d", 1, 0, "a").lease  # retried until the restarted server answers
    assert again == lease


def test_second_coordinator_on_same_db_is_refused(coordinator, tmp_path):
    """SQLite: a second coordinator on the same file refuses to start. PostgreSQL: it starts as a
    standby that writes nothing and sends every client to the leader."""
    import requests

    from elastictrain.coordinator.process import CoordinatorProcess
    from elastictrain.errors import CoordinatorUnavailableError

    other = CoordinatorProcess(coordinator.db, coordinator.token_file, log_file=str(tmp_path / "other.log"))
    if not coordinator.db.startswith("postgresql://"):
        with pytest.raises(CoordinatorUnavailableError):
            other.start(timeout=20)
        assert "in use by another coordinator" in (tmp_path / "other.log").read_text()
        return
    other.start(timeout=20)
    try:
        r = requests.post(other.url + "/v1/jobs", json={"job": "x"}, timeout=5,
                          headers={"Authorization": "Bearer " + coordinator.token})
        assert r.status_code == 503 and r.json()["error"] == "not_leader"
        assert r.headers["x-et-leader"] == coordinator.url
        with CoordinatorClient(other.url + "," + coordinator.url, coordinator.token, retry_for=10.0) as c:
            c.create_job("via-standby", 1, 1)  # the client goes to the leader it was named
            assert c.url == coordinator.url and "x" not in [j.job for j in c.jobs()]
    finally:
        other.stop()
