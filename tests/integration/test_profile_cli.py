"""``elastictrain profile``: a real DDP job (gloo on loopback) under etrun, 2 workers, profiled."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)


def test_profile_prints_stage_and_comm_profiles_of_each_worker(tmp_path):
    out = tmp_path / "p.json"
    cmd = [os.path.join(BIN, "elastictrain"), "profile", "-n", "5", "--warmup", "2", "--json", str(out), "--",
           os.path.join(BIN, "etrun"), "--nproc-per-node", "2", os.path.join(ROOT, "examples", "torch_stages_profile.py")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "compute ms" in p.stdout and "collectives/it" in p.stdout
    reports = json.loads(out.read_text())
    assert sorted(r["stage"]["worker"] for r in reports) == [0, 1]
    for r in reports:
        st, comm = r["stage"], r["comm"]
        assert st["iterations"] == 5 and st["warmup"] == 2
        assert st["stages"]["load"] > 0.0015  # the script sleeps 2 ms per batch
        assert st["stages"]["compute"] > 0 and st["stages"]["sync"] > 0
        # one bucket all-reduced per step: the whole model's gradients (256*512 + 512 + 512*10 + 10 floats)
        assert comm["collectives_per_iteration"] == pytest.approx(1.0)
        assert comm["bytes_per_iteration"] == (256 * 512 + 512 + 512 * 10 + 10) * 4
        assert comm["skew"] == pytest.approx(256 * 512 / (256 * 512 + 512 + 512 * 10 + 10))


def test_profile_without_a_command_or_without_stages_says_what_to_do(tmp_path):
    p = subprocess.run([os.path.join(BIN, "elastictrain"), "profile"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "give the training command after --" in p.stderr
    p = subprocess.run([os.path.join(BIN, "elastictrain"), "profile", "--", sys.executable, "-c", "print(1)"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "annotate the training loop with et.stage" in p.stderr


def test_profile_run_under_etrun_sends_each_workers_report_to_the_coordinator(tmp_path, coordinator, client):
    cmd = [os.path.join(BIN, "elastictrain"), "profile", "-n", "4", "--warmup", "1", "--",
           os.path.join(BIN, "etrun"), "--nproc-per-node", "2", "--coordinator", coordinator.url,
           "--token-file", coordinator.token_file, "--rdzv-id", "profiled",
           os.path.join(ROOT, "examples", "torch_stages_profile.py")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    reports = client.profiles("profiled").reports
    assert [r.stage.worker for r in reports] == [0, 1]
    assert all(r.stage.iterations == 4 and r.comm.collectives_per_iteration == pytest.approx(1.0) for r in reports)
    st = subprocess.run([os.path.join(BIN, "elastictrain"), "status", "profiled", "--coordinator", coordinator.url,
                         "--token-file", coordinator.token_file], capture_output=True, text=True, timeout=30)
    assert st.returncode == 0, st.stderr
    assert "compute ms" in st.stdout and "comm skew" in st.stdout


def test_etrun_profile_is_the_same_profiling_run(tmp_path):
    # `etrun --profile N` was not built (the README sent users to `elastictrain profile -- etrun ...`)
    cmd = [os.path.join(BIN, "etrun"), "--nproc-per-node", "2", "--profile", "5", "--profile-warmup=2",
           os.path.join(ROOT, "examples", "torch_stages_profile.py")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "compute ms" in p.stdout and "collectives/it" in p.stdout
    reports = json.loads(p.stdout[p.stdout.index("\n[") + 1:])
    assert sorted(r["stage"]["worker"] for r in reports) == [0, 1]
    assert all(r["stage"]["iterations"] == 5 and r["stage"]["warmup"] == 2 for r in reports)
    bad = subprocess.run([os.path.join(BIN, "etrun"), "--profile", "-1", "x.py"], capture_output=True, text=True,
                         timeout=30, cwd=tmp_path)
    assert bad.returncode == 2 and "--profile must be 1 to 1000000" in bad.stderr
