"""torchrun's habits under etrun: every torchrun flag is accepted, and the multi-node launches
where one node hosts the rendezvous (c10d endpoint, classic static master) work with real
agents and real gloo workers."""

import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from elastictrain.launcher.cli import config_from_args, get_args_parser

from .test_etrun import etrun, finish, kill_tree, write

torch_run = pytest.importorskip("torch.distributed.run")

ALLREDUCE = """
    import os, sys, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()}/{dist.get_world_size()} local {os.environ['LOCAL_RANK']} sum {t.item():.0f}",
          flush=True)
    dist.destroy_process_group()
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sample_value(action):
    """A value torchrun's own parser accepts for ``action``."""
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(list(action.choices)[0])]
    known = {"--nnodes": "1", "--nproc-per-node": "1", "--rdzv-backend": "c10d", "--rdzv-endpoint": "127.0.0.1:29400",
             "--rdzv-conf": "join_timeout=30", "--max-restarts": "1", "--monitor-interval": "0.5", "--redirects": "3",
             "--tee": "1", "--local-ranks-filter": "0", "--node-rank": "0", "--master-port": "29500",
             "--signals-to-handle": "SIGTERM,SIGUSR1", "--shutdown-timeout": "5",
             "--duplicate-stdout-filters": "loss", "--duplicate-stderr-filters": "error"}
    long = next(s for s in action.option_strings if s.startswith("--"))
    return [known.get(long, "x")]


def test_etrun_accepts_every_flag_of_torchrun():
    theirs = [a for a in torch_run.get_args_parser()._actions if a.option_strings and "-h" not in a.option_strings]
    ours = {s for a in get_args_parser()._actions for s in a.option_strings}
    missing = sorted({s for a in theirs for s in a.option_strings} - ours)
    assert not missing, f"torchrun flags etrun refuses: {missing}"
    for action in theirs:  # each parses with a value torchrun accepts, in every spelling
        for spelling in action.option_strings:
            argv = [spelling, *_sample_value(action), "train.py"]
            torch_run.get_args_parser().parse_args(argv)  # the value is valid for torchrun
            config_from_args(get_args_parser().parse_args(argv))


def test_etrun_help_lists_what_torchrun_help_lists():
    def flags(cmd):  # the option names at the start of the help's option lines
        out = subprocess.run(cmd + ["--help"], capture_output=True, text=True, timeout=60).stdout
        heads = [re.split(r"\s{2,}", line.strip())[0] for line in out.splitlines() if line.strip().startswith("-")]
        return {f for head in heads for f in re.findall(r"--[a-z][a-z_-]+", head)}

    theirs = flags([sys.executable, "-m", "torch.distributed.run"])
    ours = flags([sys.executable, "-m", "elastictrain.launcher.cli"])
    assert len(theirs) > 20 and not theirs - ours, f"in torchrun --help, not in etrun --help: {theirs - ours}"


def test_flag_suggestions_are_only_offered_when_close(capsys):
    with pytest.raises(SystemExit):
        get_args_parser().parse_args(["--frobnicate", "x", "train.py"])
    assert "did you mean" not in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a known flag with a bad value: no suggestion of itself
        get_args_parser().parse_args(["--profile", "x", "train.py"])
    err = capsys.readouterr().err
    assert "argument --profile: invalid int value: 'x'" in err and "did you mean" not in err


def test_shutdown_timeout_is_torchruns_name_for_the_grace(monkeypatch):
    assert config_from_args(get_args_parser().parse_args(["--shutdown-timeout", "7", "x.py"])).shutdown_grace == 7
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "11")
    assert config_from_args(get_args_parser().parse_args(["x.py"])).shutdown_grace == 11


@pytest.mark.parametrize("bad, word", [("SIGNOPE", "not a signal"), ("SIGKILL", "cannot be handled"), ("", "empty")])
def test_bad_signals_are_refused(bad, word):
    from elastictrain.errors import ConfigError

    with pytest.raises(ConfigError, match=word):
        config_from_args(get_args_parser().parse_args(["--signals-to-handle", bad, "x.py"]))


def test_etcd_is_refused_with_the_alternative():
    from elastictrain.errors import ConfigError

    with pytest.raises(ConfigError, match="use c10d"):
        config_from_args(get_args_parser().parse_args(
            ["--rdzv-backend", "etcd", "--rdzv-endpoint", "h:2379", "--nnodes", "2", "x.py"]))


def test_virtual_local_rank_and_duplicate_filters(tmp_path):
    script = write(tmp_path, "t.py", ALLREDUCE)
    logs = tmp_path / "logs"
    p = etrun(["--standalone", "--nproc-per-node", "2", "--virtual-local-rank", "--warm-spares", "0",
               "--log-dir", str(logs), "--rdzv-id", "v", "--duplicate-stdout-filters", "sum 3,nothing", script],
              cwd=str(tmp_path))
    code, out, err = finish(p, 120)
    assert code == 0, err
    assert "local 0 sum 3" in out and "local 1" not in out  # both workers see LOCAL_RANK=0
    filtered = list(logs.rglob("filtered_stdout.log"))
    assert filtered and filtered[0].read_text().count("sum 3") == 2
    assert "[etrun] INFO generation 1" in err  # generations are shown by default


def test_signals_to_handle_forwards_sigusr1(tmp_path):
    script = write(tmp_path, "t.py", """
        import signal, sys, time
        def on_usr1(*_):
            print("worker got SIGUSR1", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGUSR1, on_usr1)
        print("ready", flush=True)
        time.sleep(60)
    """)
    p = etrun(["--standalone", "--signals-to-handle", "SIGTERM,SIGUSR1", "--warm-spares", "0", script],
              cwd=str(tmp_path))
    line = p.stdout.readline()
    assert b"ready" in line
    p.send_signal(signal.SIGUSR1)
    code, out, err = finish(p, 60)
    assert "worker got SIGUSR1" in out and "forwarding SIGUSR1" in err


def _two_agents(tmp_path, argv_for):
    script = write(tmp_path, "t.py", ALLREDUCE)
    procs = [etrun(argv_for(i) + ["--warm-spares", "0", script], cwd=str(tmp_path)) for i in range(2)]
    try:
        results = [finish(p, 120) for p in procs]
    finally:
        for p in procs:
            kill_tree(p.pid)
    for code, out, err in results:
        assert code == 0, err
    outs = "".join(r[1] for r in results)
    assert "rank 0/2" in outs and "rank 1/2" in outs and outs.count("sum 3") == 2
    return results


def test_c10d_endpoint_is_hosted_by_the_node_that_owns_it(tmp_path):
    port = _free_port()
    results = _two_agents(tmp_path, lambda i: ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                                               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "habit"])
    errs = [r[2] for r in results]
    assert sum("hosting the rendezvous" in e for e in errs) == 1
    assert sum("joining the rendezvous" in e for e in errs) == 1


def test_classic_static_launch_with_master_addr_and_node_rank(tmp_path):
    port = _free_port()
    _two_agents(tmp_path, lambda i: ["--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "1",
                                     "--master-addr", "127.0.0.1", "--master-port", str(port)])


def test_is_host_0_joins_and_waits_for_a_host(tmp_path):
    port = _free_port()
    t0 = time.monotonic()
    results = _two_agents(tmp_path, lambda i: ["--nnodes", "2", "--rdzv-backend", "c10d",
                                               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "h",
                                               "--rdzv-conf", f"is_host={1 if i else 0}"])
    assert "hosting" in results[1][2] and "joining" in results[0][2]
    assert time.monotonic() - t0 < 100
