"""Horovod under etrun, real workers on gloo (skipped without Horovod: build it with `make horovod`;
`make test-horovod` builds it when missing and runs these).

* an unmodified Horovod DDP script (hvd.init, DistributedOptimizer, broadcast_parameters) trains
  on 2 workers and every rank ends with the same parameters;
* an elastic one (hvd.elastic.run): a worker is SIGKILLed mid-run; the survivor keeps its process
  (same pid after) and goes on alone at once; etrun starts a replacement, which joins at the
  survivor's next commit (a scale-up generation); both finish with the same parameters;
* the same with elastictrain_torch.horovod.State: the exactly-once ledger holds across it.
"""

import os
import re
import signal
import subprocess
import sys
import time
from importlib.util import find_spec

import pytest

from tests.integration.test_inprocess_recovery import _rows, _story  # noqa: E402 - the same events format

pytestmark = [pytest.mark.horovod,
              pytest.mark.skipif(find_spec("horovod") is None,
                                 reason="Horovod is not installed: build it with `make horovod` "
                                        "(or run `make test-horovod`)")]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ETRUN = [sys.executable, "-m", "elastictrain.launcher.cli"]


def _run(args, cwd, timeout=120):
    p = subprocess.run(ETRUN + args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def test_horovod_ddp_script_trains_under_etrun_and_ranks_agree(tmp_path):
    code, out, err = _run(["--nproc-per-node", "2", "--horovod", "on",
                           os.path.join(ROOT, "examples", "horovod_train.py"), "--steps", "30"], tmp_path)
    assert code == 0, err[-3000:]
    final = re.findall(r"rank (\d) of (\d) \(local (\d) of (\d)\) params (\w+)", out)
    assert sorted(r[0] for r in final) == ["0", "1"], out
    assert {r[1] for r in final} == {"2"} and {r[3] for r in final} == {"2"}
    assert len({r[4] for r in final}) == 1, final  # broadcast + averaged gradients: equal parameters
    losses = [float(x) for x in re.findall(r"loss ([\d.]+)", out)]
    assert len(losses) == 3 and losses[-1] < losses[0], out  # it trains


def _kill_rank1(tmp_path, script_args, steps_before, timeout=120):
    """Run an elastic example under etrun (``--events`` FILE appended), SIGKILL rank 1 once it
    has ``steps_before`` steps, and wait for the job to end: (returncode, stdout, stderr, pids
    before the kill, the last step before it, the events file)."""
    events = tmp_path / "events"
    p = subprocess.Popen(ETRUN + ["--nproc-per-node", "2", "--max-restarts", "3", "--horovod", "on", *script_args,
                                  "--events", str(events)],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            rows = _rows(events)
            if sum(1 for r in rows if r[1] == 1) >= steps_before:
                break
            assert p.poll() is None, p.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no progress before the kill"
            time.sleep(0.05)
        pids = {r[1]: r[3] for r in rows}
        os.kill(pids[1], signal.SIGKILL)
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p.returncode, out, err, pids, max(r[4] for r in rows), events


def test_elastic_horovod_survivor_keeps_its_process_when_a_worker_dies(tmp_path):
    code, out, err, pids, killed_at, events = _kill_rank1(
        tmp_path, [os.path.join(ROOT, "examples", "horovod_elastic.py"), "--steps", "150", "--step-sleep", "0.02"], 20)
    assert code == 0, err[-3000:]
    assert "continue in their own process" in err, err[-3000:]
    final = re.findall(r"rank (\d) of (\d) pid (\d+) step (\d+) params (\w+)", out)
    assert len(final) == 2, out
    by_rank = {int(r[0]): r for r in final}
    assert int(by_rank[0][2]) == pids[0], "the survivor must keep its process"
    assert int(by_rank[1][2]) != pids[1], "the dead worker is replaced"
    assert {r[3] for r in final} == {"150"} and len({r[4] for r in final}) == 1, final
    rows = _rows(events)
    alone = [r for r in rows if r[3] == pids[0] and r[2] == 1]
    assert alone, "the survivor goes on alone (size 1) while the replacement starts"
    assert min(r[4] for r in alone) <= killed_at + 1  # from its last commit, at once
    new = [r for r in rows if r[3] == int(by_rank[1][2])]
    assert new and all(r[2] == 2 for r in new) and min(r[0] for r in new) > max(r[0] for r in alone) - 1
    assert (min(r[4] for r in new) - 1) % 5 == 0  # it joined at a commit of the survivor (every 5 steps)
    assert "(scale_up)" in err, err[-3000:]  # the grown generation is a scale-up, not a counted restart


def test_elastic_horovod_with_our_state_keeps_data_exactly_once_across_a_kill(tmp_path):
    """elastictrain_torch.horovod.State under hvd.elastic.run: commits are checkpoints with the
    data cursor; after a SIGKILL the survivor (same pid) and the replacement restore the same
    commit, and the ledger shows every sample trained on exactly once per epoch."""
    code, out, err, pids, _, events = _kill_rank1(
        tmp_path, [os.path.join(ROOT, "examples", "horovod_exactly_once.py"), "--samples", "8192", "--epochs", "3",
                   "--step-sleep", "0.04"], 40, timeout=200)  # past a few commits (every 10 steps); the steps
    # left after the kill outlast the replacement's start on a loaded machine
    assert code == 0, err[-3000:]
    assert "every sample trained on exactly once per epoch: True (ledger min 3, max 3)" in out, out
    final = dict(re.findall(r"\[hvd\] rank (\d) pid (\d+) params", out))
    assert int(final.get("0", 0)) == pids[0] and int(final.get("1", pids[1])) != pids[1], \
        f"{final} {pids}\n{_story(err)}"  # (a make test here once ended before the replacement joined)
    digests = set(re.findall(r"params (\w+) \(step", out))
    assert len(digests) == 1, out
    gens = {r[2] for r in _rows(events)}
    assert gens == {1, 2, 3}, gens  # both; the survivor alone; both again after its next commit
    assert re.search(r"restored step-\d+-g1", err), err[-3000:]  # the survivor rolled back to a commit
    comm = re.findall(r"comm: (\d+) iterations, ([\d.]+) allreduces and (\d+) bytes per iteration", out)
    assert len(comm) == 2 and all(int(c[0]) > 0 and float(c[1]) == 4.0 for c in comm), comm  # 4 parameter tensors


def _doc_blocks():
    text = open(os.path.join(ROOT, "docs", "horovod.md")).read()
    return re.findall(r"^```bash runnable-horovod\n(.*?)^```", text, re.S | re.M)


def test_docs_horovod_blocks_run_in_a_clean_copy(tmp_path):
    from tests.integration.test_first_hour import _copy_repo, _env

    blocks = _doc_blocks()
    assert len(blocks) == 2
    repo = _copy_repo(tmp_path)
    for block in blocks:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=repo, env=_env(repo), capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, f"{block}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        assert len(set(re.findall(r"params (\w+)", r.stdout))) == 1, r.stdout


def _two_nodes(tmp_path, coordinator, job, script_args, env=None):
    """Two etrun agents of one job (``--nnodes 2``, one worker each) against ``coordinator``, as
    two nodes would run them: (Popen, Popen)."""
    procs = []
    for node in ("a", "b"):
        procs.append(subprocess.Popen(
            ETRUN + ["--nnodes", "2", "--nproc-per-node", "1", "--coordinator", coordinator.url, "--token-file",
                     coordinator.token_file, "--rdzv-id", job, "--horovod", "on", "--max-restarts", "3",
                     *script_args],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env=dict(os.environ, ET_NODE_NAME=f"node-{node}", **(env or {}))))
    return procs


def _finish(procs, timeout=180):
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [(p.returncode, o, e) for p, (o, e) in zip(procs, outs)]


def test_a_horovod_script_trains_across_two_nodes_meeting_in_node_0s_rendezvous(tmp_path, coordinator):
    """Each node's workers call their own agent's rendezvous; the gloo scopes meet in node rank 0's
    (two agents on one host get hostnames of their own, so Horovod sees two hosts)."""
    procs = _two_nodes(tmp_path, coordinator, "hv2", [os.path.join(ROOT, "examples", "horovod_train.py"),
                                                      "--steps", "30"])
    results = _finish(procs)
    assert all(code == 0 for code, _, _ in results), [e[-3000:] for _, _, e in results]
    final = [m for _, out, _ in results for m in re.findall(r"rank (\d) of (\d) \(local (\d) of (\d)\) params (\w+)",
                                                              out)]
    assert sorted(r[0] for r in final) == ["0", "1"] and {r[1] for r in final} == {"2"}, final
    assert {(r[2], r[3]) for r in final} == {("0", "1")}, final  # one worker per node: local 0 of 1
    assert len({r[4] for r in final}) == 1, final  # averaged across the nodes: equal parameters


def test_on_two_nodes_a_killed_worker_restarts_every_node_and_the_data_stays_exactly_once(tmp_path, coordinator):
    """Several nodes: survivors are not kept (their peers on other nodes could not be told of the
    replacement); every node's worker restarts from the last commit, and the ledger holds."""
    events = tmp_path / "events"
    procs = _two_nodes(tmp_path, coordinator, "hv3", [os.path.join(ROOT, "examples", "horovod_exactly_once.py"),
                                                      "--samples", "4096", "--epochs", "2", "--step-sleep", "0.02",
                                                      "--events", str(events)])
    try:
        deadline = time.monotonic() + 120
        while sum(1 for r in _rows(events) if r[1] == 1) < 40:
            assert all(p.poll() is None for p in procs), [p.communicate()[1][-3000:] for p in procs]
            assert time.monotonic() < deadline, "no progress before the kill"
            time.sleep(0.05)
        pids = {r[1]: r[3] for r in _rows(events)}
        os.kill(pids[1], signal.SIGKILL)
    finally:
        results = _finish(procs)
    assert all(code == 0 for code, _, _ in results), [e[-3000:] for _, _, e in results]
    out = "".join(o for _, o, _ in results)
    assert "every sample trained on exactly once per epoch: True (ledger min 2, max 2)" in out, out
    final = dict(re.findall(r"\[hvd\] rank (\d) pid (\d+) params", out))
    assert int(final["0"]) != pids[0] and int(final["1"]) != pids[1], (final, pids)  # both restarted
    assert len(set(re.findall(r"params (\w+) \(step", out))) == 1, out


def test_the_scheduler_runs_a_horovod_job_across_two_node_daemons(tmp_path):
    """Submitted with --nnodes 2 and placed on two node daemons: their etrun (--horovod auto) gives
    the workers Horovod's environment and one rendezvous, and the ranks agree."""
    from elastictrain.launcher.local_cluster import LocalCluster

    with LocalCluster(tmp_path, "fifo", nodes=2, slots=1) as c:
        job = c.cli("submit", "--nnodes", "2", "--nproc-per-node", "1", "--name", "hvd", "--",
                    os.path.join(ROOT, "examples", "horovod_train.py"), "--steps", "30").stdout.strip()
        c.finish(job, 180)
        out = c.output(job)
        final = re.findall(r"rank (\d) of (\d) \(local (\d) of (\d)\) params (\w+)", out)
        assert sorted(r[0] for r in final) == ["0", "1"] and {r[1] for r in final} == {"2"}, out[-3000:]
        assert {(r[2], r[3]) for r in final} == {("0", "1")}, final  # one worker on each node
        assert len({r[4] for r in final}) == 1, final
        starts = [e for e in c.events() if e.kind == "start" and e.job == job]
        assert starts and "n1" in str(starts[0]) and "n2" in str(starts[0]), starts
