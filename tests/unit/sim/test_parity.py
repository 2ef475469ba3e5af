"""The parity comparison: decisions reduced to steps, deferred moves folded, the first divergence named."""

from types import SimpleNamespace as NS

from elastictrain.sim.parity import Step, compare, live_decisions, normalize, sim_decisions


def ev(t, kind, job="", **detail):
    return NS(time=t, kind=kind, job=job, detail=detail)


def test_live_events_become_steps_by_submission_order():
    jobs = [NS(id="7", submit_time=105.0), NS(id="3", submit_time=100.0)]
    events = [ev(100.0, "submit", "3"), ev(100.1, "start", "3", group=[]), ev(105.2, "start", "7", group=["7", "3"]),
              ev(106.0, "regroup", "3", group=["7", "3"]), ev(110.0, "preempt", "7"), ev(111.0, "resume", "7"),
              ev(120.0, "finish", "3"), ev(121.0, "launch", "7")]
    steps = live_decisions(events, jobs)
    assert steps == [Step(0.1, "start", 0), Step(5.2, "start", 1, (0, 1)), Step(6.0, "regroup", 0, (0, 1)),
                     Step(10.0, "preempt", 1), Step(11.0, "start", 1), Step(20.0, "finish", 0)]


def test_a_deferred_move_folds_into_the_restart_it_stands_for():
    live = [Step(0, "start", 0), Step(5.0, "preempt", 0, deferred=True), Step(6.5, "start", 0, (0, 1))]
    assert normalize(live, 3.0) == [Step(0, "start", 0), Step(5.0, "regroup", 0, (0, 1))]
    assert normalize(live, 1.0) == live  # too far apart: a preemption and a later start
    # a real preemption and a quick resume (no deferred event) stay what they are
    quick = [Step(0, "start", 0), Step(5.0, "preempt", 0), Step(6.5, "start", 0)]
    assert normalize(quick, 3.0) == quick


def test_the_live_log_marks_the_stop_of_a_deferred_move():
    jobs = [NS(id="a", submit_time=100.0)]
    events = [ev(100.0, "start", "a"), ev(105.0, "preempt", "a"), ev(105.01, "deferred", "a"),
              ev(106.0, "resume", "a"), ev(110.0, "preempt", "a"), ev(111.0, "resume", "a")]
    steps = live_decisions(events, jobs)
    assert [s.deferred for s in steps] == [False, True, False, False, False]
    assert normalize(steps, 3.0) == [Step(0.0, "start", 0), Step(5.0, "migrate", 0), Step(10.0, "preempt", 0),
                                     Step(11.0, "start", 0)]


def test_compare_names_the_first_divergence_in_time():
    sim = sim_decisions([(0.0, "start", 0, ()), (2.0, "start", 1, ()), (9.0, "preempt", 0, ()),
                         (9.0, "finish", 1, ())])
    live = [Step(0.3, "start", 0), Step(2.4, "start", 1), Step(9.5, "preempt", 0)]
    assert compare(live, sim, 1.0) is None
    late = [Step(0.3, "start", 0), Step(2.4, "start", 1), Step(12.0, "preempt", 0)]
    assert "job 0, its decision #2" in compare(late, sim, 1.0)
    other = [Step(0.3, "start", 0), Step(2.4, "start", 1, (0, 1))]
    why = compare(other, sim, 1.0)
    assert why.startswith("job 1, its decision #1") and "group [0, 1]" in why  # t=2.0 comes before t=9.0
