"""``make demo-cluster``: the cluster walk-through of docs/cluster.md as one command, on CPU.

Starts a coordinator running Tiresias-L and two node daemons with 2 CPU slots each (all on
loopback, state under runs/demo-cluster), then, with the same commands a user types:

1. submits two long DDP jobs (2 workers each): they fill the cluster;
2. once they have used 20 GPU-seconds (Tiresias' first queue here), submits a short job: the
   scheduler preempts a long job (its workers checkpoint and exit) and starts the short one;
3. the short job finishes first, the long job resumes from its checkpoint (ET_RESTART_REASON
   preempt) and every job finishes, each having trained on every sample exactly once per epoch.

It prints ``elastictrain status`` at each of these moments, the event log, and the results.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from elastictrain.launcher.local_cluster import LocalCluster  # noqa: E402

JOB = os.path.join(HERE, "torch_cluster_job.py")


def main() -> int:
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join("runs", "demo-cluster"))
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    with LocalCluster(root, "tiresias-l", "--thresholds", "20", nodes=2, slots=2) as c:
        def et(*args: str) -> str:
            out = subprocess.run([sys.executable, "-m", "elastictrain", *args], env=c.env(), cwd=root,
                                 capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise SystemExit(f"elastictrain {' '.join(args)} failed:\n{out.stderr}")
            return out.stdout

        def say(text: str) -> None:
            print(f"\n[demo-cluster] {text}", flush=True)

        def submit(name: str, epochs: int) -> str:
            return et("submit", "--gpus", "2", "--name", name, "--", JOB, "--epochs", str(epochs), "--samples",
                      "1200", "--ckpt-dir", f"ckpt-{name}", "--out", f"{name}.json").strip()

        say(f"coordinator {c.coordinator.url} (policy tiresias-l), nodes n1 and n2 with 2 CPU slots each")
        print(et("status"), end="")
        long_a, long_b = submit("long-a", 12), submit("long-b", 12)
        say(f"submitted jobs {long_a} and {long_b} (2 workers each): they fill the cluster")
        c.wait(lambda st: all(j.attained_gpu > 22 for j in st.jobs), 180, "the long jobs to pass 20 GPU-seconds")
        print(et("status"), end="")
        short = submit("short", 1)
        say(f"the long jobs used up Tiresias' first queue; job {short} (short) arrives in Q0 and preempts one")
        st = c.wait(lambda st: any(j.id == short and j.status == "running" for j in st.jobs), 120,
                    "the short job to start")
        print(et("status"), end="")
        c.wait(lambda st: any(j.id == short and j.status == "finished" for j in st.jobs), 180, "the short job")
        say("the short job finished; the preempted job resumed from its checkpoint as soon as 2 slots were free")
        print(et("status"), end="")
        c.wait_all(3, timeout=300)
        say("every job finished:")
        print(et("status"), end="")
        say("the event log (elastictrain's scheduler events, from GET /v1/cluster/events):")
        t0 = None
        for e in c.events():
            if e.kind in ("launch", "exit", "first_step"):
                continue
            t0 = e.time if t0 is None else t0
            detail = {k: v for k, v in e.detail.items() if k in ("placement", "reason", "run", "codes", "jct")}
            print(f"  {e.time - t0:7.1f} s  {e.kind:<10} job {e.job or '-':<3} {json.dumps(detail)}")
        ok = True
        for name in ("long-a", "long-b", "short"):
            r = c.result(name)
            once = r["min"] == r["max"] == 1
            ok &= once
            print(f"[demo-cluster] {name}: {r['steps']} steps, started as {', '.join(r['reasons'])}; every sample "
                  f"trained on exactly once per epoch: {once}")
        preempted = [e.job for e in c.events() if e.kind == "preempted"]
        print(f"[demo-cluster] preempted and resumed: job(s) {', '.join(sorted(set(preempted))) or 'none'}")
        if not ok or not preempted:
            print("[demo-cluster] FAILED", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
