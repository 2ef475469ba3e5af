"""The mechanism core: job table, plan (every invariant), the scheduling step and its failures."""

import random
import subprocess
import sys

import pytest

from elastictrain.clock import ManualClock
from elastictrain.errors import ConfigError, PolicyError
from elastictrain.policies import create, registered
from elastictrain.policies.api import Decision, register
from elastictrain.scheduling import ActionKind, ClusterShape, Entry, JobStatus, JobTable, Scheduler, plan


class Recorder:
    """A backend whose stops complete only when told (as real workers take time to checkpoint)."""

    def __init__(self, table, clock, gpus=(4, 4), instant=False):
        self.table, self.clock, self._shape, self.instant = table, clock, ClusterShape(tuple(gpus)), instant
        self.log = []

    def shape(self):
        return self._shape

    def start(self, e, a):
        self.log.append(("start", e.key, a.placement))

    def stop(self, e, a):
        self.log.append(("stop", e.key))
        if self.instant:
            self.table.stopped(e.key, self.clock.now())

    def restart(self, e, a):
        self.log.append((a.kind.value, e.key, a.placement))

    def finish_stops(self):
        for key in list(self.table.stopping):
            self.table.stopped(key, self.clock.now())


class Fixed:
    """Places what it is told; raises when told to."""

    name = "fixed"

    def __init__(self):
        self.run, self.fail, self.seen = {}, None, []

    def decide(self, s):
        self.seen.append(([j.job_id for j in s.arrived], list(s.ended)))
        if self.fail:
            raise self.fail
        return Decision(dict(self.run))


def _setup(gpus=(4, 4), instant=False):
    table, clock = JobTable(), ManualClock(0.0)
    backend = Recorder(table, clock, gpus, instant)
    policy = Fixed()
    return table, clock, backend, policy, Scheduler(policy, table, backend, clock)


def test_string_keys_start_preempt_and_stopping_jobs_hold_their_gpus():
    table, clock, backend, policy, sched = _setup()
    table.add(Entry("job-a", 4, 0.0))
    table.add(Entry("job-b", 4, 0.0))
    policy.run = {"job-a": ((0, 4),)}
    sched.tick()
    assert table.get("job-a").status is JobStatus.RUNNING and backend.log == [("start", "job-a", ((0, 4),))]
    table.began("job-a", 0.0)  # its first training step (a live backend learns it from a step report)
    clock.advance(10)
    table.accrue(10)
    assert table.get("job-a").attained_gpu == 40.0
    policy.run = {"job-b": ((0, 4),)}
    sched.tick()  # job-a is preempted; its workers have not exited yet, so job-b waits for its GPUs
    assert "job-a" in table.stopping and table.get("job-a").held == ((0, 4),)
    assert sched.deferred == ["job-b"] and not table.get("job-b").running
    snap = sched.feed.snapshot(10, backend.shape())
    assert [j.job_id for j in snap.jobs] == ["job-b"], "a stopping job is not runnable"
    assert snap.gpus_per_node == (4, 4), "its GPUs will be free in a moment: the policy may plan on them"
    policy.run = {"job-b": ((-1, 4),)}
    sched.tick()  # "any node": resolved to the node nobody holds
    assert table.get("job-b").placement == ((1, 4),) and table.get("job-b").running
    backend.finish_stops()
    snap = sched.feed.snapshot(10, backend.shape())
    assert snap.gpus_per_node == (4, 4) and {j.job_id for j in snap.jobs} == {"job-a", "job-b"}
    assert snap.job("job-a").preemptions == 1 and table.get("job-a").status is JobStatus.PREEMPTED
    # arrival order is kept though job-a left the runnable set for a while
    assert [j.job_id for j in snap.jobs] == ["job-a", "job-b"]


def test_service_counts_from_the_runs_first_step_not_from_its_start():
    # a start that took longer than a queue's threshold demoted a job that had not trained (issue 32.5)
    table, clock, backend, policy, sched = _setup()
    table.add(Entry("a", 4, 0.0))
    policy.run = {"a": ((0, 4),)}
    sched.tick()
    assert "a" in table.starting
    clock.advance(5)
    table.accrue(5)
    assert table.get("a").attained_gpu == 0.0  # starting: time passes, no service
    table.began("a", 7.0)
    table.accrue(10)
    assert table.get("a").attained_gpu == 12.0 and "a" not in table.starting  # 3 s x 4 GPUs since the first step
    policy.run = {"a": ((1, 4),)}  # a move restarts the run: start-up again
    sched.tick()
    table.accrue(12)
    assert "a" in table.starting and table.get("a").attained_gpu == 12.0


def test_a_starting_job_is_not_preempted_and_the_start_that_needed_its_gpus_waits():
    table, clock, backend, policy, sched = _setup(gpus=(4,), instant=True)
    for k in ("a", "b", "c"):
        table.add(Entry(k, 2 if k == "c" else 4, 0.0))
    policy.run = {"a": ((0, 4),)}
    sched.tick()
    policy.run = {"b": ((0, 4),)}  # the policy would preempt a before it trained a step
    assert sched.tick() == [] and sched.held_back == {"b": "a"}
    assert table.get("a").running and not table.get("b").running and backend.log == [("start", "a", ((0, 4),))]
    table.began("a", 1.0)
    assert [a.kind for a in sched.tick()] == [ActionKind.PREEMPT, ActionKind.START] and sched.held_back == {}
    # protection off: the decision stands
    table2, clock2, backend2, policy2, _ = _setup(gpus=(4,), instant=True)
    sched2 = Scheduler(policy2, table2, backend2, clock2, protect_startup=False)
    table2.add(Entry("a", 4, 0.0))
    table2.add(Entry("b", 4, 0.0))
    policy2.run = {"a": ((0, 4),)}
    sched2.tick()
    policy2.run = {"b": ((0, 4),)}
    assert [a.kind for a in sched2.tick()] == [ActionKind.PREEMPT, ActionKind.START]


def test_the_simulator_models_start_up_as_a_live_run_has_it():
    # Tiresias-L, one GPU, a 10 GPU-s first queue and a 30 s start-up: A is demoted only after 10 s of
    # training (at 40 s), never during its start-up; B, which came at 5 s, then preempts it
    from elastictrain.model import JobSpec
    from elastictrain.sim.cluster import load_cluster
    from elastictrain.sim.engine import Simulator

    jobs = [JobSpec(0, 1, 0.0, 100.0, 1.0, "a"), JobSpec(1, 1, 5.0, 100.0, 1.0, "b")]
    log: list = []
    Simulator(jobs, load_cluster("n1g1"), create("tiresias-l", thresholds=(10.0,)), restart_cost=30.0,
              decisions=log).run()
    first_preempt = next(d for d in log if d[1] == "preempt")
    assert first_preempt[:3] == (40.0, "preempt", 0), log


@pytest.mark.parametrize("run, rule", [
    ({"nope": ((0, 1),)}, "not runnable"),
    ({"a": ((0, 2),)}, "all or nothing"),
    ({"a": ((0, 4),), "b": ((0, 4),)}, "on node 0, which offers 4"),
    ({"a": ((2, 4),)}, "bad placement"),
    ({"a": ((0, 2), (-1, 2))}, "bad placement"),
    ({"a": ((0, 0), (1, 4))}, "bad placement"),
])
def test_plan_refuses_decisions_that_break_an_invariant(run, rule):
    table = JobTable()
    table.add(Entry("a", 4, 0.0))
    table.add(Entry("b", 4, 0.0))
    snap = table.subscribe().snapshot(0.0, ClusterShape((4, 4)))
    with pytest.raises(PolicyError, match=rule):
        plan(table, snap, Decision(run), "p")


def test_plan_checks_groups_and_worker_ranges():
    table = JobTable()
    table.add(Entry("a", 2, 0.0))
    table.add(Entry("b", 2, 0.0))
    table.add(Entry("c", 1, 0.0))
    table.add(Entry("e", 2, 0.0, min_gpu=1, max_gpu=4))
    snap = table.subscribe().snapshot(0.0, ClusterShape((4, 4)))
    with pytest.raises(PolicyError, match="group"):
        plan(table, snap, Decision({"a": ((0, 2),), "b": ((1, 2),)}, groups=(("a", "b"),)))
    with pytest.raises(PolicyError, match="group"):
        plan(table, snap, Decision({"a": ((0, 2),), "c": ((0, 1),)}, groups=(("a", "c"),)))
    with pytest.raises(PolicyError, match="outside its range 1..4"):
        plan(table, snap, Decision({"e": ((0, 4), (1, 1))}, workers={"e": 5}))
    with pytest.raises(PolicyError, match="outside its range 2..2"):
        plan(table, snap, Decision({"a": ((0, 1),)}, workers={"a": 1}))
    acts = plan(table, snap, Decision({"a": ((0, 2),), "b": ((0, 2),), "e": ((1, 3),)}, groups=(("a", "b"),),
                                      workers={"e": 3}))
    assert [(a.kind, a.key, a.group, a.workers) for a in acts] == [
        (ActionKind.START, "a", ("a", "b"), 2), (ActionKind.START, "b", ("a", "b"), 2),
        (ActionKind.START, "e", (), 3)]


def test_any_node_placements_resolve_to_real_nodes_and_running_jobs_stay_put():
    table, clock, backend, policy, sched = _setup(gpus=(4, 4), instant=True)
    for k in "abc":
        table.add(Entry(k, 2, 0.0))
    policy.run = {"b": ((-1, 2),)}
    sched.tick()
    where_b = table.get("b").placement
    assert where_b == ((0, 2),)
    policy.run = {"a": ((-1, 2),), "b": ((-1, 2),), "c": ((-1, 2),)}
    acts = sched.tick()
    assert table.get("b").placement == where_b, "a running job keeps its GPUs"
    assert [a.key for a in acts] == ["a", "c"] and all(a.kind is ActionKind.START for a in acts)
    per_node = [0, 0]
    for e in table.running.values():
        for n, g in e.placement:
            per_node[n] += g
    assert per_node == [4, 2]


def test_migrate_regroup_and_resize_are_actions():
    table, clock, backend, policy, sched = _setup(instant=True)
    table.add(Entry("a", 2, 0.0))
    table.add(Entry("b", 2, 0.0))
    table.add(Entry("e", 2, 0.0, min_gpu=1, max_gpu=4))
    policy.run = {"a": ((0, 2),), "b": ((1, 2),), "e": ((1, 2),)}
    sched.tick()

    class Next:
        name = "next"

        def decide(self, s):
            return Decision({"a": ((1, 2),), "b": ((1, 2),), "e": ((0, 4),)}, groups=(("a", "b"),),
                            workers={"e": 4})

    sched.policy = Next()
    kinds = {a.key: (a.kind, a.moved) for a in sched.tick()}
    assert kinds == {"a": (ActionKind.REGROUP, True), "b": (ActionKind.REGROUP, False),
                     "e": (ActionKind.RESIZE, True)}
    assert table.get("e").num_gpu == 4 and table.get("a").group == ("a", "b")


def test_a_failing_policy_keeps_the_allocation_and_sees_its_changes_again():
    table, clock, backend, policy, sched = _setup()
    errors = []
    sched.on_error = errors.append
    table.add(Entry("a", 2, 0.0))
    policy.run = {"a": ((0, 2),)}
    sched.tick()
    table.add(Entry("b", 2, 1.0))
    policy.fail = ValueError("boom")
    assert sched.tick() == [] and sched.failures == 1
    assert "policy fixed failed: ValueError: boom" in str(errors[0])
    policy.run = {"a": ((0, 4),)}  # a bad decision is refused the same way
    policy.fail = None
    assert sched.tick() == [] and sched.failures == 2
    assert table.get("a").running and table.get("a").placement == ((0, 2),)
    policy.run = {"a": ((0, 2),), "b": ((1, 2),)}
    sched.tick()
    # the arrival of b was handed over at every attempt until a decision succeeded
    assert [seen[0] for seen in policy.seen] == [["a"], ["b"], ["b"], ["b"]]
    assert table.get("b").running
    strict = Scheduler(Fixed(), table, backend, clock, strict=True)
    strict.policy.fail = PolicyError("no")
    with pytest.raises(PolicyError, match="no"):
        strict.tick()


def test_registering_a_name_twice_is_an_error():
    register("test-dup", lambda **kw: Fixed(), ())
    with pytest.raises(ConfigError, match="already registered"):
        register("test-dup", lambda **kw: Fixed(), ())
    register("test-dup", lambda **kw: Fixed(), (), replace=True)


def test_a_shipped_policy_is_found_by_importing_its_module_alone():
    """Each shipped policy's name is listed with the module that registers it (a simulation of one
    policy imports that module only), and each module registers exactly the names listed."""
    import importlib

    from elastictrain.policies import api

    for mod, names in api._BUILTIN.items():
        module = importlib.import_module(f"elastictrain.policies.{mod}")
        mine = {n for n, f in api._REGISTRY.items() if getattr(f, "__module__", "") == module.__name__}
        assert mine == set(names), mod
    code = ("import sys; from elastictrain.policies.api import create; create('gandiva-ts'); "
            "print(sorted(m for m in sys.modules if m.startswith('elastictrain.policies.') or m == 'numpy'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["['elastictrain.policies.api',", "'elastictrain.policies.placement',",
                                  "'elastictrain.policies.timeslice']"]



def test_a_policy_of_the_users_imports_no_shipped_policy(tmp_path):
    """``module:attr`` imports that module alone (it used to import every shipped policy first)."""
    (tmp_path / "turns.py").write_text("class Turns:\n    name = 'turns'\n    def decide(self, s):\n        pass\n")
    code = ("import sys; from elastictrain.policies.api import create; create('turns:Turns'); "
            "print(sorted(m for m in sys.modules if m.startswith('elastictrain.policies.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         cwd=tmp_path)
    assert out.stdout.split() == ["['elastictrain.policies.api']"], out.stdout


def test_entries_are_validated_and_keys_are_unique():
    table = JobTable()
    table.add(Entry(1, 1, 0.0))
    with pytest.raises(ConfigError, match="already known"):
        table.add(Entry(1, 1, 0.0))
    with pytest.raises(ConfigError, match="num_gpu"):
        Entry("x", 0, 0.0)
    with pytest.raises(ConfigError, match="min_gpu"):
        Entry("x", 2, 0.0, min_gpu=3, max_gpu=2)


OPTIONS = {"tiresias-g": {"distribution": [100.0, 500.0, 2000.0, 8000.0]}}
BUILTIN = [n for n in registered() if not n.startswith("test-")]


@pytest.mark.parametrize("name", BUILTIN)
def test_every_policy_runs_live_like_with_string_keys_slow_stops_and_a_rebuild(name):
    """Jobs keyed by strings, stops that take a few ticks (the jobs are not runnable meanwhile and
    hold their GPUs), and the policy rebuilt from scratch halfway (a coordinator restart): no
    KeyError, no invariant broken (plan would refuse it), and every job finishes."""
    rng = random.Random(7)
    table, clock = JobTable(), ManualClock(0.0)
    backend = Recorder(table, clock, gpus=(4, 4, 4))
    sched = Scheduler(create(name, **OPTIONS.get(name, {})), table, backend, clock, strict=True)
    jobs = {f"job-{i}": (rng.choice([1, 1, 2, 4, 8]), rng.uniform(20, 200)) for i in range(30)}
    pending = list(jobs)
    work = {k: w for k, (_, w) in jobs.items()}
    models = ["vgg16", "resnet50", "bert"]
    profiles = {"vgg16": (0.5, 0.3, 0.2), "resnet50": (0.2, 0.6, 0.2), "bert": (0.1, 0.2, 0.7)}
    stop_age: dict = {}
    done = set()
    for step in range(4000):
        now = step * 5.0
        clock.t = now
        for e in list(table.running.values()):
            work[e.key] -= 5.0
            if work[e.key] <= 0:
                table.end(e.key, JobStatus.FINISHED, now)
                done.add(e.key)
        table.accrue(now)
        for key in list(table.stopping):  # a stop completes three ticks after it was asked
            stop_age[key] = stop_age.get(key, 0) + 1
            if stop_age[key] >= 3:
                table.stopped(key, now)
                stop_age.pop(key)
        while pending and rng.random() < 0.3:
            k = pending.pop(0)
            m = rng.choice(models)
            table.add(Entry(k, jobs[k][0], now, model=m, iteration_time=1.0, iterations=jobs[k][1],
                            stage_times=profiles[m], user=rng.choice(["u1", "u2"])))
        if step == 100:  # a rebuilt policy learns every known job from its first snapshot
            sched = Scheduler(create(name, **OPTIONS.get(name, {})), table, backend, clock, strict=True)
        if len(table):
            sched.tick()
        if not pending and not len(table):
            break
    assert done == set(jobs), f"unfinished: {set(jobs) - done}"


def _random_case(seed: int):
    """A table with running and waiting jobs on 3 nodes, and a plain decision (no groups, no worker
    counts): kept, moved, reordered, started and preempted jobs, and now and then a broken one."""
    rng = random.Random(seed)
    caps = (4, 4, 2)
    table, feed = JobTable(), None
    free = list(caps)
    for k in range(8):
        e = table.add(Entry(k, rng.choice((1, 1, 2, 3)), float(k)))
        where = []
        if rng.random() < 0.5:  # running: on one node, or spread over two
            need = e.num_gpu
            for n in rng.sample(range(3), 3):
                g = min(need, free[n])
                if g:
                    where.append((n, g))
                    free[n] -= g
                    need -= g
                if not need:
                    break
            if need:
                for n, g in where:
                    free[n] += g
                where = []
        if where:
            table.start(k, tuple(where), (), 0.0)
    feed = table.subscribe()
    snap = feed.snapshot(1.0, ClusterShape(caps))
    run, left = {}, list(caps)
    for j in sorted(snap.jobs, key=lambda j: not j.running):
        r = rng.random()
        if j.running and r < 0.5:
            # kept (the same tuple), or the same GPUs listed in another order
            run[j.job_id] = tuple(reversed(j.placement)) if r < 0.15 else j.placement
            for n, g in j.placement:
                left[n] -= g
            continue
        if r < 0.8:
            fits = [n for n in range(3) if left[n] >= j.num_gpu]
            if fits and rng.random() < 0.9:
                n = rng.choice(fits)
                left[n] -= j.num_gpu
                run[j.job_id] = ((n, j.num_gpu),) if rng.random() < 0.9 else ((-1, j.num_gpu),)
            elif rng.random() < 0.3:  # over a node's capacity
                run[j.job_id] = ((rng.randrange(3), j.num_gpu),)
    if rng.random() < 0.2 and run:  # broken now and then: a wrong size, a bad node, an unknown job
        key = rng.choice(list(run))
        run[key] = rng.choice((((0, 9),), ((7, 1),), ((0, 0),)))
    if rng.random() < 0.1:
        run[99] = ((0, 1),)
    return table, snap, Decision(run, slowdown={k: 1.5 for k in list(run)[:1]})


@pytest.mark.parametrize("seed", range(300))
def test_the_one_pass_plan_equals_the_general_one(seed):
    """plan()'s one-pass path for plain decisions returns the same actions (or the same refusal)
    and leaves the table as the general path does."""
    out = []
    for fast in (True, False):
        table, snap, decision = _random_case(seed)
        try:
            actions = plan(table, snap, decision, "p", fast=fast)
        except PolicyError as exc:
            actions = str(exc)
        out.append((actions, [(e.key, e.placement, e.group) for e in table.entries()]))
    assert out[0] == out[1]


def test_the_simulator_decides_again_when_a_start_it_held_back_may_go():
    # SRTF, one GPU, 30 s start-ups: the short job (arriving at 5 s) is held back while the long one
    # starts, and starts the moment the long one has paid its start-up (30 s), not at the next
    # arrival or end (there is none until the short job's own end)
    from elastictrain.model import JobSpec
    from elastictrain.sim.cluster import load_cluster
    from elastictrain.sim.engine import Simulator

    jobs = [JobSpec(0, 1, 0.0, 1000.0, 1.0, "a"), JobSpec(1, 1, 5.0, 10.0, 1.0, "b")]
    log: list = []
    Simulator(jobs, load_cluster("n1g1"), create("srtf"), restart_cost=30.0, decisions=log).run()
    assert [(t, k, j) for t, k, j, _ in log][:4] == [(0.0, "start", 0), (30.0, "preempt", 0), (30.0, "start", 1),
                                                     (70.0, "finish", 1)], log


def test_a_run_younger_than_min_run_is_kept_and_the_scheduler_wakes_when_it_may_go():
    table, clock, backend, policy, _ = _setup(gpus=(4,), instant=True)
    sched = Scheduler(policy, table, backend, clock, min_run=60.0)
    for k in ("a", "b"):
        table.add(Entry(k, 4, 0.0))
    policy.run = {"a": ((0, 4),)}
    sched.tick()
    table.began("a", 5.0)  # trained: start-up protection is over, min_run is not (it counts from the start)
    clock.advance(20)
    policy.run = {"b": ((0, 4),)}
    assert sched.tick() == [] and sched.held_back == {"b": "a"} and sched.kept_until == {"a": 60.0}
    assert sched.wakeup == 60.0 and table.get("a").running
    clock.advance(40)  # t = 60: a has run 60 s
    assert [a.kind for a in sched.tick()] == [ActionKind.PREEMPT, ActionKind.START] and sched.kept_until == {}
    assert table.get("b").run_at == 60.0
    clock.advance(1)
    table.began("b", 61.0)
    policy.run = {"a": ((0, 4),)}  # b's run is 1 s old: kept, with a wake-up
    assert sched.tick() == [] and sched.wakeup == 120.0
    with pytest.raises(ConfigError, match="minimum run before preemption must be 0 to"):
        Scheduler(policy, table, backend, clock, min_run=-1.0)


def test_the_simulator_never_preempts_a_run_younger_than_min_run():
    # gandiva-ts slices every 100 s: with a 250 s minimum run, no job is preempted sooner than that
    # after its start, the simulation still ends, and it preempts less than without the minimum
    from elastictrain.model import JobSpec
    from elastictrain.sim.cluster import load_cluster
    from elastictrain.sim.engine import Simulator

    rng = random.Random(5)
    jobs = [JobSpec(i, rng.choice((1, 2, 4)), float(rng.randrange(0, 2000)), float(rng.randrange(50, 3000)), 1.0,
                    "m") for i in range(40)]
    jobs.sort(key=lambda j: j.submit_time)
    counts = []
    for min_run in (0.0, 250.0):
        log: list = []
        res = Simulator(jobs, load_cluster("n2g4"), create("gandiva-ts", quantum=100.0), restart_cost=10.0,
                        decisions=log, min_run=min_run).run()
        assert len(res.jobs) == 40
        started: dict = {}
        for t, kind, job, _ in log:
            if kind == "start":
                started[job] = t
            elif kind == "preempt":
                assert t - started[job] >= min_run, (job, started[job], t)
        counts.append(sum(r.preemptions for r in res.jobs))
    assert counts[1] < counts[0], counts


def test_min_run_counts_an_interleaving_groups_gpus_once():
    # a young run is kept beside a new group on the same node: the group's members share 2 GPUs
    class Grouping(Fixed):
        def decide(self, s):
            return Decision(dict(self.run), groups=self.groups)

    table, clock, backend, _, _ = _setup(gpus=(4,), instant=True)
    policy = Grouping()
    sched = Scheduler(policy, table, backend, clock, min_run=60.0)
    for k in ("y", "a", "b"):
        table.add(Entry(k, 2, 0.0))
    policy.run, policy.groups = {"y": ((0, 2),)}, ()
    sched.tick()
    table.began("y", 1.0)
    clock.advance(10)
    policy.run, policy.groups = {"a": ((0, 2),), "b": ((0, 2),)}, (("a", "b"),)
    kinds = sorted(a.kind.value for a in sched.tick())
    assert kinds == ["start", "start"] and table.get("y").running and sched.kept_until == {"y": 60.0}


def test_the_state_names_filters_check_are_the_cores_states():
    """``model.JOB_STATES`` (what ``--state``/``?state=`` accept; the CLI does not import the core,
    which costs it 19 ms) lists the core's states, and Slurm's names map onto them."""
    from elastictrain.model import JOB_STATES, check_states

    assert JOB_STATES == tuple(s.value for s in JobStatus)
    assert check_states("PD,R,cd,F,CA") == frozenset(s.value for s in JobStatus)
    with pytest.raises(ConfigError, match="is not one of"):
        check_states("timeout")
