"""Messages that agents, workers, node daemons and the CLI send leave out fields at their defaults,
so a peer of the previous release (which refuses fields it does not know) still reads them."""

from typing import Optional

import msgspec

from elastictrain.wire import AgentReport, Assignment, ResourceSample


class OldAgentReport(msgspec.Struct, forbid_unknown_fields=True):  # before ``accumulate``
    agent: str
    generation: int
    event: str
    detail: str = ""


class OldAssignment(msgspec.Struct, forbid_unknown_fields=True):
    generation: int
    node_rank: int
    nnodes: int
    rank_offset: int
    world_size: int
    master_addr: str
    master_port: int
    restart_count: int
    reason: str
    prev_world_size: int
    workers: list[str] = []


def test_new_fields_reach_an_old_peer_only_when_used():
    raw = msgspec.msgpack.encode(AgentReport("a", 3, "failed", "boom"))
    assert msgspec.msgpack.decode(raw, type=OldAgentReport).detail == "boom"
    used = msgspec.msgpack.encode(AgentReport("a", 3, "failed", "oom", accumulate=2))
    try:
        msgspec.msgpack.decode(used, type=OldAgentReport)
        raise AssertionError("an old peer must refuse a field it cannot act on")
    except msgspec.ValidationError:
        pass
    a = Assignment(2, 0, 1, 0, 1, "h", 29500, 0, "start", 1)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(a), type=OldAssignment).generation == 2
    sample = msgspec.json.decode(msgspec.json.encode(ResourceSample(1.0, 50.0, 1e6)))
    assert "busy_time" not in sample and "gpu_util" not in sample  # left out at their defaults


def test_this_releases_fields_are_left_out_at_their_defaults():
    from elastictrain.wire import ResourceList, Task

    assert "memory_limit" not in msgspec.json.decode(msgspec.json.encode(AgentReport("a", 3, "failed", "x")))
    assert "local_batch" not in msgspec.json.decode(msgspec.json.encode(ResourceSample(1.0, 50.0, 1e6)))
    task = Task("j", 1, 1, [], 1, ["a.py"], "/w", {}, 0, 10.0, False)
    assert "memory_limit" not in msgspec.json.decode(msgspec.json.encode(task))
    assert "shares" not in msgspec.json.decode(msgspec.json.encode(ResourceList("j", [])))


def test_a_lease_request_reaches_an_older_coordinator_unless_it_is_paced():
    from elastictrain.wire import LeaseReply, LeaseRequest

    plain = msgspec.json.decode(msgspec.json.encode(LeaseRequest(1, 0, "r", 2)))
    assert plain == {"generation": 1, "worker": 0, "request_id": "r", "max_epoch": 2}
    assert "held" in msgspec.json.decode(msgspec.json.encode(LeaseRequest(1, 0, "r", None, 500, 20.0)))
    assert "later" not in msgspec.json.decode(msgspec.json.encode(LeaseReply(None, True, False)))


def test_an_agents_node_and_a_nodes_cordon_reach_an_old_peer_only_when_set():
    from elastictrain.wire import AgentJoin, NodeInfo

    outside = msgspec.json.decode(msgspec.json.encode(AgentJoin("a", "h", 2, 1234)))
    assert "node" not in outside and "grow" not in outside  # etrun outside cluster mode
    assert msgspec.json.decode(msgspec.json.encode(AgentJoin("a", "h", 2, 1234, node="n1")))["node"] == "n1"
    info = NodeInfo("n1", 0, 2, 0, "gpu", "", "h", "up", 1.0, [])
    assert "cordoned_until" not in msgspec.json.decode(msgspec.json.encode(info))
    with_cordon = msgspec.structs.replace(info, cordoned_until=5.0, cordon_why="slow")
    assert msgspec.json.decode(msgspec.json.encode(with_cordon))["cordon_why"] == "slow"
    try:
        msgspec.json.decode(msgspec.json.encode(AgentJoin("a", "h", 2, 1234, node="n 1")), type=AgentJoin)
        raise AssertionError("a node name outside the names' rule must be refused")
    except msgspec.ValidationError:
        pass


def test_an_unpaged_listing_reaches_a_cli_of_the_previous_release():
    from elastictrain.wire import ClusterJobList, ClusterStatus, JobInfo, JobList

    class OldJobList(msgspec.Struct, forbid_unknown_fields=True):  # before pages (``next``)
        jobs: list

    class OldClusterJobList(OldJobList, forbid_unknown_fields=True):
        ended_omitted: int = 0

    class OldClusterStatus(OldClusterJobList, forbid_unknown_fields=True, kw_only=True):
        policy: Optional[str]
        now: float
        nodes: list
        decisions: int
        failures: int

    one = [JobInfo("j", 1, 2, 1, 2, [])]
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(JobList(one)), type=OldJobList).jobs[0]["job"] == "j"
    old = msgspec.msgpack.decode(msgspec.msgpack.encode(ClusterJobList([], 7)), type=OldClusterJobList)
    assert old.ended_omitted == 7
    st = ClusterStatus("fifo", 1.0, [], [], 3, 0, 5)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(st), type=OldClusterStatus).ended_omitted == 5
    assert msgspec.json.decode(msgspec.json.encode(ClusterJobList([], 0, "12_3")))["next"] == "12_3"  # (a page)
