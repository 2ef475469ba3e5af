"""The auto-scaling plan maker as a pure policy: sample, optimize, adjust."""

import pytest

from elastictrain.errors import ConfigError
from elastictrain.policies import create
from elastictrain.policies.api import ClusterSnapshot, JobView
from elastictrain.policies.autoscale import AutoScale, marginal_efficiency

# samples/s of a CPU-bound job on a 2-core machine by worker count: the third worker does not pay
RATES = {1: 100.0, 2: 180.0, 3: 190.0, 4: 170.0}


class Loop:
    """Drives the policy as the coordinator does: a job restarts at the size decided, and its rate
    is measured once it has trained ``rate_window`` seconds at that size."""

    def __init__(self, policy: AutoScale, rates=RATES, lo: int = 1, hi: int = 4, gpus: int = 4, name: str = "train"):
        self.p, self.rates, self.lo, self.hi, self.gpus, self.name = policy, dict(rates), lo, hi, gpus, name
        self.now, self.size, self.since, self.running = 0.0, 0, 0.0, False
        self.sizes, self.notes = [], []

    def view(self) -> JobView:
        measured = self.running and self.now - self.since >= self.p.rate_window
        return JobView("j1", self.size or self.lo, 0.0, model=self.name, running=self.running,
                       placement=((0, self.size),) if self.running else (), min_gpu=self.lo, max_gpu=self.hi,
                       rate=self.rates[self.size] if measured else 0.0,
                       rate_window=min(self.now - self.since, self.p.rate_window) if self.running else 0.0)

    def step(self, dt: float = 1.0, ended: tuple = ()) -> None:
        v = self.view()
        snap = ClusterSnapshot(self.now, (v,) if not ended else (), (self.gpus,), 1,
                               running=(v,) if self.running and not ended else (), ended=ended)
        d = self.p.decide(snap)
        self.notes += [n for _, n in d.notes]
        if not ended and "j1" in d.run:
            size = d.workers.get("j1", v.num_gpu)
            assert sum(g for _, g in d.run["j1"]) == size
            if size != self.size or not self.running:
                self.size, self.since, self.running = size, self.now, True  # a restart at the new size
                self.sizes.append(size)
        self.now += dt

    def until_settled(self, limit: float = 600.0) -> None:
        while self.now < limit and not (self.notes and self.notes[-1]["decision"] == "settle"
                                        and self.size == self.notes[-1]["workers"]):
            self.step()


def test_marginal_efficiency():
    assert marginal_efficiency(1, 100.0, 2, 200.0) == pytest.approx(1.0)  # linear
    assert marginal_efficiency(2, 180.0, 3, 190.0) == pytest.approx(10 / 90)
    assert marginal_efficiency(3, 190.0, 2, 180.0) == pytest.approx(10 / 90)  # either direction
    with pytest.raises(ConfigError):
        marginal_efficiency(2, 0.0, 3, 1.0)


def test_grows_while_a_step_pays_then_settles_where_the_next_stops_paying():
    loop = Loop(AutoScale(threshold=0.3, rate_window=10))
    loop.until_settled()
    assert loop.size == 2 and loop.sizes == [1, 2, 3, 2]
    last = loop.notes[-1]
    assert last["decision"] == "settle" and last["from_workers"] == 2 and last["marginal_efficiency"] < 0.3
    assert [n["decision"] for n in loop.notes] == ["resize", "resize", "settle"]


def test_linear_scaling_grows_to_the_maximum_and_a_low_threshold_keeps_the_third_worker():
    loop = Loop(AutoScale(rate_window=5), rates={1: 100, 2: 200, 3: 300, 4: 400})
    loop.until_settled()
    assert loop.size == 4
    loop = Loop(AutoScale(threshold=0.1, rate_window=5))
    loop.until_settled()
    assert loop.size == 3


def test_a_drop_in_throughput_is_checked_by_shrinking_and_the_smaller_size_kept_if_the_step_no_longer_pays():
    loop = Loop(AutoScale(rate_window=5, cooldown=0))
    loop.until_settled()
    assert loop.size == 2
    for _ in range(20):  # settled: nothing changes while the rate holds
        loop.step()
    assert loop.sizes == [1, 2, 3, 2]
    loop.rates[2] = 110.0  # a dip shorter than the window is noise: nothing changes
    for _ in range(3):
        loop.step()
    loop.rates[2] = 180.0
    for _ in range(10):
        loop.step()
    assert loop.sizes == [1, 2, 3, 2]
    loop.rates[2] = 110.0  # contention: 2 workers now barely beat 1 (100), for good
    for _ in range(60):
        loop.step()
    assert loop.size == 1 and loop.notes[-1]["decision"] == "settle"
    assert "fell" in loop.notes[-2]["why"]


def test_a_settled_size_is_not_checked_again_within_the_cooldown():
    # seen live: 7 runs in 3 minutes around a settled size, on a rate that swung with the machine's load
    def swings(cooldown):
        loop = Loop(AutoScale(rate_window=5, cooldown=cooldown))
        loop.until_settled()
        settled, runs = loop.now, len(loop.sizes)
        while loop.now < settled + 180:  # 3 minutes of a rate swinging 40% for 7 s at a time
            loop.rates[2] = 110.0 if int(loop.now - settled) // 7 % 2 == 0 else 180.0
            loop.step()
        return len(loop.sizes) - runs, loop

    extra, _ = swings(cooldown=0)
    assert extra >= 1  # the swing sets off a check: a restart at another size
    extra, loop = swings(cooldown=300)
    assert extra == 0 and loop.size == 2
    loop.rates[2] = 110.0  # a drop that lasts past the cooldown is checked
    for _ in range(200):
        loop.step()
    assert loop.size == 1 and "fell" in loop.notes[-2]["why"]
    with pytest.raises(ConfigError, match="cooldown"):
        AutoScale(cooldown=-1)


def test_the_size_a_script_settled_at_is_where_its_next_job_starts():
    p = AutoScale(rate_window=5)
    loop = Loop(p)
    loop.until_settled()
    loop.step(ended=("j1",))
    assert p.history == {"train": 2}
    again = Loop(p)
    again.step()
    assert again.sizes == [2]
    assert AutoScale().export_state() == {"history": {}, "memory_history": {}}
    q = AutoScale()
    q.import_state(p.export_state(), [])
    assert q.history == {"train": 2}


def test_no_free_worker_means_no_growth_and_rigid_jobs_run_at_their_size():
    loop = Loop(AutoScale(rate_window=5), gpus=1)
    loop.until_settled(limit=100)
    assert loop.sizes == [1] and loop.notes[-1]["decision"] == "settle"
    rigid = JobView("r", 2, 0.0)
    d = AutoScale().decide(ClusterSnapshot(0.0, (rigid,), (4,), 1))
    assert d.run == {"r": ((-1, 2),)} and d.workers == {}


@pytest.mark.parametrize("bad", [{"threshold": 0}, {"threshold": 1.5}, {"rate_window": 0.5}, {"drop": 1.0},
                                 {"step": 0}, {"yield_threshold": 1.5}, {"nope": 1}])
def test_bad_options_are_refused(bad):
    with pytest.raises(ConfigError):
        create("autoscale", **bad)


def test_a_settled_job_yields_its_least_efficient_step_to_a_waiting_job():
    # 1 -> 2 workers adds 40% of an average worker: it pays (>= 0.3) but is worth less than a
    # waiting job's first worker (yield_threshold 0.7)
    p = AutoScale(rate_window=5)
    loop = Loop(p, rates={1: 100.0, 2: 140.0, 3: 145.0, 4: 150.0}, gpus=2)
    loop.until_settled()
    assert loop.size == 2 and loop.notes[-1]["decision"] == "settle"
    a = loop.view()
    waiter = JobView("w", 1, loop.now)
    d = p.decide(ClusterSnapshot(loop.now, (a, waiter), (2,), 1, running=(a,)))
    assert d.workers["j1"] == 1 and d.run["w"] == ((-1, 1),)
    (note,) = [n for _, n in d.notes]
    assert note["decision"] == "yield" and note["marginal_efficiency"] == pytest.approx(0.4)
    # a step worth more than the bar is kept: the waiting job waits
    q = AutoScale(rate_window=5, yield_threshold=0.3)
    loop = Loop(q, rates={1: 100.0, 2: 140.0, 3: 145.0, 4: 150.0}, gpus=2)
    loop.until_settled()
    d = q.decide(ClusterSnapshot(loop.now, (loop.view(), waiter), (2,), 1, running=(loop.view(),)))
    assert "w" not in d.run and "j1" not in d.workers


def _memory_decision(p, peak, now=0.0, ended=()):
    v = JobView("m1", 1, 0.0, model="big", running=not ended, placement=((0, 1),) if not ended else (),
                peak_memory=peak)
    snap = ClusterSnapshot(now, (v,) if not ended else (), (4,), 1, running=(v,) if not ended else (), ended=ended)
    return p.decide(snap)


def test_per_worker_memory_limits_follow_the_measured_peak():
    p = AutoScale()
    d = _memory_decision(p, 0.0)
    assert d.limits == {} and not [n for _, n in d.notes if n["decision"] == "memory"]  # nothing measured yet
    d = _memory_decision(p, 300 * 2**20)  # 300 MiB resident: 2x is under the 1 GiB floor
    assert d.limits == {"m1": 1 << 30}
    note = [n for _, n in d.notes if n["decision"] == "memory"][0]
    assert note["peak_rss"] == 300 * 2**20 and note["memory_limit"] == 1 << 30 and note["was"] == 0
    d = _memory_decision(p, 560 * 2**20)  # 1120 MiB wanted: within a quarter of 1 GiB, kept (no churn)
    assert d.limits == {"m1": 1 << 30} and not d.notes
    d = _memory_decision(p, 1500 * 2**20)  # 3000 MiB wanted: changed, rounded up to 64 MiB
    assert d.limits == {"m1": 3008 * 2**20}
    _memory_decision(p, 0.0, ended=("m1",))
    assert p.memory_history == {"big": 3008 * 2**20} and p.export_state()["memory_history"] == p.memory_history
    assert _memory_decision(p, 0.0).limits == {"m1": 3008 * 2**20}  # its name's next job starts with it
    assert _memory_decision(AutoScale(memory_headroom=0), 2**30).limits == {}  # 0: no limits
    with pytest.raises(ConfigError, match="memory_headroom"):
        AutoScale(memory_headroom=0.5)
