"""etrun end to end: real agents, real gloo workers, real kills."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

from elastictrain import CoordinatorClient

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOY = os.path.join(ROOT, "benchmarks", "launcher_toy.py")
LEDGER = os.path.join(HERE, "workers", "ledger_train.py")
ETRUN = [sys.executable, "-m", "elastictrain.launcher.cli"]


def etrun(args, cwd, env=None, **kw):
    e = dict(os.environ, **(env or {}))
    e.pop("ET_COORDINATOR", None)
    return subprocess.Popen(ETRUN + args, cwd=cwd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def finish(proc, timeout):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"etrun did not finish in {timeout} s:\n{err.decode()[-3000:]}")
    return proc.returncode, out.decode(), err.decode()


def kill_tree(pid):
    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = parent.children(recursive=True) + [parent]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def write(tmp_path, name, code):
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return str(path)


class Events:
    def __init__(self, path):
        self.path = path

    def rows(self):
        if not os.path.exists(self.path):
            return []
        out = []
        for line in open(self.path):
            parts = line.split(None, 4)
            if len(parts) == 5:
                out.append((float(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), parts[4].strip()))
        return out

    def wait(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for row in self.rows():
                if pred(row):
                    return row
            time.sleep(0.02)
        pytest.fail(f"timed out after {timeout} s waiting for {what}")


ENV_SCRIPT = """
    import json, os
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")  # torchrun style: env:// from MASTER_ADDR/PORT, RANK, WORLD_SIZE
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE", "OMP_NUM_THREADS", "ET_COORDINATOR", "ET_JOB_ID", "ET_TOKEN_FILE",
            "ET_GENERATION", "ET_RESTART_REASON", "ET_PREV_WORLD_SIZE"]
    env = {k: os.environ.get(k) for k in keys}
    env["sum"] = t.item()
    env["token"] = open(os.environ["ET_TOKEN_FILE"]).read().strip()
    with open(f"env{os.environ['RANK']}.json", "w") as f:
        json.dump(env, f)
    dist.destroy_process_group()
"""


def test_unmodified_torchrun_script_sees_torchrun_env(tmp_path):
    script = write(tmp_path, "envscript.py", ENV_SCRIPT)
    code, out, err = finish(etrun(["--nproc-per-node", "2", "--max-restarts", "1", "--rdzv-id", "envjob",
                                   script], cwd=tmp_path), 120)
    assert code == 0, err
    e = [json.load(open(tmp_path / f"env{r}.json")) for r in range(2)]
    for r in range(2):
        assert (e[r]["RANK"], e[r]["LOCAL_RANK"], e[r]["ROLE_RANK"]) == (str(r),) * 3
        assert e[r]["WORLD_SIZE"] == e[r]["LOCAL_WORLD_SIZE"] == e[r]["ROLE_WORLD_SIZE"] == "2"
        assert (e[r]["GROUP_RANK"], e[r]["GROUP_WORLD_SIZE"], e[r]["ROLE_NAME"]) == ("0", "1", "default")
        assert e[r]["TORCHELASTIC_RESTART_COUNT"] == "0" and e[r]["TORCHELASTIC_MAX_RESTARTS"] == "1"
        assert e[r]["TORCHELASTIC_RUN_ID"] == e[r]["ET_JOB_ID"] == "envjob"
        assert e[r]["TORCHELASTIC_ERROR_FILE"].endswith(f"/{r}/error.json")
        assert e[r]["OMP_NUM_THREADS"] == "1" and e[r]["sum"] == 3.0
        assert e[r]["ET_GENERATION"] == "1" and e[r]["ET_RESTART_REASON"] == "start"
        assert e[r]["ET_PREV_WORLD_SIZE"] == "0" and len(e[r]["token"]) > 20
        # as torchrun's, which set "localhost" and the handled signals where etrun had 127.0.0.1 and nothing
        assert e[r]["MASTER_ADDR"] == "localhost"
        assert e[r]["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    assert e[0]["MASTER_PORT"] == e[1]["MASTER_PORT"] and e[0]["ET_COORDINATOR"] == e[1]["ET_COORDINATOR"]


def test_a_killed_workers_report_names_the_signal_and_labels_its_output(tmp_path):
    script = write(tmp_path, "killed.py", """
        import os, signal, sys, time
        print("no valid checkpoint; starting fresh", file=sys.stderr, flush=True)
        if os.environ["RANK"] == "1":
            print("about to be killed", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)
    """)
    code, out, err = finish(etrun(["--nproc-per-node", "2", "--rdzv-id", "k", "--warm-spares", "0", script],
                                  cwd=tmp_path), 120)
    assert code == 1
    assert "rank 1 (local rank 1)" in err and "killed by signal SIGKILL" in err
    report = err[err.index("root cause"):]
    assert "its last 2 line(s) of stderr before it died:" in report and "about to be killed" in report
    assert "traceback" not in report.lower()


def test_root_cause_logs_and_restarts_exhausted(tmp_path):
    script = write(tmp_path, "fail.py", """
        import os
        print("hello from", os.environ["RANK"], flush=True)
        if os.environ["RANK"] == "1":
            raise ValueError("bad batch shape (on purpose)")
        import time; time.sleep(30)
    """)
    code, out, err = finish(etrun(["--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", "logs",
                                   "--tee", "3", "--rdzv-id", "f", script], cwd=tmp_path), 120)
    assert code == 1
    assert "root cause" in err and "rank 1 (local rank 1)" in err
    assert "ValueError: bad batch shape (on purpose)" in err and 'fail.py", line 5' in err
    assert "its traceback:" in err
    assert "restart 1/1" in err and "no restarts left" in err
    assert "[default0]:hello from 0" in out  # tee prefixes, as torchrun
    logs = tmp_path / "logs" / "f"
    assert "hello from 1" in (logs / "attempt_0" / "1" / "stdout.log").read_text()
    assert "ValueError" in (logs / "attempt_1" / "1" / "stderr.log").read_text()
    err_file = json.load(open(logs / "attempt_0" / "1" / "error.json"))
    assert "ValueError" in err_file["message"]["message"]


def test_a_worker_that_raises_just_after_a_save_keeps_that_save(tmp_path):
    """Under etrun as under plain python: a script that raises (torch's OutOfMemoryError, say) while
    its last checkpoint still persists finishes that persist before it exits, so the restart resumes
    from it. etrun's runner used to end a raising worker with os._exit, skipping the exit hook, and
    the restart went back to the checkpoint before (CI saw it in test_oom_accumulate)."""
    script = write(tmp_path, "crash.py", f"""
        import os, time
        import numpy as np
        from elastictrain.runtime.checkpoint import Checkpointer
        slow = Checkpointer._persist
        def persist(self, *a, **k):
            time.sleep(1.0)  # (a slow store: the exception comes while the save persists)
            return slow(self, *a, **k)
        Checkpointer._persist = persist
        ck = Checkpointer("ck", {{"w": np.arange(1000.0)}}, rank=0, world_size=1)
        info = ck.restore()
        print("restored", None if info is None else info.step, flush=True)
        if info is None:
            ck.save(7)
            raise RuntimeError("CUDA out of memory (a crash right after the save)")
    """)
    code, out, err = finish(etrun(["--nproc-per-node", "1", "--max-restarts", "1", "--rdzv-id", "c", script],
                                  cwd=tmp_path), 120)
    assert code == 0, err[-3000:]
    assert "restored None" in out and "restored 7" in out, (out, err[-3000:])
    assert "exiting while a checkpoint persists" in err, err[-3000:]


def test_redirects_and_rank_filter(tmp_path):
    script = write(tmp_path, "talk.py", """
        import os, sys
        print("out", os.environ["RANK"]); print("err", os.environ["RANK"], file=sys.stderr)
    """)
    code, out, err = finish(etrun(["--nproc-per-node", "2", "--log-dir", "L", "-r", "0:1", "--local-ranks-filter",
                                   "0", "--rdzv-id", "r", script], cwd=tmp_path), 60)
    assert code == 0, err
    assert "out 0" not in out and "out 1" not in out  # rank 0: stdout to file only; rank 1: filtered
    assert "err 0" in err and "err 1" not in err
    assert (tmp_path / "L" / "r" / "attempt_0" / "0" / "stdout.log").read_text() == "out 0\n"


def test_module_and_no_python_modes(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "main.py").write_text("import os, sys\nprint('mod', os.environ['RANK'], sys.argv[1:])\n")
    code, out, err = finish(etrun(["-m", "--nproc-per-node", "1", "pkg.main", "x"], cwd=tmp_path), 60)
    assert code == 0 and "mod 0 ['x']" in out, err
    code, out, err = finish(etrun(["--no-python", "--nproc-per-node", "2", "sh", "-c", "echo rank=$RANK"],
                                  cwd=tmp_path), 60)
    assert code == 0 and "rank=0" in out and "rank=1" in out, err


def test_sigterm_gives_workers_grace_and_preempted_exit_code(tmp_path):
    script = write(tmp_path, "preempt.py", """
        import os, signal, sys, time
        def on_term(*_):
            time.sleep(1.0)  # "checkpointing"
            open(f"saved{os.environ['RANK']}", "w").close()
            sys.exit(75)  # preempted, resumable
        signal.signal(signal.SIGTERM, on_term)
        open(f"ready{os.environ['RANK']}", "w").close()
        while True:
            time.sleep(0.1)
    """)
    p = etrun(["--nproc-per-node", "2", "--shutdown-grace", "20", script], cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    code, out, err = finish(p, 60)
    assert code == 75, err
    assert (tmp_path / "saved0").exists() and (tmp_path / "saved1").exists()


def test_grace_expires_into_sigkill(tmp_path):
    script = write(tmp_path, "stubborn.py", """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open("ready", "w").close()
        while True:
            time.sleep(0.1)
    """)
    p = etrun(["--shutdown-grace", "1", script], cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    code, out, err = finish(p, 30)
    assert code == 128 + signal.SIGTERM and time.monotonic() - t0 < 8


@pytest.mark.slow  # make test-slow (the default run stays under 15 minutes)
def test_twenty_kills_twenty_recoveries(tmp_path):
    events = Events(str(tmp_path / "events"))
    p = etrun(["--nproc-per-node", "2", "--max-restarts", "25", TOY], cwd=tmp_path,
              env={"BENCH_EVENTS": events.path})
    rng = random.Random(0)
    try:
        events.wait(lambda r: r[4] == "step 3", 90, "the first steps")
        for restart in range(20):
            rows = [r for r in events.rows() if r[2] == restart and r[4] == "joined"]
            victim = rng.choice(rows)
            os.kill(victim[3], signal.SIGKILL)
            events.wait(lambda r: r[2] == restart + 1 and r[4].startswith("step"), 30,
                        f"a step after kill {restart + 1}")
        open(events.path + ".stop", "w").close()
        code, out, err = finish(p, 60)
    finally:
        kill_tree(p.pid)
    assert code == 0, err[-3000:]
    assert err.count("root cause") == 20


def test_two_agents_shrink_and_grow_with_exactly_once_data(coordinator, tmp_path):
    """--nnodes 1:2 on loopback: kill an agent, the job goes on with one; start it again, it grows back."""
    (tmp_path / "ckpt").mkdir()
    client = CoordinatorClient(coordinator.url, coordinator.token)
    env = {"LEDGER_SAMPLES": "100000", "LEDGER_EPOCHS": "2", "LEDGER_STEP_SLEEP": "0.03",
           "LEDGER_DIR": str(tmp_path / "ckpt")}
    args = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-id", "two", "--coordinator", coordinator.url,
            "--token-file", coordinator.token_file, "--max-restarts", "5", "--rdzv-conf", "agent_timeout=2",
            "--local-addr", "127.0.0.1", "--tee", "3",
            LEDGER]

    def world():
        try:
            return client.job("two").world_size
        except Exception:
            return 0

    def wait_world(n, timeout):
        deadline = time.monotonic() + timeout
        while world() != n or not list((tmp_path / "ckpt").glob(f"g{client.job('two').generation}-*")):
            assert time.monotonic() < deadline, f"world size stayed {world()}, expected {n}"
            time.sleep(0.1)

    a = etrun(args, cwd=tmp_path, env=env)
    b = etrun(args, cwd=tmp_path, env=env)
    try:
        wait_world(2, 90)
        kill_tree(b.pid)  # the node dies: agent and workers
        wait_world(1, 60)
        gen_small = client.job("two").generation
        b = etrun(args, cwd=tmp_path, env=env)
        wait_world(2, 60)
        assert client.job("two").generation > gen_small
        code_a, _, err_a = finish(a, 240)
        code_b, _, err_b = finish(b, 60)
    finally:
        kill_tree(a.pid)
        kill_tree(b.pid)
    assert code_a == 0 and code_b == 0, err_a[-2000:] + err_b[-2000:]
    info = client.dataset("two", "train")
    assert info.finished and info.last_commit == "final"
    counts = np.load(open(tmp_path / "ckpt" / "final.npy", "rb"))
    assert counts.min() == 1 and counts.max() == 1, "exactly-once broken"


def test_a_node_that_leaves_is_a_scale_down_not_a_failure(coordinator, tmp_path):
    """SIGTERM to one agent (a drain, a spot reclaim) with --max-restarts 0: it announces that it
    leaves, the other re-forms alone (scale_down), both checkpoint, and the job finishes with every
    sample trained on exactly once."""
    job = os.path.join(ROOT, "examples", "torch_cluster_job.py")
    client = CoordinatorClient(coordinator.url, coordinator.token)
    args = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-id", "leave", "--coordinator", coordinator.url,
            "--token-file", coordinator.token_file, "--max-restarts", "0", "--local-addr", "127.0.0.1", "--tee", "3",
            "--shutdown-grace", "20", job, "--epochs", "4", "--samples", "1200", "--step-sleep", "0.03",
            "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out.json")]
    a = etrun(args, cwd=tmp_path)
    b = etrun(args, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 90
        while not (_world(client, "leave") == 2 and list((tmp_path / "ckpt").glob("step-*"))):
            assert time.monotonic() < deadline, "the two agents never trained together"
            time.sleep(0.1)
        b.send_signal(signal.SIGTERM)
        code_b, _, err_b = finish(b, 60)
        code_a, out_a, err_a = finish(a, 180)
    finally:
        kill_tree(a.pid)
        kill_tree(b.pid)
    assert code_b == 75, err_b[-2000:]  # it saved and left
    assert code_a == 0, err_a[-3000:]  # no restart was used: --max-restarts 0 still finished
    assert "(scale_down), world 1" in out_a, out_a[-2000:]
    r = json.loads((tmp_path / "out.json").read_text())
    assert r["min"] == r["max"] == 1 and r["world"] == 1, r


def _world(client, job):
    try:
        return client.job(job).world_size
    except Exception:  # not created yet
        return 0
