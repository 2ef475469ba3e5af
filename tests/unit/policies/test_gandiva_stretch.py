"""Gandiva-fair's stretched quanta (``stretch``, a simulator speed option): the decision at an
arrival or an end spans one quantum, the later ones ``stretch`` quanta while nothing arrives or
ends; an arrival or an end cuts a stretched quantum short and gives back the strides not used;
ticket shares hold as with one decision per quantum."""

import pytest

from elastictrain.errors import ConfigError
from elastictrain.model import JobSpec
from elastictrain.policies import create
from elastictrain.sim.cluster import ClusterSpec
from elastictrain.sim.engine import Simulator

from .test_gandiva_fair import Recorder


class Wakes(Recorder):
    """Also records each decision's wake-up time."""

    def __init__(self, inner):
        super().__init__(inner)
        self.wakes = []

    def decide(self, s):
        d = super().decide(s)
        self.wakes.append((s.now, d.wakeup))
        return d


def shares(stretch, horizon_jobs=16, length=10_000):
    jobs = [JobSpec(i, 1, 0.0, length, 1.0, user="light" if i % 2 else "heavy") for i in range(horizon_jobs)]
    rec = Wakes(create("gandiva-fair", tickets={"light": 1, "heavy": 3}, quantum=60, stretch=stretch))
    result = Simulator(jobs, ClusterSpec(1, 1, 4), rec).run()
    return rec, result


def test_quiet_quanta_span_stretch_quanta_and_shares_still_follow_tickets():
    rec, result = shares(16, length=100_000)
    spans = [round(w - t) for t, w in rec.wakes[:5] if w is not None]
    assert spans == [60, 960, 960, 960, 960], rec.wakes[:5]  # one quantum at the arrivals, then 16
    exact, exact_result = shares(1, length=100_000)
    assert len(rec.samples) < len(exact.samples) / 5  # far fewer decisions
    # 16-quantum slices of 4 of the 16 jobs: a user's share swings within a cycle of slices (about
    # 10% at a given instant); over time it follows the tickets, 3:1
    ratios = [(t, p["heavy"] / p["light"]) for t, p, n in rec.samples if n == 16 and t > 60_000]
    assert len(ratios) > 100 and ratios[-1][0] > 250_000
    mean = sum(r for _, r in ratios) / len(ratios)
    assert abs(mean - 3.0) / 3.0 < 0.05, mean
    assert abs(ratios[-1][1] - 3.0) / 3.0 < 0.05, ratios[-1]
    # the same work is done; the jobs' mean completion moves by little
    mean = sum(j.jct for j in result.jobs) / len(result.jobs)
    exact_mean = sum(j.jct for j in exact_result.jobs) / len(exact_result.jobs)
    assert abs(mean / exact_mean - 1) < 0.05, (mean, exact_mean)


def test_stretch_one_is_the_exact_schedule():
    a, _ = shares(1)
    b = Wakes(create("gandiva-fair", tickets={"light": 1, "heavy": 3}, quantum=60))
    jobs = [JobSpec(i, 1, 0.0, 10_000, 1.0, user="light" if i % 2 else "heavy") for i in range(16)]
    Simulator(jobs, ClusterSpec(1, 1, 4), b).run()
    assert a.wakes == b.wakes and a.samples == b.samples


class PassCheck(Wakes):
    """At each decision, after the policy: pass x tickets x quantum of every job there from the
    start equals the GPU-seconds it ran, plus the quantum just granted if it was scheduled."""

    def __init__(self, inner, old):
        super().__init__(inner)
        self.old, self.checked, self.ran_in_cut = old, [], set()

    def decide(self, s):
        d = super().decide(s)
        if s.now < 1000.0:
            self.ran_in_cut = set(d.run)
        if s.now != self.inner._qstart:  # not a quantum: nothing charged
            return d
        for j in s.jobs:
            if j.job_id in self.old:
                sj = self.inner._jobs[j.job_id]
                granted = (self.inner._next - s.now) if j.job_id in d.run else 0.0
                self.checked.append((s.now, j.job_id, sj.pass_ * sj.tickets * 60, j.attained_gpu + granted))
        return d


def test_an_arrival_cuts_a_stretched_quantum_and_unused_strides_are_given_back():
    # one GPU; from t=0 two jobs of user u and one of v (one runs per quantum); v's second job
    # arrives at t=1000 (u's tickets do not change with it, so u's passes count its GPU time)
    jobs = [JobSpec(0, 1, 0.0, 50_000, 1.0, user="v"), JobSpec(1, 1, 0.0, 50_000, 1.0, user="u"),
            JobSpec(2, 1, 0.0, 50_000, 1.0, user="u"), JobSpec(3, 1, 1000.0, 50_000, 1.0, user="v")]
    rec = PassCheck(create("gandiva-fair", quantum=60, stretch=64, compensate=0), old={1, 2})
    Simulator(jobs, ClusterSpec(1, 1, 1), rec).run()
    before = [(t, w) for t, w in rec.wakes if t < 1000.0]
    assert before[-1][1] > 1000.0, rec.wakes[:8]  # the stretched quantum was planned past the arrival
    assert rec.ran_in_cut & {1, 2}, rec.wakes[:8]  # ... and ran one of u's jobs
    at = [(t, w) for t, w in rec.wakes if t == 1000.0]
    assert at == [(1000.0, 1060.0)], rec.wakes[:8]  # cut: a fresh one-quantum decision at the arrival
    # strides charged == time run (+ the grant), before and after the cut: the unused part was given back
    upto = [c for c in rec.checked if c[0] <= 1000.0]
    assert len(upto) >= 6  # jobs 1 and 2 at t=0, 60 (the stretched quantum) and 1000 (the cut)
    for t, jid, charged, ran in upto:
        assert charged == pytest.approx(ran, abs=1e-6), (t, jid, charged, ran)


@pytest.mark.parametrize("bad", [0, -1, 4097, 2.5, True, "8"])
def test_stretch_is_validated(bad):
    with pytest.raises(ConfigError, match="stretch must be a whole number of quanta from 1 to 4096"):
        create("gandiva-fair", stretch=bad)


def test_stretch_is_for_split_stride_only():
    with pytest.raises(ConfigError, match="split stride only"):
        create("gandiva-fair", split=False, stretch=4)


def test_simulate_is_told_when_an_exact_replay_needs_millions_of_quanta(tmp_path, capsys):
    from elastictrain.sim.run import SimConfig, simulate

    exact = create("gandiva-fair")
    assert exact.replay_hint(3600.0 * 24 * 30) is None  # a month: 43,200 quanta
    note = exact.replay_hint(86.4e6)  # 1,000 days: 1.44 million quanta
    assert "1,440,000 quanta" in note and "--stretch 64" in note
    assert create("gandiva-fair", stretch=64).replay_hint(86.4e6) is None
    assert create("gandiva-fair-global").replay_hint(86.4e6) is None  # --stretch is not for it
    # simulate prints it before the run (two jobs 1,000 days apart finish at once: nothing waits)
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,num_gpu,submit_time,iterations,iteration_time\n0,1,0,10,1\n1,1,86400000,10,1\n")
    simulate(SimConfig(str(trace), "n1g4", ["gandiva-fair"]), progress=True)
    assert "note: gandiva-fair decides every 60 s quantum" in capsys.readouterr().err
