"""Per-user quotas (coordinator/quotas.py): admission into the job table the policy decides on,
in process on a manual clock with the real SQLite store."""

import pytest

from elastictrain.clock import ManualClock
from elastictrain.coordinator.app import Coordinator
from elastictrain.coordinator.quotas import Quota, QuotaBook
from elastictrain.coordinator.scheduler import ClusterConfig
from elastictrain.coordinator.store import open_store
from elastictrain.errors import ConfigError
from elastictrain.wire import JobSubmit, UserQuota

from .test_cluster_scheduler import World


class QuotaWorld(World):
    def __init__(self, tmp, quota_gpus=0, quota_jobs=0, borrow=False, **kw):
        self.quota, self.borrow = (quota_gpus, quota_jobs), borrow
        super().__init__(tmp, **kw)

    def open(self):
        self.c = Coordinator(open_store(str(self.tmp / "db")), self.clock,
                             ClusterConfig(self.policy, dict(self.options), interval=1.0,
                                           node_timeout=self.node_timeout, quota_gpus=self.quota[0],
                                           quota_jobs=self.quota[1], quota_borrow=self.borrow))
        self.s = self.c.cluster

    def submit(self, gpus=1, user="alice", **kw):
        return self.s.submit(JobSubmit(["train.py"], str(self.tmp), gpus=gpus, user=user, **kw)).id

    def placed(self):
        return {job for tasks in self.run_all().values() for job, _, _ in tasks}


def test_a_users_jobs_never_hold_more_than_its_quota_and_the_rest_are_admitted_as_they_end(tmp_path):
    w = QuotaWorld(tmp_path, policy="fifo", nodes=2, slots=4, quota_gpus=3)
    a, b, c = w.submit(2), w.submit(1), w.submit(2)  # alice: 2 + 1 fit in 3 GPUs; c waits
    d = w.submit(2, user="bob")  # bob has the default quota too, and his own room
    w.s.tick()
    assert w.placed() == {a, b, d}
    info = w.s.job(c)
    assert info.status == "queued" and "waiting for user alice's quota (3 GPUs, the coordinator's default)" in \
        info.reason and "count 3 of its 3 GPUs and this one needs 2" in info.reason and \
        "elastictrain users quota alice" in info.reason
    assert c not in w.s.table  # the policy never saw it
    kinds = [(e.kind, e.job) for e in w.s.events.list(0).events]
    assert ("quota_wait", c) in kinds and ("quota_wait", a) not in kinds
    w.exit(b, 0)  # 1 GPU back is not enough for c
    w.s.tick()
    assert c not in w.s.table
    w.exit(a, 0)
    w.s.tick()
    assert w.s.job(c).status == "running" and ("admitted", c) in [(e.kind, e.job) for e in w.s.events.list(0).events]


def test_a_job_bigger_than_its_users_quota_is_refused_with_the_fix(tmp_path):
    w = QuotaWorld(tmp_path, nodes=1, slots=4, quota_gpus=2)
    with pytest.raises(ConfigError, match=r"asks for 3 GPUs .* quota is 2: it could never be admitted; lower --gpus "
                                          r"to 2 or less, or ask an admin .*users quota alice --gpus 3"):
        w.submit(3)
    w.s.set_quota("alice", UserQuota(gpus=4))
    assert w.s.job(w.submit(3)).status == "queued"


def test_a_jobs_quota_priority_order_cancel_and_a_raised_quota(tmp_path):
    w = QuotaWorld(tmp_path, policy="fifo", nodes=2, slots=4, quota_jobs=1)
    a = w.submit(1)
    low, high = w.submit(1, priority=0), w.submit(1, priority=5)
    w.s.tick()
    assert w.placed() == {a}
    assert "its 1 admitted job reaches its limit of 1" in w.s.job(low).reason
    w.s.cancel(low)  # never admitted: it ends as it waited
    assert w.s.job(low).status == "cancelled" and low not in w.s.admission.waiting
    later = w.submit(1)
    users = w.s.set_quota("alice", UserQuota(jobs=2))  # high goes first (priority), later still waits
    me = next(u for u in users.users if u.user == "alice")
    assert (me.quota_jobs, me.quota_gpus, me.quota_own, me.admitted_gpus, me.waiting_for_quota) == (2, None, True, 2, 1)
    w.s.tick()
    assert w.placed() == {a, high}
    assert later in w.s.admission.waiting
    w.s.set_quota("alice", UserQuota(default=True))  # back to the default: 1 job; high and a keep their admission
    assert {a, high} <= set(w.s.table._entries) and later in w.s.admission.waiting
    with pytest.raises(ConfigError, match="--default alone"):
        w.s.set_quota("alice", UserQuota(gpus=2, default=True))
    with pytest.raises(ConfigError, match="user name"):
        w.s.set_quota("no good", UserQuota(gpus=2))


def test_admission_and_quotas_survive_a_restart(tmp_path):
    w = QuotaWorld(tmp_path, policy="fifo", nodes=1, slots=4)
    w.s.set_quota("alice", UserQuota(gpus=2))
    a, b = w.submit(2), w.submit(2)
    w.s.tick()
    assert w.placed() == {a}
    w.restart()
    assert b in w.s.admission.waiting and b not in w.s.table and w.s.quotas.of("alice") == Quota(2, None)
    w.exit(a, 0)
    w.s.tick()
    assert w.s.job(b).status == "running"


def test_the_admission_rule():
    book = QuotaBook({}, Quota(gpus=4))

    class R:
        def __init__(self, seq, gpus, user="u", priority=0):
            self.seq, self.gpus, self.user, self.priority = seq, gpus, user, priority

    used = {"u": [1, 1]}
    got = book.admit([R(1, 4), R(2, 2), R(3, 1), R(4, 1, priority=1)], used)
    assert [r.seq for r in got] == [4, 2]  # priority first; 4 GPUs does not fit; 2 then fills it (best effort)
    assert used == {"u": [4, 3]}
    book.set("v", Quota())  # its own: no limit
    assert len(book.admit([R(i, 100, "v") for i in range(5)], used)) == 5
    for bad in (0, -1, 10**7, 1.5, True):
        with pytest.raises(ConfigError, match=r"whole number in \[1, 1000000\]"):
            Quota(gpus=bad)
    assert QuotaBook({"user_quotas": "not json"}, Quota()).own == {}
    with pytest.raises(ConfigError, match="--quota-gpus must be in"):
        ClusterConfig("fifo", quota_gpus=-1)


# ---------------------------------------------------------------- --quota-borrow (Kueue's borrowing)
def _plans(w, job):
    return [e.detail.get("why", "") for e in w.s.events.list(0).events if e.kind == "plan" and e.job == job]


@pytest.mark.parametrize("policy", ["fifo", "tiresias-l"])
def test_borrowed_gpus_run_over_the_quota_and_go_back_first(tmp_path, policy):
    w = QuotaWorld(tmp_path, policy=policy, nodes=1, slots=4, quota_gpus=2, borrow=True)
    mine = w.submit(2)
    over = w.submit(2)  # over alice's 2 GPUs: borrowed, since nobody else wants the other 2
    w.s.tick()
    assert w.placed() == {mine, over}
    assert w.s.job(over).info["quota"].startswith("borrowing") and "quota" not in w.s.job(mine).info
    kinds = [e.kind for e in w.s.events.list(0).events if e.job == over]
    assert "borrow" in kinds and "quota_wait" not in kinds
    w.clock.advance(5)
    bob = w.submit(2, user="bob")  # within bob's quota: the borrowed GPUs go back
    w.s.tick()
    assert w.s.job(over).stopping and not w.s.job(mine).stopping
    assert "borrowed over its user's quota, and jobs within their quotas need them" in _plans(w, over)[-1]
    w.exit(over, 75)
    w.s.tick()
    assert w.placed() == {mine, bob} and w.status(over) == "preempted"
    assert w.s.job(over).reason.startswith("borrowing: over user alice's quota (2 GPUs)")
    w.exit(mine, 0)  # alice's quota has room again: the borrower counts against it, and runs
    w.s.tick()
    assert "within_quota" in [e.kind for e in w.s.events.list(0).events if e.job == over]
    assert "quota" not in w.s.job(over).info and w.placed() == {bob, over}


def test_a_borrower_keeps_its_state_across_a_restart_and_without_the_flag_nothing_borrows(tmp_path):
    w = QuotaWorld(tmp_path, policy="fifo", nodes=1, slots=4, quota_gpus=2, borrow=True)
    w.submit(2)
    over = w.submit(2)
    w.s.tick()
    w.run_all()
    w.s._flush(everything=True)
    w.restart()
    assert w.s.records[over].borrowing and over in w.s.admission.borrowers
    assert w.s.table.get(over).priority < -1000
    plain = QuotaWorld(tmp_path / "plain", policy="fifo", nodes=1, slots=4, quota_gpus=2)
    plain.submit(2)
    waits = plain.submit(2)
    plain.s.tick()
    assert plain.status(waits) == "queued" and waits not in plain.s.table  # it waits for the quota
