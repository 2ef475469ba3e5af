"""The rendezvous etrun serves to Horovod's gloo workers, over real HTTP (no Horovod needed):
the key-value store Horovod's HTTPStore calls, the scope clearing of its finalize, the elastic
``rank_and_size`` answer held until the next generation, and bad requests."""

import http.client
import threading
import time

import pytest

from elastictrain.launcher.horovod import MAX_VALUE, REMOVED, HorovodRendezvous, Slot, horovod_env


@pytest.fixture
def rdzv():
    r = HorovodRendezvous("127.0.0.1", "hostA", wait=3.0)
    yield r
    r.close()


def _req(r, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
    try:
        c.request(method, path, body=body, headers=headers or {})
        resp = c.getresponse()
        return resp.status, resp.read()
    finally:
        c.close()


def _slots(gen_size=2):
    return {lr: Slot(lr, gen_size, lr, gen_size, 0, 1) for lr in range(gen_size)}


def test_put_get_delete_and_scope_cleared_when_every_member_finished(rdzv):
    rdzv.begin(1, _slots())
    assert _req(rdzv, "GET", "/global/0") == (404, b"")
    assert _req(rdzv, "PUT", "/global/0", b"addr-of-0")[0] == 200
    assert _req(rdzv, "PUT", "/global/1", b"addr-of-1")[0] == 200
    assert _req(rdzv, "GET", "/global/1") == (200, b"addr-of-1")
    assert _req(rdzv, "DELETE", "/global/0")[0] == 200  # rank 0 finalized: the scope stays for rank 1
    assert _req(rdzv, "GET", "/global/0") == (200, b"addr-of-0")
    assert _req(rdzv, "DELETE", "/global/1")[0] == 200  # both done: cleared
    assert _req(rdzv, "GET", "/global/0")[0] == 404
    # an ad-hoc scope (a process set's): DELETE removes the key only
    _req(rdzv, "PUT", "/global_process_set_hash_x/0", b"v")
    _req(rdzv, "PUT", "/global_process_set_hash_x/1", b"w")
    _req(rdzv, "DELETE", "/global_process_set_hash_x/0")
    assert _req(rdzv, "GET", "/global_process_set_hash_x/0")[0] == 404
    assert _req(rdzv, "GET", "/global_process_set_hash_x/1") == (200, b"w")


def test_a_new_generation_clears_the_store(rdzv):
    rdzv.begin(1, _slots())
    _req(rdzv, "PUT", "/global/0", b"old")
    rdzv.begin(2, _slots())
    assert _req(rdzv, "GET", "/global/0")[0] == 404


def test_rank_and_size_waits_for_the_next_generation(rdzv):
    rdzv.begin(1, _slots())
    rdzv.started(1, {0, 1})
    got = {}

    def ask():
        got["t0"] = time.monotonic()
        got["reply"] = _req(rdzv, "GET", "/rank_and_size/hostA:0")
        got["t1"] = time.monotonic()

    t = threading.Thread(target=ask)
    t.start()
    time.sleep(0.5)
    assert "reply" not in got  # held: generation 1 is the one it already has
    rdzv.begin(2, {0: Slot(0, 3, 0, 3, 0, 1)})
    t.join(5)
    assert got["reply"] == (200, b"0,3,0,3,0,1")
    assert got["t1"] - got["t0"] >= 0.4


def test_rank_and_size_of_a_worker_left_out_or_unknown_is_removed(rdzv):
    rdzv.begin(1, _slots())
    rdzv.started(1, {0, 1})
    rdzv.begin(2, {0: Slot(0, 1, 0, 1, 0, 1)})  # local rank 1 is not in generation 2
    assert _req(rdzv, "GET", "/rank_and_size/hostA:1") == (200, REMOVED)
    assert _req(rdzv, "GET", "/rank_and_size/otherhost:0") == (200, REMOVED)
    assert _req(rdzv, "GET", "/rank_and_size/hostA:x") == (200, REMOVED)


def test_no_generation_in_time_answers_removed():
    r = HorovodRendezvous("127.0.0.1", "h", wait=0.3)
    try:
        r.begin(1, _slots())
        r.started(1, {0})
        assert _req(r, "GET", "/rank_and_size/h:0") == (200, REMOVED)
    finally:
        r.close()


def test_registration_marks_the_worker(rdzv):
    seen = []
    r = HorovodRendezvous("127.0.0.1", "hostA", on_register=seen.append)
    try:
        r.begin(1, _slots())
        r.started(1, {0, 1})
        assert _req(r, "PUT", "/worker_addresses/hostA:1", b"pickled")[0] == 200
        assert _req(r, "PUT", "/worker_addresses/elsewhere:0", b"pickled")[0] == 200
        assert _req(r, "PUT", "/worker_addresses/hostA:7", b"pickled")[0] == 200  # no such worker
        assert seen == [1]
    finally:
        r.close()


@pytest.mark.parametrize("path", ["/", "/onlyscope", "/a/b/c", "//key", "/scope/"])
def test_bad_paths_get_400_naming_the_form(rdzv, path):
    status, body = _req(rdzv, "GET", path)
    assert status == 400 and b"/<scope>/<key>" in body
    assert _req(rdzv, "PUT", path, b"x")[0] == 400


def test_oversized_and_unsized_bodies_are_refused(rdzv):
    status, body = _req(rdzv, "PUT", "/global/0", headers={"Content-Length": str(MAX_VALUE + 1)})
    assert status == 413 and b"at most" in body
    c = http.client.HTTPConnection("127.0.0.1", rdzv.port, timeout=10)
    try:
        c.putrequest("PUT", "/global/0")
        c.putheader("Content-Length", "abc")
        c.endheaders()
        assert c.getresponse().status == 411
    finally:
        c.close()
    assert _req(rdzv, "GET", "/global/0")[0] == 404  # nothing was stored


def test_environment_is_what_horovodrun_sets():
    env = horovod_env(Slot(3, 4, 1, 2, 1, 2), "hostA", "127.0.0.1", 5555, elastic=True, iface="lo")
    assert env == {
        "HOROVOD_HOSTNAME": "hostA", "HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "5555",
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": "lo",
        "HOROVOD_ELASTIC": "1"}


def test_a_survivor_is_known_by_the_local_rank_horovod_last_gave_it(rdzv):
    """Slot 1 survives alone (local rank 0 of 1), then slot 0's replacement joins: the survivor asks
    as host:0 in generation 3 and gets slot 1's place (local rank 1 of 2)."""
    rdzv.begin(1, _slots())
    rdzv.started(1, {0, 1})
    rdzv.begin(2, {1: Slot(0, 1, 0, 1, 0, 1)})  # slot 0 died: slot 1 is rank 0 of 1
    assert _req(rdzv, "GET", "/rank_and_size/hostA:1") == (200, b"0,1,0,1,0,1")
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("r", _req(rdzv, "GET", "/rank_and_size/hostA:0")))
    t.start()
    deadline = time.monotonic() + 5
    while rdzv.waiting < 1 and time.monotonic() < deadline:  # the agent grows once its survivors wait
        time.sleep(0.01)
    assert rdzv.waiting == 1
    rdzv.begin(3, {0: Slot(0, 2, 0, 2, 0, 1), 1: Slot(1, 2, 1, 2, 0, 1)})
    rdzv.started(3, {0})
    t.join(5)
    assert got["r"] == (200, b"1,2,1,2,0,1") and rdzv.waiting == 0


def test_the_store_caps_its_bytes_and_frees_them(rdzv, monkeypatch):
    import elastictrain.launcher.horovod as hv

    monkeypatch.setattr(hv, "MAX_BYTES", 3 * 1024)
    rdzv.begin(1, _slots())
    for k in range(3):
        assert _req(rdzv, "PUT", f"/other/{k}", b"x" * 1024)[0] == 200
    status, body = _req(rdzv, "PUT", "/other/3", b"x")
    assert status == 413 and b"bytes" in body
    assert _req(rdzv, "PUT", "/other/2", b"y" * 1024)[0] == 200  # replacing a value is not growth
    assert _req(rdzv, "DELETE", "/other/0")[0] == 200
    assert _req(rdzv, "PUT", "/other/3", b"z" * 1024)[0] == 200  # freed by the delete


@pytest.mark.slow  # make test-slow: the default run stays under 15 minutes
def test_connections_are_bounded_and_idle_ones_cannot_starve_it(rdzv):
    import socket

    import elastictrain.launcher.horovod as hv

    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", rdzv.port)) for _ in range(hv.MAX_HANDLERS + 30)]
    time.sleep(0.5)
    try:
        assert threading.active_count() - before <= hv.MAX_HANDLERS
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 15  # the idle ones are let go (closed here, or timed out there)
    while time.monotonic() < deadline:
        try:
            if _req(rdzv, "GET", "/global/x")[0] == 404:
                break
        except OSError:
            time.sleep(0.2)
    else:
        raise AssertionError("the rendezvous did not serve again after the idle connections closed")


@pytest.mark.skipif(not hasattr(__import__("os"), "getuid") or __import__("os").getuid() != 0,
                    reason="needs root to connect as another user")
def test_a_process_of_another_user_is_refused(rdzv):
    import os
    import socket

    pid = os.fork()
    if pid == 0:  # the child: become nobody, try a PUT; exit 0 if it was refused
        code = 1
        try:
            os.setuid(65534)
            s = socket.create_connection(("127.0.0.1", rdzv.port), timeout=5)
            s.sendall(b"PUT /global/0 HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nevil")
            code = 0 if s.recv(100) == b"" else 1
        except OSError:
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "a process of another user was served"
    assert _req(rdzv, "GET", "/global/0")[0] == 404  # nothing was stored
    assert _req(rdzv, "PUT", "/global/0", b"ok")[0] == 200  # this user's own process is served


def test_on_several_nodes_the_gloo_scopes_meet_in_node_0s_store_by_generation():
    """Node 1's agent passes its workers' gloo scopes on to node 0's, named by the generation; its
    own workers' places stay its own; a node that starts generation 3 before node 0 has (and
    clears generation 2) loses nothing."""
    lead, other = HorovodRendezvous("127.0.0.1", "h-a", wait=3.0), HorovodRendezvous("127.0.0.1", "h-b", wait=3.0)
    try:
        lead.begin(2, {0: Slot(0, 2, 0, 1, 0, 2)}, multi=True)
        other.begin(2, {0: Slot(1, 2, 0, 1, 1, 2)}, multi=True, leader=("127.0.0.1", lead.port))
        assert _req(other, "PUT", "/global/1", b"addr-of-1")[0] == 200
        assert _req(lead, "PUT", "/global/0", b"addr-of-0")[0] == 200
        assert _req(other, "GET", "/global/0") == (200, b"addr-of-0")  # through node 0's store
        assert _req(lead, "GET", "/global/1") == (200, b"addr-of-1")
        assert _req(other, "PUT", "/local_h-b/0", b"local")[0] == 200
        assert lead.get("g2~local_h-b", "0") == b"local" and other.get("g2~local_h-b", "0") is None
        _req(other, "DELETE", "/global/1")  # a member done: kept for the others until the generation passes
        assert _req(lead, "GET", "/global/1") == (200, b"addr-of-1")
        other.begin(3, {0: Slot(1, 2, 0, 1, 1, 2)}, multi=True, leader=("127.0.0.1", lead.port))
        assert _req(other, "PUT", "/global/1", b"gen3")[0] == 200  # before node 0 begins generation 3
        lead.begin(3, {0: Slot(0, 2, 0, 1, 0, 2)}, multi=True)
        assert _req(lead, "GET", "/global/1") == (200, b"gen3") and _req(lead, "GET", "/global/0")[0] == 404
        # a worker's place is its own agent's: the other agent's store does not know it
        assert other.get("rank_and_size", "h-a:0") == REMOVED
    finally:
        lead.close()
        other.close()


def test_on_several_nodes_an_unreachable_node_0_is_a_miss_not_a_crash():
    r = HorovodRendezvous("127.0.0.1", "h-b", wait=3.0)
    try:
        r.begin(1, {0: Slot(1, 2, 0, 1, 1, 2)}, multi=True, leader=("127.0.0.1", 9))  # (nothing listens on 9)
        assert _req(r, "GET", "/global/0")[0] == 404  # the worker's gloo client asks again
        status, body = _req(r, "PUT", "/global/1", b"x")
        assert status == 503 and b"unreachable" in body
    finally:
        r.close()


def test_on_several_nodes_a_node_0_without_a_rendezvous_is_an_error_only_where_horovod_is_required(tmp_path):
    from elastictrain.errors import ConfigError
    from elastictrain.launcher.horovod_driver import HorovodDriver
    from elastictrain.wire import Assignment

    a = Assignment(1, 1, 2, 1, 2, "127.0.0.1", 29500, 0, "start", 0, horovod_port=0)  # node 1 of 2; node 0: none
    on = HorovodDriver("127.0.0.1", True, str(tmp_path), 3.0, name="h-b", required=True)
    auto = HorovodDriver("127.0.0.1", True, str(tmp_path), 3.0, name="h-b", required=False)
    try:
        with pytest.raises(ConfigError, match="node rank 0 serves no Horovod rendezvous"):
            on.open(a, [0])
        assert auto.open(a, [0])(0) == {} and not auto.multi  # (auto: this generation runs without it)
        auto.rdzv.started(a.generation, {0})  # (what the agent calls next)
        env = auto.open(msgspec_replace(a, horovod_port=on.rdzv.port), [0])(0)
        assert env["HOROVOD_RANK"] == "1" and env["HOROVOD_SIZE"] == "2" and env["HOROVOD_HOSTNAME"] == "h-b"
        assert env["HOROVOD_CROSS_RANK"] == "1" and env["HOROVOD_CROSS_SIZE"] == "2" and auto.multi
    finally:
        on.close()
        auto.close()


def msgspec_replace(obj, **kw):
    import msgspec

    return msgspec.structs.replace(obj, **kw)


def test_the_survivors_are_told_again_until_they_stop_at_a_commit(tmp_path, monkeypatch):
    """Horovod drops a notification that lands while a survivor is still resetting into its
    generation (State.on_reset), so one message may be lost: the agent tells them again every
    RENOTIFY seconds, and grows once every survivor waits at a commit."""
    from types import SimpleNamespace

    from elastictrain.launcher import horovod_driver
    from elastictrain.launcher.horovod_driver import HorovodDriver

    monkeypatch.setattr(horovod_driver, "RENOTIFY", 0.05)
    driver = HorovodDriver("127.0.0.1", True, str(tmp_path), wait=5.0)
    told = []

    class Rdzv:  # the driver's view of its rendezvous
        waiting = 0

        def notify_added(self, slots):
            told.append(list(slots))

    real, driver.rdzv = driver.rdzv, Rdzv()
    try:
        alive = SimpleNamespace(local_rank=0, proc=SimpleNamespace(poll=lambda: None))
        dead = SimpleNamespace(local_rank=1, proc=SimpleNamespace(poll=lambda: -9))
        group, a = SimpleNamespace(workers=[alive, dead]), SimpleNamespace(generation=2)
        assert not driver.should_grow(group, a, 2)
        assert not driver.should_grow(group, a, 2)  # (told just now: not yet again)
        deadline = time.monotonic() + 5
        while len(told) < 3:
            assert time.monotonic() < deadline, told
            assert not driver.should_grow(group, a, 2)
            time.sleep(0.01)
        assert told[0] == [0] and all(t == [0] for t in told)  # the survivors only
        driver.rdzv.waiting = 1
        n = len(told)
        assert driver.should_grow(group, a, 2) and driver.take() == (None, True)
        time.sleep(0.1)
        assert len(told) == n  # told no more once they act on it
    finally:
        real.close()
