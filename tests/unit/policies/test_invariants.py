"""Contract suite: every registered policy, on random traces, through the real engine.

Checked at every decision: no node and no cluster over capacity; gangs all-or-nothing (a
placement's GPUs add up to the job's demand); only runnable jobs placed; policies never
write to the snapshot (they get read-only views). At the end: every job finished. Also as a
live coordinator shows the cluster: while it changes (a node registers late, one drains and is
lost) and while preempted jobs stop (they leave the snapshot for a decision).
"""

import random
import sys

import msgspec
import pytest

from elastictrain.model import JobSpec
from elastictrain.policies import create, registered
from elastictrain.policies.api import ClusterSnapshot
from elastictrain.sim.cluster import ClusterSpec
from elastictrain.sim.engine import Simulator

OPTIONS = {"tiresias-g": {"distribution": [100.0, 500.0, 2000.0, 8000.0, 30000.0]}}


class ReadOnly:
    def __init__(self, job):
        object.__setattr__(self, "_j", job)

    def __getattr__(self, name):
        return getattr(self._j, name)

    def __setattr__(self, name, value):
        raise AssertionError(f"policy wrote {name} on a job")


class Checked:
    def __init__(self, inner, cluster):
        self.inner, self.cluster, self.name, self.decisions = inner, cluster, inner.name, 0

    def decide(self, s):
        ro = ClusterSnapshot(s.now, tuple(ReadOnly(j) for j in s.jobs), s.gpus_per_node, s.nodes_per_switch,
                             tuple(ReadOnly(j) for j in s.arrived), s.ended, tuple(ReadOnly(j) for j in s.running))
        d = self.inner.decide(ro)
        by_id = {j.job_id: j for j in s.jobs}
        per_node = [0] * len(s.gpus_per_node)
        total = 0
        followers = set()  # members of an interleaving group after the first share its GPUs
        for grp in d.groups:
            assert len(grp) >= 2 and len({d.run[m] for m in grp}) == 1, f"group {grp} split across placements"
            assert len({by_id[m].num_gpu for m in grp}) == 1, f"group {grp} mixes GPU counts"
            assert not followers & set(grp), f"a job is in two groups: {grp}"
            followers.update(grp[1:])
        for jid, f in d.slowdown.items():
            assert jid in d.run and f > 0
        for jid, where in d.run.items():
            assert jid in by_id, f"placed job {jid} that is not runnable"
            assert sum(g for _, g in where) == by_id[jid].num_gpu, f"job {jid}: partial gang {where}"
            if jid in followers:
                continue
            for node, g in where:
                assert g > 0
                if node >= 0:
                    per_node[node] += g
            total += by_id[jid].num_gpu
        assert total <= s.total_gpus
        assert all(u <= c for u, c in zip(per_node, s.gpus_per_node)), per_node
        if d.wakeup is not None:
            assert d.wakeup > s.now
        self.decisions += 1
        return d


PROFILES = {"vgg16": (0.08, 0.07, 0.06), "resnet50": (0.37, 0.18, 0.0), "bert": (0.0005, 0.16, 0.02),
            "gpt2": (0.2, 0.4, 0.1, 0.05)}


def random_trace(seed, n=80):
    rng = random.Random(seed)
    t, jobs = 0.0, []
    for i in range(n):
        t += rng.expovariate(1 / 300)
        model = rng.choice(["vgg16", "resnet50", "bert", "gpt2"])
        stages = PROFILES[model] if rng.random() < 0.8 else ()  # some jobs were never profiled
        jobs.append(JobSpec(i, rng.choice([1, 1, 2, 4, 8, 16]), t, rng.randint(10, 5000), rng.uniform(0.1, 2.0),
                            model, stages))
    return jobs


@pytest.mark.parametrize("name", ["yarn-cs", "fifo-be", "srtf", "srsf", "tiresias-l", "tiresias-g", "gandiva-ts",
                                  "gandiva-fair-notrade", "gandiva-fair-global",
                                  "gandiva-fair", "muri-s", "muri-l", "muri-l-worst", "muri-l-noblossom"])
@pytest.mark.parametrize("placement", [None, "consolidated", "spread", "count", "skew"])
@pytest.mark.parametrize("seed", [1, 2])
def test_policy_invariants(name, placement, seed):
    assert name in registered()
    cluster = ClusterSpec(2, 2, 4)  # 16 GPUs in 4 nodes under 2 switches
    opts = dict(OPTIONS.get(name, {}))
    if placement:
        opts["placement"] = placement
    jobs = random_trace(seed)
    for charge in ("on_start", "every_event"):
        policy = Checked(create(name, **opts), cluster)  # policies keep state: one per run
        result = Simulator(jobs, cluster, policy, restart_cost=5.0, charge=charge).run()
        assert sorted(r.job_id for r in result.jobs) == [j.job_id for j in jobs], "a job never finished"
        for r in result.jobs:
            assert r.end_time >= r.start_time >= r.submit_time
            assert r.jct >= r.duration - 1e-6  # nobody runs faster than full speed
    assert policy.decisions > 0


def test_unknown_policy_names_the_known_ones():
    from elastictrain.errors import ConfigError

    with pytest.raises(ConfigError, match="is not registered.*srtf"):
        create("srft")


def test_a_policy_named_by_its_path_is_imported_from_the_working_directory(tmp_path, monkeypatch):
    from elastictrain.errors import ConfigError

    (tmp_path / "my_pol.py").write_text("from elastictrain.policies.fifo import Fifo\n"
                                        "class Mine(Fifo):\n    name = 'mine'\nNOT_CALLABLE = 3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "my_pol", raising=False)
    from elastictrain.policies import api

    monkeypatch.setattr(api, "_REGISTRY", dict(api._REGISTRY))  # (registered for this test only)
    monkeypatch.setattr(api, "_OPTIONS", dict(api._OPTIONS))
    assert type(create("my_pol:Mine")).__name__ == "Mine"
    assert "my_pol:Mine" in registered()
    for name, says in (("no_such_mod_x:Mine", "cannot import 'no_such_mod_x'"),
                       ("my_pol:Nope", "has no callable 'Nope'"), ("my_pol:NOT_CALLABLE", "has no callable"),
                       ("my_pol:Mine;rm", "write a policy in a module as module:attr")):
        with pytest.raises(ConfigError, match=says):
            create(name)


class Changing:
    """Shows ``inner`` the cluster as a live coordinator does while it changes: the last node
    registers only at ``join`` s (before, the snapshot has one node fewer), and node ``node`` is
    cordoned from ``start`` to ``end`` s (it offers only the GPUs its running jobs hold). (A node
    lost is the engine's own outage.)"""

    def __init__(self, inner, join: float, node: int, start: float, end: float):
        self.inner, self.name, self.node = inner, inner.name, node
        self.join, self.start, self.end = join, start, end
        self.lost = 0  # decisions made with the node at 0 GPUs (the engine's outage)

    def decide(self, s):
        caps, types = list(s.gpus_per_node), s.node_types
        if self.start <= s.now < self.end:
            caps[self.node] = min(caps[self.node], sum(g for j in s.running for n, g in j.placement
                                                       if n == self.node))
        self.lost += s.gpus_per_node[self.node] == 0
        if s.now < self.join:
            caps, types = caps[:-1], types[:-1]
        s = ClusterSnapshot(s.now, s.jobs, tuple(caps), s.nodes_per_switch, s.arrived, s.ended, s.running, types)
        d = self.inner.decide(s)
        change = min((t for t in (self.join, self.start, self.end) if t > s.now), default=None)
        if change is not None and (d.wakeup is None or d.wakeup > change):  # (live, a node's change is an event)
            d = msgspec.structs.replace(d, wakeup=change)
        return d


class Stopping:
    """Live, the jobs a decision preempts are *stopping* until their workers have checkpointed and
    exited: the next snapshot leaves them out (neither running nor waiting, nor ended), and they
    come back once stopped. (The engine's stops are instant: this shows it to ``inner`` as live.)"""

    def __init__(self, inner):
        self.inner, self.name, self.hidden, self.prev = inner, inner.name, 0, set()

    def decide(self, s):
        hide = self.prev
        if hide:
            jobs = tuple(j for j in s.jobs if j.job_id not in hide)
            self.hidden += len(s.jobs) - len(jobs)
            s = ClusterSnapshot(s.now, jobs, s.gpus_per_node, s.nodes_per_switch,
                                tuple(j for j in s.arrived if j.job_id not in hide), s.ended,
                                tuple(j for j in s.running if j.job_id not in hide), s.node_types)
        d = self.inner.decide(s)
        self.prev = {j.job_id for j in s.running if j.job_id not in d.run}
        return d


@pytest.mark.parametrize("name", ["srtf", "tiresias-l", "tiresias-g", "gandiva-ts", "gandiva-fair",
                                  "gandiva-fair-global", "muri-s", "muri-l"])
def test_policy_invariants_while_preempted_jobs_are_stopping(name):
    """A policy that keeps state by job must take a job leaving the snapshot while it stops (not
    ended) and coming back, as the coordinator shows it (docs/policies.md, rules for state)."""
    cluster = ClusterSpec(2, 2, 4)
    jobs = random_trace(5)
    policy = Checked(create(name, **OPTIONS.get(name, {})), cluster)
    stopping = Stopping(policy)
    result = Simulator(jobs, cluster, stopping, restart_cost=5.0).run()
    assert sorted(r.job_id for r in result.jobs) == [j.job_id for j in jobs]
    assert stopping.hidden > 0  # (these policies preempt)


@pytest.mark.parametrize("name", ["yarn-cs", "fifo-be", "srtf", "srsf", "tiresias-l", "tiresias-g", "gandiva-ts",
                                  "gandiva-fair", "gandiva-fair-global", "muri-s", "muri-l"])
def test_policy_invariants_while_the_cluster_changes(name):
    """Live clusters change: a node registers late, a cordoned node offers only its running jobs'
    GPUs, a lost one none. Every policy keeps deciding (no failure) within what each node offers
    now, and every job ends."""
    cluster = ClusterSpec(2, 2, 4)
    jobs = random_trace(3)
    policy = Checked(create(name, **OPTIONS.get(name, {})), cluster)
    drain = Changing(policy, 1_000.0, 1, 2_000.0, 6_000.0)  # cordoned, then lost until 40,000 s:
    result = Simulator(jobs, cluster, drain, restart_cost=5.0, outages=[(1, 6_000.0, 40_000.0)]).run()
    assert sorted(r.job_id for r in result.jobs) == [j.job_id for j in jobs]
    assert policy.decisions > 0 and drain.lost > 0
