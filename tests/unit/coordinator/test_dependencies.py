"""Slurm's habits in cluster mode: ``--after`` (--dependency=afterok/afterany), ``--hold`` and
``hold``/``release``, in process on a manual clock with the real SQLite store."""

import pytest

from elastictrain.coordinator.records import Cold
from elastictrain.errors import ConfigError, ConflictError
from elastictrain.wire import AgentJoin, JobSubmit

from .test_cluster_scheduler import World


def _submit(w, gpus=1, **kw):
    return w.s.submit(JobSubmit(["train.py"], str(w.tmp), gpus=gpus, **kw)).id


def _kinds(w, job):
    return [e.kind for e in w.s.events.list(0).events if e.job == job]


def test_a_pipeline_runs_in_order_and_a_failed_step_cancels_what_depends_on_it(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=1, slots=4)
    prep = _submit(w)
    train = _submit(w, after=[prep])
    evaluate = _submit(w, after=[f"{train}:any"])
    report = _submit(w, after=[train])
    w.s.tick()
    w.run_all()
    assert w.status(prep) == "running" and {w.status(j) for j in (train, evaluate, report)} == {"queued"}
    assert w.s.job(train).reason == f"waiting for job {prep} to finish (--after)"
    assert w.s.job(evaluate).reason == f"waiting for job {train} to end (--after)"
    assert train not in w.s.table  # no policy sees it before it may run
    w.exit(prep, 0)
    w.s.tick()
    w.run_all()
    assert w.status(train) == "running" and w.status(evaluate) == "queued"
    w.c.rendezvous.join(train, AgentJoin("ag", "h", 1, 1, max_restarts=0, run=1))
    w.exit(train, 1)  # train fails: evaluate (any end) runs, report (needs a finish) never can
    assert w.status(train) == "failed"
    w.s.tick()
    assert w.status(evaluate) == "running"
    assert w.status(report) == "cancelled"
    why = w.s.job(report).reason
    assert f"job {train}, which it runs after (--after {train}), failed, so it never can" in why, why
    assert "cancel" in _kinds(w, report) and "admitted" in _kinds(w, evaluate)


def test_dependencies_are_checked_at_submission(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=1, slots=2)
    a = _submit(w)
    with pytest.raises(ConfigError, match="no scheduled job '99'"):
        _submit(w, after=["99"])
    with pytest.raises(ConfigError, match="write JOB .*, JOB:any .* or JOB:notok"):
        _submit(w, after=[f"{a}:ok-ish"])
    with pytest.raises(ConfigError, match="job name '../x' is invalid"):
        _submit(w, after=["../x"])
    w.s.records.keep = 0  # (every ended record packed once written: records.py)
    w.s.cancel(a)
    assert type(w.s.records.kept(a)) is Cold
    with pytest.raises(ConfigError, match=f"job {a} already cancelled, so it will never finish; use {a}:any"):
        _submit(w, after=[a])
    assert type(w.s.records.kept(a)) is Cold  # (its state read as packed, not unpacked)
    b = _submit(w, after=[f"{a}:any", f"{a}:any"])  # an ended job satisfies :any at once
    assert type(w.s.records.kept(a)) is Cold
    w.s.tick()
    assert w.status(b) == "running" and w.s.records[b].after == [f"{a}:any"]


def test_hold_and_release_and_a_restart_in_between(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=1, slots=2)
    a = _submit(w, gpus=2)
    held = _submit(w, hold=True)
    w.s.tick()
    w.run_all()
    assert w.s.job(held).reason == f"on hold: `elastictrain release {held}` lets it run"
    b = _submit(w)  # admitted: waits in the queue for a's GPUs ...
    w.s.tick()
    assert b in w.s.table
    w.s.hold(b)  # ... and leaves it when held
    assert b not in w.s.table and w.s.job(b).status == "queued"
    with pytest.raises(ConflictError, match="is running; a hold applies to a waiting job"):
        w.s.hold(a)
    with pytest.raises(ConflictError, match="not on hold"):
        w.s.release(a)
    w.restart()
    assert {held, b} <= set(w.s.admission.waiting) and w.s.records[b].hold
    w.exit(a, 0)
    w.s.tick()
    assert w.status(held) == "queued" and w.status(b) == "queued"  # free GPUs, and still held
    w.s.release(b)
    w.s.tick()
    w.run_all()
    assert w.status(b) == "running" and w.status(held) == "queued"
    assert _kinds(w, b)[:4] == ["submit", "hold", "release", "admitted"], _kinds(w, b)


def test_a_time_limit_counts_only_the_time_the_job_holds_gpus_then_it_fails_as_timeout(tmp_path):
    w = World(tmp_path, nodes=1, slots=2, thresholds=(10.0,))  # tiresias-l: a long job is preempted
    a = _submit(w, gpus=2, time_limit=10.0)
    w.s.tick()
    w.run_all()
    w.clock.advance(6)  # a: 12 GPU-s, demoted; b preempts it
    b = _submit(w, gpus=2)
    w.s.tick()
    assert w.s.job(a).info["time_limit"] == "10 s (6 s used)"
    w.exit(a, 75)
    w.s.tick()
    w.run_all()
    w.clock.advance(100)  # a waits 100 s: not counted
    w.exit(b, 0)
    w.s.tick()
    w.run_all()
    w.clock.advance(3)
    w.s.tick()
    assert w.status(a) == "running" and w.s.job(a).info["time_limit"] == "10 s (9 s used)"
    w.clock.advance(2)
    w.s.tick()
    info = w.s.job(a)
    assert info.status == "failed"
    assert info.reason.startswith("TIMEOUT: it held its GPUs 11 s, its --time limit is 10 s")
    assert "timeout" in _kinds(w, a) and w.poll("n1").tasks == []  # its workers are told to stop (and save)


def test_without_steps_a_time_limit_is_the_work_an_srtf_policy_assumes(tmp_path):
    w = World(tmp_path, policy="srtf", nodes=1, slots=2)
    a = _submit(w, time_limit=600.0)
    w.s.tick()
    assumed = [e.detail["assumed"] for e in w.s.events.list(0).events if e.kind == "assumed" and e.job == a
               and e.detail["input"] == "remaining"]
    assert assumed == ["the rest of its --time limit as its work left (no --steps or --epochs)"], assumed
    assert w.s.table.get(a).remaining_iterations == pytest.approx(600.0)


def test_after_notok_runs_a_cleanup_only_when_its_job_fails(tmp_path):
    """Slurm's afternotok: the job runs once JOB failed or was cancelled; if JOB finished, it never
    can, so it is cancelled saying why."""
    w = World(tmp_path, policy="fifo", nodes=1, slots=4)
    bad, good = _submit(w), _submit(w)
    on_bad, on_good = _submit(w, after=[f"{bad}:notok"]), _submit(w, after=[f"{good}:notok"])
    w.s.tick()
    w.run_all()
    assert w.s.job(on_bad).reason == f"waiting for job {bad} to fail (--after)"
    w.exit(bad, 1)
    w.exit(good, 0)
    w.s.tick()
    w.run_all()
    assert w.status(on_bad) == "running" and w.status(on_good) == "cancelled"
    assert w.s.job(on_good).reason.startswith(f"job {good}, which it runs after (--after {good}:notok), finished, "
                                              "so it never can")
    with pytest.raises(ConfigError, match=f"job {good} already finished, so it will never fail"):
        _submit(w, after=[f"{good}:notok"])
    assert _submit(w, after=[f"{bad}:notok"]) in w.s.records  # failed already: it may run at once
    with pytest.raises(ConfigError, match="JOB:notok"):
        _submit(w, after=[f"{bad}:maybe"])


def test_begin_keeps_a_job_out_until_its_time_and_survives_a_restart(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=1, slots=2, node_timeout=1000.0)
    t0 = w.clock.now()
    later = _submit(w, begin=t0 + 100.0)
    past = _submit(w, begin=t0 - 5.0)  # a time already past: at once
    w.s.tick()
    w.run_all()
    assert w.status(past) == "running" and w.status(later) == "queued" and later not in w.s.table
    assert w.s.job(later).reason.startswith("waiting for its begin time (--begin): ")
    assert w.s.job(later).reason.endswith(", in 100 s")
    submitted = next(e for e in w.s.events.list(0).events if e.kind == "submit" and e.job == later)
    assert submitted.detail["begin"] == t0 + 100.0
    w.s._flush(everything=True)
    w.restart()
    w.clock.advance(99)
    w.s.tick()
    assert later not in w.s.table
    w.clock.advance(1)
    w.s.tick()
    w.run_all()
    assert w.status(later) == "running" and "admitted" in _kinds(w, later)
    with pytest.raises(ConfigError, match="at most 366 days ahead"):
        _submit(w, begin=w.clock.now() + 400 * 86_400.0)


def test_update_begin_moves_a_waiting_jobs_start_and_refuses_a_running_one(tmp_path):
    """scontrol update StartTime=: later takes an admitted waiting job out of the policy's view
    until then; now (or a time passed) lets it in at once; a running job gets a 409."""
    from elastictrain.errors import BadRequestError
    from elastictrain.wire import JobUpdate

    w = World(tmp_path, policy="fifo", nodes=1, slots=1, node_timeout=1000.0)
    t0 = w.clock.now()
    first = _submit(w)
    second = _submit(w)  # admitted, waiting for the slot
    late = _submit(w, begin=t0 + 500.0)
    w.s.tick()
    w.run_all()
    assert w.status(first) == "running" and second in w.s.table and late not in w.s.table
    with pytest.raises(ConflictError, match="a begin time applies to a waiting job"):
        w.s.update(first, JobUpdate(begin=t0 + 60.0))
    info = w.s.update(second, JobUpdate(begin=t0 + 60.0))
    assert second not in w.s.table and info.info["begin"] and "begin time" in info.reason
    assert w.s.update(late, JobUpdate(begin=0.0)).status == "queued" and late in w.s.table  # now: admitted
    changed = [e.detail for e in w.s.events.list(0).events if e.kind == "update" and e.job == second]
    assert changed and changed[-1]["begin"].startswith("now -> ")
    w.exit(first, 0)
    w.s.tick()
    w.run_all()
    assert w.status(late) == "running" and w.status(second) == "queued"  # late overtook it
    w.s._flush(everything=True)
    w.restart()
    w.clock.advance(60)
    w.s.tick()
    assert second in w.s.table and "admitted" in _kinds(w, second)
    with pytest.raises(BadRequestError, match="at most 366 days ahead"):
        w.s.update(second, JobUpdate(begin=w.clock.now() + 400 * 86_400.0))


def test_begin_times_as_slurm_writes_them():
    import argparse
    import time

    from elastictrain.cluster_cli import begin_time

    now = time.mktime((2026, 11, 27, 15, 30, 0, 0, 0, -1))  # 15:30 local
    assert begin_time("now+90m", now) == now + 5400 and begin_time("now+2h", now) == now + 7200
    assert begin_time("now+1d", now) == now + 86_400 and begin_time("now+30", now) == now + 30
    assert begin_time("now", now) == now and begin_time(" NOW ", now) == now
    assert begin_time("16:00", now) == now + 1800  # later today
    assert begin_time("15:00", now) == now + 86_400 - 1800  # passed: tomorrow
    assert begin_time("2026-11-28", now) == time.mktime((2026, 11, 28, 0, 0, 0, 0, 0, -1))
    assert begin_time("2026-11-28T08:00", now) == time.mktime((2026, 11, 28, 8, 0, 0, 0, 0, -1))
    for bad in ("tomorrow", "now+", "now+2w", "25:00", "2026-13-01"):
        with pytest.raises(argparse.ArgumentTypeError, match="--begin"):
            begin_time(bad, now)


def test_singleton_runs_one_job_of_a_name_and_user_at_a_time(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=1, slots=4)
    first = _submit(w, name="train", after=["singleton"])
    second = _submit(w, name="train", after=["singleton"])
    third = _submit(w, name="train", after=["singleton"])
    other = _submit(w, name="eval", after=["singleton"])  # another name: not held by them
    w.s.tick()
    w.run_all()
    assert [w.status(j) for j in (first, second, third, other)] == ["running", "queued", "queued", "running"]
    assert w.s.job(third).reason == (f"waiting for jobs {first}, {second} to end (--after; singleton: one job named "
                                     "train of user default at a time)")
    w.exit(first, 1)  # it failed: singleton waits for an end of any kind
    w.s.tick()
    w.run_all()
    assert [w.status(j) for j in (first, second, third)] == ["failed", "running", "queued"]
    w.s.cancel(second)
    w.s.tick()
    w.run_all()
    assert w.status(third) == "running"


def test_singleton_runs_an_arrays_tasks_one_at_a_time_and_after_earlier_jobs_of_its_name(tmp_path):
    """Slurm's singleton on an array: its tasks share the array's name, so they run one at a time,
    by index, after any earlier job of that name (and before a later one)."""
    w = World(tmp_path, policy="fifo", nodes=1, slots=4)
    before = _submit(w, name="sweep", after=["singleton"])
    sub = JobSubmit(["sweep.py"], str(tmp_path), name="sweep", array="0-2", after=["singleton"])
    tasks = [j.id for j in w.s.submit_array(sub).jobs]
    later = _submit(w, name="sweep", after=["singleton"])
    other = _submit(w, name="sweep_1", after=["singleton"])  # a job named like a task: another name
    w.s.tick()
    w.run_all()
    assert [w.status(j) for j in (before, *tasks, later, other)] == ["running"] + ["queued"] * 4 + ["running"]
    assert w.s.job(tasks[1]).reason == (f"waiting for jobs {before}, {tasks[0]} to end (--after; singleton: one job "
                                        "named sweep of user default at a time)")
    for done in (before, *tasks):
        w.exit(done, 0)
        w.s.tick()
        w.run_all()
        running = [j for j in (*tasks, later) if w.status(j) == "running"]
        assert len(running) <= 1, running
    assert w.status(later) == "running"


def test_requeue_stops_a_running_job_and_places_it_again_and_requeue_hold_frees_its_gpus(tmp_path):
    """scontrol requeue / requeuehold: the run checkpoints and exits as on a preemption; requeued,
    the policy places it again (its next run resumes, reason requeue); on hold it leaves the queue
    once stopped, so a waiting job takes its GPUs, across a restart too, until released."""
    from elastictrain.wire import JobRequeue

    w = World(tmp_path, policy="fifo", nodes=1, slots=1, node_timeout=1000.0)
    a, b = _submit(w), _submit(w)
    w.s.tick()
    w.run_all()
    assert w.status(a) == "running" and w.status(b) == "queued"
    with pytest.raises(ConflictError, match=f"job {b} is not running; a requeue stops a running job"):
        w.s.requeue(b, JobRequeue())
    assert w.s.requeue(a, JobRequeue()).stopping
    w.exit(a, 75)  # it checkpointed
    w.s.tick()
    w.run_all()
    assert w.status(a) == "running" and w.s.job(a).run == 2 and w.s.records[a].resume_reason == "requeue"
    w.s.requeue(a, JobRequeue(hold=True))
    w.s._flush(everything=True)
    w.restart()  # (the hold waits for the stop, across a restart)
    w.exit(a, 75)
    w.s.tick()
    w.run_all()
    assert w.status(b) == "running" and a not in w.s.table and "on hold" in w.s.job(a).reason
    assert [k for k in _kinds(w, a) if k in ("requeue", "hold")] == ["requeue", "requeue", "hold"]
    w.s.release(a)
    w.exit(b, 0)
    w.s.tick()
    w.run_all()
    assert w.status(a) == "running" and w.s.job(a).run == 3
    w.exit(a, 0)
    w.s.tick()
    with pytest.raises(ConflictError, match="already finished; nothing to requeue"):
        w.s.requeue(a, JobRequeue())


def test_update_gpus_resizes_a_waiting_job_within_the_nodes_and_quotas(tmp_path):
    """scontrol update NumNodes= on a pending job: it is admitted again at its new size (quotas
    count it anew) and starts at it; a running job, a size the nodes or the quota can never hold,
    and min_gpus alone are refused with the reason."""
    from elastictrain.errors import BadRequestError
    from elastictrain.wire import JobUpdate, UserQuota

    w = World(tmp_path, policy="fifo", nodes=1, slots=2)
    a, b = _submit(w, gpus=2), _submit(w, gpus=2)
    w.s.tick()
    w.run_all()
    assert w.status(a) == "running" and b in w.s.table
    with pytest.raises(ConflictError, match="a size applies to a waiting job"):
        w.s.update(a, JobUpdate(gpus=1))
    with pytest.raises(ConfigError, match="the cluster's nodes have 2 in all"):
        w.s.update(b, JobUpdate(gpus=3))
    with pytest.raises(BadRequestError, match="min_gpus alone"):
        w.s.update(b, JobUpdate(min_gpus=1))
    info = w.s.update(b, JobUpdate(gpus=2, min_gpus=1))  # elastic: 1 to 2 workers
    assert (info.min_gpus, info.gpus) == (1, 2) and w.s.table.get(b).min_gpu == 1
    changed = [e.detail for e in w.s.events.list(0).events if e.kind == "update" and e.job == b]
    assert changed[-1]["gpus"] == "2 -> 1:2"
    w.s.set_quota("default", UserQuota(gpus=2))  # a's 2 GPUs count against it
    with pytest.raises(ConfigError, match="asks for 3 GPUs .* user default's quota is 2: it could never be admitted"):
        w.s.update(b, JobUpdate(gpus=3, min_gpus=1))
    w.s.update(b, JobUpdate(gpus=1))  # admitted again at 1: it waits for the quota now, as a new job would
    assert b not in w.s.table and "waiting for user default's quota" in w.s.job(b).reason
    w.exit(a, 0)
    w.s.tick()
    out = w.run_all()
    assert out == {"n1": [(b, 1, (0,))]} or out == {"n1": [(b, 1, (1,))]}, out
