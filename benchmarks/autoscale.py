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

``--quick``: shorter measurement windows. Stragglers are not handled yet, so their figures are
not printed.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
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
