"""The Slurm adapter's parsing and batch scripts, without a Slurm (the real one runs in
tests/integration/test_slurm_engine.py)."""

import pytest

from elastictrain.engines.api import RunLaunch, warn_if_no_gpus
from elastictrain.engines.slurm import (SlurmAdapter, _expand, job_name, parse_gres_gpus, parse_gres_type,
                                        parse_job_name)
from elastictrain.errors import ConfigError
from elastictrain.wire import Task


@pytest.mark.parametrize("gres, gpus", [("gpu:2", 2), ("gpu:a100:4(S:0-1)", 4), ("gpu:2,shard:8", 2),
                                         ("(null)", 0), ("", 0), ("gpu:a100:2,gpu:v100:1", 3), ("mps:100", 0)])
def test_gpus_from_gres(gres, gpus):
    assert parse_gres_gpus(gres) == gpus


@pytest.mark.parametrize("gres, kind", [("gpu:2", ""), ("gpu:a100:4(S:0-1)", "a100"), ("gpu:h100:2,shard:8", "h100"),
                                         ("(null)", ""), ("gpu:a100:2,gpu:v100:1", ""),
                                         ("gpu:a100:1,gpu:a100:1", "a100")])
def test_gpu_type_from_gres(gres, kind):
    assert parse_gres_type(gres) == kind  # (a node of two types names none: a run there could mix them)


def test_node_lists_and_job_names():
    assert _expand("n[1-3],m7") == ["n1", "n2", "n3", "m7"]
    assert _expand("gpu[08-10]") == ["gpu08", "gpu09", "gpu10"]
    assert _expand("n1") == ["n1"]
    assert parse_job_name(job_name("train-7", 3)) == ("train-7", 3)
    assert parse_job_name("et.x") is None and parse_job_name("someone-elses-job") is None


def _task(slots, n=2):
    return Task("j1", 4, slots, [], n, ["train.py", "--lr", "0.1 x"], "/w", {"A": "b c"}, 3, 20.0, False)


def test_the_batch_script_pins_the_placement_and_execs_srun(tmp_path):
    a = SlurmAdapter("gpu", "http://c:7707", str(tmp_path), token_file="/t/token", tag="abc")
    s = a.script(RunLaunch("j1", 4, ("n1", "n2"), (_task(2), _task(2))))
    for line in ("#SBATCH --job-name=et.j1.r4", "#SBATCH --partition=gpu", "#SBATCH --nodelist=n1,n2",
                 "#SBATCH --gres=gpu:2", "#SBATCH --nodes=2", "#SBATCH --requeue", "#SBATCH --comment=elastictrain:abc",
                 "export A='b c'"):
        assert line in s.splitlines(), line
    last = s.strip().splitlines()[-1]
    assert last.startswith("exec srun ") and "--rdzv-id j1" in last and "--rdzv-conf run=4" in last
    assert "'0.1 x'" in last and "--token-file /t/token" in last and "hetjob" not in s
    het = a.script(RunLaunch("j1", 4, ("n1", "n2"), (_task(2), _task(1))))
    assert het.count("#SBATCH hetjob") == 1 and "--het-group=0" in het and "--het-group=1" in het
    assert "--account" not in a.script(RunLaunch("j1", 4, ("n1",), (_task(2, 1),), "vision"))  # (not asked for)
    charged = SlurmAdapter("gpu", "http://c:7707", str(tmp_path), accounts=True)
    assert "#SBATCH --account=vision" in charged.script(RunLaunch("j1", 4, ("n1",), (_task(2, 1),), "vision"))
    assert "--account" not in charged.script(RunLaunch("j1", 4, ("n1",), (_task(2, 1),)))  # (no project)


def test_a_bad_partition_name_is_refused():
    with pytest.raises(ConfigError, match="sinfo"):
        SlurmAdapter("a b; rm -rf /", "http://c:7707", "/tmp")


def test_a_partition_without_gpus_is_scheduled_by_cpus(tmp_path):
    a = SlurmAdapter("cpu", "http://c:7707", str(tmp_path), cpus_per_worker=4)
    s = a.script(RunLaunch("j1", 1, ("n1", "n2"), (_task(2), _task(2)))).splitlines()
    assert "#SBATCH --cpus-per-task=8" in s and "#SBATCH --ntasks-per-node=1" in s
    assert not any("--gres" in line for line in s)
    het = a.script(RunLaunch("j1", 1, ("n1", "n2"), (_task(2), _task(1)))).splitlines()
    assert "#SBATCH --cpus-per-task=8" in het and "#SBATCH --cpus-per-task=4" in het


class _Sinfo(SlurmAdapter):
    """The adapter reading a given ``sinfo -N -o %N|%G|%T|%c|%P`` output (the real one: test_slurm_engine.py);
    lines of 4 fields are in partition ``p``."""

    def __init__(self, out: str, partition: str = "p", **kw):
        super().__init__(partition, "http://c:7707", "/tmp", **kw)
        self.out = "".join(line + ("|p" if line.count("|") == 3 else "") + "\n" for line in out.splitlines())

    async def _cmd(self, *args: str, check: bool = True) -> str:
        assert args[:2] == ("sinfo", "-h") and args[-1] == "%N|%G|%T|%c|%P"
        return self.out


def test_nodes_offer_gpus_or_cpu_slots_and_a_gpu_less_partition_names_the_option(caplog):
    import asyncio

    gpus = asyncio.run(_Sinfo("n1|gpu:2|idle|8\nn2|gpu:a100:4(S:0)|mixed|16\nn3|(null)|drained|8\n"
                              "n4|gpu:2|draining|8\nn5|gpu:2|drained*|8\nn6|gpu:2|down|8\n").nodes())
    # an admin's drain (its jobs go on) is up and cordoned; not responding or down is not up
    assert [(n.name, n.gpus, n.up, n.kind, n.cordoned) for n in gpus] == [
        ("n1", 2, True, "gpu", False), ("n2", 4, True, "gpu", False), ("n3", 0, True, "gpu", True),
        ("n4", 2, True, "gpu", True), ("n5", 2, False, "gpu", True), ("n6", 2, False, "gpu", False)]
    cpus = asyncio.run(_Sinfo("c1|(null)|idle|8\nc2|(null)|idle*|6\n", cpus_per_worker=4).nodes())
    assert [(n.name, n.gpus, n.up, n.kind) for n in cpus] == [("c1", 2, True, "slot"), ("c2", 1, False, "slot")]
    bare, warned = _Sinfo("c1|(null)|idle|8\n"), False
    for _ in range(3):  # still reported (a run on a node that left is requeued), and said once (as the bridge does)
        nodes = asyncio.run(bare.nodes())
        assert [(n.name, n.gpus) for n in nodes] == [("c1", 0)]
        warned = warn_if_no_gpus(nodes, bare.cpus_per_worker, bare.name, bare.gpus_from, warned)
    said = [r.getMessage() for r in caplog.records if "--engine-cpus-per-worker N" in r.getMessage()]
    assert len(said) == 1 and "partition 'p'" in said[0] and "has no GPUs" in said[0], said


def test_several_partitions_a_run_goes_to_one_holding_all_its_nodes_else_a_component_per_node(tmp_path):
    import asyncio

    # n1 in a (the default, *) and b, n2 in b, n3 in c: --slurm-partition a,b,c
    s = _Sinfo("n1|gpu:2|idle|8|a*\nn1|gpu:2|idle|8|b\nn2|gpu:2|idle|8|b\nn3|gpu:2|idle|8|c", "a,b,c")
    assert [n.name for n in asyncio.run(s.nodes())] == ["n1", "n2", "n3"]  # (each once)

    def partitions(nodes, slots):
        text = s.script(RunLaunch("j1", 1, nodes, tuple(_task(g, len(nodes)) for g in slots)))
        return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("#SBATCH --partition=")], text

    assert partitions(("n1",), (2,))[0] == ["a"]  # the first of ours that holds it
    got, text = partitions(("n1", "n2"), (2, 2))
    assert got == ["b"] and "hetjob" not in text  # b holds both: one component
    got, text = partitions(("n1", "n2"), (2, 1))
    assert got == ["b", "b"] and text.count("#SBATCH hetjob") == 1  # unequal GPUs: each component names it
    got, text = partitions(("n2", "n3"), (2, 2))
    assert got == ["b", "c"] and text.count("#SBATCH hetjob") == 1 and "--het-group=1" in text  # no one partition
    with pytest.raises(ConfigError, match="a Slurm partition, or several"):
        SlurmAdapter("a,,b", "http://c:7707", str(tmp_path))


@pytest.mark.parametrize("bad", [-1, 4097, 2.5, True, "4"])
def test_cpus_per_worker_is_checked(bad):
    with pytest.raises(ConfigError, match="1 to 4096"):
        SlurmAdapter("cpu", "http://c:7707", "/tmp", cpus_per_worker=bad)
