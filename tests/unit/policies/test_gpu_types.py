"""Jobs that need a GPU type (Slurm's --gres=gpu:a100:N): every policy places them on the nodes of
that type only, through the real engine, and the mechanism refuses a decision that does not."""

import random

import pytest

from elastictrain.errors import PolicyError
from elastictrain.model import JobSpec
from elastictrain.policies import create
from elastictrain.policies.api import ClusterSnapshot, Decision, JobView
from elastictrain.policies.placement import Placer, any_node, type_mask, type_matches
from elastictrain.scheduling import ClusterShape, Entry, JobTable
from elastictrain.scheduling.plan import plan
from elastictrain.sim.cluster import ClusterSpec
from elastictrain.sim.engine import Simulator
from elastictrain.errors import ConfigError

# two nodes of A100s (driver names) and two of V100s, 4 GPUs each, one switch
TYPES = ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB", "Tesla V100-SXM2-32GB")
CLUSTER = ClusterSpec(1, 4, 4, TYPES, (4, 4, 4, 4))
CLUSTER3 = ClusterSpec(1, 6, 4, TYPES + ("NVIDIA H100 80GB HBM3",) * 2, (4,) * 6)  # and two nodes of H100s
OPTIONS = {"tiresias-g": {"distribution": [100.0, 500.0, 2000.0, 8000.0, 30000.0]}}


def test_a_type_matches_words_of_the_nodes_type_in_a_row_ignoring_case():
    assert type_matches("a100", "NVIDIA A100-SXM4-80GB")
    assert type_matches("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB")  # (nvidia-smi's name without the vendor)
    assert type_matches("nvidia a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB")
    assert not type_matches("a10", "NVIDIA A100-SXM4-80GB") and not type_matches("80gb-a100", "NVIDIA A100-SXM4-80GB")
    assert not type_matches("a100-40gb", "NVIDIA A100-SXM4-80GB") and not type_matches("-", "NVIDIA A100")
    assert type_matches("v100", "Tesla V100-SXM2-32GB") and not type_matches("v100", "NVIDIA A100-SXM4-80GB")
    assert type_mask("a100", TYPES) == (True, True, False, False)
    assert type_mask("a100", ()) == ()  # nodes that name no type serve no typed job
    assert type_mask("v100|h100", TYPES + ("NVIDIA H100 80GB HBM3",)) == (False, False, True, True, True)
    assert not type_matches("a100|h100", "Tesla V100-SXM2-32GB") and type_matches("H100|a10", "NVIDIA H100 PCIe")


def test_the_placer_uses_only_the_nodes_of_a_jobs_type():
    for mode in ("consolidated", "spread", "count", "skew"):
        p = Placer((4, 4, 4, 4), 4, mode, node_types=TYPES)
        assert p.place(4, 0.0, (), "v100") in (((2, 4),), ((3, 4),))
        assert p.place(8, 0.0, (), "v100") is None  # 4 V100s left: it waits, though 12 A100s are free
        assert p.place(4, 0.0, (), "v100") is not None
        assert p.place(1, 0.0, (), "v100") is None
        assert p.place(8, 0.0) is not None  # the A100s still serve an untyped job
        assert p.place(1, 0.0, (), "h100") is None  # no node of the type


def test_any_node_keeps_to_the_mask():
    assert any_node(2, [4, 4, 1, 1], None, (False, False, True, True)) == ((2, 1), (3, 1))
    assert any_node(3, [4, 4, 1, 1], None, (False, False, True, True)) is None


def _view(key, gpus, gpu_type="", running=False, placement=()):
    return JobView(key, gpus, 0.0, running=running, placement=placement, gpu_type=gpu_type)


def test_plan_refuses_a_job_placed_on_another_type_and_resolves_any_node_within_it():
    table = JobTable()
    for key, t in (("a", "v100"), ("b", "")):
        table.add(Entry(key, 2, 0.0, gpu_type=t))
    jobs = tuple(e.view() for e in table.entries())
    snap = ClusterSnapshot(0.0, jobs, (4, 4, 4, 4), 4, node_types=TYPES)
    with pytest.raises(PolicyError, match="needs GPU type 'v100' but was placed on node 0"):
        plan(table, snap, Decision({"a": ((0, 2),)}), "mine")
    # "any node": the untyped job first in the decision takes the best fit (a V100 node with 2 free GPUs
    # would do for it too); the typed one still gets V100s
    actions = plan(table, ClusterSnapshot(0.0, jobs, (4, 4, 2, 0), 4, node_types=TYPES),
                   Decision({"b": ((-1, 2),), "a": ((-1, 2),)}), "mine")
    where = {a.key: a.placement for a in actions}
    assert where["a"] == ((2, 2),) and where["b"][0][0] in (0, 1)


def _trace(seed, n=60, kinds=("", "", "a100", "v100")):
    rng = random.Random(seed)
    t, jobs = 0.0, []
    for i in range(n):
        t += rng.expovariate(1 / 200)
        jobs.append(JobSpec(i, rng.choice([1, 1, 2, 4, 8]), t, rng.randint(10, 3000), rng.uniform(0.1, 2.0),
                            rng.choice(["vgg16", "resnet50"]), (0.1, 0.2, 0.05), f"u{i % 3}",
                            gpu_type=rng.choice(kinds)))
    return jobs


class TypeChecked:
    """Asserts every decision keeps each typed job on its type's nodes (the mechanism refuses it
    too: the simulator runs strict, so a violation fails the run either way)."""

    def __init__(self, inner):
        self.inner, self.name, self.placed, self.where = inner, inner.name, 0, {}

    def decide(self, s):
        d = self.inner.decide(s)
        for key, where in d.run.items():
            j = s.by_key[key]
            if j.gpu_type:
                mask = type_mask(j.gpu_type, s.node_types)
                assert all(n < 0 or mask[n] for n, _ in where), (key, j.gpu_type, where)
                self.placed += 1
                self.where.setdefault(j.gpu_type, set()).update(n for n, _ in where)
        return d

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("name", ["yarn-cs", "fifo-be", "srtf", "srsf", "tiresias-l", "tiresias-g", "gandiva-ts",
                                  "gandiva-fair", "gandiva-fair-notrade", "gandiva-fair-global", "muri-s", "muri-l",
                                  "autoscale"])
@pytest.mark.parametrize("placement", [None, "count"])
def test_every_policy_runs_typed_jobs_on_their_type_only(name, placement):
    opts = dict(OPTIONS.get(name, {}))
    if placement and name not in ("gandiva-fair", "gandiva-fair-notrade", "autoscale"):
        opts["placement"] = placement
    jobs = _trace(3)
    policy = TypeChecked(create(name, **opts))
    result = Simulator(jobs, CLUSTER, policy, restart_cost=5.0).run()
    big = {j.job_id for j in jobs if j.gpu_type and j.num_gpu > 8}
    assert sorted(r.job_id for r in result.jobs) == sorted(j.job_id for j in jobs if j.job_id not in big)
    assert policy.placed > 0
    # alternatives (Slurm's --constraint "a100|h100"): on a third type's nodes too, never on the V100s
    jobs = _trace(4, kinds=("", "a100|h100", "v100", "h100"))
    policy = TypeChecked(create(name, **opts))
    result = Simulator(jobs, CLUSTER3, policy, restart_cost=5.0).run()
    assert sorted(r.job_id for r in result.jobs) == [j.job_id for j in jobs]
    used = policy.where["a100|h100"]
    assert used <= {0, 1, 4, 5} and used & {0, 1} and used & {4, 5}, policy.where  # both types served it


@pytest.mark.parametrize("name", ["yarn-cs", "fifo-be", "backfill", "multifactor", "srtf", "tiresias-l",
                                  "tiresias-g", "gandiva-ts", "gandiva-fair", "gandiva-fair-global", "muri-s",
                                  "autoscale"])
@pytest.mark.parametrize("placement", [None, "count"])
def test_every_policy_keeps_a_one_type_gang_on_one_of_its_types(name, placement):
    """Slurm's --constraint "[a100|h100]": any one of them, the whole gang on it."""
    opts = dict(OPTIONS.get(name, {}))
    if placement and name not in ("gandiva-fair", "gandiva-fair-notrade", "autoscale", "backfill", "multifactor"):
        opts["placement"] = placement
    jobs = _trace(5, n=80, kinds=("", "[a100|h100]", "[a100|h100]", "v100"))
    seen = []

    class OneType(TypeChecked):
        def decide(self, s):
            d = super().decide(s)
            for key, where in d.run.items():
                j = s.by_key[key]
                if j.gpu_type.startswith("["):
                    mask = type_mask(j.gpu_type, s.node_types)
                    kinds = {mask[n] for n, _ in where if n >= 0}
                    assert len(kinds) <= 1, (key, where, s.node_types)
                    seen.extend(kinds)
            return d

    policy = OneType(create(name, **opts))
    result = Simulator(jobs, CLUSTER3, policy, restart_cost=5.0).run()
    assert sorted(r.job_id for r in result.jobs) == [j.job_id for j in jobs]
    if placement is None or name in ("gandiva-fair", "autoscale"):  # (count mode places "any node": the mechanism)
        assert set(seen) == {1, 2}, set(seen)  # both types served such gangs, each gang on one


def test_a_one_type_gang_goes_whole_to_one_type_or_waits():
    types = TYPES[:1] + TYPES[2:3] + ("NVIDIA H100 80GB HBM3",)  # nodes: A100, V100, H100, 4 GPUs each
    p = Placer((2, 4, 4), 3, "consolidated", node_types=types)  # the A100 node has 2 free
    assert p.place(4, gpu_type="[a100|h100]") == ((2, 4),)  # whole on the H100s, not 2 + 2
    p = Placer((4, 4, 4), 3, "spread", node_types=types)
    assert p.place(6, gpu_type="a100|h100") is not None  # mixed: the two types together hold it
    assert Placer((4, 4, 4), 3, "spread", node_types=types).place(6, gpu_type="[a100|h100]") is None
    assert any_node(3, [2, 4, 2], None, type_mask("[a100|h100]", types)) is None  # 2 + 2 across types: no
    assert any_node(2, [2, 4, 2], None, type_mask("[a100|h100]", types)) == ((0, 2),)
    assert type_mask("[h100|a100]", types) == (2, 0, 1) and type_matches("[a100|h100]", "NVIDIA H100 PCIe")
    # the mechanism refuses a decision that mixes them, and the simulator sets aside a gang no one type holds
    table = JobTable()
    table.add(Entry("a", 4, 0.0, gpu_type="[a100|h100]"))
    snap = ClusterSnapshot(0.0, tuple(e.view() for e in table.entries()), (4, 4, 4), 3, node_types=types)
    with pytest.raises(PolicyError, match="needs all its GPUs of one type of"):
        plan(table, snap, Decision({"a": ((0, 2), (2, 2))}), "mine")
    r = Simulator([JobSpec(0, 6, 0.0, 10, 1.0, gpu_type="[a100|h100]"), JobSpec(1, 6, 0.0, 10, 1.0,
                   gpu_type="a100|h100")], ClusterSpec(1, 3, 4, types, (4, 4, 4)), create("srtf")).run()
    assert [j.job_id for j in r.jobs] == [1] and "needs 6 GPUs of type [a100|h100]" in dict(r.extra["rejected"])[0]


def test_the_simulator_sets_aside_a_job_whose_type_cannot_hold_it():
    jobs = [JobSpec(0, 2, 0.0, 10, 1.0, gpu_type="h100"), JobSpec(1, 12, 0.0, 10, 1.0, gpu_type="v100"),
            JobSpec(2, 8, 0.0, 10, 1.0, gpu_type="a100")]
    r = Simulator(jobs, CLUSTER, create("srtf")).run()
    assert [j.job_id for j in r.jobs] == [2]
    why = dict(r.extra["rejected"])
    assert "needs 2 GPUs of type h100 but the cluster has 0" in why[0]
    assert "needs 12 GPUs of type v100 but the cluster has 8" in why[1]


def test_a_gpu_type_is_a_name_or_alternatives():
    with pytest.raises(ConfigError, match="GPU type name 'a 100' is invalid"):
        JobSpec(0, 1, 0.0, 10, 1.0, gpu_type="a 100")
    assert JobSpec(0, 1, 0.0, 10, 1.0, gpu_type="a100|h100").gpu_type == "a100|h100"
    assert JobSpec(0, 1, 0.0, 10, 1.0, gpu_type="[a100|h100]").gpu_type == "[a100|h100]"
    for bad in ("a100||h100", "a100|", "|h100", "|".join("abcdefghi"), "[a100|h100", "a100]", "[]", "[[a100]]"):
        with pytest.raises(ConfigError, match="up to 8 such names joined by |"):
            JobSpec(0, 1, 0.0, 10, 1.0, gpu_type=bad)


def test_the_live_shape_carries_types():
    assert ClusterShape((4,), 1, ("x",)).node_types == ("x",)


def test_a_native_trace_carries_the_gpu_type_column(tmp_path):
    from elastictrain.sim.synth import write_native
    from elastictrain.sim.traces import TraceError, load_trace

    jobs = [JobSpec(0, 2, 0.0, 10.0, 1.0, "m", (), "u", gpu_type="a100"), JobSpec(1, 1, 1.0, 10.0, 1.0)]
    path = write_native(jobs, str(tmp_path / "t.csv"))
    assert [j.gpu_type for j in load_trace(path)] == ["a100", ""]
    assert "gpu_type" not in open(write_native(jobs[1:], str(tmp_path / "u.csv"))).readline()  # (only where used)
    with open(tmp_path / "bad.csv", "w") as f:
        f.write("job_id,num_gpu,submit_time,iterations,iteration_time,gpu_type\n0,1,0,10,1.0,a 100\n")
    with pytest.raises(TraceError, match="bad.csv:2: GPU type name 'a 100' is invalid"):
        load_trace(str(tmp_path / "bad.csv"))
