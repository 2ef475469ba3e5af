"""Backfill (policies/backfill.py): short jobs pass a blocked one without delaying it."""

import random

import pytest

from elastictrain.errors import ConfigError
from elastictrain.model import JobSpec
from elastictrain.policies import create
from elastictrain.sim.cluster import ClusterSpec
from elastictrain.sim.engine import Simulator


class HeadWatch:
    """Wraps a backfill and keeps, for each job, the start of the reservation it got when it
    first stood at the head of the queue (the first reservation of a decision)."""

    def __init__(self, inner):
        self.inner, self.name, self.first_step_events = inner, inner.name, inner.first_step_events
        self.first_step_events_elastic = inner.first_step_events_elastic
        self.needs, self.head = inner.needs, {}

    def decide(self, s):
        d = self.inner.decide(s)
        if self.inner.reserved:
            key, start, _ = self.inner.reserved[0]
            self.head.setdefault(key, start)
        return d


def arrivals(seed: int, n: int, gap: float, make) -> list:
    """``n`` jobs arriving as a Poisson process (mean ``gap`` s apart): ``make(id, submit time, rng)``."""
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / gap)
        jobs.append(make(i, round(t, 3), rng))
    return jobs


def late_heads(jobs, policy, cluster, **kw):
    """Simulate ``policy`` (a backfill) under HeadWatch: the result, how many jobs stood at the head
    of the queue, and those that started later than the reservation they got there (job -> (start,
    reserved start))."""
    watch = HeadWatch(policy)
    r = Simulator(jobs, cluster, watch, **kw).run()
    got = {j.job_id: j.start_time for j in r.jobs}
    return r, len(watch.head), {k: (got[k], s) for k, s in watch.head.items() if got[k] > s + 1e-6}


def starts(jobs, policy, cluster=ClusterSpec(1, 1, 4), **kw):
    r = Simulator(jobs, cluster, create(policy) if isinstance(policy, str) else policy, **kw).run()
    return {j.job_id: j.start_time for j in r.jobs}


def test_a_short_job_passes_a_blocked_one_and_a_long_one_does_not():
    # 4 GPUs: job 0 holds 2 until t=100; job 1 needs 4 (it waits for job 0: reserved at 100);
    # job 2 needs 2 for 50 s (ends before 100: it starts at once); job 3 needs 2 for 500 s (it would
    # hold job 1's GPUs past 100: it waits for job 1)
    jobs = [JobSpec(0, 2, 0.0, 100, 1.0), JobSpec(1, 4, 1.0, 100, 1.0), JobSpec(2, 2, 2.0, 50, 1.0),
            JobSpec(3, 2, 3.0, 500, 1.0)]
    bf = starts(jobs, "backfill")
    assert bf[2] == 2.0 and bf[1] == 100.0 and bf[3] == 200.0, bf
    fifo = starts(jobs, "yarn-cs")  # strict FIFO: the short job waits behind the blocked one
    assert fifo[2] == 200.0, fifo
    be = starts(jobs, "fifo-be")  # best effort: the long job starts when the short one ends, the big one waits
    assert be[3] == 52.0 and be[1] == 552.0, be


def test_a_job_may_use_gpus_the_reservation_does_not_need():
    # 2 nodes of 4: job 0 holds node 0 until 100, job 1 node 1 until 51; job 2 (8 GPUs) is reserved
    # at 100 (both nodes); job 3 (1 GPU, 1000 s) would hold one of them past 100: it waits
    jobs = [JobSpec(0, 4, 0.0, 100, 1.0), JobSpec(1, 4, 1.0, 50, 1.0), JobSpec(2, 8, 2.0, 100, 1.0),
            JobSpec(3, 1, 3.0, 1000, 1.0)]
    got = starts(jobs, "backfill", ClusterSpec(1, 2, 4))
    assert got[1] == 1.0 and got[2] == 100.0 and got[3] == 200.0, got
    # with a 2-GPU head instead, reserved on node 0 at 100, a long 1-GPU job fits beside it on node 1
    jobs = [JobSpec(0, 4, 0.0, 100, 1.0), JobSpec(1, 3, 1.0, 1000, 1.0), JobSpec(2, 2, 2.0, 100, 1.0),
            JobSpec(3, 1, 3.0, 1000, 1.0)]
    got = starts(jobs, "backfill", ClusterSpec(1, 2, 4))
    assert got[1] == 1.0 and got[2] == 100.0 and got[3] == 3.0, got


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("reservations", [1, 3])
def test_the_head_of_the_queue_starts_no_later_than_its_reservation(seed, reservations):
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(120):
        t += rng.expovariate(1 / 40)
        size = rng.choice([1, 1, 1, 2, 2, 4, 4, 8, 12])
        jobs.append(JobSpec(i, size, round(t, 3), rng.choice([20, 60, 300, 900, 3000]), rng.choice([0.5, 1.0, 2.0])))
    _, heads, late = late_heads(jobs, create("backfill", reservations=reservations), ClusterSpec(2, 2, 4),
                                restart_cost=7.0)
    assert heads > 10 and not late, late  # (jobs did wait at the head)


@pytest.mark.parametrize("seed", range(4))
def test_on_gpus_of_two_speeds_the_head_still_starts_no_later_than_its_reservation(seed):
    # nodes 0-1 of type k80, where the jobs run at 0.4 of their speed, 2-3 of v100: backfill's estimates
    # take each job's speed on the type it runs on (a gang across both at the k80's); without, it fails
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(120):
        t += rng.expovariate(1 / 40)
        size = rng.choice([1, 1, 2, 4, 4, 8, 12])
        jobs.append(JobSpec(i, size, round(t, 3), rng.choice([20, 60, 300, 900, 3000]), 1.0,
                            speeds=(("k80", 0.4), ("v100", 1.0))))
    _, heads, late = late_heads(jobs, create("backfill"), ClusterSpec(1, 4, 4, ("k80", "k80", "v100", "v100"),
                                                                  (4, 4, 4, 4)), restart_cost=7.0)
    assert heads > 10 and not late, late


def test_it_beats_strict_fifo_and_does_not_starve_big_jobs_as_best_effort_does():
    rng = random.Random(7)
    jobs, t = [], 0.0
    for i in range(300):
        t += rng.expovariate(1 / 30)
        big = rng.random() < 0.15
        jobs.append(JobSpec(i, 16 if big else rng.choice([1, 2]), round(t, 3), rng.choice([60, 200, 600]), 1.0))
    out = {}
    for p in ("yarn-cs", "fifo-be", "backfill"):
        r = Simulator(jobs, ClusterSpec(1, 4, 4), create(p)).run()
        out[p] = (sum(j.jct for j in r.jobs) / len(r.jobs), max(j.queueing_delay for j in r.jobs if j.num_gpu == 16))
    assert out["backfill"][0] < out["yarn-cs"][0], out  # short jobs pass blocked big ones
    assert out["backfill"][1] < out["fifo-be"][1], out  # the big ones are not passed for ever


def peek(jobs, cluster, look):
    """Run a backfill through the engine, calling ``look(snapshot, policy, decision)`` after each decision."""
    bf = create("backfill")

    class Peek:
        name, needs, first_step_events = bf.name, bf.needs, bf.first_step_events

        def decide(self, s):
            d = bf.decide(s)
            look(s, bf, d)
            return d

    Simulator(jobs, cluster, Peek()).run()


def test_status_says_where_a_waiting_job_stands():
    jobs = [JobSpec(0, 2, 0.0, 100, 1.0), JobSpec(1, 4, 1.0, 100, 1.0), JobSpec(2, 2, 3.0, 500, 1.0)]
    seen = []
    peek(jobs, ClusterSpec(1, 1, 4), lambda s, bf, d: seen.append(
        (s.now, bf.waiting_reason(1, s.now), bf.waiting_reason(2, s.now), bf.annotate(1))))
    now, head, behind, info = next(x for x in seen if x[0] == 3.0)
    assert "reserved (backfill): it starts in about 97 s" in head and "4 GPUs" in head
    assert "behind job 1's reservation" in behind and "2 GPUs are free" in behind
    assert info == {"reservation": "4 GPUs (backfill)"}


def test_a_backfilled_start_is_noted_for_the_event_log():
    jobs = [JobSpec(0, 2, 0.0, 100, 1.0), JobSpec(1, 4, 1.0, 100, 1.0), JobSpec(2, 2, 2.0, 50, 1.0)]
    notes = []
    peek(jobs, ClusterSpec(1, 1, 4), lambda s, bf, d: notes.extend(d.notes))
    assert [(k, n["decision"]) for k, n in notes] == [(2, "backfill")]
    assert "ahead of job 1, whose reservation is in about 98 s" in notes[0][1]["why"]


@pytest.mark.parametrize("bad", [0, 1001, True, 2.5, "1"])
def test_reservations_out_of_range_are_refused(bad):
    with pytest.raises(ConfigError, match="reservations must be a whole number from 1 to 1000"):
        create("backfill", reservations=bad)


def test_count_placement_is_refused():
    with pytest.raises(ConfigError, match="not count"):
        create("backfill", placement="count")


def test_a_node_that_offers_nothing_now_does_not_hide_the_others_free_gpus():
    # node 0 was cordoned or lost (it offers 0) while job 0 still holds 2 of its GPUs: node 1's 4
    # free GPUs are still free, and job 0's end frees nothing there
    from elastictrain.policies.api import ClusterSnapshot, JobView

    running = JobView(0, 2, 0.0, iterations=100, remaining_iterations=50, running=True, placement=((0, 2),))
    big = JobView(1, 4, 1.0, iterations=100, remaining_iterations=100)
    bigger = JobView(2, 6, 2.0, iterations=100, remaining_iterations=100)
    s = ClusterSnapshot(10.0, (running, big, bigger), (0, 4), 2, arrived=(running, big, bigger), running=(running,))
    bf = create("backfill")
    d = bf.decide(s)
    assert d.run == {0: ((0, 2),), 1: ((1, 4),)}
    assert bf.reserved == []  # 6 GPUs never fit while node 0 offers none


def test_nothing_starts_where_it_would_run_into_a_planned_maintenance():
    # 2 nodes of 4, node 0 in maintenance from 100 to 400: a 1000-s job goes to node 1 (node 0 comes
    # first otherwise); a 50-s job may use node 0 (it ends by 100); a 4-GPU 1000-s job cannot start
    # on node 0 and is reserved node 0 from 400, after the maintenance
    from elastictrain.policies.api import ClusterSnapshot, JobView

    long = JobView(0, 2, 0.0, iterations=1000, remaining_iterations=1000)
    short = JobView(1, 2, 1.0, iterations=50, remaining_iterations=50)
    whole = JobView(2, 4, 2.0, iterations=1000, remaining_iterations=1000)
    s = ClusterSnapshot(10.0, (long, short, whole), (4, 4), 2, arrived=(long, short, whole),
                        windows=((0, 100.0, 400.0),))
    bf = create("backfill")
    d = bf.decide(s)
    assert d.run == {0: ((1, 2),), 1: ((0, 2),)}, d.run
    assert bf.reserved == [(2, 400.0, ((0, 4),))]  # node 0 after its maintenance (node 1 is busy until 1010)
    # without the window the first two share node 0, and the 4-GPU job starts at once on node 1
    d = bf.decide(ClusterSnapshot(10.0, (long, short, whole), (4, 4), 2, arrived=(long, short, whole)))
    assert d.run == {0: ((0, 2),), 1: ((0, 2),), 2: ((1, 4),)} and bf.reserved == [], d.run


def test_an_elastic_job_starts_at_the_most_workers_that_fit_now_down_to_its_least():
    # 1 node of 8: job 0 runs on 5 GPUs until 1010; elastic job 1 (2..8 workers, 800 s of work at 8)
    # starts now on the 3 free (Slurm's --nodes=MIN-MAX), not at 8 at 1010; job 2 (elastic, 4..8)
    # cannot start now: it is reserved at its least, 4, when job 0 ends
    from elastictrain.policies.api import ClusterSnapshot, JobView

    run = JobView(0, 5, 0.0, iterations=1000, remaining_iterations=1000, running=True, placement=((0, 5),))
    flex = JobView(1, 8, 1.0, iterations=800, remaining_iterations=800, min_gpu=2, max_gpu=8)
    wide = JobView(2, 8, 2.0, iterations=100, remaining_iterations=100, min_gpu=4, max_gpu=8)
    bf = create("backfill")
    d = bf.decide(ClusterSnapshot(10.0, (run, flex, wide), (8,), 1, arrived=(flex, wide), running=(run,)))
    assert d.run == {0: ((0, 5),), 1: ((0, 3),)} and d.workers == {1: 3}, (d.run, d.workers)
    # at 3 of its 8 workers it takes 8/3 as long: about 2133 s; job 2's 4 GPUs are free at 1010
    assert bf.reserved == [(2, 1010.0, ((0, 4),))], bf.reserved
    fixed = JobView(1, 8, 1.0, iterations=800, remaining_iterations=800)  # the same job, not elastic: it waits
    d = bf.decide(ClusterSnapshot(10.0, (run, fixed), (8,), 1, arrived=(fixed,), running=(run,)))
    assert d.run == {0: ((0, 5),)} and not d.workers and bf.reserved == [(1, 1010.0, ((0, 8),))]


def test_idle_gpus_grow_a_running_elastic_job_where_no_reservation_moves():
    # 1 node of 8: rigid job 0 holds 4 until 100; elastic job 1 (2..8) runs on 2, 1000 s left; job 2
    # waits. Needing 6, it is reserved at 100 on job 0's 4 and the 2 idle: job 1 would hold them past
    # 100, so it does not grow. Needing 4, it is reserved at 100 on job 0's 4: job 1 grows onto the 2
    # idle (it holds them until it would have ended on 2: more workers never make it slower).
    from elastictrain.policies.api import ClusterSnapshot, JobView

    rigid = JobView(0, 4, 0.0, iterations=90, remaining_iterations=90, running=True, placement=((0, 4),))
    flex = JobView(1, 2, 1.0, iterations=1000, remaining_iterations=1000, running=True, placement=((0, 2),),
                   min_gpu=2, max_gpu=8)
    for need, grown in ((6, False), (4, True)):
        wide = JobView(2, need, 2.0, iterations=100, remaining_iterations=100)
        bf = create("backfill", grow=True)
        d = bf.decide(ClusterSnapshot(10.0, (rigid, flex, wide), (8,), 1, arrived=(wide,), running=(rigid, flex)))
        assert bf.reserved == [(2, 100.0, ((0, need),))], (need, bf.reserved)
        if grown:
            assert d.workers == {1: 4} and d.run[1] == ((0, 4),) and d.run[0] == ((0, 4),), d
            assert [n for n in d.notes if n[0] == 1 and n[1]["decision"] == "grow"], d.notes
        else:
            assert not d.workers and d.run == {0: ((0, 4),), 1: ((0, 2),)}, d
    # nothing waits: it grows to its most (8) once job 0 has ended, not while it is still starting
    flex = JobView(1, 2, 1.0, iterations=1000, remaining_iterations=1000, running=True, placement=((0, 2),),
                   min_gpu=2, max_gpu=8)
    d = create("backfill", grow=True).decide(ClusterSnapshot(200.0, (flex,), (8,), 1, running=(flex,)))
    assert d.workers == {1: 8} and d.run == {1: ((0, 8),)}, d
    starting = JobView(1, 2, 1.0, iterations=1000, remaining_iterations=1000, running=True, placement=((0, 2),),
                       min_gpu=2, max_gpu=8, starting=True)

    def grows(view, **kw):
        return create("backfill", **kw).decide(ClusterSnapshot(200.0, (view,), (8,), 1, running=(view,))).workers

    assert not grows(starting, grow=True)
    assert not grows(flex)  # (off by default, as in Slurm)
    # its work left assumed (live: no --steps/--epochs, the rest of its --time): more workers shorten nothing known
    assumed = JobView(1, 2, 1.0, iterations=1000, remaining_iterations=1000, running=True, placement=((0, 2),),
                      min_gpu=2, max_gpu=8, work_known=False)
    assert not grows(assumed, grow=True)
    # near its end a resize (a restart) does not pay: 12 s left at 2; on 8, 3 s after a 10 s restart
    near = JobView(1, 2, 1.0, iterations=1000, remaining_iterations=12, running=True, placement=((0, 2),),
                   min_gpu=2, max_gpu=8, restart_cost=10.0)
    assert not grows(near, grow=True)
    with pytest.raises(ConfigError, match="grow must be true or false"):
        create("backfill", grow="no")


@pytest.mark.parametrize("seed", range(3))
def test_in_the_simulator_grown_jobs_delay_no_reservation_and_the_trace_ends_sooner(seed):
    # elastic jobs (1..8 workers, linear scaling) among rigid ones: every head of the queue starts no
    # later than the reservation it got there, as without growing, and the GPUs left idle shorten the
    # whole trace (by 1-20% on these; the mean JCT by 0-5%)
    def make(i, t, rng):
        if rng.random() < 0.4:
            return JobSpec(i, 4, t, rng.choice([300, 900, 3000]), 1.0, min_gpu=1, max_gpu=8)
        return JobSpec(i, rng.choice([1, 2, 4, 8]), t, rng.choice([60, 300, 900]), 1.0)

    jobs = arrivals(seed, 150, 60, make)
    out = {}
    for grow in (True, False):
        r, heads, late = late_heads(jobs, create("backfill", grow=grow), ClusterSpec(1, 2, 8), restart_cost=5.0)
        assert len(r.jobs) == len(jobs) and heads > 10 and not late, (grow, late)
        out[grow] = (r.makespan, sum(j.resizes for j in r.jobs))
    assert out[True][1] > 0 and out[False][1] == 0, out
    assert out[True][0] < out[False][0], out


@pytest.mark.parametrize("grow", (False, True))
def test_jobs_that_scale_less_than_linearly_delay_no_reservation(grow):
    # elastic jobs asking for 2 workers (1..8) with a serial fraction of 0.3 among big rigid ones: a start
    # on more workers than asked, or a growth, is never estimated shorter than the job's time at its size
    # now (with a linear estimate a start on 8 took a quarter of it, and heads of the queue started late)
    def make(i, t, rng):
        if rng.random() < 0.5:
            return JobSpec(i, 2, t, rng.choice([600, 1800, 3600]), 1.0, min_gpu=1, max_gpu=8, serial=0.3)
        return JobSpec(i, rng.choice([4, 8, 16]), t, rng.choice([60, 600]), 1.0)

    jobs = arrivals(11, 200, 90, make)
    _, heads, late = late_heads(jobs, create("backfill", grow=grow), ClusterSpec(1, 2, 8), restart_cost=5.0)
    assert heads > 20 and not late, late


def test_in_the_simulator_a_planned_maintenance_preempts_nothing_under_backfill():
    rng = random.Random(3)
    jobs, t = [], 0.0
    for i in range(80):
        t += rng.expovariate(1 / 60)
        jobs.append(JobSpec(i, rng.choice([1, 2, 4]), round(t, 3), rng.choice([60, 300, 1200]), 1.0))
    windows = ((0, 1000.0, 1500.0), (3, 2500.0, 4000.0))
    surprise = Simulator(jobs, ClusterSpec(1, 4, 4), create("backfill"), outages=windows).run()
    planned = Simulator(jobs, ClusterSpec(1, 4, 4), create("backfill"), planned=windows).run()
    fifo = Simulator(jobs, ClusterSpec(1, 4, 4), create("fifo-be"), planned=windows).run()
    assert surprise.extra["outage_preemptions"] > 0 and fifo.extra["outage_preemptions"] > 0
    assert planned.extra["outage_preemptions"] == 0
    assert len(planned.jobs) == len(jobs)
    with pytest.raises(ConfigError, match="overlap"):
        Simulator(jobs, ClusterSpec(1, 4, 4), create("backfill"), outages=((0, 1200.0, 1300.0),), planned=windows)


def test_under_priority_tiers_each_tier_plans_around_the_maintenance_too():
    from elastictrain.policies.api import ClusterSnapshot, JobView
    from elastictrain.policies.tiers import PriorityTiers

    high = JobView(0, 2, 0.0, iterations=1000, remaining_iterations=1000, priority=5)
    low = JobView(1, 2, 1.0, iterations=1000, remaining_iterations=1000)
    pol = PriorityTiers(lambda: create("backfill"))
    s = ClusterSnapshot(10.0, (high, low), (4, 4), 2, arrived=(high, low), windows=((0, 100.0, 400.0),))
    d = pol.decide(s)
    assert d.run == {0: ((1, 2),), 1: ((1, 2),)}, d.run  # both kept off node 0, whose window comes first
