"""Auto-scaling on measured throughput: where the plan settles, how fast, and how good that is.

A CPU-bound data-parallel job (``examples/torch_cluster_job.py --cpu-work 60``: about 18 ms of
single-threaded CPU work per step, a small model, gloo DDP, no sleep between steps) runs on one node daemon with 4 CPU slots, under a coordinator started
as ``elastictrain coordinator --policy ...``. Baseline, measured in the same run: the same job at
every fixed size 1..4 (``--policy fifo``), its throughput (samples/s from the shard cursors,
the coordinator's measurement) after it has trained for a while. Then the same job as an
elastic job of 1..4 workers under ``--policy autoscale``. Prints ``name: value unit``:

* ``autoscale_fixed_<n>_throughput``: samples/s at n workers (the baseline);
* ``autoscale_settled_workers``: where the plan settled;
* ``autoscale_seconds_to_settle``: from the job's first start to the plan's settle decision;
* ``autoscale_settled_throughput`` and ``autoscale_throughput_vs_best_fixed`` (target >= 0.9);
* ``autoscale_resizes``: restarts the plan made to get there.

Stragglers (``--part straggler``, also in the default run): an elastic etrun job of 3 nodes (one
worker each, ``--nnodes 2:3``) plus a spare agent, on a coordinator that samples every second
(``ET_MONITOR_PERIOD=1``); each step is 40 ms of "GPU" time in ``et.stage("compute")`` and a gloo
all-reduce. From step 60 one node's worker computes 3x slower, which slows every rank's step
(synchronous DDP). Prints:

* ``straggler_detect_seconds``: from the slowdown's start (the first step past 60 in the
  coordinator's samples) to the coordinator flagging the rank (the ``straggler`` event);
* ``straggler_throughput_before`` / ``_slowed`` / ``_after`` (steps/s; the baseline is the same
  run before the slowdown) and ``straggler_throughput_recovered`` (after / before; target >= 0.8):
  the straggler's node is excluded for a cooldown and the spare takes its place.

Fewer samples for the straggler (``--part shares``, also in the default run): the same job on 4
nodes (``--nnodes 3:4``, no spare) with ``--uneven``: each rank takes its part of the 32-sample
global batch from ``job.local_batch()`` and its compute time is per sample (5 ms, 15 ms on the
slow node from step 60). The coordinator cuts the slow rank's share instead of replacing it.
Prints ``straggler_shares_detect_seconds``, ``straggler_shares_throughput_before`` / ``_slowed`` /
``_after`` (steps of 32 samples per second; "after" from 5 steps past the step the shares apply
from) and ``straggler_shares_throughput_recovered`` (target >= 0.8; with one rank at a third of
its speed, 4 ranks can reach at most (3 + 1/3) / 4 = 0.83 of the speed before, less the start-up).

``--quick``: shorter measurement windows.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from elastictrain.launcher.local_cluster import LocalCluster  # noqa: E402

WORKER = os.path.join(ROOT, "examples", "torch_cluster_job.py")


def job_command(tmp: str, name: str, samples: int, epochs: int) -> list[str]:
    return [WORKER, "--ckpt-dir", os.path.join(tmp, f"ckpt-{name}"), "--out", os.path.join(tmp, f"{name}.json"),
            "--samples", str(samples), "--epochs", str(epochs), "--batch", "64", "--cpu-work", "60",
            "--shard-size", "1000", "--step-sleep", "0", "--ckpt-every", "200"]


def job_info(c: LocalCluster, jid: str):
    return next(j for j in c.client.cluster_status().jobs if j.id == jid)


def fixed_rate(c: LocalCluster, tmp: str, n: int, seconds: float) -> float:
    """Samples/s of a rigid n-worker run: the coordinator's measurement after ``seconds`` of training."""
    jid = c.submit(f"fixed{n}", n, job_command(tmp, f"fixed{n}", 100_000, 50))
    c.wait(lambda st: any(j.id == jid and j.rate for j in st.jobs), 180, f"job fixed{n} to train")
    time.sleep(seconds)
    rate = job_info(c, jid).rate or 0.0
    c.client.cancel(jid)
    c.wait(lambda st: job_info(c, jid).status == "cancelled" and not any(n.used for n in st.nodes), 120,
           f"job fixed{n} to stop")
    return rate


MURI_JOB = os.path.join(ROOT, "examples", "torch_muri_job.py")


def straggler(tmp: str, quick: bool, shares: bool = False) -> dict:
    """The straggler scenario (see the module's docstring; ``shares``: the one where the slow rank
    gets fewer samples); returns its figures and evidence."""
    import subprocess

    from elastictrain.coordinator.process import CoordinatorProcess
    from elastictrain.runtime.client import CoordinatorClient

    at, steps = 60, (260 if quick else 420)
    coord = CoordinatorProcess(os.path.join(tmp, "coord.db"), os.path.join(tmp, "token"),
                               log_file=os.path.join(tmp, "coordinator.log"),
                               extra_args=("--policy", "fifo", "--straggler-cooldown", "120"))
    coord.start()
    client = CoordinatorClient(coord.url, coord.token, timeout=10.0, retry_for=30.0)
    agents, timeline, flagged, cut = [], [], None, None
    nodes = 4 if shares else 3
    uneven = ["--uneven"] if shares else []
    env = dict(os.environ, ET_MONITOR_PERIOD="1", ET_MONITOR_BATCH="1", OMP_NUM_THREADS="1")
    env.pop("ET_TOKEN", None)

    def agent(name: str, slow: bool):
        cmd = [sys.executable, "-m", "elastictrain.launcher.cli", "--nnodes", f"{nodes - 1}:{nodes}",
               "--nproc-per-node", "1",
               "--rdzv-id", "strag", "--coordinator", coord.url, "--token-file", coord.token_file,
               "--max-restarts", "3", "--warm-spares", "0", MURI_JOB, "--steps", str(steps),
               "--samples", str(steps * 8 * nodes), "--load-ms", "2", "--compute-ms", "40", "--straggle-at", str(at),
               *uneven,
               "--ckpt-every", "20", "--ckpt-dir", os.path.join(tmp, "ckpt"), "--out", os.path.join(tmp, "out.json")]
        log = open(os.path.join(tmp, f"{name}.log"), "wb")
        agents.append(subprocess.Popen(cmd, env=dict(env, ET_STRAGGLER="1" if slow else "0"), stdout=log,
                                       stderr=subprocess.STDOUT, cwd=tmp))

    try:
        agent("slow", True)
        time.sleep(0.5)
        for name in "abc"[:nodes - 1]:
            agent(name, False)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the first generation forms with all of them
            try:
                if client.job("strag").world_size == nodes:
                    break
            except Exception:  # noqa: BLE001 - not created yet
                pass
            time.sleep(0.2)
        if not shares:
            agent("spare", False)  # waits: the job runs at its maximum of 3 nodes
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and any(p.poll() is None for p in agents[:nodes]):
            try:
                res = client.resources("strag")
            except Exception:  # noqa: BLE001
                res = None
            if res is not None:
                for w in res.workers:
                    if w.latest.step is not None:
                        timeline.append((w.latest.t, w.latest.step))
                if res.stragglers and flagged is None:
                    flagged = res.stragglers[0]
                if res.shares is not None and cut is None:
                    cut = res.shares
            if os.path.exists(os.path.join(tmp, "out.json")):
                break
            time.sleep(0.25)
        events = [e for e in client.events().events if e.kind == "straggler"]
        status = subprocess.run([sys.executable, "-m", "elastictrain", "status", "--job", "strag", "--coordinator",
                                 coord.url, "--token-file", coord.token_file], capture_output=True, text=True,
                                timeout=60).stdout
    finally:
        for p in agents:
            if p.poll() is None:
                p.terminate()
        for p in agents:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        client.close()
        coord.stop()
    timeline = sorted(set(timeline))

    def rate(t0: float, t1: float) -> float:
        pts = [(t, s) for t, s in timeline if t0 <= t <= t1]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return 0.0
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])

    onset = next((t for t, s in timeline if s >= at), None)
    t_flag = events[0].time if events else None
    start = next((t for t, s in timeline if s >= 10), timeline[0][0] if timeline else 0.0)
    before = rate(start, onset) if onset else 0.0
    slowed = rate(onset, t_flag) if onset and t_flag else 0.0
    if shares:  # after: from 5 steps past the step the new parts apply from, to the end
        t_cut = next((t for t, s in timeline if cut is not None and s >= cut.from_step + 5), None)
        after = rate(t_cut, timeline[-1][0]) if t_cut else 0.0
    else:  # after: from 5 s past the flag (the restart without the straggler) to the end
        after = rate(t_flag + 5.0, timeline[-1][0]) if t_flag and timeline else 0.0
    out = {}
    try:
        import json

        with open(os.path.join(tmp, "out.json")) as f:
            out = json.load(f)
    except OSError:
        pass
    return {"detect": (t_flag - onset) if t_flag and onset else None, "before": before, "slowed": slowed,
            "after": after, "events": events, "flag": flagged, "status": status, "result": out, "shares": cut}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", choices=("all", "autoscale", "straggler", "shares"), default="all")
    args = ap.parse_args()
    for part, prefix in (("straggler", "straggler"), ("shares", "straggler_shares")):
        if args.part not in ("all", part):
            continue
        with tempfile.TemporaryDirectory(prefix="et-straggler-") as tmp:
            r = straggler(tmp, args.quick, shares=part == "shares")
        print(f"{prefix}_detect_seconds: {r['detect'] if r['detect'] is None else round(r['detect'], 2)} s")
        print(f"{prefix}_throughput_before: {r['before']:.2f} steps/s")
        print(f"{prefix}_throughput_slowed: {r['slowed']:.2f} steps/s")
        print(f"{prefix}_throughput_after: {r['after']:.2f} steps/s")
        print(f"{prefix}_throughput_recovered: {r['after'] / r['before'] if r['before'] else 0.0:.3f} x")
        sys.stdout.flush()
    if args.part in ("straggler", "shares"):
        return
    window = 5.0 if args.quick else 10.0
    with tempfile.TemporaryDirectory(prefix="et-autoscale-") as tmp:
        fixed = {}
        for sub in ("fixed", "auto"):
            os.makedirs(os.path.join(tmp, sub))
        with LocalCluster(os.path.join(tmp, "fixed"), "fifo", nodes=1, slots=4) as c:
            for n in (1, 2, 3, 4):
                fixed[n] = fixed_rate(c, c.tmp, n, 2 * window)
                print(f"autoscale_fixed_{n}_throughput: {fixed[n]:.1f} samples/s", flush=True)
        with LocalCluster(os.path.join(tmp, "auto"), "autoscale", "--rate-window", str(window),
                          nodes=1, slots=4) as c:
            jid = c.submit("elastic", 4, job_command(c.tmp, "elastic", 100_000, 50), min_gpus=1)
            c.wait(lambda st: any(e.detail.get("decision") == "settle" for e in _plan(c, jid)), 600,
                   "the plan to settle")
            settle = [e for e in _plan(c, jid) if e.detail.get("decision") == "settle"][0]
            workers = int(settle.detail["workers"])
            started = next(e.time for e in c.events() if e.job == jid and e.kind == "start")
            resizes = sum(1 for e in c.events() if e.job == jid and e.kind == "resize")
            settled_run = job_info(c, jid).run  # settling at another size started a new run already
            c.wait(lambda st: job_info(c, jid).run >= settled_run and job_info(c, jid).rate is not None, 180,
                   "the settled run to train")
            time.sleep(2 * window)  # a whole window of the settled run, past its first seconds
            rate = job_info(c, jid).rate or 0.0
            c.client.cancel(jid)
        print(f"autoscale_settled_workers: {workers} workers")
        print(f"autoscale_seconds_to_settle: {settle.time - started:.1f} s")
        print(f"autoscale_resizes: {resizes} restarts")
        print(f"autoscale_settled_throughput: {rate:.1f} samples/s")
        print(f"autoscale_throughput_vs_best_fixed: {rate / max(fixed.values()):.3f} x")


def _plan(c: LocalCluster, jid: str) -> list:
    return [e for e in c.events() if e.job == jid and e.kind == "plan"]


if __name__ == "__main__":
    main()
