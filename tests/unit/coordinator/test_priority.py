"""``coordinator --priority-preemption``: a job of a higher ``--priority`` takes a lower one's GPUs
on the live scheduler (the lower one checkpoints and resumes later), the policy decides within
each priority, only the admin may submit above 0, and a restart keeps every tier's memory."""

import pytest

from elastictrain.coordinator.access import Identity
from elastictrain.coordinator.app import Coordinator
from elastictrain.coordinator.scheduler import ClusterConfig
from elastictrain.coordinator.store import open_store
from elastictrain.errors import BadRequestError, ConflictError, ForbiddenError, NotFoundError
from elastictrain.wire import JobSubmit, JobUpdate, UserQuota

from .test_cluster_scheduler import World


class TierWorld(World):
    def __init__(self, tmp, preempt=True, min_run=0.0, **kw):
        self.preempt, self.min_run = preempt, min_run
        super().__init__(tmp, **kw)

    def open(self):
        self.c = Coordinator(open_store(str(self.tmp / "db")), self.clock,
                             ClusterConfig(self.policy, dict(self.options), interval=1.0,
                                           node_timeout=self.node_timeout, priority_preemption=self.preempt,
                                           min_run=self.min_run))
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


def test_only_the_admin_submits_above_priority_0_unless_a_quota_allows_more(tmp_path):
    w = TierWorld(tmp_path, policy="fifo", nodes=1, slots=2)
    w.c.creds.add_user("alice", "alice", False)
    alice = Identity("user", "alice")
    req = JobSubmit(["train.py"], str(tmp_path), gpus=1, priority=1)
    with pytest.raises(ForbiddenError, match=r"user alice may submit up to priority 0; submit at 0 or below .*"
                                             r"`elastictrain users quota alice --max-priority N`"):
        w.s.submit(req, alice)
    assert w.s.submit(JobSubmit(["train.py"], str(tmp_path), gpus=1, priority=-5), alice).user == "alice"
    assert w.s.submit(req).id  # the admin may
    # a Slurm association's allowed QOS: the admin lets alice go up to 5; her limits stay as they were
    w.s.set_quota("alice", UserQuota(gpus=4))
    ul = w.s.set_quota("alice", UserQuota(max_priority=5))
    assert [(u.max_priority, u.quota_gpus) for u in ul.users if u.user == "alice"] == [(5, 4)]
    ul = w.s.set_quota("alice", UserQuota(gpus=6))  # and new limits leave her highest priority
    assert [(u.max_priority, u.quota_gpus) for u in ul.users if u.user == "alice"] == [(5, 6)]
    job = w.s.submit(JobSubmit(["train.py"], str(tmp_path), gpus=1, priority=5), alice).id
    with pytest.raises(ForbiddenError, match="may submit up to priority 5"):
        w.s.submit(JobSubmit(["train.py"], str(tmp_path), gpus=1, priority=6), alice)
    w.s.update(job, JobUpdate(priority=2), alice)
    w.s.update(job, JobUpdate(priority=5), alice)  # back up to its highest
    with pytest.raises(ForbiddenError, match=r"set it at 5 or below \(user alice's highest\)"):
        w.s.update(job, JobUpdate(priority=6), alice)
    w.restart()  # kept in the database
    assert w.s.quotas.max_priority("alice") == 5 and w.s.quotas.max_priority("bob") == 0
    w.s.set_quota("alice", UserQuota(default=True))
    with pytest.raises(ForbiddenError, match="may submit up to priority 0"):
        w.s.submit(JobSubmit(["train.py"], str(tmp_path), gpus=1, priority=1), alice)
    assert w.s.quotas.of("alice").gpus is None  # --default drops both
    ev = [e.detail for e in w.s.events.list(0).events if e.kind == "quota"]
    assert [d["max_priority"] for d in ev] == [0, 5, 5, 0]


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


# ---------------------------------------------------------------- elastictrain update (scontrol update)
def test_raising_a_waiting_jobs_priority_preempts_the_lower_one_at_once(tmp_path):
    w = TierWorld(tmp_path, policy="fifo", nodes=1, slots=2)
    low = w.submit(2)
    w.s.tick()
    w.run_all()
    w.clock.advance(5)
    other = w.submit(2)
    w.s.tick()
    assert w.status(other) == "queued" and not w.s.job(low).stopping  # fifo: it waits its turn
    info = w.s.update(other, JobUpdate(priority=10))
    assert info.priority == 10
    w.s.tick()
    assert w.s.job(low).stopping  # the raised job takes the GPUs: the lower one checkpoints
    ev = [e for e in w.s.events.list(0).events if e.kind == "update"]
    assert [(e.job, e.detail["priority"], e.detail["by"]) for e in ev] == [(other, "0 -> 10", "admin")]
    w.exit(low, 75)
    w.s.tick()
    assert w.run_all() == {"n1": [(other, 1, (0, 1))]}


def test_lowering_a_running_jobs_priority_lets_a_waiting_one_preempt_it(tmp_path):
    w = TierWorld(tmp_path, policy="fifo", nodes=1, slots=2)
    first = w.submit(2, priority=5)
    w.s.tick()
    w.run_all()
    second = w.submit(2, priority=5)
    w.s.tick()
    assert w.status(second) == "queued" and not w.s.job(first).stopping
    w.s.update(first, JobUpdate(priority=-1))  # its owner yields (a user may lower)
    w.s.tick()
    assert w.s.job(first).stopping
    w.exit(first, 75)
    w.s.tick()
    assert w.run_all() == {"n1": [(second, 1, (0, 1))]} and w.s.job(first).priority == -1


def test_who_may_change_what(tmp_path):
    w = TierWorld(tmp_path, policy="fifo", nodes=1, slots=2)
    w.c.creds.add_user("alice", "alice", False)
    alice = Identity("user", "alice")
    job = w.s.submit(JobSubmit(["train.py"], str(tmp_path), gpus=1, priority=0, time_limit=600.0), alice).id
    with pytest.raises(ForbiddenError, match=r"a user may lower its job's priority \(now 0\) or set it at 0 or below"):
        w.s.update(job, JobUpdate(priority=1), alice)
    with pytest.raises(ForbiddenError, match=r"may only lower its job's time limit \(now 600 s\)"):
        w.s.update(job, JobUpdate(time_limit=900.0), alice)
    with pytest.raises(ForbiddenError, match="time limit none"):  # lifting the limit is raising it
        w.s.update(job, JobUpdate(time_limit=0.0), alice)
    assert w.s.job(job).priority == 0 and w.s.job(job).info["time_limit"].startswith("600 s")
    w.s.update(job, JobUpdate(priority=-3, time_limit=300.0), alice)  # lowering both: allowed
    assert w.s.job(job).priority == -3 and w.s.job(job).info["time_limit"].startswith("300 s")
    w.s.update(job, JobUpdate(priority=0), alice)  # back up to 0: a user may submit at 0
    w.s.update(job, JobUpdate(priority=50, time_limit=0.0))  # the admin may raise both, and lift the limit
    assert w.s.job(job).priority == 50 and "time_limit" not in w.s.job(job).info
    w.s.update(job, JobUpdate(priority=20), alice)  # the owner may lower the admin's 50
    with pytest.raises(ForbiddenError):
        w.s.update(job, JobUpdate(priority=30), alice)
    with pytest.raises(BadRequestError, match=r"nothing to change: give a priority \(--priority N\)"):
        w.s.update(job, JobUpdate())
    ev = [e.detail for e in w.s.events.list(0).events if e.kind == "update"]
    assert [d.get("priority") for d in ev] == ["0 -> -3", "-3 -> 0", "0 -> 50", "50 -> 20"]
    assert ev[0]["time_limit"] == "600 s -> 300 s" and ev[2]["time_limit"] == "300 s -> none"


def test_without_the_flag_a_user_sets_any_priority(tmp_path):
    w = TierWorld(tmp_path, preempt=False, policy="fifo", nodes=1, slots=2)
    w.c.creds.add_user("bob", "bob", False)
    bob = Identity("user", "bob")
    job = w.s.submit(JobSubmit(["train.py"], str(tmp_path), gpus=1), bob).id
    assert w.s.update(job, JobUpdate(priority=7), bob).priority == 7  # it orders bob's own admission only


def test_a_lowered_time_limit_ends_the_run_and_an_update_survives_a_restart(tmp_path):
    w = TierWorld(tmp_path, policy="fifo", nodes=1, slots=2)
    job = w.submit(1)
    w.s.tick()
    w.run_all()
    w.clock.advance(100)
    w.s.update(job, JobUpdate(priority=4))
    w.s._flush(everything=True)
    w.restart()
    assert w.s.job(job).priority == 4 and w.s.table.get(job).priority == 4
    w.s.update(job, JobUpdate(time_limit=60.0))  # below the 100 s it has held
    w.s.tick()
    info = w.s.job(job)
    assert info.status == "failed" and "TIMEOUT" in info.reason
    with pytest.raises(ConflictError, match="already failed; nothing to update"):
        w.s.update(job, JobUpdate(priority=1))
    with pytest.raises(NotFoundError):
        w.s.update("nope", JobUpdate(priority=1))


# ---------------------------------------------------------------- coordinator --preempt-exempt (PreemptExemptTime)
def test_a_higher_priority_waits_until_the_lower_run_is_exempt_no_more_across_a_restart(tmp_path):
    w = TierWorld(tmp_path, policy="fifo", nodes=1, slots=2, min_run=60.0)
    low = w.submit(2)
    w.s.tick()
    w.run_all()
    w.clock.advance(10)
    high = w.submit(2, priority=10)
    w.s.tick()
    assert not w.s.job(low).stopping and w.status(high) == "queued"
    assert w.s.job(high).reason == (f"placed; waiting until job {low} has run 60 s, in 50 s (a run is not preempted "
                                    "before: --preempt-exempt)")
    ev = [e for e in w.s.events.list(0).events if e.kind == "deferred" and e.job == high]
    assert ev and "--preempt-exempt" in ev[-1].detail["why"]
    w.s._flush(everything=True)
    w.restart()  # the run's start is kept: the exemption still ends at 60 s, not 60 s after the restart
    assert w.s.table.get(low).run_at == 1000.0  # (the world's clock starts at 1000)
    w.clock.advance(30)
    w.s.tick()
    assert not w.s.job(low).stopping and w.s.sched.wakeup == w.s.table.get(low).run_at + 60.0
    w.clock.advance(20)  # the low run is 60 s old
    w.s.tick()
    assert w.s.job(low).stopping
