"""Rendezvous rounds survive a coordinator restart; a round that was lost says why it re-formed."""

from elastictrain.clock import ManualClock
from elastictrain.coordinator.app import Coordinator
from elastictrain.coordinator.store import open_store
from elastictrain.wire import AgentJoin


def _coord(tmp_path, clock):
    return Coordinator(open_store(str(tmp_path / "db")), clock)


def test_a_formed_generation_is_readopted_after_a_restart(tmp_path):
    clock = ManualClock(100.0)
    c = _coord(tmp_path, clock)
    a = c.rendezvous.join("j", AgentJoin("agent-1", "h", 2, 1000, last_call=0.0))
    assert a.action == "run" and a.assignment.generation == 1
    c.store.close()  # kill -9
    clock.advance(30)  # a 30 s outage: longer than the agent timeout, yet the agent is not lost
    c = _coord(tmp_path, clock)
    again = c.rendezvous.poll("j", __import__("elastictrain.wire", fromlist=["AgentPoll"]).AgentPoll("agent-1", 1))
    assert again.action == "run" and again.assignment == a.assignment  # no new generation
    c.store.close()


def test_a_round_not_on_disk_reforms_with_reason_coordinator_restart(tmp_path):
    clock = ManualClock(100.0)
    c = _coord(tmp_path, clock)
    c.rendezvous.join("j", AgentJoin("agent-1", "h", 1, 1000, last_call=0.0))
    with c.store.transaction() as tx:
        tx.delete_rdzv("j")  # as a database from before rounds were durable would be
    c.store.close()
    c = _coord(tmp_path, clock)
    a = c.rendezvous.join("j", AgentJoin("agent-1", "h", 1, 1000, last_call=0.0))
    assert a.action == "run" and a.assignment.generation == 2 and a.assignment.reason == "coordinator_restart"
    c.store.close()


def test_worker_addresses_follow_global_rank_order_and_survive_a_restart(tmp_path):
    clock = ManualClock(100.0)
    c = _coord(tmp_path, clock)
    first = c.rendezvous.join("j", AgentJoin("agent-b", "hb", 2, 1000, 2, 2, worker_ports=[5001, 5002],
                                             node_rank=1))
    assert first.action == "wait"
    a = c.rendezvous.join("j", AgentJoin("agent-a", "ha", 2, 1000, 2, 2, worker_ports=[4001, 4002], node_rank=0))
    assert a.action == "run" and a.assignment.workers == ["ha:4001", "ha:4002", "hb:5001", "hb:5002"]
    c.store.close()
    c = _coord(tmp_path, clock)
    again = c.rendezvous.poll("j", __import__("elastictrain.wire", fromlist=["AgentPoll"]).AgentPoll("agent-a", 1))
    assert again.assignment.workers == a.assignment.workers
    c.store.close()


def test_no_worker_addresses_unless_every_node_offers_them(tmp_path):
    c = _coord(tmp_path, ManualClock(100.0))
    c.rendezvous.join("j", AgentJoin("agent-b", "hb", 2, 1000, 2, 2, worker_ports=[5001], node_rank=1))
    a = c.rendezvous.join("j", AgentJoin("agent-a", "ha", 2, 1000, 2, 2, worker_ports=[4001, 4002], node_rank=0))
    assert a.action == "run" and a.assignment.workers == []
    c.store.close()


def test_an_ended_job_accepts_no_new_generation_ever(tmp_path):
    """The audit: a node frozen for 60 s while its job resumed elsewhere and finished; after the
    thaw its stale agent opened generation 3 of the finished job. An ended job's round leaves a
    durable tombstone: every later join is told to exit, across a coordinator restart too."""
    from elastictrain.wire import AgentPoll

    clock = ManualClock(100.0)
    c = _coord(tmp_path, clock)
    c.rendezvous.expect("j", 2, "requeue", 0)
    a = c.rendezvous.join("j", AgentJoin("agent-1", "h", 1, 1000, last_call=0.0, run=2))
    assert a.action == "run"
    gen = c.members.get("j").generation
    c.rendezvous.forget("j", "finished")  # the scheduler saw the job finish
    stale = c.rendezvous.poll("j", AgentPoll("agent-2", 1))
    assert stale.action == "restart"  # an unknown agent is told to join again ...
    for run in (1, 2, 3, 0):
        again = c.rendezvous.join("j", AgentJoin("agent-2", "h", 1, 1000, last_call=0.0, run=run))
        assert again.action == "exit" and "already finished" in again.detail  # ... and the join says exit
    c.store.close()
    c = _coord(tmp_path, clock)
    again = c.rendezvous.join("j", AgentJoin("agent-2", "h", 1, 1000, last_call=0.0, run=2))
    assert again.action == "exit" and "job j already finished" in again.detail
    assert c.members.get("j").generation == gen  # no generation was opened
    c.store.close()
