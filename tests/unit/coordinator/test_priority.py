"""``coordinator --priority-preemption``: a job of a higher ``--priority`` takes a lower one's GPUs
on the live scheduler (the lower one checkpoints and resumes later), the policy decides within
each priority, only the admin may submit above 0, and a restart keeps every tier's memory."""

import pytest

from elastictrain.coordinator.access import Identity
from elastictrain.coordinator.app import Coordinator
from elastictrain.coordinator.scheduler import ClusterConfig
from elastictrain.coordinator.store import open_store
from elastictrain.errors import ForbiddenError
from elastictrain.wire import JobSubmit

from .test_cluster_scheduler import World


class TierWorld(World):
    def __init__(self, tmp, preempt=True, **kw):
        self.preempt = preempt
        super().__init__(tmp, **kw)

    def open(self):
        self.c = Coordinator(open_store(str(self.tmp / "db")), self.clock,
                             ClusterConfig(self.policy, dict(self.options), interval=1.0,
                                           node_timeout=self.node_timeout, priority_preemption=self.preempt))
        self.s = self.c.cluster


@pytest.mark.parametrize("policy", ["fifo", "tiresias-l", "gandiva-fair"])
def test_a_higher_priority_job_preempts_a_lower_one_which_resumes_after_it(tmp_path, policy):
    w = TierWorld(tmp_path, policy=policy, nodes=1, slots=2)
    low = w.submit(2)
    w.s.tick()
    assert w.run_all() == {"n1": [(low, 1, (0, 1))]}
    w.clock.advance(5)
    high = w.submit(2, priority=10)
    w.s.tick()
    assert w.s.job(low).stopping and w.status(high) == "queued"
    plans = [e for e in w.s.events.list(0).events if e.kind == "plan" and e.job == low]
    assert plans and "went to jobs of priority 10, above its 0" in str(plans[-1].detail)
    w.exit(low, 75)  # it checkpointed and exited
    w.s.tick()
    assert w.run_all() == {"n1": [(high, 1, (0, 1))]}
    w.clock.advance(5)
    w.s.tick()
    assert w.status(low) == "preempted"  # it waits while the higher one runs, whatever the policy's turns
    assert "jobs of a priority above its 0 hold 2 (--priority-preemption)" in w.s.job(low).reason
    w.exit(high, 0)
    w.s.tick()
    assert w.run_all() == {"n1": [(low, 2, (0, 1))]} and w.s.job(low).runs_by_reason == {"preempt": 1}


def test_without_the_flag_priority_does_not_preempt(tmp_path):
    w = TierWorld(tmp_path, preempt=False, policy="fifo", nodes=1, slots=2)
    low = w.submit(2)
    w.s.tick()
    w.run_all()
    high = w.submit(2, priority=10)
    w.s.tick()
    assert not w.s.job(low).stopping and w.status(high) == "queued"


def test_only_the_admin_submits_above_priority_0(tmp_path):
    w = TierWorld(tmp_path, policy="fifo", nodes=1, slots=2)
    w.c.creds.add_user("alice", "alice", False)
    alice = Identity("user", "alice")
    req = JobSubmit(["train.py"], str(tmp_path), gpus=1, priority=1)
    with pytest.raises(ForbiddenError, match=r"only the admin may submit above priority 0; submit at 0 or below"):
        w.s.submit(req, alice)
    assert w.s.submit(JobSubmit(["train.py"], str(tmp_path), gpus=1, priority=-5), alice).user == "alice"
    assert w.s.submit(req).id  # the admin may


def test_a_restarted_coordinator_keeps_each_tiers_policy_memory(tmp_path):
    w = TierWorld(tmp_path, policy="tiresias-l", nodes=1, slots=2, thresholds=(10.0,))
    a, b = w.submit(2), w.submit(2, priority=1)
    w.s.tick()
    w.run_all()
    w.clock.advance(20)  # b (priority 1) is demoted to Q1 within its tier
    w.s.tick()
    before = w.s.policy.export_state()
    assert sorted(before["tiers"]) == ["0", "1"]
    w.s._flush(everything=True)
    w.restart()
    assert w.s.policy.export_state() == before
    assert w.status(b) == "running" and w.status(a) == "queued"
