"""Gang-aware stride against the worked examples of the Gandiva-fair slides (EuroSys 2020, slides 7-8),
and ticket shares honoured over time in the simulator."""

import math
import os

import pytest

from elastictrain.model import JobSpec
from elastictrain.policies import create
from elastictrain.policies.gandiva_fair import StrideJob, gang_stride
from elastictrain.sim.cluster import ClusterSpec
from elastictrain.sim.engine import Simulator


def table(queue, gpus, quanta):
    rows = []
    for _ in range(quanta):
        passes = [j.pass_ for j in sorted(queue, key=lambda j: j.job_id)]
        rows.append((passes, sorted(gang_stride(queue, gpus))))
    return rows


def test_single_gpu_stride_table():
    # A has 4 tickets, B 1; one GPU. (The slide's tie at t=0 and t=5 goes to B: B is first in the queue.)
    a, b = StrideJob(0, 1, 4), StrideJob(1, 1, 1)
    rows = table([b, a], 1, 9)
    assert [r[0] for r in rows] == [[0, 0], [0, 1], [.25, 1], [.5, 1], [.75, 1], [1, 1], [1, 2], [1.25, 2],
                                    [1.5, 2]]
    assert [r[1] for r in rows] == [[1], [0], [0], [0], [0], [1], [0], [0], [0]]


def test_gang_aware_stride_table():
    # A, B: 1 GPU; C, D: 2 GPUs; E: 4 GPUs; one ticket each; 4 GPUs. Queue order as on the slide (E first).
    a, b, c, d, e = (StrideJob(i, size, 1) for i, size in enumerate([1, 1, 2, 2, 4]))
    rows = table([e, a, b, c, d], 4, 9)
    A, B, C, D, E = range(5)
    assert [r[0] for r in rows] == [[0, 0, 0, 0, 0], [0, 0, 0, 0, 4], [1, 1, 2, 0, 4], [2, 2, 2, 2, 4],
                                    [3, 3, 4, 2, 4], [4, 4, 4, 4, 4], [4, 4, 4, 4, 8], [5, 5, 6, 4, 8],
                                    [6, 6, 6, 6, 8]]
    assert [r[1] for r in rows] == [[E], [A, B, C], [A, B, D], [A, B, C], [A, B, D], [E], [A, B, C], [A, B, D],
                                    [A, B, C]]


class Recorder:
    """Wraps a policy and records each user's attained GPU-seconds at every decision."""

    def __init__(self, inner):
        self.inner, self.name, self.samples = inner, inner.name, []

    def decide(self, s):
        per_user = {}
        for j in s.jobs:
            per_user[j.user] = per_user.get(j.user, 0.0) + j.attained_gpu
        self.samples.append((s.now, per_user, len(s.jobs)))
        return self.inner.decide(s)


def test_tickets_are_honoured_over_time():
    # two users with 1:3 tickets, each with eight 1-GPU jobs of 10,000 s, on 4 GPUs
    jobs = [JobSpec(i, 1, 0.0, 10_000, 1.0, user="light" if i % 2 else "heavy") for i in range(16)]
    rec = Recorder(create("gandiva-fair", tickets={"light": 1, "heavy": 3}, quantum=60))
    Simulator(jobs, ClusterSpec(1, 1, 4), rec).run()
    # while every job is still there (both users backlogged), shares follow the tickets
    t, per_user, n = [x for x in rec.samples if x[2] == 16][-1]
    assert t > 20_000
    ratio = per_user["heavy"] / per_user["light"]
    assert abs(ratio - 3.0) / 3.0 < 0.05, ratio


def test_homogeneous_experiment_every_class_within_10_percent():
    import os

    from elastictrain.sim.fairness import homogeneous

    trace = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data",
                         "60_job.csv")
    r = homogeneous(trace, hours=6)
    assert set(r.share_by_class) == {1, 2, 4, 8}
    for g, share in r.share_by_class.items():
        assert abs(share - 1) < 0.10, (g, share)
    assert r.utilization > 0.95


def test_second_price_trade_of_the_slides():
    # U1 runs SuperResolution (1.2x faster on a V100 than a K80), U2 ResNeXt (6x), U3 something at 2x:
    # U2 buys U1's V100 time at p = 2 K80s per V100, the next-best bid below its own
    from elastictrain.policies.gandiva_fair import throughput, trade

    speed = {"U1": {"v100": 1.2, "k80": 1.0}, "U2": {"v100": 6.0, "k80": 1.0}, "U3": {"v100": 2.0, "k80": 1.0}}
    alloc = {"U1": {"v100": 1.0, "k80": 0.0}, "U2": {"v100": 0.0, "k80": 4.0}, "U3": {"v100": 0.0, "k80": 0.0}}
    before = throughput(alloc, speed)
    trades = trade(alloc, speed, "v100", "k80")
    assert [(t.seller, t.buyer, t.price) for t in trades] == [("U1", "U2", 2.0)]
    after = throughput(alloc, speed)
    assert after["U1"] > before["U1"] and after["U2"] > before["U2"] and after["U3"] == before["U3"]


def test_trading_never_lowers_anyones_throughput():
    import random

    from elastictrain.policies.gandiva_fair import throughput, trade

    rng = random.Random(5)
    for _ in range(50):
        users = [f"u{i}" for i in range(rng.randint(2, 6))]
        speed = {u: {"k80": 1.0, "v100": rng.uniform(0.5, 10)} for u in users}
        alloc = {u: {"k80": rng.uniform(0, 10), "v100": rng.uniform(0, 3)} for u in users}
        before = throughput(alloc, speed)
        totals = {t: sum(a[t] for a in alloc.values()) for t in ("v100", "k80")}
        for t in trade(alloc, speed, "v100", "k80", unit=0.5):
            # per trade: the seller gets at least what the fast GPUs were worth to it, the buyer more
            assert t.price * speed[t.seller]["k80"] >= speed[t.seller]["v100"] - 1e-9
            assert speed[t.buyer]["v100"] > t.price * speed[t.buyer]["k80"]
        after = throughput(alloc, speed)
        assert all(after[u] >= before[u] - 1e-9 for u in users)
        for t, total in totals.items():  # GPUs change hands, none appear or vanish
            assert abs(sum(a[t] for a in alloc.values()) - total) < 1e-9
        assert sum(after.values()) >= sum(before.values()) - 1e-9


GAVEL_SUBSET = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data",
                            "gavel_throughputs_subset.json")


def test_heterogeneous_experiment_trading_helps_the_extremes_and_hurts_nobody():
    """The slides' cluster (12 V100, 24 P100, 128 K80) and 4 users, through the event engine:
    trading against the heterogeneity-agnostic fair share on the same jobs."""
    from elastictrain.sim.fairness import heterogeneous

    r = heterogeneous(GAVEL_SUBSET, hours=4, jobs_per_user=30)
    assert r.trades > 0
    assert all(g >= -0.01 for g in r.gain.values()), r.gain  # nobody is worse off (1% noise)
    assert r.gain["user1"] > 0.2  # the highest-speedup user gains the most ...
    assert r.gain["user1"] == max(r.gain.values())
    assert r.gain["user4"] > 0.05  # ... and the lowest-speedup one, who sold fast GPUs above its own bid
    assert r.total_gain > 0.05


def test_split_stride_runs_multi_server_jobs_centrally_and_keeps_shares():
    """Two users on 4 servers of 4 GPUs: one with 8-GPU jobs (span 2 servers: central stride),
    one with 1-GPU jobs (local strides); equal tickets give each half of the GPU time."""
    jobs = [JobSpec(i, 8, 0.0, 1e9, 1.0, user="big") for i in range(3)]
    jobs += [JobSpec(10 + i, 1, 0.0, 1e9, 1.0, user="small") for i in range(24)]
    policy = create("gandiva-fair", quantum=60)
    r = Simulator(jobs, ClusterSpec(1, 4, 4), policy, until=6 * 3600).run()
    service = r.extra["service_by_user"]
    total = sum(service.values())
    assert total > 0.97 * 16 * 6 * 3600  # work conserving
    assert abs(service["big"] / total - 0.5) < 0.05, service
    assert all(policy._jobs[j.job_id].home is None for j in jobs[:3])  # the 8-GPU gangs are central


def test_a_server_a_big_job_takes_in_part_lends_the_rest():
    """A 6-GPU gang on two servers of 4 takes one whole and half the other when it runs; the other
    half goes to that server's own 1-GPU residents for the quantum (they keep running where they
    are), so no GPU idles while jobs wait. (Before, the half stayed idle: 86% utilization.)"""
    jobs = [JobSpec(0, 6, 0.0, 1e9, 1.0, user="big")]
    jobs += [JobSpec(1 + i, 1, 0.0, 1e9, 1.0, user="small") for i in range(8)]
    hours = 6
    r = Simulator(jobs, ClusterSpec(1, 2, 4), create("gandiva-fair", quantum=60), until=hours * 3600).run()
    service = r.extra["service_by_user"]
    assert sum(service.values()) > 0.999 * 8 * hours * 3600, service
    assert service["big"] > 0.4 * sum(service.values())  # the gang still gets its turns


@pytest.mark.parametrize("restart_cost", [5.0, 20.0])
def test_deciding_at_first_steps_changes_no_result(restart_cost):
    """With every idle GPU used at the quantum, a decision between quanta (a run's first step,
    a live round) finds nothing to start and leaves usage and tickets alone, so skipping those
    decisions in the simulator (``first_step_events = False``) gives the same schedule. Before,
    it started residents in the holes a big job left, and the results depended on it."""
    def run(first_steps):
        pol = create("gandiva-fair", quantum=60)
        pol.first_step_events = first_steps
        jobs = [JobSpec(0, 6, 0.0, 20_000, 1.0, user="big")]
        jobs += [JobSpec(1 + i, 1, 100.0 * i, 3000 + 1000 * i, 1.0, user="small") for i in range(8)]
        r = Simulator(jobs, ClusterSpec(1, 2, 4), pol, restart_cost=restart_cost).run()
        return r, sorted((j.job_id, j.end_time, j.preemptions) for j in r.jobs)

    (every, a), (skipped, b) = run(True), run(False)
    assert [(k, p) for k, _, p in a] == [(k, p) for k, _, p in b]
    for (k, t1, _), (_, t2, _) in zip(a, b):
        assert t2 == pytest.approx(t1, rel=1e-9, abs=1e-6), f"job {k}"
    assert skipped.events < every.events


def test_load_balancing_migrates_to_the_least_loaded_server_and_the_engine_charges_it():
    # arriving together in the order long, short, short, ... the long jobs all get server 0 as
    # home (ties go to the lowest server); once the short ones end, servers 1 and 2 are empty and
    # the long ones must be spread out by migration, each move charged 30 s by the engine
    jobs = [JobSpec(i, 2, 0.0, 1e9 if i % 3 == 0 else 300, 1.0, user="x") for i in range(12)]
    policy = create("gandiva-fair", quantum=60)
    r = Simulator(jobs, ClusterSpec(1, 3, 4), policy, until=3 * 3600, migration_cost=30.0).run()
    longs = [i for i in range(12) if i % 3 == 0]
    assert [j.job_id for j in r.jobs] == [i for i in range(12) if i % 3]  # the short ones ended
    homes = sorted(policy._jobs[i].home for i in longs)
    assert homes in ([0, 0, 1, 2], [0, 1, 1, 2], [0, 1, 2, 2]), homes  # 4 gangs of 2 over 3 servers of 4
    assert policy.moves >= 2  # (waiting jobs move first: moving them costs nothing)
    assert r.restart_seconds >= 30.0 * r.extra["migrations"] - 1e-6


def test_global_stride_migrates_far_more_than_split_stride():
    from elastictrain.sim.fairness import homogeneous

    trace = os.path.join(os.path.dirname(GAVEL_SUBSET), "60_job.csv")
    split = homogeneous(trace, hours=3, policy="gandiva-fair")
    flat = homogeneous(trace, hours=3, policy="gandiva-fair-global")
    assert split.migrations * 3 < flat.migrations, (split.migrations, flat.migrations)
    assert all(abs(v - 1) < 0.1 for v in split.share_by_class.values())


def test_usage_accounting_does_not_depend_on_where_decisions_fall():
    """Compensation tickets correct for decayed usage; deciding in the middle of an interval (a
    run's first step, a live round) must not change it. Summing GPUs x seconds between decisions
    did: what came before the extra decision was decayed less."""
    from elastictrain.policies.api import ClusterSnapshot, JobView

    def usage(times):
        pol = create("gandiva-fair", compensate=600.0)
        a = JobView("a", 4, 0.0, user="u1", running=True, placement=((0, 4),))
        b = JobView("b", 2, 0.0, user="u2", running=True, placement=((1, 2),))
        for t in times:
            pol._account(ClusterSnapshot(t, (a, b), (8, 8), 2, running=(a, b)), ("gpu", "gpu"))
        return pol._usage

    once, split = usage([0.0, 900.0]), usage([0.0, 5.0, 300.0, 301.5, 900.0])
    assert set(once) == set(split) == {("u1", "gpu"), ("u2", "gpu")}
    for k in once:
        assert abs(once[k] - split[k]) <= 1e-9 * once[k], (k, once[k], split[k])
    # and it is the decayed GPU-seconds: 4 GPUs for 900 s at a 600 s half-life
    assert abs(once[("u1", "gpu")] - 4 * 600 / math.log(2) * (1 - 0.5 ** 1.5)) < 1e-6


def test_a_server_down_loses_its_residents_to_the_others_and_gets_them_back():
    """A live node lost or drained offers 0 GPUs: its residents move to the servers up (the
    policy used to divide by its 0 GPUs at every decision, and so never decided again), and once
    it is back the balancing spreads the jobs onto it again."""
    from elastictrain.policies.api import ClusterSnapshot, JobView

    pol = create("gandiva-fair")
    jobs = tuple(JobView(i, 4, 0.0, user=f"u{i % 2}") for i in range(6))
    first = pol.decide(ClusterSnapshot(0.0, jobs, (8, 8, 8), 8, arrived=jobs))
    assert sorted(n for where in first.run.values() for n, _ in where) == [0, 0, 1, 1, 2, 2]
    moves = pol.moves
    for t in (60.0, 120.0, 180.0):
        d = pol.decide(ClusterSnapshot(t, jobs, (8, 0, 8), 8))
        assert len(d.run) == 4 and all(n != 1 for where in d.run.values() for n, _ in where), d.run
        assert all(sj.home in (0, 2) for sj in pol._jobs.values())
    assert pol.moves == moves + 2  # its two residents, once
    ran = set()
    for t in (240.0, 300.0, 360.0):
        d = pol.decide(ClusterSnapshot(t, jobs, (8, 8, 8), 8))
        ran |= {n for where in d.run.values() for n, _ in where}
        assert len(d.run) == 6, d.run
    assert ran == {0, 1, 2}


def test_a_job_arriving_while_no_server_holds_it_waits_and_gets_a_home_later():
    """A gang bigger than every server up now (the others lost or cordoned) used to fail every
    decision ("more than any one GPU type has"); it waits in the central stride, and gets a home
    once a server that holds it is back."""
    from elastictrain.policies.api import ClusterSnapshot, JobView

    pol = create("gandiva-fair")
    small = JobView(0, 2, 0.0, user="a", running=True, placement=((0, 2),))
    big = JobView(1, 4, 1.0, user="b")
    d = pol.decide(ClusterSnapshot(0.0, (small,), (2, 0), 2, arrived=(small,), running=(small,)))
    d = pol.decide(ClusterSnapshot(60.0, (small, big), (2, 0), 2, arrived=(big,), running=(small,)))
    assert 1 not in d.run and pol._jobs[1].home is None
    d = pol.decide(ClusterSnapshot(120.0, (small, big), (8, 8), 2, running=(small,)))
    assert pol._jobs[1].home in (0, 1) and d.run[1] == ((pol._jobs[1].home, 4),), d.run


def test_entitlements_follow_the_gpus_each_type_offers_now():
    """Each user's entitlement is its share of the GPUs each type offers: recomputed when a
    node is lost or back (it was computed again only when the set of users changed)."""
    from elastictrain.policies.api import ClusterSnapshot, JobView

    pol = create("gandiva-fair-notrade")
    jobs = (JobView(0, 1, 0.0, user="a"), JobView(1, 1, 0.0, user="b"))
    pol.decide(ClusterSnapshot(0.0, jobs, (4, 8), 2, arrived=jobs, node_types=("v100", "k80")))
    assert pol.entitlement["a"] == {"v100": 2.0, "k80": 4.0}
    pol.decide(ClusterSnapshot(60.0, jobs, (0, 8), 2, node_types=("v100", "k80")))
    assert pol.entitlement["a"] == {"v100": 0.0, "k80": 4.0}
    pol.decide(ClusterSnapshot(120.0, jobs, (4, 8), 2, node_types=("v100", "k80")))
    assert pol.entitlement["b"] == {"v100": 2.0, "k80": 4.0}


@pytest.mark.parametrize("policy", ["gandiva-fair", "gandiva-fair-global"])
def test_a_restored_instance_decides_as_the_original_would_have(policy):
    """A coordinator restart rebuilds the policy: with its memory exported and imported (as JSON,
    as the coordinator stores it), the new instance decides every later quantum exactly as the
    old one goes on to, arrivals and ends included. Without it, the passes and the usage start
    afresh and the schedule differs (checked too, so the test can fail)."""
    import json

    import msgspec

    from elastictrain.policies.api import ClusterSnapshot, JobView

    users = ("ann", "bob", "cyd")
    sizes = (1, 2, 1, 4, 1, 2, 1, 1, 3, 1, 2, 6)
    jobs = [JobView(f"j{i}", g, 0.0, user=users[i % 3]) for i, g in enumerate(sizes)]
    late = JobView("late", 2, 0.0, user="ann")

    def drive(pols, t0, t1, present, run):
        """Quanta from t0 to t1 for each policy in pols, the same snapshots (as the engine makes
        them from the first one's decisions); returns every decision of each."""
        out = [[] for _ in pols]
        for q, t in enumerate(range(t0, t1, 60)):
            arrived = ()
            if t == 1800:
                present.append(late)
                arrived = (late,)
            ended = ()
            if t == 2400:
                ended = (present.pop(3).job_id,)
            views = tuple(msgspec.structs.replace(j, running=j.job_id in run, placement=run.get(j.job_id, ()))
                          for j in present)
            snap = ClusterSnapshot(float(t), views, (8, 8), 2, arrived=arrived if t else views, ended=ended,
                                   running=tuple(v for v in views if v.running))
            decisions = [p.decide(snap) for p in pols]
            for o, d in zip(out, decisions):
                o.append(sorted(d.run.items()))
            run = dict(decisions[0].run)
        return out, run

    old = create(policy, quantum=60)
    present = list(jobs)
    _, run = drive([old], 0, 1200, present, {})
    state = json.loads(json.dumps(old.export_state()))
    views = [msgspec.structs.replace(j, running=j.job_id in run, placement=run.get(j.job_id, ())) for j in present]
    new, blank = create(policy, quantum=60), create(policy, quantum=60)
    new.import_state(state, views)
    (a, b, c), _ = drive([old, new, blank], 1200, 3600, present, run)
    assert a == b
    assert a != c  # (memory matters: a fresh instance decides otherwise)
