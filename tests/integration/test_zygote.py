"""etrun's zygote (launcher/zygote.py): every worker is forked from one process per node that
imported the preload list once. Real etrun, real gloo workers, real kills: the workers come from
the zygote with torchrun's environment, their own process group and their output routed; a
worker killed in the first second of training is replaced by a fork and the job keeps its data
exactly once; a SIGKILLed etrun takes the zygote and its workers with it; a preload that starts a
thread makes etrun fall back, and say so. (How fast: benchmarks/launcher.py.)"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

pytest.importorskip("torch")

ETRUN = [sys.executable, "-m", "elastictrain.launcher.cli"]
HERE = os.path.dirname(os.path.abspath(__file__))
LEDGER = os.path.join(HERE, "workers", "ledger_train.py")

PROBE = """
import json, os, sys
preloaded = "torch" in sys.modules  # before this script imports anything
import numpy as np
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
info = {"rank": dist.get_rank(), "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0),
        "preloaded": preloaded, "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "MYVAR")}, "np": float(np.random.rand()),
        "cwd": os.getcwd()}
with open(f"probe{dist.get_rank()}.json", "w") as f:
    json.dump(info, f)
print(f"hello from rank {dist.get_rank()}", flush=True)
print(f"warning from rank {dist.get_rank()}", file=sys.stderr, flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def _run(args, cwd, timeout=120, env=None):
    e = dict(os.environ, **(env or {}))
    e.pop("ET_COORDINATOR", None)
    return subprocess.run(ETRUN + args, cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)


def test_workers_are_forked_from_the_zygote_with_torchruns_environment(tmp_path):
    (tmp_path / "probe.py").write_text(textwrap.dedent(PROBE))
    r = _run(["--standalone", "--nproc-per-node", "2", "--tee", "3", "--log-dir", str(tmp_path / "logs"),
              "probe.py"], tmp_path, env={"MYVAR": "kept"})
    assert r.returncode == 0, r.stderr[-3000:]
    info = [json.loads((tmp_path / f"probe{i}.json").read_text()) for i in range(2)]
    assert all(i["preloaded"] for i in info), "the workers did not come from a process that had imported torch"
    assert info[0]["ppid"] == info[1]["ppid"] != os.getpid()  # both forked by one zygote
    for rank, i in enumerate(info):
        assert i["pgid"] == i["pid"], "a worker has its own process group (etrun signals it as a group)"
        assert i["env"]["RANK"] == str(rank) and i["env"]["LOCAL_RANK"] == str(rank)
        assert i["env"]["WORLD_SIZE"] == "2" and i["env"]["MYVAR"] == "kept" and i["env"]["MASTER_PORT"]
        assert i["cwd"] == str(tmp_path)
    assert info[0]["np"] != info[1]["np"], "numpy's generator is reseeded in each fork, as in a fresh process"
    assert "[default0]:hello from rank 0" in r.stdout and "[default1]:hello from rank 1" in r.stdout
    assert "[default1]:warning from rank 1" in r.stderr
    logs = list((tmp_path / "logs").rglob("stdout.log"))
    assert len(logs) == 2 and any("hello from rank" in p.read_text() for p in logs)


def test_a_worker_killed_in_its_first_second_is_replaced_by_a_fork(tmp_path):
    """SIGKILL of rank 1 as soon as its first checkpoint lands (well within the first second of
    training): the replacement is forked by the same zygote, and every sample is trained on
    exactly once."""
    import numpy as np

    (tmp_path / "ckpt").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ET_COORDINATOR"}
    env.update(LEDGER_SAMPLES="20000", LEDGER_EPOCHS="2", LEDGER_STEP_SLEEP="0.02", LEDGER_CKPT_EVERY="5",
               LEDGER_DIR=str(tmp_path / "ckpt"))
    p = subprocess.Popen(ETRUN + ["--standalone", "--nproc-per-node", "2", "--max-restarts", "2", LEDGER],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        victim = zygote = None
        while victim is None:
            assert time.monotonic() < deadline and p.poll() is None, p.communicate()[1].decode()[-3000:]
            if list((tmp_path / "ckpt").glob("g1-s5.npy")):
                (zygote,) = [k for k in psutil.Process(p.pid).children() if "launcher.zygote" in " ".join(k.cmdline())]
                victim = max(zygote.children(), key=lambda k: k.pid)  # rank 1 (forked second)
            time.sleep(0.005)
        os.kill(victim.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        while len(zygote.children()) < 2 or victim.pid in [k.pid for k in zygote.children()]:
            assert time.monotonic() - t_kill < 60 and p.poll() is None
            time.sleep(0.005)  # the replacement: a new child of the same zygote
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    err = err.decode()
    assert p.returncode == 0, err[-3000:]
    assert "restart 1/2" in err and "zygote not used" not in err
    counts = np.load(open(tmp_path / "ckpt" / "final.npy", "rb"))
    assert counts.min() == 1 and counts.max() == 1, "exactly-once broken"


def test_a_killed_etrun_takes_its_zygote_and_workers_with_it(tmp_path):
    (tmp_path / "sleep.py").write_text("import time\nwhile True:\n    time.sleep(0.1)\n")
    p = subprocess.Popen(ETRUN + ["--standalone", "--nproc-per-node", "2", "sleep.py"], cwd=tmp_path,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            kids = psutil.Process(p.pid).children(recursive=True)
            if len([k for k in kids if "launcher.zygote" in " ".join(k.cmdline())]) >= 3:  # zygote + 2 forks
                break
            assert time.monotonic() < deadline, kids
            time.sleep(0.05)
        p.kill()  # SIGKILL: no chance to clean up
        p.wait()
        gone, alive = psutil.wait_procs(kids, timeout=10)
        assert not alive, f"left running after etrun's SIGKILL: {[k.pid for k in alive]}"
    finally:
        for k in psutil.process_iter():
            try:
                if "launcher.zygote" in " ".join(k.cmdline()) and str(tmp_path) in k.cwd():
                    k.kill()
            except psutil.Error:
                pass


def test_a_preload_that_starts_a_thread_falls_back_and_says_so(tmp_path):
    (tmp_path / "threaded_mod.py").write_text("import threading, time\n"
                                              "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    (tmp_path / "job.py").write_text("import os\nprint('ran', os.environ['RANK'], flush=True)\n")
    r = _run(["--standalone", "--nproc-per-node", "2", "--preload", "threaded_mod", "job.py"], tmp_path,
             env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "zygote not used" in r.stderr and "started Python threads" in r.stderr
    assert "ran 0" in r.stdout and "ran 1" in r.stdout


def test_the_zygote_exits_without_the_interpreters_teardown(tmp_path):
    """etrun waits for its zygote's exit before its own; with torch imported, Python's teardown
    took about a second, which every preemption paid. The zygote now leaves with os._exit: an
    atexit handler of its preload list (the teardown) never runs, and the exit status is 0."""
    import socket

    (tmp_path / "teardown_mod.py").write_text(
        "import atexit\n"
        f"atexit.register(lambda: open({str(tmp_path / 'teardown_ran')!r}, 'w').close())\n")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    p = subprocess.Popen([sys.executable, "-m", "elastictrain.launcher.zygote", str(theirs.fileno()), "teardown_mod"],
                         pass_fds=[theirs.fileno()], env={**os.environ, "PYTHONPATH": str(tmp_path)})
    theirs.close()
    try:
        ours.settimeout(60)
        assert ours.recv(256) == b"R"  # imported, ready to fork
        ours.close()  # etrun is done: the zygote retires
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
    assert not (tmp_path / "teardown_ran").exists()


def test_zygote_off_uses_fresh_interpreters(tmp_path):
    (tmp_path / "probe.py").write_text(textwrap.dedent(PROBE))
    r = _run(["--standalone", "--nproc-per-node", "2", "--zygote", "off", "--warm-spares", "0", "probe.py"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    info = [json.loads((tmp_path / f"probe{i}.json").read_text()) for i in range(2)]
    assert not any(i["preloaded"] for i in info)


# ---------------------------------------------------------------- --zygote keep (launcher/zygote_keep.py)
KEPT_JOB = """
import json, os, sys
print(json.dumps({"rank": os.environ["RANK"], "ppid": os.getppid(), "preloaded": "%s" in sys.modules,
                  "var": os.environ.get("MYVAR")}), flush=True)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


@pytest.fixture
def kept_env(tmp_path):
    """A private runtime directory of its own (short: a socket path is at most 107 bytes), and every
    kept zygote started in it stopped afterwards."""
    import tempfile

    run = tempfile.mkdtemp(prefix="etz", dir="/tmp")
    env = {"XDG_RUNTIME_DIR": run}
    yield env
    subprocess.run([sys.executable, "-m", "elastictrain.launcher.zygote", "--stop"], env=dict(os.environ, **env),
                   capture_output=True, timeout=30)
    for k in psutil.process_iter():
        if _cmdline_has(k, run):
            try:
                k.kill()
            except psutil.Error:
                pass
    import shutil

    shutil.rmtree(run, ignore_errors=True)


def _cmdline_has(proc, *words) -> bool:
    if proc is None:
        return False
    try:
        line = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return all(w in line for w in words)


def _parent(proc):
    try:
        return proc.parent()
    except psutil.Error:
        return None


def _kept(tmp_path, env, *extra):
    (tmp_path / "job.py").write_text(textwrap.dedent(KEPT_JOB % "xml.dom.minidom"))
    r = _run(["--standalone", "--nproc-per-node", "2", "--zygote", "keep", "--zygote-idle", "30",
              "--preload", "xml.dom.minidom", *extra, "job.py"], tmp_path, env=env)
    rows = [json.loads(line[line.index("{"):]) for line in r.stdout.splitlines() if "{" in line]
    return r, rows


def test_a_kept_zygote_serves_the_next_launch_of_the_same_environment(tmp_path, kept_env):
    r1, first = _kept(tmp_path, dict(kept_env, MYVAR="one"))
    assert r1.returncode == 0 and len(first) == 2, r1.stderr[-3000:]
    assert "started a kept zygote" in r1.stderr
    zygote = first[0]["ppid"]
    assert first[1]["ppid"] == zygote and all(w["preloaded"] for w in first)
    assert psutil.pid_exists(zygote), "the kept zygote outlives the launch that started it"
    # the next launch (another value of a variable imports do not read) forks from the same process
    r2, second = _kept(tmp_path, dict(kept_env, MYVAR="two"))
    assert r2.returncode == 0 and "started a kept zygote" not in r2.stderr, r2.stderr[-3000:]
    assert "forking workers from the kept zygote" in r2.stderr
    assert {w["ppid"] for w in second} == {zygote}
    assert {w["var"] for w in second} == {"two"}, "each launch's workers get that launch's environment"
    # a variable that could change what an import does selects another zygote
    r3, third = _kept(tmp_path, dict(kept_env, TORCH_SHOW_CPP_STACKTRACES="1"))
    assert r3.returncode == 0 and "started a kept zygote" in r3.stderr, r3.stderr[-3000:]
    assert {w["ppid"] for w in third} != {zygote}
    # a worker's exit status comes back through the kept zygote
    r4, _ = _kept(tmp_path, dict(kept_env, EXIT="3"), "--max-restarts", "0")
    assert r4.returncode != 0 and "exit code 3" in r4.stderr, r4.stderr[-3000:]
    stop = subprocess.run([sys.executable, "-m", "elastictrain.launcher.zygote", "--stop"],
                          env=dict(os.environ, **kept_env), capture_output=True, text=True, timeout=30)
    assert "stopped 2 kept zygotes" in stop.stdout, stop.stdout + stop.stderr
    assert not psutil.pid_exists(zygote) or psutil.Process(zygote).status() == psutil.STATUS_ZOMBIE


def test_a_killed_etrun_takes_its_workers_but_not_the_kept_zygote_which_retires_when_idle(tmp_path, kept_env):
    (tmp_path / "sleep.py").write_text("import time\nwhile True:\n    time.sleep(0.1)\n")
    env = dict(os.environ, **kept_env)
    env.pop("ET_COORDINATOR", None)
    p = subprocess.Popen(ETRUN + ["--standalone", "--nproc-per-node", "2", "--zygote", "keep", "--zygote-idle", "2",
                                  "--preload", "json", "sleep.py"], cwd=tmp_path, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            # (its forks have its command line too)
            zyg = [k for k in psutil.process_iter() if _cmdline_has(k, "--keep", kept_env["XDG_RUNTIME_DIR"])
                   and not _cmdline_has(_parent(k), "--keep")]
            workers = [c for z in zyg for c in z.children()]
            if len(zyg) == 1 and len(workers) == 2:
                break
            assert time.monotonic() < deadline, (zyg, workers)
            time.sleep(0.05)
        p.kill()  # SIGKILL: etrun cannot clean up; the kept zygote sees its connection close
        p.wait()
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"workers left running after etrun's SIGKILL: {[k.pid for k in alive]}"
        assert zyg[0].is_running(), "the kept zygote stays for the next launch"
        sock = [f for f in os.listdir(os.path.join(kept_env["XDG_RUNTIME_DIR"], "elastictrain"))
                if f.endswith(".sock")]
        assert len(sock) == 1
        zyg[0].wait(timeout=15)  # --zygote-idle 2: it retires, and removes its socket
        assert not [f for f in os.listdir(os.path.join(kept_env["XDG_RUNTIME_DIR"], "elastictrain"))
                    if f.endswith(".sock")]
    finally:
        if p.poll() is None:
            p.kill()


def test_a_shared_socket_directory_is_refused_and_the_launch_goes_on(tmp_path, kept_env):
    os.mkdir(os.path.join(kept_env["XDG_RUNTIME_DIR"], "elastictrain"), 0o755)
    os.chmod(os.path.join(kept_env["XDG_RUNTIME_DIR"], "elastictrain"), 0o755)
    r, rows = _kept(tmp_path, kept_env)
    assert r.returncode == 0 and len(rows) == 2, r.stderr[-3000:]
    assert "--zygote keep" in r.stderr and "only user" in r.stderr and "starts its own zygote" in r.stderr
    assert all(w["preloaded"] for w in rows), "the launch still forks from a zygote, its own"
