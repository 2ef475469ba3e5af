import os

import pytest

from elastictrain.errors import ConfigError
from elastictrain.launcher.cli import config_from_args, get_args_parser


def cfg(argv, monkeypatch=None):
    return config_from_args(get_args_parser().parse_args(argv))


def test_both_spellings_give_the_same_config():
    a = cfg(["--nproc-per-node", "3", "--max-restarts", "2", "--rdzv-id", "j", "train.py", "--lr", "1"])
    b = cfg(["--nproc_per_node=3", "--max_restarts=2", "--rdzv_id=j", "train.py", "--lr", "1"])
    assert a == b
    assert a.nproc_per_node == 3 and a.args == ("--lr", "1") and a.run_id == "j"


def test_every_flag_reads_an_env_variable(monkeypatch):
    monkeypatch.setenv("ET_NPROC_PER_NODE", "4")
    monkeypatch.setenv("ET_MAX_RESTARTS", "7")
    monkeypatch.setenv("ET_STANDALONE", "1")
    c = cfg(["train.py"])
    assert (c.nproc_per_node, c.max_restarts, c.coordinator) == (4, 7, None)
    assert cfg(["--nproc-per-node", "2", "train.py"]).nproc_per_node == 2  # a flag beats the env


def test_unknown_flag_names_the_closest(capsys):
    with pytest.raises(SystemExit) as exc:
        get_args_parser().parse_args(["--nproc-per-nod", "2", "train.py"])
    assert exc.value.code == 2
    assert "did you mean --nproc-per-node" in capsys.readouterr().err


def test_nnodes_nproc_and_streams():
    c = cfg(["--nnodes", "1:4", "--rdzv-endpoint", "host:7707", "--nproc-per-node", "cpu", "-r", "0:1,1:2",
             "-t", "3", "--local-ranks-filter", "0", "x.py"])
    assert (c.min_nodes, c.max_nodes, c.coordinator) == (1, 4, "http://host:7707")
    assert c.redirects == {0: 1, 1: 2} and c.tee[0] == 3 and c.local_ranks_filter == {0}
    assert cfg(["--standalone", "--rdzv-endpoint", "h:1", "x.py"]).coordinator is None


@pytest.mark.parametrize("argv, word", [
    (["--nnodes", "2:1", "--coordinator", "http://h:1", "x.py"], "MIN <= MAX"),
    (["--nnodes", "1:2", "x.py"], "shared coordinator"),
    (["--nproc-per-node", "many", "x.py"], "--nproc-per-node"),
    (["-r", "9", "x.py"], "--redirects"),
    (["-m", "--no-python", "x"], "--module and --no-python"),
    (["--rdzv-conf", "oops", "x.py"], "key=value"),
])
def test_bad_values_name_the_flag(argv, word):
    with pytest.raises(ConfigError, match=word):
        cfg(argv)


def test_horovod_mode_is_chosen_and_refused_where_it_cannot_work(monkeypatch):
    import elastictrain.launcher.cli as cli

    monkeypatch.setattr(cli, "find_spec", lambda name: object() if name == "horovod" else None)
    assert cfg(["x.py"]).horovod is True  # auto: installed, one node
    assert cfg(["--horovod", "off", "x.py"]).horovod is False
    # several nodes too: auto (a node 0 without Horovod turns it off there), on (required: that is an error)
    multi = cfg(["--nnodes", "2", "--coordinator", "http://127.0.0.1:1", "x.py"])
    assert multi.horovod is True and multi.horovod_required is False
    assert cfg(["--group", "a.py", "b.py"]).horovod is False
    assert cfg(["--horovod", "on", "--nnodes", "1:2", "--coordinator", "http://127.0.0.1:1", "x.py"]).horovod_required
    with pytest.raises(ConfigError, match="one context per process"):
        cfg(["--horovod", "on", "--group", "a.py", "b.py"])
    monkeypatch.setattr(cli, "find_spec", lambda name: None)
    assert cfg(["x.py"]).horovod is False
    with pytest.raises(ConfigError, match="make horovod"):
        cfg(["--horovod", "on", "x.py"])


def test_zygote_keep_flags():
    from elastictrain.launcher.cli import config_from_args, get_args_parser

    cfg = config_from_args(get_args_parser().parse_args(["--standalone", "--zygote", "keep", "x.py"]))
    assert cfg.zygote and cfg.zygote_keep == 600.0
    cfg = config_from_args(get_args_parser().parse_args(["--standalone", "--zygote", "keep", "--zygote-idle", "5",
                                                         "x.py"]))
    assert cfg.zygote_keep == 5.0
    assert config_from_args(get_args_parser().parse_args(["--standalone", "x.py"])).zygote_keep == 0.0
    for bad in ("0", "-1", "nan", "1e9"):
        with pytest.raises(ConfigError, match="zygote-idle"):
            config_from_args(get_args_parser().parse_args(["--standalone", "--zygote", "keep", "--zygote-idle",
                                                           bad, "x.py"]))


def test_kept_zygote_key_reads_only_what_imports_could_depend_on():
    from elastictrain.launcher.zygote_keep import key

    base = {"PATH": "/usr/bin", "HOME": "/root"}
    k = key(("torch",), base)
    assert key(("torch",), dict(base, RANK="3", MASTER_PORT="1234", ET_JOB="x")) == k
    for name in ("PYTHONPATH", "LD_LIBRARY_PATH", "TORCH_LOGS", "OMP_NUM_THREADS", "CUDA_HOME"):
        assert key(("torch",), dict(base, **{name: "1"})) != k, name
    assert key(("torch", "numpy"), base) != k
    assert key(("torch",), dict(base, PATH="/opt/bin")) != k
    # a job on other GPUs of the node forks from the same zygote: the device list is the worker's,
    # read when it first uses a GPU, after the fork (the zygote does not even see one)
    assert key(("torch",), dict(base, CUDA_VISIBLE_DEVICES="2,3", HIP_VISIBLE_DEVICES="1")) == k
    from elastictrain.launcher.zygote_keep import zygote_env

    assert zygote_env(dict(base, ET_TOKEN="secret", RANK="1", TORCH_LOGS="x", CUDA_VISIBLE_DEVICES="0")) == \
        dict(base, TORCH_LOGS="x")


def test_node_daemon_passes_its_zygote_mode_to_every_task():
    from elastictrain.launcher.task_command import etrun_command
    from elastictrain.wire import Task

    spec = Task(job="j1", run=1, slots=2, gpus=[0, 1], nnodes=1, command=["train.py"], workdir="/w", env={},
                max_restarts=3, grace=30.0, module=False)
    cmd = etrun_command(spec, "http://127.0.0.1:1", log_dir=None, zygote="keep")
    assert cmd[cmd.index("--zygote") + 1] == "keep" and cmd[-1] == "train.py"
    assert "--zygote" not in etrun_command(spec, "http://127.0.0.1:1", log_dir=None)
    cfg = config_from_args(get_args_parser().parse_args(cmd[4:]))  # etrun accepts what the daemon builds
    assert cfg.zygote_keep == 600.0


def test_node_daemon_keeps_a_zygote_for_its_own_accounts_jobs_by_default(tmp_path, monkeypatch):
    """Without --zygote, the daemon's own account's jobs keep a zygote between tasks (a job started
    or resumed there forks at once); a job run as another account gets one per task."""
    import subprocess

    from elastictrain.launcher import node as node_mod
    from elastictrain.launcher.run_as import Account
    from elastictrain.wire import Task

    seen = []

    class Stop(Exception):
        pass

    def popen(cmd, **kw):
        seen.append((cmd[cmd.index("--zygote") + 1] if "--zygote" in cmd else None, kw["env"].get("ET_ZYGOTE_DIR")))
        raise Stop

    me = Account("me", os.getuid(), os.getgid(), (), str(tmp_path), "/bin/sh", False)
    other = Account("alice", 12345, 12345, (), str(tmp_path), "/bin/sh", True)
    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(node_mod, "chown_for", lambda *a: None)
    spec = Task(job="j1", run=1, slots=1, gpus=[0], nnodes=1, command=["train.py"], workdir=str(tmp_path), env={},
                max_restarts=3, grace=30.0, module=False)
    ours = node_mod.node_zygote_dir(str(tmp_path))
    try:
        # (a kept zygote of our own account's job listens in the daemon's own directory, which the
        # daemon stops and removes when it leaves; another account's stays in that user's default)
        for zygote, acct, want in ((None, me, ("keep", ours)), (None, other, ("on", None)), ("on", me, ("on", None)),
                                   ("keep", other, ("keep", None))):
            monkeypatch.setattr(node_mod, "resolve", lambda *a, _acct=acct: _acct)
            daemon = node_mod.NodeDaemon(node_mod.NodeConfig("http://127.0.0.1:1", None, "n1", 1,
                                                             state_dir=str(tmp_path), zygote=zygote))
            with pytest.raises(Stop):
                daemon._start(spec)
            assert seen[-1] == want, (zygote, acct.name)
        assert os.stat(ours).st_mode & 0o777 == 0o700
    finally:
        node_mod.stop_node_zygotes(str(tmp_path))
    assert not os.path.exists(ours)
    # /tmp is shared: a directory of that name that is not private to the daemon is not its to remove
    os.mkdir(ours, 0o755)
    try:
        assert node_mod.stop_node_zygotes(str(tmp_path)) == 0 and os.path.isdir(ours)
    finally:
        os.rmdir(ours)


@pytest.mark.parametrize("argv, says", [
    (["missing.py"], "the training script missing.py does not exist (looked in"),
    (["--group", "here.py", "missing.py"], "the --group script missing.py does not exist"),
    (["--no-python", "no-such-program-x"], "the program no-such-program-x was not found or is not executable on PATH"),
    (["--no-python", "./here.py"], "the program ./here.py was not found or is not executable;"),
    (["-m", "no_such_module_x"], "-m no_such_module_x: no module named 'no_such_module_x'"),
])
def test_a_missing_script_program_or_module_fails_at_once(argv, says, tmp_path, monkeypatch, capsys):
    # it was retried --max-restarts times, each attempt failing the same way (issue 32.8)
    from elastictrain.launcher.cli import main

    (tmp_path / "here.py").write_text("print('hi')\n")  # exists, but is not executable
    monkeypatch.chdir(tmp_path)
    assert main(["--max-restarts", "3", "--standalone", *argv]) == 2
    assert says in capsys.readouterr().err


def test_a_script_module_or_program_that_is_there_passes_the_check(tmp_path, monkeypatch):
    from elastictrain.launcher.cli import check_entrypoint

    (tmp_path / "here.py").write_text("print('hi')\n")
    (tmp_path / "mymod.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    for argv in (["here.py"], ["-m", "mymod"], ["-m", "json.tool"], ["--no-python", "true"],
                 ["--group", "here.py", "here.py"]):
        check_entrypoint(cfg(argv))


def test_the_agent_names_its_node_from_et_node_name_when_it_is_a_node_name(monkeypatch, caplog):
    from elastictrain.launcher.agent import node_name

    monkeypatch.delenv("ET_NODE_NAME", raising=False)
    assert node_name() == ""
    monkeypatch.setenv("ET_NODE_NAME", "gpu-07.rack2")
    assert node_name() == "gpu-07.rack2"
    monkeypatch.setenv("ET_NODE_NAME", "my node; rm -rf /")
    assert node_name() == "" and "is not a node name" in caplog.text  # not reported, not refused
