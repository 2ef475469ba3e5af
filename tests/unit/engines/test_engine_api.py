"""What every engine shares: run names (how a restarted coordinator finds its runs) and one exit
status for a run of several nodes."""

import pytest

from elastictrain.engines.api import combine_codes, parse_run_name, run_name
from elastictrain.engines.ray_engine import RayAdapter, node_name
from elastictrain.errors import ConfigError


def test_run_names_round_trip_and_refuse_others():
    assert parse_run_name(run_name("train-7", 3)) == ("train-7", 3)
    assert parse_run_name(run_name("a.b_c", 12)) == ("a.b_c", 12)
    for other in ("et.x", "someone-elses", "et..r1", "et.x.r", "et.x.r1.n0"):
        assert parse_run_name(other) is None


@pytest.mark.parametrize("codes,want", [
    ([0, 0], 0), ([0, 75], 75), ([75, 1], 1), ([1, 2], 1), ([None, 0], 0), ([None, None], None), ([137, 75], 137)])
def test_one_exit_status_for_a_run_of_several_nodes(codes, want):
    assert combine_codes(codes) == want


def test_ray_names_and_settings():
    assert node_name("665b27554f148f0961ba1318c9d4") == "ray-665b27554f14"
    with pytest.raises(ConfigError, match="--ray-address"):
        RayAdapter("", "http://c", "/tmp")
    a = RayAdapter("10.0.0.1:6379", "http://c", "/tmp/x", tag="abc")
    assert a.namespace == "elastictrain-abc" and a.output("et.j.r4") == "/tmp/x/ray/j/run4/etrun.log"


def test_the_slurm_option_names_are_the_engine_options():
    """``--slurm-state-dir`` and ``--slurm-coordinator-url`` (the first Slurm release's names) set the
    same settings as ``--engine-state-dir`` and ``--engine-coordinator-url``."""
    from elastictrain.cli import _engine_config, get_parser

    base = ["coordinator", "--policy", "fifo", "--backend", "slurm", "--slurm-partition", "gpu"]
    old = _engine_config(get_parser().parse_args(base + ["--slurm-state-dir", "/s", "--slurm-coordinator-url",
                                                         "http://h:1"]))
    new = _engine_config(get_parser().parse_args(base + ["--engine-state-dir", "/s", "--engine-coordinator-url",
                                                         "http://h:1"]))
    assert old == new and old.state_dir == "/s" and old.coordinator_url == "http://h:1"


def test_cpus_per_worker_reaches_every_engine_and_is_checked():
    from elastictrain.cli import _engine_config, get_parser

    base = ["coordinator", "--policy", "fifo"]
    engines = {"slurm": ["--slurm-partition", "cpu"], "ray": ["--ray-address", "h:6379"],
               "kubernetes": ["--k8s-image", "img:1"]}
    for backend, extra in engines.items():
        args = base + ["--backend", backend, *extra]
        assert _engine_config(get_parser().parse_args(args)).cpus_per_worker == 0  # GPUs, by default
        cfg = _engine_config(get_parser().parse_args(args + ["--engine-cpus-per-worker", "4"]))
        assert cfg.cpus_per_worker == 4, backend
        with pytest.raises(ConfigError, match="1 to 4096"):
            _engine_config(get_parser().parse_args(args + ["--engine-cpus-per-worker", "5000"]))
    old = _engine_config(get_parser().parse_args(base + ["--backend", "slurm", "--slurm-partition", "cpu",
                                                         "--slurm-cpus-per-worker", "3"]))
    assert old.cpus_per_worker == 3  # the name it had first
