"""Hostile input against a real coordinator process: every numeric field at and beyond its range,
non-UTF-8 strings, every name on every route, oversized and trickled request heads, token
files. The answer is always a 4xx with a reason, never a 5xx, and the server stays healthy."""

import http.client
import json
import os
import socket
import stat
import subprocess
import sys
import time

import msgspec
import pytest

from elastictrain import DatasetSpec
from elastictrain.coordinator.process import CoordinatorProcess

from .test_coordinator_bad_input import assert_healthy, raw

BIG = [2**63, 2**64 - 1, -1, -(2**63), float("nan"), float("inf"), -float("inf"), 1e300]
#: (path, a valid body): every numeric field of each is tried with every value of BIG
BODIES = [
    ("/v1/jobs", {"job": "h", "min_workers": 1, "max_workers": 2}),
    ("/v1/jobs/j/generations", {"expected": 1, "world_size": 2, "reason": "start"}),
    ("/v1/jobs/j/datasets/d/lease", {"generation": 1, "worker": 0, "request_id": "r", "max_epoch": 0,
                                      "held": 500, "rate": 100.0}),
    ("/v1/jobs/j/datasets/d/progress", {"generation": 1, "worker": 0,
                                         "updates": [{"shard_id": 0, "lease_id": 1, "offset": 0}]}),
    ("/v1/jobs/j/datasets/d/commit", {"generation": 1, "worker": 0, "world_size": 2, "checkpoint": "c",
                                       "step": 3, "updates": []}),
    ("/v1/jobs/j/datasets/d/restore", {"generation": 1, "checkpoint": None}),
    ("/v1/jobs/j/datasets/d/release", {"generation": 1, "worker": 0}),
    ("/v1/jobs/j/agents/join", {"agent": "a", "host": "h", "nproc": 1, "port": 1, "min_nodes": 1, "max_nodes": 1,
                                "max_restarts": 0, "agent_timeout": 10.0, "node_rank": -1, "last_call": 1.0, "run": 0}),
    ("/v1/jobs/j/agents/poll", {"agent": "a", "generation": 0}),
    ("/v1/jobs/j/agents/report", {"agent": "a", "generation": 1, "event": "failed", "detail": ""}),
    ("/v1/jobs/j/steps", {"worker": 0, "step": 1}),
    ("/v1/jobs/j/profiles", {"stage": {"worker": 0, "iterations": 4, "warmup": 1, "iteration_seconds": 0.1,
                                       "stages": {"compute": 0.1}, "device": False}}),
    ("/v1/jobs/j/datasets", {"name": "e", "num_samples": 10, "shard_size": 5, "epochs": 1, "seed": 0,
                             "shuffle": True, "lease_ttl": 30.0, "taper": 2}),
]


@pytest.fixture
def job(client):
    client.create_job("j", 1, 8)
    client.open_generation("j", 0, 2)
    client.register_dataset("j", DatasetSpec("d", 1000, 10))
    return "j"


def _numeric_paths(body, prefix=()):
    for k, v in body.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)) or (k == "max_epoch" and v == 0):
            yield prefix + (k,)
        elif isinstance(v, dict):
            yield from _numeric_paths(v, prefix + (k,))
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            yield from _numeric_paths(v[0], prefix + (k, 0))


def _set(body, path, value):
    body = json.loads(json.dumps(body))
    node = body
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return body


def _encode(body):
    """msgpack where it can hold the value; JSON text otherwise (ints past 64 bits, NaN)."""
    try:
        return msgspec.msgpack.encode(body), "application/msgpack"
    except OverflowError:
        return json.dumps(body).encode(), "application/json"


def test_every_numeric_field_out_of_range_is_a_400_naming_it(coordinator, client, job):
    tried = 0
    for path, body in BODIES:
        for field in _numeric_paths(body):
            for value in BIG:
                data, ctype = _encode(_set(body, field, value))
                status, err = raw(coordinator, "POST", path, data, headers={"Content-Type": ctype})
                tried += 1
                assert status < 500, (path, field, value, status, err)
                if status == 200:  # within range for this field (a negative node_rank, a float): fine
                    continue
                assert 400 <= status < 500 and err["reason"], (path, field, value, err)
    assert tried > 300
    jsonbig = b'{"generation": 1, "worker": 0, "request_id": "r", "max_epoch": ' + str(10**30).encode() + b"}"
    status, err = raw(coordinator, "POST", "/v1/jobs/j/datasets/d/lease", jsonbig,
                      headers={"Content-Type": "application/json"})
    assert status == 400 and "max_epoch" in err["reason"]
    status, err = raw(coordinator, "POST", "/v1/jobs/j/datasets/d/lease",
                      msgspec.msgpack.encode({"generation": 1, "worker": 70000, "request_id": "r"}))
    assert status == 400 and "$.worker" in err["reason"]
    assert_healthy(client)


def test_invalid_utf8_and_bad_strings_are_400s(coordinator, client, job):
    status, err = raw(coordinator, "POST", "/v1/jobs", b"\x81\xa1\xff\x00")  # D1
    assert status == 400 and "UTF-8" in err["reason"]
    status, err = raw(coordinator, "POST", "/v1/jobs", b'{"job": "\xff\xfe"}', headers={"Content-Type": "application/json"})
    assert 400 <= status < 500
    for ctype in ("APPLICATION/MSGPACK", "application/msgpack; charset=binary"):  # media types ignore case
        status, _ = raw(coordinator, "POST", "/v1/jobs", msgspec.msgpack.encode({"job": "m"}),
                        headers={"Content-Type": ctype})
        assert status == 200, ctype
    assert_healthy(client)


NAMES = ["../../x", "a/b", "..", "a\x00b", "evil\n", "x" * 300, "é", " ", "", "a b", "%2e%2e"]


def test_every_name_is_checked_on_every_route_that_takes_one(coordinator, client, job):
    for name in NAMES:
        quoted = name.replace("/", "%2F").replace("\n", "%0A").replace("\x00", "%00").replace(" ", "%20")
        cases = [
            ("POST", "/v1/jobs", {"job": name}),
            ("POST", f"/v1/jobs/{quoted}/agents/join", {"agent": "a", "host": "h", "nproc": 1, "port": 1}),
            ("POST", "/v1/jobs/j/datasets", {"name": name, "num_samples": 10, "shard_size": 5}),
            ("POST", "/v1/jobs/j/datasets/d/commit", {"generation": 1, "worker": 0, "world_size": 2,
                                                      "checkpoint": name, "step": 1}),
            ("POST", "/v1/jobs/j/datasets/d/restore", {"generation": 1, "checkpoint": name}),
            ("GET", f"/v1/jobs/{quoted}", None),
            ("GET", f"/v1/jobs/j/datasets/{quoted}", None),
            ("POST", f"/v1/jobs/{quoted}/steps", {"worker": 0, "step": 1}),
        ]
        for method, path, body in cases:
            data = b"" if body is None else msgspec.msgpack.encode(body)
            try:
                status, err = raw(coordinator, method, path, data)
            except (http.client.InvalidURL, ValueError):
                continue  # the client library itself refused to send it
            assert 400 <= status < 500, (name, method, path, status, err)
    assert_healthy(client)
    assert "evil" not in json.dumps(msgspec.to_builtins(client.job("j")))


def _head_trickler(url, n):
    host, port = url.split("//")[1].rsplit(":", 1)
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")  # never finishes the head
        socks.append(s)
    return socks


def test_slow_clients_and_huge_heads_do_not_take_the_server_down(tmp_path):
    log_file = tmp_path / "coordinator.log"
    proc = CoordinatorProcess(str(tmp_path / "db"), str(tmp_path / "token"), log_file=str(log_file),
                              extra_args=("--header-timeout", "2", "--max-connections", "150"))
    proc.start()
    try:
        from elastictrain import CoordinatorClient

        client = CoordinatorClient(proc.url, proc.token, timeout=5, retry_for=2)
        socks = _head_trickler(proc.url, 200)  # more than --max-connections: the rest are refused
        t0, answered = time.monotonic(), 0
        while time.monotonic() - t0 < 4:  # health checks keep answering throughout
            assert client.health().status == "ok"
            answered += 1
            time.sleep(0.05)
        assert answered > 20
        closed = 0
        for s in socks:  # the server dropped every trickler after --header-timeout (408) or at once
            try:
                s.settimeout(0.5)
                data = s.recv(4096)
                closed += data == b"" or data.startswith(b"HTTP/1.1 408")
            except (ConnectionResetError, socket.timeout):
                closed += 1
            s.close()
        assert closed == len(socks)
        host, port = proc.url.split("//")[1].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:  # D4: a 1 MiB header
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
            reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 431")
        assert client.health().status == "ok"
        assert log_file.stat().st_size < 200_000, "the log stays small"
    finally:
        proc.stop()


def test_token_files_are_checked(tmp_path):
    def start(*extra):
        return subprocess.run([sys.executable, "-m", "elastictrain", "coordinator", "--port", "0", "--db",
                               str(tmp_path / "db"), *extra], capture_output=True, text=True, timeout=30,
                              env={k: v for k, v in os.environ.items() if k != "ET_TOKEN"})

    r = start("--token-file", str(tmp_path / "missing" / "token"))
    assert r.returncode == 2 and "directory" in r.stderr and "does not exist" in r.stderr, r.stderr
    open_file = tmp_path / "open.token"
    open_file.write_text("secret\n")
    os.chmod(open_file, 0o644)
    r = start("--token-file", str(open_file))
    assert r.returncode == 2 and "readable by other users" in r.stderr and "chmod 600" in r.stderr
    from elastictrain.coordinator.server import load_or_create_token

    assert load_or_create_token(str(open_file), use_env=False, allow_insecure=True) == "secret"
    fresh = tmp_path / "fresh.token"
    load_or_create_token(str(fresh), use_env=False)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


def test_idle_anonymous_connections_cannot_lock_clients_out(tmp_path):
    """The audit: sockets that each sent a complete request without the token (a GET /v1/health,
    or a POST whose body never comes) and then stayed idle held every connection slot, and new
    connections were reset for as long as they stayed. Answers without the token now close
    their connection, a missing body is timed out, and idle ones are evicted first."""
    proc = CoordinatorProcess(str(tmp_path / "db"), str(tmp_path / "token"), log_file=str(tmp_path / "c.log"),
                              extra_args=("--max-connections", "150", "--body-timeout", "2"))
    proc.start()
    host, port = proc.url.split("//")[1].rsplit(":", 1)
    socks = []
    try:
        from elastictrain import CoordinatorClient

        for i in range(200):
            s = socket.create_connection((host, int(port)), timeout=5)
            if i % 4:
                s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
            else:
                s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 100\r\n\r\n")
            socks.append(s)
        client = CoordinatorClient(proc.url, proc.token, timeout=2, retry_for=2)
        ok = 0
        for _ in range(40):
            try:
                ok += client.health().status == "ok"
            except Exception:  # noqa: BLE001 - counted as a failed check
                pass
            time.sleep(0.05)
        assert ok == 40, f"{ok} of 40 health checks answered"
        closed = 0
        for s in socks:  # every anonymous socket got its answer (or was refused) and was closed
            s.settimeout(3)
            try:
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
                closed += 1
            except ConnectionResetError:
                closed += 1
            except socket.timeout:
                pass
        assert closed == len(socks), f"{len(socks) - closed} anonymous connections were kept open"
    finally:
        for s in socks:
            s.close()
        proc.stop()
