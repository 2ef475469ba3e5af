"""An agent's long poll returns the moment its job changes, not at the end of its wait."""

import asyncio
import time

from elastictrain.clock import ManualClock
from elastictrain.coordinator.app import Coordinator
from elastictrain.coordinator.store import open_store
from elastictrain.wire import AgentJoin, AgentPoll, AgentReport


def test_a_peer_failure_wakes_the_long_poll_at_once(tmp_path):
    c = Coordinator(open_store(str(tmp_path / "db")), ManualClock(100.0))
    r = c.rendezvous
    r.join("j", AgentJoin("a", "ha", 1, 1000, 2, 2, max_restarts=3))
    gen = r.join("j", AgentJoin("b", "hb", 1, 1000, 2, 2, max_restarts=3)).assignment.generation

    async def scenario():
        t0 = time.monotonic()
        poll = asyncio.ensure_future(r.long_poll("j", AgentPoll("b", gen, wait=10.0)))
        await asyncio.sleep(0.2)
        assert not poll.done()  # nothing changed: the answer is held
        r.report("j", AgentReport("a", gen, "failed", "rank 0 exited with code 1"))
        action = await asyncio.wait_for(poll, 2.0)
        return action, time.monotonic() - t0

    action, took = asyncio.run(scenario())
    assert action.action == "restart" and took < 1.0
    c.store.close()


def test_an_unchanged_generation_answers_run_when_the_wait_ends(tmp_path):
    c = Coordinator(open_store(str(tmp_path / "db")), ManualClock(100.0))
    gen = c.rendezvous.join("j", AgentJoin("a", "ha", 1, 1000)).assignment.generation
    t0 = time.monotonic()
    action = asyncio.run(c.rendezvous.long_poll("j", AgentPoll("a", gen, wait=0.3)))
    assert action.action == "run" and 0.25 < time.monotonic() - t0 < 2.0
    c.store.close()
