"""``torchx run -s elastictrain``: what a TorchX app becomes at the coordinator (the request
``torchx run --dryrun`` prints), and the apps it refuses, with the reason."""

import pytest

pytest.importorskip("torchx", reason="TorchX is not installed: `make install` (the dev extra) installs it")

from torchx.components.dist import torchrun  # noqa: E402
from torchx.components.utils import python, sh  # noqa: E402
from torchx.specs import AppDef, AppState, Role  # noqa: E402

from elastictrain.errors import ConfigError  # noqa: E402
from elastictrain_torchx.scheduler import STATES, ElastictrainScheduler, job_request  # noqa: E402


def _req(app, **cfg):
    return job_request(app, {"workdir": "/work", **cfg})


def test_a_torchrun_app_becomes_one_job_of_its_workers_elastic_between_its_node_counts():
    r = _req(torchrun("--epochs", "3", "--lr", "0.1", script="train.py", j="1:2x2"))
    assert r.command == ["train.py", "--epochs", "3", "--lr", "0.1"] and not r.module
    assert (r.gpus, r.min_gpus) == (4, 2) and r.workdir == "/work" and r.name == "train"
    assert "LOGLEVEL" not in r.env and r.env["TORCHX_TRACKING_RUN_NAME"] == "train"  # (torchrun's own: dropped)
    assert r.max_restarts == 0  # TorchX's max_retries (0 unless given), not the coordinator's default 3
    r = _req(torchrun(m="pkg.train", j="2x1", max_retries=2))
    assert r.command == ["pkg.train"] and r.module and (r.gpus, r.min_gpus) == (2, None) and r.max_restarts == 2


def test_a_python_app_runs_its_replicas_as_workers_and_run_options_reach_the_job():
    app = python("--data", "d", script="train.py", num_replicas=3)
    r = _req(app, priority=5, project="vision", gpu_type="a100", steps=100, time_limit=3600.0, grace=60.0)
    assert r.command == ["train.py", "--data", "d"] and r.gpus == 3 and r.min_gpus is None
    assert (r.priority, r.project, r.gpu_type, r.steps, r.time_limit, r.grace) == (5, "vision", "a100", 100, 3600.0,
                                                                                  60.0)
    role = Role("trainer", image="", entrypoint="python3", args=["-u", "-m", "pkg.main", "--x"], num_replicas=4,
                min_replicas=2)
    r = _req(AppDef("my app!", roles=[role]))
    assert r.command == ["pkg.main", "--x"] and r.module and (r.gpus, r.min_gpus) == (4, 2) and r.name == "my-app"
    bare = Role("t", image="", entrypoint="torchrun", args=["--nnodes", "1", "--nproc-per-node", "3",
                                                          "--max-restarts", "5", "t.py", "${app_id}"])
    r = _req(AppDef("exp-1", roles=[bare]))
    assert r.gpus == 3 and r.max_restarts == 5 and r.command == ["t.py", "exp-1"]  # ${app_id}: the app's name


@pytest.mark.parametrize("app, says", [
    (sh("echo", "hi"), "runs Python training scripts under etrun: use a torchrun command (the dist.ddp component) or "
                       "python SCRIPT/-m MODULE (utils.python), not echo"),
    (AppDef("two", roles=[Role("a", image="", entrypoint="python", args=["a.py"]),
                          Role("b", image="", entrypoint="python", args=["b.py"])]),
     "runs apps of one role (a training job), not 2 (a, b)"),
    (AppDef("r", roles=[Role("a", image="", entrypoint="python", args=["a.py", "--rank", "${replica_id}"])]),
     "${replica_id} in the script's arguments is not supported here: etrun sets GROUP_RANK"),
    (AppDef("n", roles=[Role("a", image="", entrypoint="torchrun", args=["--nproc-per-node", "gpu", "a.py"])]),
     "give --nproc-per-node as a number"),
    (AppDef("p", roles=[Role("a", image="", entrypoint="python", args=["-c", "print(1)"])]),
     "run a script (python train.py ...)"),
    (AppDef("e", roles=[Role("a", image="", entrypoint="python", args=["a.py"], env={"1 BAD": "x"})]),
     "the coordinator would refuse it"),
])
def test_apps_it_cannot_run_are_refused_with_the_reason(app, says):
    with pytest.raises(ConfigError) as err:
        _req(app)
    assert says in str(err.value)


def test_the_coordinators_states_as_torchx_names_them_and_the_dryrun_shows_the_request():
    assert STATES == {"queued": AppState.PENDING, "preempted": AppState.PENDING, "running": AppState.RUNNING,
                      "finished": AppState.SUCCEEDED, "failed": AppState.FAILED, "cancelled": AppState.CANCELLED}
    s = ElastictrainScheduler("sess")
    info = s.submit_dryrun(torchrun(script="train.py", j="1x2"), {"coordinator": "http://c:7707", "workdir": "/w"})
    text = str(info)
    assert text.startswith("POST http://c:7707/v1/cluster/jobs") and '"gpus": 2' in text and '"train.py"' in text
