"""The interleaving executor with real torch jobs on CPU."""

import os
import threading
import time

import pytest

torch = pytest.importorskip("torch")

import elastictrain as et  # noqa: E402
from elastictrain.errors import ConfigError  # noqa: E402
from elastictrain.runtime.interleave import GroupJob, InterleaveGroup  # noqa: E402


def train(seed: int, steps: int, io_s: float, fail_at: int = -1):
    """A small regression with its own generator (the global RNG is shared by the process)."""

    def run():
        g = torch.Generator().manual_seed(seed)
        model = torch.nn.Linear(8, 1)
        with torch.no_grad():
            model.weight.copy_(torch.randn(1, 8, generator=g))
            model.bias.zero_()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(steps):
            with et.stage("load"):
                time.sleep(io_s)
                x = torch.randn(16, 8, generator=g)
                y = x.sum(dim=1, keepdim=True)
            if step == fail_at:
                raise RuntimeError(f"job {seed} fails at step {step}")
            with et.stage("compute"):
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
            with et.stage("sync"):
                opt.step()
        return [p.detach().clone() for p in model.parameters()]

    return run


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("n", [2, 3])
def test_interleaved_jobs_end_with_the_same_weights_as_alone(n):
    alone = [train(seed, 12, 0.001)() for seed in range(n)]
    group = InterleaveGroup([GroupJob(f"job{s}", train(s, 12, 0.001)) for s in range(n)], probe=2)
    results = group.run(timeout=60)
    assert [r.ok for r in results] == [True] * n, [r.traceback for r in results]
    for r, want in zip(results, alone):
        assert _same(r.value, want)
        assert r.iterations == 12
    assert len(set(group.offsets)) == n


def test_a_failing_job_leaves_the_group_and_the_others_finish():
    group = InterleaveGroup([GroupJob("ok1", train(1, 10, 0.001)), GroupJob("bad", train(2, 10, 0.001, fail_at=4)),
                             GroupJob("ok2", train(3, 10, 0.001))], probe=1)
    results = group.run(timeout=60)
    by = {r.name: r for r in results}
    assert by["ok1"].ok and by["ok2"].ok
    assert not by["bad"].ok and "fails at step 4" in str(by["bad"].error)
    assert by["ok1"].iterations == 10 and by["ok2"].iterations == 10


def test_each_resource_serves_one_job_at_a_time_in_phase_shifted_order():
    spans, lock = [], threading.Lock()

    def job(name, load_s, compute_s, steps=8):
        def run():
            for _ in range(steps):
                for stage, secs in (("load", load_s), ("compute", compute_s)):
                    with et.stage(stage):
                        t0 = time.perf_counter()
                        time.sleep(secs)
                        with lock:
                            spans.append((stage, name, t0, time.perf_counter()))
        return run

    group = InterleaveGroup([GroupJob("a", job("a", 0.01, 0.002), {"load": 0.01, "compute": 0.002}),
                             GroupJob("b", job("b", 0.002, 0.01), {"load": 0.002, "compute": 0.01})],
                            resources=("load", "compute"))
    assert all(r.ok for r in group.run(timeout=60))
    for stage in ("load", "compute"):
        mine = sorted((a, b, n) for s, n, a, b in spans if s == stage)
        for (a1, b1, n1), (a2, b2, n2) in zip(mine, mine[1:]):
            assert a2 >= b1 - 1e-4, f"{stage} used by {n1} and {n2} at once"
    # and the two jobs do run at once, on different resources (a loads while b computes)
    loads = [(a, b) for s, n, a, b in spans if s == "load" and n == "a"]
    computes = [(a, b) for s, n, a, b in spans if s == "compute" and n == "b"]
    assert any(min(b1, b2) - max(a1, a2) > 0.005 for a1, b1 in loads for a2, b2 in computes)
    # eq. 3: max(10, 10) + max(2, 2) = 12 ms per interleaved iteration, against 24 ms one after the other
    assert group.iteration_estimate == pytest.approx(0.012)


def test_bad_groups_are_refused():
    with pytest.raises(ConfigError, match="1 to 4 jobs"):
        InterleaveGroup([("j", lambda: None)] * 5)
    with pytest.raises(ConfigError, match="at least as many resource types"):
        InterleaveGroup([("a", lambda: None), ("b", lambda: None), ("c", lambda: None)], resources=("load", "compute"))
    with pytest.raises(ConfigError, match="distinct slot"):
        InterleaveGroup([("a", lambda: None), ("b", lambda: None)], offsets=(1, 1))


def test_a_cancelled_job_frees_its_slots_at_once_and_raises_at_its_next_stage():
    """A job stuck in a stage (a collective whose peer died) is cancelled: the others go on at
    once, and the stuck job raises JobCancelled when it reaches its next stage."""
    from elastictrain.runtime.interleave import JobCancelled

    release = threading.Event()

    def stuck():
        for step in range(100):
            with et.stage("load"):
                pass
            with et.stage("compute"):
                if step == 2:
                    release.wait(30)  # blocked, as in a collective that never completes
            with et.stage("sync"):
                pass

    group = InterleaveGroup([GroupJob("ok", train(1, 40, 0.001)), GroupJob("stuck", stuck)],
                            resources=("load", "compute", "sync"), offsets=(0, 1))
    out = {}
    runner = threading.Thread(target=lambda: out.setdefault("r", group.run(timeout=60)))
    runner.start()
    time.sleep(0.5)  # "ok" is now waiting at a slot barrier for "stuck"
    group.cancel("stuck", "peer failed")
    deadline = time.monotonic() + 20  # generous for a loaded machine; it takes ~0.1 s here
    while group.gate.members[0].active and time.monotonic() < deadline:
        time.sleep(0.05)
    ok_done = not group.gate.members[0].active  # "ok" finished while "stuck" was still blocked
    release.set()
    runner.join(30)
    ok, st = out["r"]
    assert ok_done, "the healthy job stayed blocked behind the cancelled one"
    assert ok.ok and ok.iterations == 40
    assert not st.ok and isinstance(st.error, JobCancelled) and "peer failed" in str(st.error)


def test_a_job_cancelled_before_the_group_starts_never_runs_a_stage():
    from elastictrain.runtime.interleave import JobCancelled

    group = InterleaveGroup([GroupJob("a", train(1, 5, 0.001)), GroupJob("b", train(2, 5, 0.001))],
                            resources=("load", "compute", "sync"), offsets=(0, 1))
    group.cancel("b", "failed on rank 1 already")
    a, b = group.run(timeout=60)
    assert a.ok and a.iterations == 5
    assert isinstance(b.error, JobCancelled) and b.iterations == 0


# ---------------------------------------------------------------- the work-conserving gate
def test_a_job_whose_next_resource_is_free_is_not_held_back():
    """While "a" sits in its load stage, "b" (compute only) runs compute again and again: its
    resource is free. Muri's lockstep slots would hold "b" at the barrier until "a" leaves load
    (this test would then time out); the work-conserving gate does not."""
    b_ran = threading.Event()
    count = [0]

    def a():
        for _ in range(3):
            with et.stage("load"):
                b_ran.wait(10)  # leaves load only once b has computed 5 times meanwhile
                b_ran.clear()
                count[0] = 0
            with et.stage("compute"):
                pass

    def b():
        for _ in range(400):
            with et.stage("compute"):
                time.sleep(0.001)
            count[0] += 1
            if count[0] == 5:
                b_ran.set()

    group = InterleaveGroup([GroupJob("a", a, {"load": 1.0, "compute": 0.1}),
                             GroupJob("b", b, {"compute": 0.1})], resources=("load", "compute"))
    t0 = time.monotonic()
    ra, rb = group.run(timeout=60)
    assert ra.ok and rb.ok, (ra.traceback, rb.traceback)
    assert group.schedule == "work"
    assert time.monotonic() - t0 < 9, "a waited in load for b, which the gate held back"


def _spanning_job(spans: list, lock, name: str, stage: str, seconds: float, steps: int):
    """A job of ``steps`` stages of ``stage``, each sleeping ``seconds``; appends (name, start, end)."""
    def run():
        for _ in range(steps):
            with et.stage(stage):
                t0 = time.perf_counter()
                time.sleep(seconds)
                with lock:
                    spans.append((name, t0, time.perf_counter()))
    return run


def test_each_resource_serves_one_job_at_a_time_and_waiters_take_turns():
    spans, lock = [], threading.Lock()
    group = InterleaveGroup([GroupJob(n, _spanning_job(spans, lock, n, "compute", 0.001, 30), {"compute": 0.001})
                             for n in "abc"],
                            resources=("load", "preprocess", "compute"))
    assert all(r.ok for r in group.run(timeout=60))
    spans.sort(key=lambda s: s[1])
    for (n1, a1, b1), (n2, a2, b2) in zip(spans, spans[1:]):
        assert a2 >= b1 - 1e-4, f"compute used by {n1} and {n2} at once"
    # all three always want compute: the ring hands it to each in turn (none runs twice in a row
    # while another waits), so each gets every third turn
    order = [n for n, _, _ in spans]
    # (from the first turn of the last to arrive: on a loaded machine a thread may start late)
    start = max(order.index(n) for n in "abc") - 2
    assert start <= 20 and all(len(set(order[i:i + 3])) == 3 for i in range(start, start + 60, 3)), order[:80]


def test_a_host_resource_with_two_slots_serves_two_jobs_at_once_never_three():
    """cpu+cpu on a many-core GPU host: two single-threaded augmentations run side by side
    (host_slots), a third waits for a free slot, and the waiters still take turns."""
    spans, lock = [], threading.Lock()
    group = InterleaveGroup([GroupJob(n, _spanning_job(spans, lock, n, "preprocess", 0.004, 20), {"preprocess": 0.004})
                             for n in "abc"],
                            resources=("load", "preprocess", "compute"), host_slots={"preprocess": 2})
    assert all(r.ok for r in group.run(timeout=60))
    # the most stages in flight at any instant: sweep over span starts and ends
    marks = sorted([(a, 1) for _, a, _ in spans] + [(b - 1e-4, -1) for _, _, b in spans])
    depth, most = 0, 0
    for _, d in marks:
        depth += d
        most = max(most, depth)
    assert most == 2, f"{most} preprocess stages at once with 2 slots"
    overlapped = sum(1 for (n1, a1, b1), (n2, a2, b2) in zip(sorted(spans, key=lambda s: s[1]),
                                                             sorted(spans, key=lambda s: s[1])[1:])
                     if a2 < b1 - 1e-3)
    assert overlapped > 10, "two slots, but the stages ran one at a time"
    counts = {n: sum(1 for m, _, _ in spans if m == n) for n in "abc"}
    assert counts == {"a": 20, "b": 20, "c": 20}


def test_host_slots_are_checked_and_auto_follows_the_cores(monkeypatch):
    from elastictrain.runtime import interleave

    jobs = [("a", lambda: None), ("b", lambda: None)]
    for bad in ({"preprocess": 0}, {"preprocess": 65}, {"prep": 2}, {"preprocess": True}, "many", 2):
        with pytest.raises(ConfigError, match="host_slots"):
            InterleaveGroup(jobs, host_slots=bad)
    assert InterleaveGroup(jobs, host_slots={"load": 2}).host_slots == {"load": 2}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert interleave.auto_host_slots(2) == 2 and interleave.auto_host_slots(4) == 4
    assert InterleaveGroup(jobs).host_slots == {"preprocess": 2}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert interleave.auto_host_slots(4) == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert interleave.auto_host_slots(2) == 1  # 2 cores: one kept for the jobs' other threads


class _FakeEvent:
    def __init__(self, done: threading.Event) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done.is_set()


class _FakeDevice:
    """Device work that completes when the test says so (what a CUDA event reports)."""

    def __init__(self) -> None:
        self.finish = threading.Event()
        self.events = 0

    def event(self):
        self.events += 1
        return _FakeEvent(self.finish)


def test_a_device_stage_is_in_flight_until_its_device_work_completes():
    """The device is shared (its kernels interleave, as concurrent CUDA streams do), but a job
    has at most device_depth (2) stages in flight: its third waits until the event recorded at
    the end of an earlier one completes; another job is not held back by it."""
    device = _FakeDevice()
    a_two, a_three, b_in = threading.Event(), threading.Event(), threading.Event()

    def a():
        for n in range(3):
            with et.stage("compute"):
                pass  # launches work and returns at once, as a CUDA stage does
            if n == 1:
                a_two.set()
        a_three.set()

    def b():
        a_two.wait(10)
        with et.stage("compute"):
            b_in.set()

    group = InterleaveGroup([GroupJob("a", a, {"compute": 1.0}), GroupJob("b", b, {"compute": 1.0})],
                            resources=("load", "compute"), device=device,
                            isolate_setup=False)  # b's code before its first stage waits for a's stages
    out = {}
    runner = threading.Thread(target=lambda: out.setdefault("r", group.run(timeout=30)))
    runner.start()
    assert a_two.wait(10), "a's second stage was held back"
    assert b_in.wait(10), "b was held back by a's device work"
    assert not a_three.wait(0.3), "a ran a third stage ahead of its device work"
    device.finish.set()  # a's kernels complete: the gate sees it by polling the events
    assert a_three.wait(5)
    runner.join(30)
    assert all(r.ok for r in out["r"]) and device.events == 4


def test_the_order_follows_a_job_whose_phase_changes():
    """Re-derived every 10 iterations from the latest 20: after a's phase change the group runs
    in the order eq. 3 picks for the new profiles."""
    from elastictrain.policies.interleaving import best_ordering

    res = ("load", "preprocess", "compute")
    before, after = (0.004, 0.0005, 0.001), (0.0005, 0.004, 0.001)  # both begin with load
    other = (0.001, 0.0, 0.004)
    first = best_ordering([before, other], 3)[1]
    second = best_ordering([after, other], 3)[1]
    assert first != second  # the test needs a phase change that changes the best order

    def job(phases):
        def run():
            for prof, steps in phases:
                for _ in range(steps):
                    for stage, secs in zip(res, prof):
                        if secs:
                            with et.stage(stage):
                                time.sleep(secs)
        return run

    group = InterleaveGroup([GroupJob("a", job([(before, 30), (after, 60)])), GroupJob("b", job([(other, 90)]))],
                            resources=res, probe=3, reorder_every=10)
    assert all(r.ok for r in group.run(timeout=60))
    assert group.reorders >= 1 and group.offsets == second


def test_each_job_sets_up_alone_from_the_same_rng_state():
    """Issue 32.2: jobs of one group share the process's global RNG. Each job's set-up (before
    its first stage) runs alone, in job order, from the state the group began with, so a job
    draws the same 'dataset' whatever the other jobs do, as it would alone."""
    import random

    np = pytest.importorskip("numpy")
    random.seed(7)
    np.random.seed(7)
    alone = ([random.random() for _ in range(50)], np.random.rand(50).tolist())
    random.seed(7)
    np.random.seed(7)
    got, order = {}, []

    def job(name, extra_draws):
        def fn():
            order.append(("setup", name))
            for _ in range(extra_draws):
                random.random()
                time.sleep(0.001)  # another job's set-up would draw meanwhile if it could
            got[name] = ([random.random() for _ in range(50 - extra_draws)], np.random.rand(50).tolist())
            for _ in range(3):
                with et.stage("compute"):
                    order.append(("train", name))
                    random.random()  # training draws (dropout...) are shared, and harmless
        return fn

    InterleaveGroup([GroupJob("a", job("a", 0)), GroupJob("b", job("b", 20))], probe=0, offsets=(0, 1)).run(30)
    assert got["a"] == alone
    assert got["b"][0] == alone[0][20:] and got["b"][1] == alone[1]
    first_train = next(k for k, (what, _) in enumerate(order) if what == "train")
    assert order[:first_train] == [("setup", "a"), ("setup", "b")]  # in job order, all before training
