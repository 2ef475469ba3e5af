"""docs/policies.md's example policy (examples/policies/user_turns.py), loaded by its path
``user_turns:UserTurns``: in the simulator, and live on a real cluster (a coordinator process
and a node daemon) where the simulator, replaying the live run's exported trace, must make the
same decisions in the same order (the parity harness of test_parity.py)."""

import os
import time

import pytest

from elastictrain.launcher.local_cluster import LocalCluster as Cluster
from elastictrain.policies.api import create
from elastictrain.sim.cluster import load_cluster
from elastictrain.sim.engine import Simulator
from elastictrain.model import JobSpec
from tests.integration.test_parity import check, submit_muri

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "policies")


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (EXAMPLE, os.environ.get("PYTHONPATH")))))
    monkeypatch.syspath_prepend(EXAMPLE)


def test_the_example_policy_gives_the_next_gpus_to_the_user_holding_least(on_path):
    # one node of 2 GPUs; alice's three 1-GPU jobs arrive first, then bob's: bob's job starts
    # before alice's third (she holds 1 GPU, he holds none when the first of hers ends)
    jobs = [JobSpec(i, 1, float(i), 100.0, 1.0, "m", user=u) for i, u in enumerate(("alice",) * 3 + ("bob",))]
    log: list = []
    Simulator(jobs, load_cluster("n1g2"), create("user_turns:UserTurns"), decisions=log).run()
    starts = [d for d in log if d[1] == "start"]
    assert [d[2] for d in starts] == [0, 1, 3, 2], log


@pytest.mark.slow
def test_the_example_policy_live_and_simulated_make_the_same_decisions(tmp_path, on_path):
    with Cluster(tmp_path, "user_turns:UserTurns", nodes=1, slots=2) as c:
        for i, user in enumerate(("alice", "alice", "alice", "bob")):
            submit_muri(c, f"{user}{i}", 150 + 20 * i, (20, 0, 20), user=user)
            time.sleep(1.0)  # each arrival is its own decision, live as in the simulator
        c.wait_all(4, timeout=300)
        live = check(c, "user_turns:UserTurns", "n1g2", {})
        assert [s.job for s in live if s.kind == "start"][:4] == [0, 1, 3, 2], live  # bob before alice's third
