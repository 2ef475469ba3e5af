"""``elastictrain status --start`` (Slurm's ``squeue --start``): the coordinator simulates its own
policy from the cluster as it is, and says when each job is expected to start and end."""

import asyncio
import dataclasses

import pytest

from elastictrain.sim.forecast import ForecastJob, forecast, when
from elastictrain.policies import create
from elastictrain.wire import JobSubmit, StepReport

from .test_priority import TierWorld


def _steps(w, job, every, n):
    """``job`` reports ``n`` steps, one every ``every`` seconds (its step time is measured)."""
    for _ in range(n):
        w.clock.advance(every)
        w.c.step(job, StepReport(0, w.s.job(job).step + 1))


def test_fifo_a_waiting_job_starts_when_the_running_one_ends(tmp_path):
    w = TierWorld(tmp_path, preempt=False, policy="fifo", nodes=1, slots=2)
    a = w.submit(2, steps=100)
    w.s.tick()
    w.run_all()
    _steps(w, a, 2.0, 20)  # 2 s a step, 20 of its 100 done
    b = w.submit(2, steps=30)
    c = w.submit(1)  # no --steps: an hour of work is assumed, and said
    w.s.tick()
    f = asyncio.run(w.s.forecast())
    got = {j.id: j for j in f.jobs}
    assert f.complete and f.policy == "fifo" and 0 <= f.wall < 2.0
    assert got[a].start is None or got[a].status == "running"
    assert got[a].end - f.now == pytest.approx(80 * 2.0, abs=3.0)  # its 80 steps left at 2 s
    assert got[b].start == pytest.approx(got[a].end, abs=1e-6)  # fifo: b next, once a's GPUs are free
    assert got[b].end - got[b].start == pytest.approx(30 * 1.0, abs=1.0)  # not measured: 1 s a step, assumed
    assert got[b].assumed == ["1 s per step (not measured yet)"]
    assert got[c].start == pytest.approx(got[b].end, abs=1e-6) and got[c].end - got[c].start == pytest.approx(3600, 1)
    assert "3600 s of work left (no --steps or --epochs)" in got[c].assumed
    assert w.status(b) == "queued" and w.s.table.get(a).running  # the forecast changed nothing live
    assert asyncio.run(w.s.forecast()) is f  # asked again within 5 s: the same answer, not another simulation
    w.clock.advance(6)
    again = asyncio.run(w.s.forecast())
    assert again is not f and again.now == f.now + 6
    w.clock.advance(1)
    w.s.tick()  # a decision: the next request simulates again, whatever the time
    assert asyncio.run(w.s.forecast()) is not again


def test_a_slow_forecast_is_shared_for_30_s(tmp_path, monkeypatch):
    import elastictrain.coordinator.scheduler as scheduler

    monkeypatch.setattr(scheduler, "FORECAST_BUDGET", 0.0)  # (every forecast then took "half its budget")
    w = TierWorld(tmp_path, preempt=False, policy="fifo", nodes=1, slots=2)
    w.submit(2, steps=10)
    f = asyncio.run(w.s.forecast())
    w.clock.advance(20)
    w.s.tick()
    assert asyncio.run(w.s.forecast()) is f  # a decision since, and still the same answer
    w.clock.advance(11)
    assert asyncio.run(w.s.forecast()) is not f


def test_priority_tiers_and_a_held_job(tmp_path):
    w = TierWorld(tmp_path, policy="srtf", nodes=1, slots=2)
    low = w.submit(2, steps=1000)
    w.s.tick()
    w.run_all()
    _steps(w, low, 1.0, 5)
    held = w.s.submit(JobSubmit(["train.py"], str(tmp_path), gpus=1, steps=10, hold=True)).id
    high = w.submit(2, steps=50, priority=5)  # preempts low at the next decision
    f = asyncio.run(w.s.forecast())
    got = {j.id: j for j in f.jobs}
    assert got[high].start - f.now == pytest.approx(0.0, abs=1.0)
    assert got[low].end > got[high].end  # low resumes after high (and pays its restart)
    assert got[held].start is None and got[held].why.startswith("not admitted: on hold")


def test_a_minimum_run_counts_from_the_live_runs_start(tmp_path):
    w = TierWorld(tmp_path, policy="fifo", nodes=1, slots=2, min_run=100.0)
    low = w.submit(2, steps=1000)
    w.s.tick()
    w.run_all()
    _steps(w, low, 1.0, 40)  # its run is 40 s old
    high = w.submit(2, steps=10, priority=5)
    got = {j.id: j for j in asyncio.run(w.s.forecast()).jobs}
    assert got[high].start - w.clock.now() == pytest.approx(60.0, abs=1.0)  # when low's 100 s are up


def test_the_simulation_is_bounded_and_says_what_it_covers():
    jobs = [ForecastJob(f"j{i}", 1, 0.0, 1.0, 1e6, 1e6) for i in range(4)]
    f = forecast(create("gandiva-ts", quantum=1.0), jobs, (1,), budget=0.2)  # a slice a second: many events
    assert not f.complete and 0 < f.reached < 4e6 and f.wall < 1.5
    assert set(f.start) == {"j0", "j1", "j2", "j3"} and not f.end  # they all had a turn; none has ended
    f = forecast(create("fifo"), jobs, (0, 0))  # every node down
    assert f.never == {f"j{i}": "no node offers GPUs now" for i in range(4)}
    big = forecast(create("fifo"), [ForecastJob("big", 4, 0.0, 1.0, 10, 10)], (2, 0))  # a node drained
    assert big.never == {"big": "needs 4 GPUs but the cluster has 2 GPUs"}
    assert when(None) == "-" and when(0.2) == "now" and when(4000) == "in 1h 6m" and when(90000) == "in 1d 1h"


@pytest.mark.parametrize("now", [0.0, 1.8e9])
def test_the_live_policys_memory_carries_into_the_forecast(now):
    """The forecast imports the live policy's memory under the simulation's own job ids and runs on
    the live clock: Gandiva-fair's passes (y owed most, then z, then x) order the starts; without
    them every job starts level and x, the first to arrive, runs first."""
    from elastictrain.policies.api import JobView

    jobs = [ForecastJob(k, 1, now, 1.0, 1000, 1000) for k in ("x", "y", "z")]
    views = [JobView(k, 1, now) for k in ("x", "y", "z")]
    state = {"jobs": [["x", 5.0, 0, "gpu"], ["y", 1.0, 0, "gpu"], ["z", 3.0, 0, "gpu"]], "servers": [],
             "usage": [], "last": None, "next": now, "moves": 0}
    f = forecast(create("gandiva-fair", quantum=60), jobs, (1,), now=now, memory=(state, views))
    assert f.complete and f.start["y"] == 0 < f.start["z"] < f.start["x"], f.start
    assert max(f.end.values()) == pytest.approx(f.reached) and 3000 <= f.reached < 3500
    fresh = forecast(create("gandiva-fair", quantum=60), jobs, (1,), now=now)
    assert fresh.start["x"] == 0 < fresh.start["y"], fresh.start


@pytest.mark.parametrize("policy", ["autoscale", "fifo-be", "gandiva-fair", "gandiva-fair-global", "gandiva-ts",
                                    "muri-l", "muri-s", "srsf", "tiresias-g", "yarn-cs"])
@pytest.mark.parametrize("flags", [{}, {"priority_preemption": True, "quota_borrow": True, "min_run": 30.0}])
def test_every_policy_forecasts(tmp_path, policy, flags):
    from elastictrain.coordinator.app import Coordinator
    from elastictrain.coordinator.scheduler import ClusterConfig
    from elastictrain.coordinator.store import open_store

    class World(TierWorld):
        def open(self):
            self.c = Coordinator(open_store(str(self.tmp / "db")), self.clock,
                                 ClusterConfig(self.policy, dict(self.options), interval=1.0, **flags))
            self.s = self.c.cluster

    root = __import__("pathlib").Path(__file__).resolve().parents[3]
    opts = {"distribution": str(root / "traces" / "tiresias" / "yarn-gput1000.csv")} if policy == "tiresias-g" else {}
    w = World(tmp_path, policy=policy, nodes=2, slots=2, **opts)
    jobs = [w.s.submit(JobSubmit(["train.py"], str(tmp_path), gpus=g, steps=50, min_gpus=1 if g == 2 else None,
                                 stage_times={"load": 0.01, "compute": 0.02})).id for g in (2, 1, 2, 1, 2)]
    w.s.tick()
    w.run_all()
    _steps(w, jobs[0], 0.5, 4)
    f = asyncio.run(w.s.forecast())
    assert {j.id for j in f.jobs} == set(jobs) and f.wall < 3.0
    assert all(j.start is not None or not f.complete or j.why for j in f.jobs), f


def test_a_borrower_a_shared_placement_and_a_failing_policy_still_forecast():
    from elastictrain.policies.api import Decision
    from elastictrain.policies.tiers import BORROW_TIER, PriorityTiers

    tiers = PriorityTiers(lambda: create("fifo"))
    jobs = [ForecastJob("a", 2, 0.0, 1.0, 100, 50, placement=((0, 2),)),
            ForecastJob("b", 2, 0.0, 1.0, 100, 50, placement=((0, 2),)),  # a group member: its GPUs are a's
            ForecastJob("c", 2, 0.0, 1.0, 10, 10, priority=BORROW_TIER)]  # over its user's quota
    f = forecast(tiers, jobs, (2, 2))  # b goes to the other node; c, below every priority, waits for GPUs
    assert f.complete and not f.stopped and f.start == {"a": 0.0, "b": 0.0, "c": 50.0}
    assert f.end == {"a": 50.0, "b": 50.0, "c": 60.0}

    class Broken:
        name = "broken"

        def decide(self, s):
            if s.now > 5:
                raise RuntimeError("a bug in a user's policy")
            return Decision({j.job_id: ((0, 1),) for j in s.jobs[:1]}, wakeup=10.0)

    f = forecast(Broken(), [ForecastJob("x", 1, 0.0, 1.0, 100, 100), ForecastJob("y", 1, 0.0, 1.0, 5, 5)], (1,))
    assert f.stopped.startswith("PolicyError: ") and "a bug in a user's policy" in f.stopped
    assert f.start == {"x": 0.0} and not f.complete


def test_borrowers_forecast_and_a_job_bigger_than_its_quota_may_borrow(tmp_path):
    from .test_quotas import QuotaWorld

    w = QuotaWorld(tmp_path, policy="fifo", nodes=1, slots=4, quota_gpus=2, borrow=True)
    a = w.submit(2, steps=20)
    big = w.submit(3, steps=20)  # more than alice's 2 GPUs: it can only ever borrow, so it may
    w.s.tick()
    w.run_all()
    assert w.s.records[big].borrowing
    got = {j.id: j for j in asyncio.run(w.s.forecast()).jobs}
    assert got[big].start is not None and got[big].start >= got[a].end - 1e-6, got  # once a's GPUs are free


@pytest.mark.parametrize("policy", ["fifo-be", "srtf", "gandiva-ts"])
def test_a_job_that_needs_a_gpu_type_is_forecast_to_wait_for_it(policy):
    """The A100 node is free, but job b needs a V100: it starts when job a leaves the V100 node
    (job c, of no type, takes the A100s at once)."""
    jobs = [ForecastJob("a", 2, 0.0, 1.0, 100.0, 30.0, placement=((1, 2),), gpu_type="v100"),
            ForecastJob("b", 2, 1.0, 1.0, 50.0, 50.0, gpu_type="V100"),
            ForecastJob("c", 2, 2.0, 1.0, 50.0, 50.0)]
    f = forecast(create(policy), jobs, (2, 2), ("NVIDIA-A100", "Tesla-V100"))
    assert f.complete and not f.never, (f.stopped, f.never)
    assert f.start["a"] == 0.0 and f.start["c"] == pytest.approx(0.0, abs=1e-6)
    assert f.start["b"] == pytest.approx(30.0, abs=1.0) and f.end["b"] == pytest.approx(80.0, abs=1.0)
    f = forecast(create(policy), [ForecastJob("d", 1, 0.0, 1.0, 5.0, 5.0, gpu_type="h100")], (2, 2),
                 ("NVIDIA-A100", "Tesla-V100"))
    assert "needs 1 GPUs of type h100 but the cluster has 0" in f.never["d"]


def test_jobs_not_admitted_yet_arrive_in_the_forecast_at_their_begin_time_or_after_their_dependencies(tmp_path):
    """squeue --start for a pipeline: job b runs after job a (--after), c after b, d from a begin time
    (--begin); each gets a start. A held job, one waiting for a failure and one for the quota do not."""
    w = TierWorld(tmp_path, preempt=False, policy="srtf", nodes=1, slots=2)
    a = w.submit(2, steps=100)
    w.s.tick()
    w.run_all()
    _steps(w, a, 2.0, 20)  # 2 s a step: a ends in 160 s
    b = w.submit(2, steps=30, after=[a])  # 30 s (1 s a step, assumed)
    c = w.submit(1, steps=10, after=[b])
    d = w.submit(1, steps=10, begin=w.clock.now() + 500.0)
    held = w.submit(1, steps=10, hold=True)
    notok = w.submit(1, steps=10, after=[f"{a}:notok"])
    w.s.tick()
    f = asyncio.run(w.s.forecast())
    got = {j.id: j for j in f.jobs}
    assert f.complete, f.stopped
    assert got[b].start == pytest.approx(got[a].end, abs=1e-6) and got[b].end - got[b].start == pytest.approx(30, 1)
    assert got[c].start == pytest.approx(got[b].end, abs=1e-6)
    assert got[d].start == pytest.approx(w.clock.now() + 500.0, abs=1.0)
    assert "it is admitted once the jobs it runs after end, as this forecast has them" in got[c].assumed
    assert "it is admitted at its begin time" in got[d].assumed and not got[d].why
    assert got[held].start is None and got[held].why.startswith("not admitted: on hold")
    assert got[notok].start is None and "to fail" in got[notok].why
    assert w.status(b) == "queued" and b in w.s.admission.waiting  # (a read: nothing was admitted)


def test_the_engine_admits_a_job_once_the_jobs_it_runs_after_finished():
    from elastictrain.model import JobSpec
    from elastictrain.sim.cluster import ClusterSpec
    from elastictrain.sim.engine import Simulator

    jobs = [JobSpec(0, 1, 0.0, 100.0, 1.0), JobSpec(1, 1, 0.0, 50.0, 1.0), JobSpec(2, 1, 10.0, 10.0, 1.0),
            JobSpec(3, 8, 0.0, 10.0, 1.0), JobSpec(4, 1, 0.0, 10.0, 1.0)]
    r = Simulator(jobs, ClusterSpec(1, 1, 4), create("srtf"), after={1: [0], 2: [0, 1], 4: [3]}).run()
    end = {j.job_id: j.end_time for j in r.jobs}
    start = {j.job_id: j.start_time for j in r.jobs}
    assert start[1] == end[0] == 100.0 and start[2] == end[1] == 150.0  # (job 2 also waits past its submit time)
    assert 3 not in end and 4 not in end and r.extra["unfinished"] == 1  # job 3 never runs: 4 never arrives
    assert [k for k, _ in r.extra["rejected"]] == [3]


def test_a_job_waiting_for_its_quota_is_forecast_to_start_when_the_jobs_before_it_leave_room(tmp_path):
    """squeue --start under a quota: alice's quota is 2 GPUs and her first job holds them; her second
    waits though 2 slots are free, and is forecast to start when the first ends. Bob's job, charged to
    a project of one job that carol's job fills, waits for carol's."""
    from elastictrain.wire import ProjectSet

    from .test_quotas import QuotaWorld

    w = QuotaWorld(tmp_path, policy="srtf", nodes=1, slots=6, quota_gpus=2)
    w.s.set_project("vision", ProjectSet(jobs=1, users=["bob", "carol"]))
    a = w.submit(2, steps=100)
    c = w.submit(1, user="carol", steps=50)
    w.s.tick()
    w.run_all()
    _steps(w, a, 2.0, 20)  # a ends in 160 s
    _steps(w, c, 1.0, 10)  # c in 40 s
    b = w.submit(2, steps=30)
    bob = w.submit(1, user="bob", steps=10)
    w.s.tick()
    assert b in w.s.admission.waiting and bob in w.s.admission.waiting
    got = {j.id: j for j in asyncio.run(w.s.forecast()).jobs}
    assert got[b].start == pytest.approx(got[a].end, abs=1e-6), got[b]
    assert got[bob].start == pytest.approx(got[c].end, abs=1e-6), got[bob]
    assert any("its quota admits it once the jobs admitted before it end" in x for x in got[b].assumed)
    assert b in w.s.admission.waiting  # (a read)


def test_an_arrays_tasks_held_back_by_its_limit_are_forecast_to_start_as_its_running_tasks_end(tmp_path):
    """squeue --start for --array 0-3%2: two tasks run, 4 slots free; task 2 starts when the first
    running task ends, task 3 when the next does (not at once, though the slots are free)."""
    from elastictrain.wire import JobSubmit

    w = TierWorld(tmp_path, preempt=False, policy="fifo", nodes=1, slots=4)
    tasks = [j.id for j in w.s.submit_array(JobSubmit(["sweep.py"], str(tmp_path), name="sweep", array="0-3%2",
                                                      steps=40)).jobs]
    w.s.tick()
    w.run_all()
    _steps(w, tasks[0], 1.0, 10)  # 1 s a step: task 0 ends in 30 s
    _steps(w, tasks[1], 2.0, 10)  # 2 s a step: task 1 in 60 s
    assert [w.status(t) for t in tasks] == ["running", "running", "queued", "queued"]
    f = asyncio.run(w.s.forecast())
    got = {j.id: j for j in f.jobs}
    assert f.complete, f.stopped
    assert got[tasks[2]].start == pytest.approx(got[tasks[0]].end, abs=1e-6), got
    assert got[tasks[3]].start == pytest.approx(min(got[tasks[1]].end, got[tasks[2]].end), abs=1e-6), got
    assert got[tasks[3]].start > got[tasks[2]].start and not got[tasks[3]].why
    assert "its array's %2 admits it then" in got[tasks[3]].assumed


def test_the_engine_runs_at_most_n_of_an_arrays_jobs_at_once():
    from elastictrain.model import JobSpec
    from elastictrain.sim.cluster import ClusterSpec
    from elastictrain.sim.engine import Simulator

    jobs = [JobSpec(i, 1, 0.0, 10.0 * (i + 1), 1.0) for i in range(5)]
    arrays = {i: ("a", 2, i == 4) for i in range(5)}  # job 4: admitted already (live), never held back
    r = Simulator(jobs, ClusterSpec(1, 1, 8), create("fifo"), arrays=arrays).run()
    start = {j.job_id: j.start_time for j in r.jobs}
    end = {j.job_id: j.end_time for j in r.jobs}
    # 0 and 1 fill the array's 2 and 4 is admitted over it: 2 waits until two of them ended (0 at 10 s,
    # 1 at 20 s), 3 until one more did (2 and 4 at 50 s)
    assert start[0] == start[1] == start[4] == 0.0 and (end[0], end[1], end[4]) == (10.0, 20.0, 50.0)
    assert start[2] == end[1] and start[3] == 50.0 and r.extra["unfinished"] == 0


@pytest.mark.parametrize("now", [0.0, 1.8e9])
def test_a_planned_maintenance_window_is_in_the_forecast(now):
    # 2 nodes of 1: under backfill the 1000-s job goes to node 1, away from node 0's window at +100..+400;
    # the 50-s job fits on node 0 before it; the third waits for node 0's end of maintenance
    jobs = [ForecastJob("long", 1, now, 1.0, 1000, 1000), ForecastJob("short", 1, now, 1.0, 50, 50),
            ForecastJob("next", 1, now, 1.0, 500, 500)]
    f = forecast(create("backfill"), jobs, (1, 1), now=now, windows=((0, now + 100, now + 400), (1, now - 5, now - 1)))
    assert f.complete
    assert f.start["long"] == pytest.approx(0.0) and f.start["short"] == pytest.approx(0.0)
    assert f.start["next"] == pytest.approx(400.0), f.start  # after the window, not at the short job's end
    plain = forecast(create("backfill"), jobs, (1, 1), now=now)
    assert plain.start["next"] == pytest.approx(50.0), plain.start


def test_a_cordon_lets_the_nodes_jobs_run_on_and_starts_nothing_there_in_the_forecast():
    # one node of 1: a (200 s) runs on it, b (50 s) waits; a cordon from +100 to +400 (no drain) lets a
    # run on to its end and b start only when the cordon ends; a drain there requeues a instead
    jobs = [ForecastJob("a", 1, 0.0, 1.0, 200, 200, placement=((0, 1),)), ForecastJob("b", 1, 0.0, 1.0, 50, 50)]
    cordon = forecast(create("fifo"), jobs, (1,), windows=((0, 100.0, 400.0, False),))
    assert cordon.complete and cordon.end["a"] == pytest.approx(200.0)
    assert cordon.start["b"] == pytest.approx(400.0) and cordon.end["b"] == pytest.approx(450.0)
    drain = forecast(create("fifo"), jobs, (1,), windows=((0, 100.0, 400.0, True),))
    assert drain.end["a"] == pytest.approx(500.0) and drain.start["b"] == pytest.approx(500.0)
    assert forecast(create("fifo"), jobs, (1,)).start["b"] == pytest.approx(200.0)


def test_a_node_cordoned_now_takes_nothing_new_in_the_forecast_until_its_cordon_ends(tmp_path):
    from elastictrain.wire import NodeCordon

    w = TierWorld(tmp_path, preempt=False, policy="fifo", nodes=2, slots=1)
    a = w.submit(1, steps=100)
    w.s.tick()
    w.run_all()
    _steps(w, a, 1.0, 10)  # 1 s a step: 90 s left, on n1
    b = w.submit(1, steps=2000)  # on n2 (n1 is busy)
    w.s.tick()
    w.run_all()
    _steps(w, b, 1.0, 5)
    c = w.submit(1, steps=10)
    w.s.cordon("n1", NodeCordon(600.0, "bad fan"))  # a runs on; nothing new goes there for 600 s
    w.s.tick()
    assert w.s.table.get(a).running and w.status(c) == "queued"
    f = asyncio.run(w.s.forecast())
    got = {j.id: j for j in f.jobs}
    assert got[a].end - f.now == pytest.approx(85.0, abs=3.0)  # it runs on to its end (5 s passed since)
    # c waits for the cordon's end (at 600 s), not for a's end, when n1 empties
    assert got[c].start - f.now == pytest.approx(600.0, abs=3.0), got[c]


def test_a_job_waiting_for_a_parent_projects_quota_is_forecast_to_start_when_room_is_made(tmp_path):
    """lab is under dept, which admits 1 job at once: carol's job (lab) runs; bob's (lab too) waits for
    dept's quota though lab has no limit, and is forecast to start when carol's ends."""
    from elastictrain.wire import ProjectSet

    from .test_quotas import QuotaWorld

    w = QuotaWorld(tmp_path, policy="srtf", nodes=1, slots=6)
    w.s.set_project("dept", ProjectSet(jobs=1))
    w.s.set_project("lab", ProjectSet(users=["bob", "carol"], parent="dept"))
    c = w.submit(1, user="carol", steps=50)
    w.s.tick()
    w.run_all()
    _steps(w, c, 1.0, 10)  # c ends in 40 s
    bob = w.submit(1, user="bob", steps=10)
    w.s.tick()
    assert bob in w.s.admission.waiting and "project dept, which project lab is under" in w.s.job(bob).reason
    got = {j.id: j for j in asyncio.run(w.s.forecast()).jobs}
    assert got[bob].start == pytest.approx(got[c].end, abs=1e-6), got[bob]


def test_an_elastic_job_is_forecast_at_the_sizes_the_policy_would_give_it():
    """b may run on 1-4 workers: backfill starts it now on the 2 GPUs that are free (at half its
    4-worker speed: 2 s a step, it ends at 80); with --grow it grows to 4 when a's end frees 2 more
    at 30 s (15 steps done, the other 25 at 1 s: it ends at 55); rigid at 4, it waits 30 s."""
    def jobs(lo):
        return [ForecastJob("a", 2, 0.0, 1.0, 100.0, 30.0, placement=((0, 2),)),
                ForecastJob("b", 4, 1.0, 1.0, 40.0, 40.0, min_gpu=lo, max_gpu=4)]

    rigid, elastic = forecast(create("backfill"), jobs(4), (2, 2)), forecast(create("backfill"), jobs(1), (2, 2))
    assert rigid.complete and elastic.complete
    assert rigid.start["b"] == pytest.approx(30.0) and rigid.end["b"] == pytest.approx(70.0)
    assert elastic.start["b"] == pytest.approx(0.0, abs=1e-6) and elastic.end["b"] == pytest.approx(80.0, abs=1e-6)
    grown = forecast(create("backfill", grow=True), jobs(1), (2, 2))
    assert grown.start["b"] == pytest.approx(0.0, abs=1e-6) and grown.end["b"] == pytest.approx(55.0, abs=1e-6)
    # its work left assumed (no --steps/--epochs): the live backfill would not grow it, nor does the forecast's
    unknown = [jobs(1)[0], dataclasses.replace(jobs(1)[1], work_known=False)]
    kept = forecast(create("backfill", grow=True), unknown, (2, 2))
    assert kept.end["b"] == pytest.approx(80.0, abs=1e-6), kept.end
    # autoscale starts it at its minimum, then resizes it as it measures: a start now, an end the
    # rigid forecast could not have given
    auto = forecast(create("autoscale"), jobs(1), (2, 2))
    assert auto.complete and auto.start["b"] == pytest.approx(0.0, abs=1e-6) and auto.end["b"] != pytest.approx(70.0)


def test_the_coordinator_forecasts_an_elastic_job_within_its_range_and_says_what_it_assumes(tmp_path):
    w = TierWorld(tmp_path, preempt=False, policy="backfill", nodes=2, slots=2)
    a = w.submit(2, steps=100)
    w.s.tick()
    w.run_all()
    _steps(w, a, 1.0, 10)
    b = w.submit(4, min_gpus=2, steps=40)  # 2 GPUs are free: backfill starts it there
    c = w.submit(4, steps=40)  # rigid: it needs both nodes
    f = asyncio.run(w.s.forecast())
    got = {j.id: j for j in f.jobs}
    assert got[b].start == pytest.approx(f.now, abs=1e-6), got[b]
    assert got[c].start >= got[a].end - 1e-6
    assert "its step time scales linearly with its workers (2-4), from the one at 4" in got[b].assumed
    assert not any("scales linearly" in x for x in got[c].assumed)
