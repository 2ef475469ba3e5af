"""The coordinator's live scheduler in process, on a manual clock: tasks, the launch rule, run
fencing, node loss, persistence across a restart (policy memory included), assumptions."""

import asyncio
from pathlib import Path

import pytest

from elastictrain.clock import ManualClock
from elastictrain.coordinator.app import Coordinator
from elastictrain.coordinator.scheduler import ClusterConfig
from elastictrain.coordinator.store import open_store
from elastictrain.errors import ConfigError, ConflictError, NotFoundError
from elastictrain.wire import (
    AgentJoin, JobSubmit, NodeCordon, NodeLeave, NodePoll, NodeRegister, StepReport, TaskState,
)


ROOT = Path(__file__).resolve().parents[3]


class World:
    def __init__(self, tmp, policy="tiresias-l", nodes=2, slots=2, node_timeout=60.0, **options):
        self.tmp, self.policy, self.options, self.node_timeout = tmp, policy, options, node_timeout
        self.clock = ManualClock(1000.0)
        self.nodes, self.slots = nodes, slots
        self.open()
        self.inst = {}
        for i in range(nodes):
            self.register(f"n{i + 1}", f"inst{i + 1}")

    def register(self, node, inst):
        self.inst[node] = inst
        return self.s.node_register(node, NodeRegister(self.slots, inst, "slot", "cpu", "h"))

    def open(self):
        self.c = Coordinator(open_store(str(self.tmp / "db")), self.clock,
                             ClusterConfig(self.policy, dict(self.options), interval=1.0,
                                           node_timeout=self.node_timeout))
        self.s = self.c.cluster

    def restart(self):
        self.c.store.close()  # kill -9: nothing more is written
        self.open()

    def submit(self, gpus=1, **kw):
        return self.s.submit(JobSubmit(["train.py"], str(self.tmp), gpus=gpus, **kw)).id

    def poll(self, node, states=(), inst=None):
        req = NodePoll(inst or self.inst[node], list(states), [], 0.0)
        return asyncio.run(self.s.node_poll(node, req))

    def run_all(self, train=True):
        """Every node reports its released tasks as running; returns {node: [(job, run, gpus)]}.
        ``train``: and each of their jobs reports a training step (its start-up is over)."""
        out = {}
        for n in self.s.nodes.by_index:
            tasks = self.poll(n.name).tasks
            self.poll(n.name, [TaskState(t.job, t.run, "running") for t in tasks])
            out[n.name] = [(t.job, t.run, tuple(t.gpus)) for t in tasks]
            for t in tasks if train else ():
                for job in [m.job for m in t.group] or [t.job]:
                    self.c.step(job, StepReport(0, self.s.job(job).step))
        return out

    def exit(self, job, code, node=None):
        for n in self.s.nodes.by_index:
            if node and n.name != node:
                continue
            for t in list(n.tasks):
                if t.job == job and t.alive:
                    self.poll(n.name, [TaskState(t.job, t.run, "exited", code, "bye")])

    def status(self, job):
        return self.s.job(job).status


def test_start_preempt_stop_resume_with_the_launch_rule(tmp_path):
    w = World(tmp_path, nodes=1, slots=2, thresholds=(10.0,))
    a = w.submit(2)
    w.s.tick()
    assert w.run_all() == {"n1": [(a, 1, (0, 1))]}
    w.clock.advance(6)  # 12 GPU-seconds: a is demoted to Q1
    b = w.submit(2)
    w.s.tick()
    assert w.status(a) == "running" and w.s.job(a).stopping
    assert w.s.job(b).status == "queued"
    # b's task is not handed out while a's workers still hold the GPUs
    assert w.run_all() == {"n1": []}
    w.exit(a, 75)
    assert w.status(a) == "preempted"
    w.s.tick()
    assert w.run_all() == {"n1": [(b, 1, (0, 1))]}
    w.exit(b, 0)
    w.s.tick()
    assert w.status(b) == "finished"
    assert w.run_all() == {"n1": [(a, 2, (0, 1))]}  # a resumes: run 2
    assert w.s.job(a).runs_by_reason == {"preempt": 1} and w.s.job(b).runs_by_reason == {}
    assert (w.s.job(a).exit_code, w.s.job(b).exit_code) == (None, 0)  # (history's accounting)
    kinds = [e.kind for e in w.s.events.list(0).events if e.job == a]
    assert kinds[:5] == ["submit", "start", "launch", "first_step", "preempt"] and "resume" in kinds


def test_agents_of_an_old_run_are_told_to_exit(tmp_path):
    w = World(tmp_path, nodes=1, slots=2, thresholds=(10.0,))
    a = w.submit(2)
    w.s.tick()
    w.run_all()
    w.clock.advance(6)
    w.submit(2)
    w.s.tick()
    w.exit(a, 75)
    w.s.tick()
    w.exit("2", 0)
    w.s.tick()  # a's run 2 is placed
    late = w.c.rendezvous.join(a, AgentJoin("old-agent", "h", 2, 1234, run=1))
    assert late.action == "exit" and late.status == "preempted" and "superseded" in late.detail
    fresh = w.c.rendezvous.join(a, AgentJoin("new-agent", "h", 2, 1234, run=2))
    assert fresh.action == "run" and fresh.assignment.reason == "preempt"


def test_a_restart_mid_slice_does_not_re_slice_gandiva_ts(tmp_path):
    """gandiva-ts keeps its slice across a coordinator restart (its end, what it runs): the running
    job goes on to the slice's end, where a fresh instance re-sliced at once, preempting it."""
    w = World(tmp_path, policy="gandiva-ts", nodes=1, slots=1, node_timeout=1000.0, quantum=100.0)
    a, b = w.submit(1), w.submit(1)
    w.s.tick()
    w.run_all()
    w.clock.advance(30)
    w.s.tick()
    assert w.status(a) == "running" and not w.s.job(a).stopping and w.status(b) == "queued"
    w.s._flush(everything=True)
    w.restart()
    w.s.tick()
    assert w.status(a) == "running" and not w.s.job(a).stopping  # mid-slice: it goes on
    w.clock.advance(71)  # the slice's end: b's turn
    w.s.tick()
    assert w.s.job(a).stopping


def test_gandiva_fair_keeps_its_passes_and_usage_across_a_restart(tmp_path):
    """Stride scheduling's memory (each job's pass and home, the users' decayed usage) is stored
    with the jobs: a restarted coordinator goes on from it, even one killed again before its first
    decision, instead of every job starting level."""
    w = World(tmp_path, policy="gandiva-fair", nodes=1, slots=2)
    jobs = [w.submit(1, user=u) for u in ("ann", "ann", "ann", "bob")]
    for _ in range(4):
        w.s.tick()
        w.run_all()
        w.clock.advance(60)
    before = w.s.policy.export_state()
    assert len(before["jobs"]) == 4 and len({p for _, p, _, _ in before["jobs"]}) > 1 and before["usage"]
    w.s._flush(everything=True)
    w.restart()
    assert w.s.policy.export_state() == before  # restored (nothing decided yet)
    w.restart()  # killed again before deciding: what it stores is still the memory
    assert w.s.policy.export_state() == before
    w.s.tick()
    passes = {k: p for k, p, _, _ in w.s.policy.export_state()["jobs"]}
    assert set(passes) == set(jobs) and all(passes[k] >= p for k, p, _, _ in before["jobs"])


def test_a_restarted_coordinator_keeps_jobs_nodes_events_and_the_policy_memory(tmp_path):
    w = World(tmp_path, nodes=1, slots=2, thresholds=(10.0,))
    a, b = w.submit(2), w.submit(2)
    w.s.tick()
    w.run_all()
    w.clock.advance(20)
    w.s.tick()  # a (40 GPU-s) demoted to Q1 and preempted, b (Q0) waits for its GPUs
    queues = w.s.policy.export_state()["queues"]
    seq = w.s.events.seq
    w.restart()
    assert w.s.job(a).stopping and w.s.job(b).status == "queued"
    assert w.s.policy.export_state()["queues"] == queues
    assert w.s.events.seq == seq
    w.exit(a, 75)
    w.s.tick()
    assert w.status(a) == "preempted" and w.run_all() == {"n1": [(b, 1, (0, 1))]}
    w.submit(1)
    assert w.s.events.list(seq).events[0].seq == seq + 1


def test_a_lost_node_requeues_its_jobs_and_a_new_daemon_starts_clean(tmp_path):
    w = World(tmp_path, nodes=2, slots=2, node_timeout=5.0)
    a = w.submit(4)  # spans both nodes
    w.s.tick()
    assert sorted(w.run_all()) == ["n1", "n2"]
    w.clock.advance(3)
    w.poll("n1", [TaskState(a, 1, "running")])
    w.clock.advance(3)  # n2 silent for 6 s > 5 s
    w.s.tick()
    assert [n.state for n in w.s.nodes.by_index] == ["up", "down"]
    assert w.s.job(a).stopping  # n1's part is being stopped
    assert w.poll("n1", [TaskState(a, 1, "running")]).tasks == []
    w.exit(a, 75, "n1")
    assert w.status(a) == "preempted"
    assert w.poll("n2").action == "register"  # the old daemon instance is not trusted any more
    w.register("n2", "inst2-new")
    w.s.tick()
    assert w.run_all() == {"n1": [(a, 2, (0, 1))], "n2": [(a, 2, (0, 1))]}
    assert w.status(a) == "running" and w.s.job(a).preemptions == 1
    kinds = [e.kind for e in w.s.events.list(0).events]
    assert "node_down" in kinds and "requeue" in kinds and kinds.count("node_up") == 3


def test_failures_cancel_and_leave(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=1, slots=2)
    a, b = w.submit(1), w.submit(1)
    w.s.tick()
    w.run_all()
    w.c.rendezvous.join(a, AgentJoin("ag", "h", 1, 1, max_restarts=0, run=1))
    w.exit(a, 1)
    assert w.status(a) == "failed" and "etrun exited with code 1" in w.s.job(a).reason
    w.s.cancel(b)
    assert w.status(b) == "cancelled" and w.poll("n1", [TaskState(b, 1, "running")]).tasks == []
    with pytest.raises(ConflictError, match="already cancelled"):
        w.s.cancel(b)
    with pytest.raises(NotFoundError):
        w.s.job("nope")
    c = w.submit(2)
    w.s.tick()
    w.run_all()
    w.s.node_leave("n1", NodeLeave("inst1"))  # a drain: its daemon stopped the job already
    assert w.s.job(c).stopping or w.status(c) == "preempted"
    with pytest.raises(ConflictError, match="another daemon"):
        w.s.node_leave("n1", NodeLeave("someone-else"))


def test_submissions_are_checked(tmp_path):
    w = World(tmp_path, nodes=1, slots=2)
    with pytest.raises(ConfigError, match="needs 3 GPUs but the cluster's nodes have 2"):
        w.submit(3)
    with pytest.raises(ConfigError, match="min_gpus"):
        w.submit(2, min_gpus=3)
    assert w.s.job(w.submit(2, min_gpus=1)).min_gpus == 1


def test_measured_inputs_and_what_was_assumed(tmp_path):
    w = World(tmp_path, policy="srtf", nodes=1, slots=2)
    a = w.submit(1)  # no --steps: SRTF needs a duration it does not have
    b = w.submit(1, steps=100)
    w.s.tick()
    views = w.s.sched.last_snapshot.by_key  # what the policy was told: a's work left is assumed, b's known
    assert views[a].work_known is False and views[b].work_known is True
    w.run_all()
    assumed = {(e.job, e.detail["input"]) for e in w.s.events.list(0).events if e.kind == "assumed"}
    assert {(a, "remaining"), (a, "iteration_time"), (b, "iteration_time")} <= assumed
    assert (b, "remaining") not in assumed
    w.c.step(b, StepReport(0, 10))
    w.clock.advance(5)
    info = w.c.step(b, StepReport(0, 20))
    assert info.iteration_time == pytest.approx(0.5)
    e = w.s.table.get(b)
    w.s.tick()
    view = w.s.sched.last_snapshot.job(b)
    assert view.iteration_time == pytest.approx(0.5) and view.remaining_iterations == 80 and e.attained_gpu > 0
    w.clock.advance(2)
    assert w.c.step(b, StepReport(0, 30)).iteration_time == pytest.approx(0.7 * 0.5 + 0.3 * 0.2)  # (smoothed)
    # on 2 workers (as after a resize) a step takes another time: measured afresh, not smoothed into 1's
    e.num_gpu = 2
    w.clock.advance(1)
    assert w.c.step(b, StepReport(0, 40)).iteration_time == pytest.approx(0.1)
    assert w.s.records[b].timed_workers == 2


def test_a_runs_start_up_is_measured_as_its_restart_cost(tmp_path):
    """Muri's finish hold weighs a job's time left against what a restart costs it: live, the
    start-up measured from its run's launch to its first step report."""
    w = World(tmp_path, policy="srtf", nodes=1, slots=1)
    a = w.submit(1)
    w.s.tick()
    w.run_all(train=False)
    w.clock.advance(3.5)
    w.c.step(a, StepReport(0, 1))
    assert w.s.table.get(a).restart_cost == pytest.approx(3.5)
    w.clock.advance(10)
    w.c.step(a, StepReport(0, 2))  # later steps are not start-up
    assert w.s.table.get(a).restart_cost == pytest.approx(3.5)
    w.s.tick()
    assert w.s.sched.last_snapshot.job(a).restart_cost == pytest.approx(3.5)


def test_progress_is_carried_past_the_last_step_report_at_the_measured_pace(tmp_path):
    """Workers report steps every so often; between reports a policy sees the run's progress
    carried on at its measured pace (capped, so a run that stalls is not taken for finishing)."""
    w = World(tmp_path, policy="srtf", nodes=1, slots=1)
    a = w.submit(1, steps=1000)
    w.s.tick()
    w.run_all(train=False)
    w.c.step(a, StepReport(0, 10))
    w.clock.advance(10)
    w.c.step(a, StepReport(0, 20))  # 1 s per step
    w.clock.advance(5)
    w.s.tick()
    assert w.s.sched.last_snapshot.job(a).remaining_iterations == pytest.approx(1000 - 20 - 5)
    for _ in range(100):  # no report for 1005 s (the node stays in touch): carried for at most 30 s
        w.clock.advance(10)
        w.poll("n1")
    w.s.tick()
    assert w.status(a) == "running"
    assert w.s.sched.last_snapshot.job(a).remaining_iterations == pytest.approx(1000 - 20 - 30)
    w.c.step(a, StepReport(0, 25))  # a report is the truth, even behind the estimate
    assert w.s.table.get(a).remaining_iterations == pytest.approx(1000 - 25)


def test_two_step_reports_at_one_instant_are_no_sample(tmp_path):
    """A step time of 0 s (two reports at the same clock reading) is not a measurement: it once
    made the iteration time 0 and the next decision divide by it."""
    w = World(tmp_path, policy="srtf", nodes=1, slots=1)
    a = w.submit(1)
    w.s.tick()
    w.run_all()
    w.c.step(a, StepReport(0, 1))
    w.c.step(a, StepReport(0, 2))
    assert w.s.job(a).iteration_time is None
    w.s.tick()
    w.clock.advance(2)
    assert w.c.step(a, StepReport(0, 4)).iteration_time == pytest.approx(1.0)


def _profile(load, pre, compute, sync):
    from elastictrain.wire import ProfileReport, StageProfile

    stages = {"load": load, "preprocess": pre, "compute": compute, "sync": sync}
    return ProfileReport(StageProfile(0, 20, 5, sum(stages.values()), stages))


def test_muri_groups_become_one_group_task_whose_members_end_on_their_own(tmp_path):
    from elastictrain.wire import MemberResult

    w = World(tmp_path, policy="muri-s", nodes=1, slots=1)
    a, b = w.submit(1, steps=1000), w.submit(1, steps=1000)
    w.s.tick()
    assert w.run_all() == {"n1": [(a, 1, (0,))]}
    (task,) = w.poll("n1").tasks
    assert task.env["ET_PROFILE_STEPS"] == "20" and not task.group  # profiled at its first start
    w.c.put_profile(a, _profile(0.06, 0.0, 0.008, 0.0))  # I/O-bound
    w.c.put_profile(b, _profile(0.004, 0.0, 0.06, 0.0))  # compute-bound: interleaves with a
    w.s.tick()
    assert w.s.job(a).stopping is False and w.s.job(a).info["group"] == f"{b}+{a}" or \
        w.s.job(a).info["group"] == f"{a}+{b}"
    assert w.run_all() == {"n1": []}  # the group task waits for a's own run to checkpoint and exit
    w.exit(a, 75)
    w.s.tick()
    (gt,) = w.poll("n1").tasks
    assert gt.job.startswith("g.") and {m.job for m in gt.group} == {a, b} and gt.command == []
    assert {m.reason for m in gt.group} == {"regroup", "start"} and "ET_PROFILE_STEPS" not in gt.env
    w.run_all()
    predicted = float(w.s.job(a).info["group_predicted"])
    assert 0.06 <= predicted <= 0.07  # eq. 3: the two overlap almost fully
    # b finishes inside the group: it ends at once; a trains on in the group task
    w.s.member_result(b, MemberResult(w.s.job(b).run, "finished"))
    assert w.status(b) == "finished" and w.status(a) == "running"
    assert [t.job for t in w.poll("n1").tasks] == [gt.job]
    # a stale or foreign result changes nothing
    w.s.member_result(b, MemberResult(1, "failed", "late"))
    assert w.status(b) == "finished"
    # a runs on alone in the group task: nothing restarts
    w.s.tick()
    assert [t.job for t in w.poll("n1").tasks] == [gt.job] and w.s.job(a).run == 2
    # a third job comes, is profiled, and is grouped with a: the old group task is withdrawn and
    # the new one waits for it to exit, across a coordinator restart
    c = w.submit(1, steps=1000)
    w.c.put_profile(c, _profile(0.004, 0.0, 0.06, 0.0))
    w.s.tick()
    assert w.poll("n1").tasks == []
    w.restart()
    w.register("n1", w.inst["n1"])
    w.s.tick()
    assert w.poll("n1").tasks == []
    w.exit(gt.job, 75)
    w.s.tick()
    (gt2,) = w.poll("n1").tasks
    assert {m.job for m in gt2.group} == {a, c} and gt2.job != gt.job


def test_a_member_that_fails_in_its_group_is_restarted_then_fails_with_the_reason(tmp_path):
    from elastictrain.wire import MemberResult

    w = World(tmp_path, policy="muri-s", nodes=1, slots=1)
    a, b = w.submit(1, steps=1000, max_restarts=1), w.submit(1, steps=1000)
    w.c.put_profile(a, _profile(0.06, 0.0, 0.008, 0.0))
    w.c.put_profile(b, _profile(0.004, 0.0, 0.06, 0.0))
    w.s.tick()
    (gt,) = w.poll("n1").tasks
    assert gt.group and not any(t.group for t in [])  # formed at once: both were profiled
    w.run_all()
    w.s.member_result(a, MemberResult(w.s.job(a).run, "failed", "RuntimeError: boom"))
    assert w.status(a) == "running" and w.s.job(a).stopping and w.s.job(b).stopping  # the group checkpoints
    kinds = [e.kind for e in w.s.event_list(0, a).events]
    assert "member_failed" in kinds
    w.exit(gt.job, 75)
    assert w.status(a) == "preempted" and w.status(b) == "preempted"
    w.s.tick()
    (gt2,) = w.poll("n1").tasks
    assert gt2.job != gt.job and {m.reason for m in gt2.group} == {"failure", "regroup"}
    w.run_all()
    w.s.member_result(a, MemberResult(w.s.job(a).run, "failed", "RuntimeError: boom again"))
    assert w.status(a) == "failed" and "boom again" in w.s.job(a).reason
    assert w.status(b) == "running" and [t.job for t in w.poll("n1").tasks] == [gt2.job]  # b goes on


def test_a_stage_profile_given_at_submission_is_checked_and_used_until_one_is_measured(tmp_path):
    import msgspec

    from elastictrain.wire import MemberResult

    w = World(tmp_path, policy="muri-s", nodes=1, slots=1)
    with pytest.raises(ConfigError, match="unknown stages"):
        w.submit(1, steps=10, stage_times={"disk": 0.1})
    with pytest.raises(ConfigError, match="above 0"):
        w.submit(1, steps=10, stage_times={"load": 0.0})
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"run": 1, "status": "exploded"}', type=MemberResult)
    a = w.submit(1, steps=10, stage_times={"load": 0.05, "compute": 0.01})
    info = w.s.job(a)
    assert info.stage_times == [0.05, 0.0, 0.01, 0.0] and info.iteration_time is None
    w.s.tick()
    (task,) = w.poll("n1").tasks
    assert "ET_PROFILE_STEPS" not in task.env  # nothing to profile: it was given
    w.c.put_profile(a, _profile(0.02, 0.0, 0.02, 0.0))  # measured: it replaces the given one
    assert w.s.job(a).stage_times == [0.02, 0.0, 0.02, 0.0]


def test_a_waiting_job_says_why_it_waits(tmp_path):
    # the reason column was empty ("-") for every waiting job (issue 32.6 and 32.8)
    w = World(tmp_path, policy="fifo", nodes=0, slots=2)
    a = w.submit(1)
    w.s.tick()
    assert "no node is up to run it: start `elastictrain node`" in w.s.job(a).reason
    w.register("n1", "i1")
    w.register("n2", "i2")
    w.s.tick()
    w.run_all()
    b = w.submit(1)
    w.s.tick()
    w.run_all()
    assert w.status(a) == w.status(b) == "running" and w.s.job(a).reason == ""
    c = w.submit(2)  # one slot free on each node
    w.s.tick()
    assert w.s.job(c).reason == "2 of 4 slots are free, but no node has 2 free together (at most 1); it waits " \
                                "for a node to free up"
    d = w.submit(3)
    w.s.tick()
    assert w.s.job(d).reason == "waiting for 3 slots: 2 of 4 free; policy fifo runs other jobs first"
    w.s.node_leave("n2", NodeLeave("i2"))
    w.s.tick()
    assert w.s.job(d).reason.startswith("needs 3 slots; the nodes up offer 2 in all: add nodes")
    assert {j.id: j.reason for j in w.s.jobs().jobs}[c].startswith("waiting for 2 slots")  # the list the CLI reads


def test_repeated_identical_deferred_and_plan_events_fold_into_one_with_a_count(tmp_path):
    # every tick wrote one more identical row (issue 32.6)
    w = World(tmp_path, nodes=1, slots=2)
    ev = w.c.cluster.events
    for t in range(4):
        ev.emit(1000.0 + t, "deferred", "7", "", why="held")
        if t == 1:
            w.s._flush()  # a fold reaches a row already written as well as one still pending
    ev.emit(1005.0, "plan", "7", "", decision="grow")
    ev.emit(1006.0, "deferred", "7", "", why="held")  # another event came between: a row of its own
    ev.emit(1007.0, "deferred", "8", "", why="held")  # another job: its own row
    w.s._flush()
    rows = [(e.kind, e.job, e.detail) for e in w.s.event_list(0, None).events if e.job in ("7", "8")]
    assert rows == [("deferred", "7", {"why": "held", "count": 4, "last": 1003.0}),
                    ("plan", "7", {"decision": "grow"}), ("deferred", "7", {"why": "held"}),
                    ("deferred", "8", {"why": "held"})]


def test_a_live_job_gains_service_and_can_be_preempted_only_once_it_trains(tmp_path):
    # its start-up counted as service (a start slower than the first queue demoted a job that had
    # not trained) and a decision could preempt it before its first step (issue 32.5)
    w = World(tmp_path, nodes=1, slots=2, thresholds=(10.0,))
    a = w.submit(2)
    w.s.tick()
    w.run_all(train=False)
    w.clock.advance(30)  # a slow start: 60 GPU-seconds of holding, none of training
    b = w.submit(2)
    w.s.tick()
    assert w.s.job(a).attained_gpu == 0.0 and w.status(a) == "running" and not w.s.job(a).stopping
    assert w.status(b) != "running"
    w.c.step(a, StepReport(0, 1))  # its first step
    w.clock.advance(6)  # 12 GPU-seconds of training: past the 10 GPU-s queue, b (0) goes first
    w.s.tick()
    assert w.s.job(a).attained_gpu == pytest.approx(12.0) and w.s.job(a).stopping

    w = World(tmp_path / "srtf", policy="srtf", nodes=1, slots=2)
    long = w.submit(2, steps=1000)
    w.s.tick()
    w.run_all(train=False)
    short = w.submit(2, steps=10)
    w.s.tick()  # SRTF would preempt the long job for the short one: not before the long one trains
    assert w.status(long) == "running" and not w.s.job(long).stopping
    why = "placed; waiting until job 1 has trained its first step (a job is not preempted before it trains)"
    assert w.s.job(short).reason == why
    assert ("deferred", "its GPUs go to it once job 1 has trained its first step (a job is not preempted before "
                        "it trains)") in [(e.kind, e.detail.get("why", "")) for e in w.s.event_list(0, short).events]
    w.c.step(long, StepReport(0, 1))
    w.s.tick()
    assert w.s.job(long).stopping  # it trained: now the decision stands


def _placed(w, job):
    return sorted(n.name for n in w.s.nodes.by_index for t in n.tasks if t.job == job and t.wanted)


def _one_job_on_n1(tmp_path):
    """Two nodes of 2 slots (FIFO; a long node timeout: the clock jumps) and a 2-slot job running on n1."""
    w = World(tmp_path, policy="fifo", nodes=2, slots=2, node_timeout=600.0)
    a = w.submit(2)
    w.s.tick()
    w.run_all()
    assert _placed(w, a) == ["n1"]
    return w, a


def test_a_cordoned_node_keeps_its_job_takes_nothing_new_and_the_cordon_survives_a_restart(tmp_path):
    w, a = _one_job_on_n1(tmp_path)
    info = w.s.cordon("n1", NodeCordon(60.0, "fan failure"))
    assert info.cordoned_until == 1060.0 and info.cordon_why == "fan failure"
    b, c = w.submit(2), w.submit(1)
    w.s.tick()
    w.run_all()
    assert w.status(a) == "running" and _placed(w, b) == ["n2"]  # a keeps running on n1
    assert w.status(c) == "queued"  # n1 offers only the GPUs its job holds
    w.restart()  # the cordon is the node's durable state
    w.exit(a, 0)
    w.s.tick()
    assert w.status(a) == "finished" and w.status(c) == "queued" and w.s.nodes.capacities() == (0, 2)
    why = w.s.job(c).reason
    assert "waiting for 1 slots: 0 of 4 free (cordoned, taking nothing new: n1;" in why, why
    w.clock.advance(61)  # the cordon is over
    w.s.tick()
    assert _placed(w, c) == ["n1"] and not w.s.nodes.nodes["n1"].cordoned_until
    kinds = [(e.kind, e.node) for e in w.s.events.list(0).events if e.kind.startswith("node_")]
    assert ("node_cordoned", "n1") in kinds and ("node_uncordoned", "n1") in kinds
    assert w.s.cordon("n2", NodeCordon(0.0)).cordoned_until == 0.0  # not cordoned: nothing to lift
    with pytest.raises(NotFoundError):
        w.s.cordon("n9", NodeCordon(5.0))


def test_a_stragglers_node_is_cordoned_and_its_job_placed_again_without_it(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=3, slots=1, node_timeout=600.0)
    a = w.submit(2)
    w.s.tick()
    w.run_all()
    assert _placed(w, a) == ["n1", "n2"]
    join = w.c.rendezvous.join(a, AgentJoin("agent-n1", "h", 1, 1234, min_nodes=2, max_nodes=2, run=1, node="n1"))
    assert w.c.rendezvous.node_of(a, "agent-n1") == "n1" and join.action == "wait"
    assert w.s.replace_node(a, "", 60.0, "slow").startswith("kept: its etrun agent did not say")
    assert w.s.replace_node("no-such-job", "n1", 60.0, "slow") is None  # not a scheduled job: etrun's own path
    done = w.s.replace_node(a, "n1", 60.0, "rank 0 does its work 3.00x slower")
    assert done == "node n1 cordoned for 60 s; the job is requeued to run without it", done
    assert w.s.job(a).stopping
    w.exit(a, 75)
    w.s.tick()
    w.run_all()
    assert _placed(w, a) == ["n2", "n3"] and w.s.job(a).runs_by_reason == {"straggler": 1}
    # flagged again on n2 soon after: no third node to move to, so it is kept where it is
    assert w.s.replace_node(a, "n2", 60.0, "slow").startswith("kept: the other nodes have 1 free GPU(s) for its 2")
    # n1's cordon ends; a new straggle there within the hour doubles its length
    w.clock.advance(61)
    w.s.tick()
    assert not w.s.nodes.nodes["n1"].cordoned_until
    b = w.submit(1)
    w.s.tick()
    w.run_all()
    assert _placed(w, b) == ["n1"]
    assert w.s.replace_node(b, "n1", 60.0, "slow").startswith("kept: the other nodes have 0 free GPU(s)")
    w.exit(a, 0)
    assert w.s.replace_node(b, "n1", 60.0, "slow") == "node n1 cordoned for 120 s; the job is requeued to run " \
        "without it"


def test_an_engines_drain_is_a_cordon_that_only_the_engine_lifts(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=2, slots=2)
    w.s.engine_cordon("n1", True, "slurm says the node is draining")
    n1 = w.s.nodes.nodes["n1"]
    assert n1.cordoned_until and n1.cordon_by == "engine" and w.s.nodes.capacities() == (0, 2)
    w.s.engine_cordon("n1", True, "slurm says the node is drained")  # still drained: nothing new
    w.s.engine_cordon("n1", False, "slurm lifted it")
    assert not n1.cordoned_until and w.s.nodes.capacities() == (2, 2)
    w.s.cordon("n2", NodeCordon(600.0, "bad fan"))  # an administrator's own cordon here ...
    w.s.engine_cordon("n2", False, "slurm lifted it")  # ... is not the engine's to lift
    assert w.s.nodes.nodes["n2"].cordon_by == "admin" and w.s.nodes.capacities() == (2, 0)
    w.s.engine_cordon("n9", True, "unknown node")  # (a node the engine has not registered: nothing)
    # a run on a node the engine drains before it trains (Slurm would never start it) is placed again
    w.s.cordon("n2", NodeCordon(0.0))
    a, b = w.submit(2), w.submit(2)
    w.s.tick()
    w.run_all(train=False)
    w.c.step(a, StepReport(0, 1))  # a trains, b has not yet
    w.s.engine_cordon("n2", True, "slurm says the node is draining")
    w.s.engine_cordon("n1", True, "slurm says the node is draining")
    assert w.status(a) == "running" and not w.s.job(a).stopping  # it trains: it runs on
    assert w.s.job(b).stopping and w.s.records[b].resume_reason == "requeue"
    kinds = [(e.kind, e.node, e.detail.get("by")) for e in w.s.events.list(0).events if "cordon" in e.kind]
    assert kinds[:3] == [("node_cordoned", "n1", "engine"), ("node_uncordoned", "n1", None),
                         ("node_cordoned", "n2", "admin")], kinds


def test_a_drain_cordons_the_node_and_requeues_its_jobs_which_resume_elsewhere(tmp_path):
    w, a = _one_job_on_n1(tmp_path)
    with pytest.raises(ConfigError, match="seconds > 0"):
        w.s.cordon("n1", NodeCordon(0.0, drain=True))
    info = w.s.cordon("n1", NodeCordon(3600.0, "firmware update", drain=True))
    assert info.cordoned_until and info.jobs == [] and w.s.job(a).stopping  # its job checkpoints and goes
    w.exit(a, 75)
    w.s.tick()
    w.run_all()
    assert _placed(w, a) == ["n2"] and w.s.job(a).runs_by_reason == {"requeue": 1}
    ev = [e.detail for e in w.s.events.list(0).events if e.kind == "requeue" and e.job == a]
    assert ev and "node n1 was drained (firmware update)" in ev[0]["why"], ev


def test_a_planned_maintenance_drains_the_node_when_it_begins_and_survives_a_restart(tmp_path):
    w, a = _one_job_on_n1(tmp_path)  # (fifo: it does not plan ahead, so a stays on n1 until the window)
    with pytest.raises(ConfigError, match="needs its length"):
        w.s.cordon("n1", NodeCordon(0.0, at=w.clock.now() + 100))
    info = w.s.cordon("n1", NodeCordon(600.0, "firmware", drain=True, at=w.clock.now() + 100))
    assert info.maint_start == 1100.0 and info.maint_end == 1700.0 and info.maint_drain and not info.cordoned_until
    assert w.s.nodes.windows() == ((0, 1100.0, 1700.0),) and w.s.backend.shape().windows == ((0, 1100.0, 1700.0),)
    assert w.s.nodes.next_maintenance() == 1100.0
    w.restart()  # the plan is the node's durable state
    w.clock.advance(99)
    w.s.tick()
    assert w.status(a) == "running" and not w.s.job(a).stopping
    w.clock.advance(1)  # it begins: cordoned to its end, and its job requeued
    w.s.tick()
    n1 = w.s.nodes.nodes["n1"]
    assert n1.cordoned_until == 1700.0 and n1.cordon_why == "maintenance: firmware" and not n1.maint_start
    assert w.s.job(a).stopping
    w.exit(a, 75)
    w.s.tick()
    w.run_all()
    assert _placed(w, a) == ["n2"]
    # planned again, then cancelled by an uncordon (which also lifts the cordon)
    w.s.cordon("n2", NodeCordon(60.0, at=w.clock.now() + 10))
    w.s.cordon("n2", NodeCordon(0.0))
    assert not w.s.nodes.nodes["n2"].maint_start and w.s.nodes.windows() == ()
    kinds = [e.kind for e in w.s.events.list(0).events if "maintenance" in e.kind]
    assert kinds == ["node_maintenance_planned", "node_maintenance_planned", "node_maintenance_cancelled"], kinds


class _Scripted:
    """A policy whose decision the test writes (``plan(snapshot) -> {job: placement}``)."""

    name = "test-scripted"
    plan = None

    def decide(self, s):
        from elastictrain.policies.api import Decision

        return Decision(_Scripted.plan(s))


def test_a_decision_cannot_hand_a_cordoned_nodes_gpus_to_a_new_job(tmp_path):
    """A decision may move a job off a cordoned node and, in the same decision, give the GPUs it
    leaves to another job (the node offers them for its placed task): that start is refused."""
    from elastictrain.policies.api import register

    register("test-scripted", _Scripted, (), replace=True)
    w = World(tmp_path, policy="test-scripted", nodes=2, slots=2, node_timeout=600.0)
    _Scripted.plan = lambda s: {j.job_id: ((0, 2),) for j in s.jobs[:1]}
    a = w.submit(2)
    w.s.tick()
    w.run_all()
    assert _placed(w, a) == ["n1"]
    w.s.cordon("n1", NodeCordon(600.0, "fan failure"))
    b = w.submit(2)
    _Scripted.plan = lambda s: {a: ((1, 2),), b: ((0, 2),)}  # a to n2, b onto n1's GPUs
    w.s.tick()
    assert _placed(w, a) == ["n2"] and _placed(w, b) == [] and w.status(b) == "queued"
    assert "node n1 is cordoned (fan failure) and takes no new job" in w.s.job(b).reason
    assert any(e.kind == "deferred" and e.job == b and "cordoned" in e.detail["why"] for e in w.s.events.list(0).events)
    _Scripted.plan = lambda s: {a: ((1, 2),), b: ((0, 2),)} if s.gpus_per_node[0] else {a: ((1, 2),)}
    w.s.tick()  # n1 offers nothing now (a's task there is no longer wanted): b waits
    assert w.s.nodes.capacities()[0] == 0 and _placed(w, b) == [] and w.status(b) == "queued"
    c = w.submit(2)
    _Scripted.plan = lambda s: {a: ((0, 2),), c: ((1, 2),)} if s.gpus_per_node[0] else {a: ((1, 2),)}
    w.s.cordon("n1", NodeCordon(0.0))  # lifted: a move back and a start are made
    w.s.tick()
    assert _placed(w, a) == ["n1"] and _placed(w, c) == ["n2"]


@pytest.mark.parametrize("policy", ["fifo", "srtf", "srsf", "tiresias-l", "tiresias-g", "gandiva-ts", "gandiva-fair",
                                    "muri-s", "muri-l"])
def test_a_coordinator_restart_changes_no_decision(tmp_path, policy):
    """Two coordinators on the same jobs and clock, one killed and restarted midway: their next
    decisions are the same (nothing is stopped or started because of the restart)."""
    def world(name):
        (tmp_path / name).mkdir()
        opts = {"quantum": 100.0} if policy.startswith("gandiva") else \
            {"distribution": str(ROOT / "traces" / "tiresias" / "yarn-gput1000.csv")} if policy == "tiresias-g" else {}
        w = World(tmp_path / name, policy=policy, nodes=1, slots=2, node_timeout=1000.0, **opts)
        jobs = [w.submit(1, steps=1000 + 500 * i) for i in range(4)]
        for step in range(3):
            w.s.tick()
            w.run_all()
            for j in jobs:
                if w.s.job(j).stopping:
                    w.exit(j, 75)
            w.clock.advance(30)
        return w, jobs

    def state(w, jobs):
        return [(w.status(j), w.s.job(j).stopping, tuple((p.node, p.slots) for p in w.s.job(j).placement))
                for j in jobs]

    (kept, jobs), (restarted, _) = world("kept"), world("restarted")
    assert state(kept, jobs) == state(restarted, jobs)
    restarted.s._flush(everything=True)
    restarted.restart()
    for w in (kept, restarted):
        w.s.tick()
    assert state(kept, jobs) == state(restarted, jobs)


def test_the_policys_memory_is_exported_once_per_decision_not_at_every_step_report(tmp_path):
    """A flush writes the policy's memory only if the policy decided since (Muri's is 63 kB and
    1.75 ms to export and encode with 1,000 jobs; a step report flushes too)."""
    w = World(tmp_path, policy="gandiva-fair", nodes=1, slots=2)
    a = w.submit(1, steps=1000)
    w.s.tick()
    w.run_all()
    calls = []
    real = w.s.policy.export_state
    w.s.policy.export_state = lambda: calls.append(1) or real()
    for step in range(1, 6):
        w.c.step(a, StepReport(0, step))
    assert calls == []
    w.s.tick()
    w.c.step(a, StepReport(0, 6))
    assert len(calls) == 1
    w.s._flush(everything=True)  # (a full flush exports it regardless)
    assert len(calls) == 2


def test_under_backfill_an_elastic_job_starts_on_the_gpus_free_now(tmp_path):
    # 4 slots, 2 held: an elastic job of 1..4 workers starts on the 2 free ones (Slurm's --nodes=MIN-MAX)
    w = World(tmp_path, policy="backfill", nodes=1, slots=4)
    a = w.submit(2, steps=1000)
    w.s.tick()
    w.run_all()
    b = w.submit(4, min_gpus=1, steps=100)
    w.s.tick()
    placed = w.run_all()
    assert [(job, len(gpus)) for job, _, gpus in placed["n1"] if job == b] == [(b, 2)], placed
    assert w.status(a) == w.status(b) == "running" and w.s.table.get(b).num_gpu == 2


def test_a_restart_makes_the_group_task_of_members_that_all_started_before_it(tmp_path):
    """LiveBackend.recover: every member of a group had started its run (each ``forming``) when
    the coordinator stopped, before the group task was made: the restart makes it."""
    from elastictrain.coordinator.live import FORMING

    w = World(tmp_path, policy="muri-s", nodes=1, slots=1)
    a, b = w.submit(1, steps=1000), w.submit(1, steps=1000)
    w.c.put_profile(a, _profile(0.06, 0.0, 0.008, 0.0))
    w.c.put_profile(b, _profile(0.004, 0.0, 0.06, 0.0))
    w.s.tick()
    (gt,) = w.poll("n1").tasks
    node = w.s.nodes.by_index[0]
    node.tasks = [t for t in node.tasks if t.job != gt.job]  # (as if the coordinator stopped just before it)
    for j in (a, b):
        w.s.records[j].grun = FORMING
    w.s.backend.recover()
    (made,) = [t for t in node.tasks if t.members]
    assert sorted(made.members) == sorted([a, b]) and {w.s.records[j].grun for j in (a, b)} == {made.job}
