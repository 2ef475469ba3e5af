"""Users in cluster mode: tickets set through the API reach Gandiva-fair live, are kept in the
database across a restart, and the users' measured shares over a window follow them; bad input is
refused with the fix named."""

import pytest

from elastictrain.errors import ConfigError
from elastictrain.wire import UserTickets

from .test_cluster_scheduler import World


def _drive(w, seconds):
    """Run the cluster for ``seconds``: every second a decision, stops confirmed by the node
    (workers exit with the preempted code), starts reported running."""
    for _ in range(int(seconds)):
        w.clock.advance(1.0)
        w.s.tick()
        for key in list(w.s.table.stopping):
            w.exit(key, 75)
        w.s.tick()
        w.run_all()


def test_tickets_reach_gandiva_fair_and_survive_a_restart(tmp_path):
    w = World(tmp_path, policy="gandiva-fair", nodes=1, slots=2, quantum=10.0)
    out = w.s.set_user("alice", UserTickets(3.0))
    assert w.s.policy.tickets == {"alice": 3.0}
    assert out.tickets_used and [u.user for u in out.users] == ["alice"] and out.users[0].set
    w.s.set_user("bob", UserTickets(1.0))
    kinds = [(e.kind, e.detail.get("user")) for e in w.s.events.list(0).events]
    assert ("tickets", "alice") in kinds and ("tickets", "bob") in kinds
    w.restart()
    assert w.s.policy.tickets == {"alice": 3.0, "bob": 1.0}


def test_shares_follow_the_tickets_over_the_window(tmp_path):
    w = World(tmp_path, policy="gandiva-fair", nodes=1, slots=2, quantum=10.0, compensate=0.0)
    w.s.set_user("alice", UserTickets(3.0))
    for user in ("alice", "alice", "bob", "bob"):
        w.submit(1, user=user)
    _drive(w, 400)
    ul = w.s.user_list(300.0)
    by = {u.user: u for u in ul.users}
    assert by["alice"].entitled == pytest.approx(0.75) and by["bob"].entitled == pytest.approx(0.25)
    assert by["alice"].share == pytest.approx(0.75, abs=0.08), ul
    assert by["bob"].share == pytest.approx(0.25, abs=0.08), ul
    assert by["bob"].tickets == 1.0 and not by["bob"].set  # the default
    assert 290 <= ul.window <= 300
    assert by["alice"].jobs == 2 and by["alice"].running_gpus + by["bob"].running_gpus <= 2
    # equal tickets: equal shares from then on
    w.s.set_user("alice", UserTickets(1.0))
    _drive(w, 400)
    by = {u.user: u for u in w.s.user_list(300.0).users}
    assert by["alice"].share == pytest.approx(0.5, abs=0.08) and by["bob"].share == pytest.approx(0.5, abs=0.08)


def test_shares_are_reported_under_any_policy(tmp_path):
    w = World(tmp_path, policy="tiresias-l", nodes=1, slots=2)
    w.submit(2, user="carol")
    _drive(w, 20)
    ul = w.s.user_list(600.0)
    assert not ul.tickets_used and [(u.user, u.share) for u in ul.users] == [("carol", 1.0)]
    w.s.set_user("carol", UserTickets(2.0))  # kept, for a policy that uses them later
    assert w.s.users.tickets == {"carol": 2.0}


@pytest.mark.parametrize("user, tickets, word", [("bad name!", 1.0, "user"), ("x" * 300, 1.0, "user"),
                                                 ("ok", float("inf"), "tickets")])
def test_bad_users_and_tickets_are_refused(tmp_path, user, tickets, word):
    w = World(tmp_path, policy="gandiva-fair", nodes=1, slots=2)
    with pytest.raises(ConfigError, match=word):
        w.s.users.set(user, tickets)
    with pytest.raises(ConfigError, match="window"):
        w.s.user_list(0.0)
    with pytest.raises(ConfigError, match="window"):
        w.s.user_list(10 ** 9)


def test_the_live_fairness_report_from_the_event_log(tmp_path):
    from elastictrain.sim.fairness_live import live_fairness, write_live_report

    w = World(tmp_path, policy="gandiva-fair", nodes=1, slots=2, quantum=10.0, compensate=0.0)
    w.s.set_user("alice", UserTickets(3.0))
    for user in ("alice", "alice", "bob", "bob"):
        w.submit(1, user=user)
    _drive(w, 600)
    events = w.s.events.list(0).events
    r = live_fairness(events, {"alice": 3.0}, 1.0, 200.0, w.clock.now())
    assert r.users == ["alice", "bob"] and len(r.timeline) == 3
    assert r.received["alice"] + r.received["bob"] == pytest.approx(2 * 600, rel=0.05)  # both slots busy
    assert r.ratio("alice") == pytest.approx(1.0, abs=0.1) and r.ratio("bob") == pytest.approx(1.0, abs=0.3)
    assert r.received["alice"] / (r.received["alice"] + r.received["bob"]) == pytest.approx(0.75, abs=0.05)
    paths = write_live_report(r, str(tmp_path / "report"))
    assert open(paths[0]).read().splitlines()[0] == "user,tickets,gpu_seconds,entitled_gpu_seconds," \
                                                    "received_over_entitled"
    assert len(open(paths[1]).read().splitlines()) == 4


def _two_types(tmp_path, slow_slots: int, *sizes):
    """A fifo world of a 1-GPU node of type "fast" (n1) and a ``slow_slots``-GPU one of type "slow"
    (n2), jobs of one name of ``sizes`` GPUs submitted and placed: (world, job ids, job -> node)."""
    from elastictrain.wire import NodeRegister

    w = World(tmp_path, policy="fifo", nodes=0)
    w.inst = {"n1": "i1", "n2": "i2"}
    w.s.node_register("n1", NodeRegister(1, "i1", "slot", "fast", "h"))
    w.s.node_register("n2", NodeRegister(slow_slots, "i2", "slot", "slow", "h"))
    jobs = [w.submit(g) for g in sizes]
    w.s.tick()
    placed = w.run_all()
    return w, jobs, {job: node for node, tasks in placed.items() for job, _, _ in tasks}


def test_per_type_speeds_are_measured_from_step_times(tmp_path):
    """Two nodes of different GPU types: jobs of one name step 3x faster on one; once the name has
    run on every type, its jobs carry the measured speeds (the slowest type 1.0), status shows
    them, and a policy that trades on them is told to recompute."""
    from elastictrain.wire import StepReport

    w, (a, b), on = _two_types(tmp_path, 1, 1, 1)
    assert set(on) == {a, b} and on[a] != on[b]
    fast, slow = (a, b) if on[a] == "n1" else (b, a)
    for i in range(1, 16):  # 0.1 s per step on the fast node, 0.3 s on the slow one
        w.clock.advance(0.1)
        w.c.step(fast, StepReport(0, i))
        if i % 3 == 0:
            w.c.step(slow, StepReport(0, i // 3))
    w.c.step(fast, StepReport(0, 16))  # a second report at the same instant is no sample (no 0 s step)
    assert w.s.job(fast).iteration_time == pytest.approx(0.1)
    speeds = dict(w.s.table.get(fast).speeds)
    assert speeds == pytest.approx({"fast": 3.0, "slow": 1.0}, rel=0.05), speeds
    assert w.s.table.get(slow).speeds == w.s.table.get(fast).speeds  # one name: one table
    assert "fast=3.00" in w.s.job(fast).info["speeds"]


def test_per_type_speeds_compare_step_times_at_one_worker_count(tmp_path):
    """A job of the name on 2 workers of the slow type steps in 0.15 s (a fixed global batch): that is
    no speed of the type against 1 worker's 0.1 s on the fast one. Speeds come once both types have
    a step time at one worker count."""
    from elastictrain.wire import StepReport

    w, (a, b), on = _two_types(tmp_path, 2, 1, 2)
    assert on == {a: "n1", b: "n2"}, on
    for i in range(1, 31):  # a: 0.1 s a step on 1 fast GPU; b: 0.15 s on 2 slow ones
        w.clock.advance(0.05)
        if i % 2 == 0:
            w.c.step(a, StepReport(0, i // 2))
        if i % 3 == 0:
            w.c.step(b, StepReport(0, i // 3))
    assert w.s.job(b).iteration_time == pytest.approx(0.15) and w.s.job(a).iteration_time == pytest.approx(0.1)
    assert dict(w.s.table.get(a).speeds) == {}  # (not fast=1.5: the two were on other worker counts)
    w.exit(b, 0)
    c = w.submit(1)
    w.s.tick()
    assert {job for job, _, _ in w.run_all()["n2"]} == {c}
    for i in range(1, 11):  # c: 0.3 s a step on 1 slow GPU
        w.clock.advance(0.1)
        w.c.step(a, StepReport(0, w.s.job(a).step + 1))
        if i % 3 == 0:
            w.c.step(c, StepReport(0, i // 3))
    w.s.tick()
    assert dict(w.s.table.get(a).speeds) == pytest.approx({"fast": 3.0, "slow": 1.0}, rel=0.05)


def test_gandiva_fair_recomputes_entitlements_when_inputs_change():
    from elastictrain.policies.gandiva_fair import GandivaFair

    p = GandivaFair()
    p._users = frozenset({"alice"})
    p.inputs_changed()
    assert p._users is None
    p.set_tickets({"alice": 2.0})
    assert p.tickets == {"alice": 2.0} and p._users is None
    with pytest.raises(ConfigError, match="positive"):
        p.set_tickets({"alice": 0.0})


def test_trace_export_replays_in_the_simulator(tmp_path):
    """The live jobs as a trace: submit times from the first, GPUs, steps, measured step times,
    users; a job without a measured step time is left out; the simulator runs the trace."""
    from elastictrain.sim.export import jobs_to_trace
    from elastictrain.sim.run import SimConfig, simulate
    from elastictrain.sim.synth import write_native
    from elastictrain.wire import StepReport

    w = World(tmp_path, policy="srtf", nodes=1, slots=2)
    a = w.submit(1, user="alice", steps=50)
    w.clock.advance(3)
    b = w.submit(1, user="bob", steps=20, priority=3)
    c = w.submit(2, user="bob")  # never runs here: no step time
    w.s.tick()
    w.run_all()
    for i in range(1, 6):
        w.clock.advance(0.5)
        w.c.step(a, StepReport(0, i))
        w.c.step(b, StepReport(0, 2 * i))
    jobs, left_out = jobs_to_trace(w.s.jobs().jobs)
    assert left_out == [c]
    got = [(j.job_id, j.num_gpu, j.submit_time, j.iterations, round(j.iteration_time, 6), j.model, j.user)
           for j in jobs]
    assert got == [(0, 1, 0.0, 50.0, 0.5, "train", "alice"), (1, 1, 3.0, 20.0, 0.25, "train", "bob")]
    assert [j.priority for j in jobs] == [0, 3]
    path = write_native(jobs, str(tmp_path / "live.csv"))
    (r,) = simulate(SimConfig(path, "n1g2", ["srtf"]), progress=False)
    assert sorted((x.job_id, round(x.duration, 3), x.user) for x in r.jobs) == [(0, 25.0, "alice"), (1, 5.0, "bob")]


def test_trace_export_carries_the_nodes_lost_and_the_cluster(tmp_path):
    """Node outages from the event log as simulate's --outage (seconds after the first
    submission), the cluster as --cluster; a node that joins late is out until it does."""
    import math

    from elastictrain.sim.export import cluster_form, first_submit, jobs_to_trace, outages_from_events
    from elastictrain.sim.run import SimConfig, simulate
    from elastictrain.sim.synth import write_native
    from elastictrain.wire import NodeLeave, NodeRegister, StepReport, TaskState

    w = World(tmp_path, policy="fifo", nodes=2, slots=2, node_timeout=5.0)
    a = w.submit(2, steps=40)  # t0 = 1000
    w.s.tick()
    w.run_all()
    for i in range(1, 7):
        w.clock.advance(0.5)
        w.c.step(a, StepReport(0, i))
        w.poll("n1", [TaskState(a, 1, "running")])
    w.clock.advance(3)
    w.poll("n1", [TaskState(a, 1, "running")])
    w.s.tick()  # n2 silent for 6 s: lost at 1006
    w.clock.advance(14)
    w.poll("n1", [TaskState(a, 1, "running")])
    w.register("n2", "inst2-new")  # back at 1020
    w.clock.advance(5)
    w.s.node_register("n3", NodeRegister(2, "inst3", "slot", "cpu", "h"))  # joins at 1025: out from 0
    w.clock.advance(5)
    w.s.node_leave("n1", NodeLeave(w.inst["n1"]))  # leaves at 1030, for good
    records = w.s.jobs().jobs
    events = w.s.events.list(0).events
    nodes = w.s.status().nodes
    t0 = first_submit(records)
    assert t0 == 1000.0
    got = outages_from_events(events, nodes, t0)
    assert got == [(0, 30.0, math.inf), (1, 6.0, 20.0), (2, 0.0, 25.0)], got
    assert cluster_form(nodes) == "n3g2"
    jobs, _ = jobs_to_trace(records)
    path = write_native(jobs, str(tmp_path / "live.csv"))
    (r,) = simulate(SimConfig(path, cluster_form(nodes), ["fifo"], outages=tuple(got)), progress=False)
    assert len(r.jobs) == 1


def test_trace_export_keeps_an_elastic_jobs_range(tmp_path):
    """An elastic job (min_gpus below its GPUs) is elastic in the trace: measured at its run's
    workers, with its range, so the simulator can resize it (docs/simulator.md "Elastic jobs")."""
    from elastictrain.sim.export import jobs_to_trace
    from elastictrain.wire import StepReport

    w = World(tmp_path, policy="srtf", nodes=1, slots=4)
    a = w.submit(4, user="alice", steps=40, min_gpus=2)
    w.s.tick()
    w.run_all()
    for i in range(1, 5):
        w.clock.advance(0.5)
        w.c.step(a, StepReport(0, i))
    (j,), _ = jobs_to_trace(w.s.jobs().jobs)
    assert (j.num_gpu, j.min_gpu, j.max_gpu, j.serial, j.iteration_time) == (4, 2, 4, 0.0, 0.5)
