"""The engine on heterogeneous clusters: typed nodes, per-type job speeds, migration cost, and
the per-user timeline that fairness reports are built from."""

import os

import pytest

from elastictrain.errors import ConfigError
from elastictrain.model import JobSpec
from elastictrain.policies.api import ClusterSnapshot, Decision, JobView
from elastictrain.sim.cluster import heterogeneous_cluster, load_cluster
from elastictrain.sim.engine import Simulator

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data")


class Pin:
    """Runs every job on the nodes it is told, moving job 0 to ``move_to`` at ``move_at``."""

    name = "pin"

    def __init__(self, where, move_at=None, move_to=None):
        self.where, self.move_at, self.move_to = where, move_at, move_to

    def decide(self, s):
        run = {}
        for j in s.jobs:
            w = self.where[j.job_id]
            if j.job_id == 0 and self.move_at is not None and s.now >= self.move_at:
                w = self.move_to
            run[j.job_id] = w
        return Decision(run, self.move_at if self.move_at is not None and s.now < self.move_at else None)


def test_heterogeneous_cluster_forms():
    c = load_cluster("v100:3x4+p100:6x4+k80:16x8")
    assert c.total_gpus == 164 and c.gpus_by_type == {"v100": 12, "p100": 24, "k80": 128}
    assert c.node_types[:4] == ("v100", "v100", "v100", "p100") and c.capacities[-1] == 8
    with pytest.raises(ConfigError, match="given twice"):
        load_cluster("v100:1x4+v100:2x4")
    with pytest.raises(ConfigError, match="n8g8 or v100:3x4"):
        load_cluster("v100:three")


def test_a_job_runs_at_its_speed_on_the_type_of_its_gpus():
    cluster = heterogeneous_cluster({"v100": (1, 2), "k80": (1, 2)})
    speeds = (("k80", 1.0), ("v100", 4.0))
    jobs = [JobSpec(0, 1, 0.0, 1000, 1.0, speeds=speeds), JobSpec(1, 1, 0.0, 1000, 1.0, speeds=speeds),
            JobSpec(2, 2, 0.0, 1000, 1.0, speeds=speeds)]  # job 2 spans both types: the slower one sets its pace
    where = {0: ((0, 1),), 1: ((1, 1),), 2: ((0, 1), (1, 1))}
    r = Simulator(jobs, cluster, Pin(where)).run()
    end = {j.job_id: j.end_time for j in r.jobs}
    assert end[0] == pytest.approx(250.0) and end[1] == pytest.approx(1000.0) and end[2] == pytest.approx(1000.0)


def test_moving_a_running_job_costs_the_migration_cost():
    cluster = load_cluster("n2g1")
    jobs = [JobSpec(0, 1, 0.0, 1000, 1.0)]
    r = Simulator(jobs, cluster, Pin({0: ((0, 1),)}, move_at=100.0, move_to=((1, 1),)), migration_cost=40.0).run()
    assert r.extra["migrations"] == 1 and r.restart_seconds == pytest.approx(40.0)
    assert r.jobs[0].end_time == pytest.approx(1040.0)


def test_the_timeline_adds_up_to_the_service_received():
    cluster = heterogeneous_cluster({"v100": (1, 2), "k80": (1, 4)})
    jobs = [JobSpec(i, 1, 10.0 * i, 500 + 100 * i, 1.0, user=f"u{i % 3}", speeds=(("v100", 2.0),))
            for i in range(6)]
    where = {0: ((0, 1),), 1: ((0, 1),), 2: ((1, 1),), 3: ((1, 1),), 4: ((1, 1),), 5: ((1, 1),)}
    r = Simulator(jobs, cluster, Pin(where), window=120.0).run()
    tl = r.extra["timeline"]
    assert [w["start"] for w in tl] == [120.0 * k for k in range(len(tl))]
    for u, got in r.extra["service_by_user"].items():
        assert sum(sum(w["gpu_seconds"].get(u, {}).values()) for w in tl) == pytest.approx(got)
    # iterations per user add up to the jobs' lengths (every job finished)
    for u in {j.user for j in jobs}:
        done = sum(j.iterations for j in jobs if j.user == u)
        assert sum(w["iterations"].get(u, 0.0) for w in tl) == pytest.approx(done)
    v100 = sum(w["gpu_seconds"].get("u0", {}).get("v100", 0.0) for w in tl)
    assert v100 > 0  # typed GPU-seconds are kept per GPU type


def test_fairness_reports_are_written_as_csv_and_png(tmp_path):
    from elastictrain.sim.fairness import heterogeneous, homogeneous, write_report

    hom = homogeneous(os.path.join(DATA, "60_job.csv"), hours=2, window=1800)
    paths = write_report(hom, str(tmp_path / "hom"))
    assert [os.path.basename(p) for p in paths] == ["fairness_total.csv", "fairness_timeline.csv", "fairness.png"]
    rows = open(paths[1]).read().splitlines()
    assert rows[0].startswith("window_start_h,class_1gpu") and len(rows) == 1 + 4  # four half-hour windows
    het = heterogeneous(os.path.join(DATA, "gavel_throughputs_subset.json"), hours=2, warmup=1800,
                        jobs_per_user=20, window=1800)
    paths = write_report(het, str(tmp_path / "het"))
    total = open(paths[0]).read().splitlines()
    assert total[0] == "user,rate_agnostic,rate_traded,gain" and len(total) == 6 and total[-1].startswith("mean,")
    assert os.path.getsize(paths[2]) > 10_000  # a real PNG


def test_fairness_command_prints_the_table_and_names_the_fix_for_bad_input(tmp_path, capsys):
    from elastictrain.cli import main

    assert main(["fairness", "heterogeneous", "--throughputs", os.path.join(DATA, "gavel_throughputs_subset.json"),
                 "--hours", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ResNet-50 (batch size 64)" in out and "wrote" in out and (tmp_path / "fairness.png").exists()
    assert main(["fairness", "heterogeneous", "--throughputs", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert "--throughputs" in err and "no such file" in err
    assert main(["fairness", "heterogeneous", "--hours", "1"]) == 2
    assert "warm-up" in capsys.readouterr().err
    assert main(["fairness", "heterogeneous", "--hours", "1.5"]) == 0  # the shipped table is the default
    assert "V100/K80" in capsys.readouterr().out
    assert main(["fairness", "homogeneous", "--hours", "1", "--policy", "gandiva-fair-global"]) == 0
    assert "GPU time / fair share" in capsys.readouterr().out


def test_gandiva_fair_refuses_a_gang_bigger_than_every_gpu_type():
    from elastictrain.policies import create

    cluster = heterogeneous_cluster({"v100": (1, 4), "k80": (1, 4)})
    r = Simulator([JobSpec(0, 6, 0.0, 100, 1.0)], cluster, create("gandiva-fair")).run()
    assert not r.jobs and "runs a gang on one GPU type, and the largest type has 4" in r.extra["rejected"][0][1]
    # given one anyway (a live coordinator, where a type may be whole again later), it waits in the
    # central stride, and the next decision's notes say why (once; each decision used to fail on it)
    policy = create("gandiva-fair")
    d = policy.decide(ClusterSnapshot(0.0, (JobView(0, 6, 0.0),), (4, 4), 1, arrived=(JobView(0, 6, 0.0),),
                                      node_types=("v100", "k80")))
    assert d.run == {} and len(d.notes) == 1 and "more than any one GPU type offers now" in d.notes[0][1]["why"]
    assert policy._jobs[0].home is None
    assert policy.decide(ClusterSnapshot(60.0, (JobView(0, 6, 0.0),), (4, 4), 1, node_types=("v100", "k80"))).notes \
        == ()
