"""The straggler watch (busy time against the peers' median, N windows in a row) and the
rendezvous' exclusion of a straggler's node (cooldown, doubling, the job's minimum)."""

from types import SimpleNamespace as NS

import pytest

from elastictrain.clock import ManualClock
from elastictrain.coordinator.membership import Membership
from elastictrain.coordinator.rendezvous import Rendezvous
from elastictrain.coordinator.stragglers import StragglerWatch
from elastictrain.coordinator.store import open_store
from elastictrain.errors import ConfigError
from elastictrain.wire import AgentJoin, AgentPoll


def s(t, busy):
    return NS(t=t, busy_time=busy)


def test_a_rank_is_flagged_after_n_slow_windows_and_cleared_when_it_recovers():
    w = StragglerWatch(factor=1.5, windows=3)
    for t in range(3):
        for worker in (0, 1, 2):
            assert w.observe("j", 1, worker, [s(t, 0.04)]) is None
    assert w.observe("j", 1, 2, [s(3, 0.12)]) is None and w.observe("j", 1, 2, [s(4, 0.12)]) is None
    flag = w.observe("j", 1, 2, [s(5, 0.12)])
    assert flag is not None and flag.worker == 2 and flag.slowdown == pytest.approx(3.0)
    assert w.observe("j", 1, 2, [s(6, 0.12)]) is None and [f.worker for f in w.current("j")] == [2]  # raised once
    w.observe("j", 1, 2, [s(7, 0.05)])
    assert w.current("j") == []
    assert w.observe("j", 1, 0, [s(8, None), s(9, 0.0)]) is None  # no spans: nothing to judge
    with pytest.raises(ConfigError):
        StragglerWatch(factor=1.0)


def _agent(name):
    return AgentJoin(name, "127.0.0.1", 1, 29500, 2, 3, 3, 1000.0, -1, 10.0)  # 1 worker, --nnodes 2:3


def _round(r, names, waiting=()):
    """The agents of ``names`` join again (those in ``waiting`` were waiting already and only
    poll); returns each one's answer once the round is settled."""
    for a in names:
        if a not in waiting:
            r.join("j", _agent(a))
    return {a: r.poll("j", AgentPoll(a, 0)) for a in names}


def test_exclusion_restarts_without_the_node_for_a_doubling_cooldown(tmp_path):
    clock = ManualClock(100.0)
    store = open_store(str(tmp_path / "db"))
    members = Membership(store, [])
    r = Rendezvous(members, clock, store)
    first = _round(r, ["a", "b", "c"])  # the round closes at the maximum of 3
    assert {x.action for x in first.values()} == {"run"} and members.get("j").world_size == 3
    assert r.join("j", _agent("spare")).action == "wait"  # a spare: the job is at its maximum
    assert r.agent_of("j", first["b"].assignment.rank_offset) == "b"
    assert r.exclude("j", "b", 60.0, "slow") == "excluded for 60 s"
    assert r.poll("j", AgentPoll("a", 1)).action == "restart"  # every node restarts ...
    second = _round(r, ["a", "b", "c", "spare"], waiting=("spare",))
    assert second["b"].action == "wait" and "straggler" in second["b"].detail  # ... the straggler's sits out
    assert {second[x].action for x in ("a", "c", "spare")} == {"run"}, second
    assert second["a"].assignment.reason == "straggler" and members.get("j").world_size == 3
    # down to its minimum of 2 nodes the job keeps a straggler's node (it is only flagged)
    assert r.exclude("j", "a", 60.0, "slow") == "excluded for 60 s"
    for x in ("a", "c", "spare"):
        r.join("j", _agent(x))
    clock.advance(10.5)  # two nodes are fewer than the maximum: the round closes after its last call
    third = {x: r.poll("j", AgentPoll(x, 0)) for x in ("a", "c", "spare")}
    assert third["a"].action == "wait" and {third[x].action for x in ("c", "spare")} == {"run"} and members.get("j").world_size == 2
    assert r.exclude("j", "c", 60.0, "slow").startswith("kept: without its node the job has 1 node(s)")
    # the cooldowns end: the job grows back to its maximum of 3 nodes (scale_up); the 4th waits
    clock.advance(61.0)
    assert r.poll("j", AgentPoll("c", third["c"].assignment.generation)).action == "restart"
    fourth = _round(r, ["a", "b", "c", "spare"], waiting=("a", "b"))
    runners = sorted(x for x, act in fourth.items() if act.action == "run")
    assert len(runners) == 3 and "b" in runners and members.get("j").world_size == 3, fourth
    assert {fourth[x].assignment.reason for x in runners} == {"scale_up"}
    # excluded again, b sits out twice as long
    assert r.exclude("j", "b", 60.0, "slow") == "excluded for 120 s"
    store.close()


def sp(t, busy, step, part, step_time=0.05):
    return NS(t=t, busy_time=busy, step=step, local_batch=part, step_time=step_time)


def test_a_straggler_that_asks_for_its_part_first_gets_fewer_samples_then_its_node_replaced():
    w = StragglerWatch(factor=1.5, windows=2)
    for t in range(2):  # three ranks, each asking for its part (Job.local_batch), equal so far
        for worker in (0, 1, 2):
            w.observe("j", 1, worker, [sp(t, 0.04, 10 * t, 8)])
    w.observe("j", 1, 2, [sp(2, 0.12, 20, 8)])
    flag = w.observe("j", 1, 2, [sp(3, 0.12, 30, 8)])
    assert flag is not None and flag.slowdown == pytest.approx(3.0)
    action = w.share_out("j", flag, world=3)
    shares = w.shares["j"]
    assert action.startswith("fewer samples per step: 0.33 of a full share")
    assert shares.weights == [1.0, 1.0, pytest.approx(1 / 3, abs=1e-3)] and shares.generation == 1
    assert shares.from_step > 30 and shares.version == 1 and w.cut("j") == {2}
    # before the new parts are in use its busy time does not count; once they are, even again: no flag
    assert w.observe("j", 1, 2, [sp(4, 0.12, shares.from_step - 1, 8)]) is None
    for t in range(5, 9):
        for worker in (0, 1):
            w.observe("j", 1, worker, [sp(t, 0.045, shares.from_step + 2 + t, 10)])
        assert w.observe("j", 1, 2, [sp(t, 0.045, shares.from_step + 2 + t, 4)]) is None
    # slow again for two windows with its cut share: raised again, and share_out declines (replace the node)
    w.observe("j", 1, 2, [sp(9, 0.12, shares.from_step + 20, 4)])
    again = w.observe("j", 1, 2, [sp(10, 0.12, shares.from_step + 21, 4)])
    assert again is not None and w.share_out("j", again, world=3) is None
    w.observe("j", 2, 0, [sp(11, 0.04, 0, 8)])  # a new generation starts over
    assert "j" not in w.shares and w.cut("j") == set()


def test_no_shares_unless_every_rank_asks_for_its_part():
    w = StragglerWatch(factor=1.5, windows=1)
    for worker in (0, 1):
        w.observe("j", 1, worker, [sp(0, 0.04, 5, 8)])
    w.observe("j", 1, 2, [s(0, 0.04)])  # rank 2 does not call Job.local_batch
    flag = w.observe("j", 1, 1, [sp(1, 0.2, 6, 8)])
    assert flag is not None and w.share_out("j", flag, world=3) is None and "j" not in w.shares
