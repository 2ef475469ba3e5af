"""The interleaving executor with real torch jobs on CPU."""

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
