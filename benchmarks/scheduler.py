"""The live scheduler: decision latency per policy, and preemption/resume latency on real processes.

Part 1, ``scheduler_tick_<policy>_p50/_p99``: one step of the coordinator's scheduling loop
(snapshot + decide + plan + act through the live backend: tasks, GPU indices, rendezvous,
events) with 1,000 jobs queued on 64 nodes x 8 GPUs, for every registered policy. It runs the
coordinator's own ClusterScheduler in this process on a simulated clock; the node daemons are
played by a loop that starts released tasks and stops withdrawn ones at once and finishes jobs
as their work runs out, so every tick sees arrivals, completions and the policy's own changes.
Baseline (in the same run): the mechanism alone, a policy that keeps every placement
(``scheduler_tick_noop_p99``). Target: p99 <= 50 ms. ``_max`` is the slowest tick (usually the
first, which places the whole queue at once).

Part 2, on real processes (a coordinator with tiresias-l and one node daemon with 2 CPU slots):
a long DDP job runs; a short job arrives and preempts it; the short one finishes and the long
one resumes from its checkpoint. ``preempt_to_exit_median``: the decision to the long job's
workers having exited after saving; ``resume_to_first_step_median``: the resume decision to the
resumed job's first training step. Both from the coordinator's event log. Baseline: the time
from a *first* start decision to its first step (``start_to_first_step_median``): a resume
that costs about the same shows that restoring the checkpoint adds little.

Part 3, the same cycles through a real Slurm (``--backend slurm``: a private slurmctld and slurmd on
this host, partition ``one`` = one node with 2 GPUs, started here as the tests do; it needs root
and Debian's Slurm, else the part says why it is skipped): ``slurm_*`` figures beside the node
daemons' of part 2, and ``slurm_vs_nodes_*`` ratios (the cost of going through sbatch, Slurm's
scheduling pass and srun).

``--quick``: 3 repetitions and 60 ticks per policy instead of 5 and 200.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from elastictrain.clock import ManualClock  # noqa: E402
from elastictrain.coordinator.app import Coordinator  # noqa: E402
from elastictrain.coordinator.scheduler import ClusterConfig  # noqa: E402
from elastictrain.coordinator.store import open_store  # noqa: E402
from elastictrain.policies.api import Decision, register, registered  # noqa: E402
from elastictrain.wire import JobSubmit, NodeRegister, ProfileReport, StageProfile, TaskState  # noqa: E402

WORKER = os.path.join(os.path.dirname(HERE), "examples", "torch_cluster_job.py")
OPTIONS = {"tiresias-g": {"distribution": [100.0, 500.0, 2000.0, 8000.0, 30000.0]}}


class Keep:
    """The baseline: places jobs first-come while they fit and never moves or preempts anyone."""

    name = "noop"

    def __init__(self, **_):
        pass

    def decide(self, s):
        free = s.total_gpus
        run = {}
        for j in s.jobs:
            if j.running:
                run[j.job_id] = j.placement
                free -= j.num_gpu
        for j in s.jobs:
            if not j.running and j.num_gpu <= free:
                run[j.job_id] = ((-1, j.num_gpu),)
                free -= j.num_gpu
        return Decision(run)


def pct(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def pct_rank(n: int, q: float) -> int:
    """The 1-based rank of the sample :func:`pct` returns out of ``n``."""
    return min(n - 1, int(round(q * (n - 1)))) + 1


def tick_latency(policy: str, ticks: int, jobs: int = 1000, nodes: int = 64, gpus: int = 8) -> list[float]:
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="et-bench-sched-") as tmp:
        clock = ManualClock(1_000_000.0)
        c = Coordinator(open_store(os.path.join(tmp, "db")), clock,
                        ClusterConfig(policy, dict(OPTIONS.get(policy, {})), interval=60.0))
        s = c.cluster
        types = ("v100", "p100") if policy.startswith("gandiva-fair") else ("",)
        for i in range(nodes):
            s.node_register(f"n{i}", NodeRegister(gpus, f"i{i}", "gpu", types[i % len(types)], "h"))
        stage = [(0.3, 0.5, 0.2), (0.6, 0.3, 0.1), (0.1, 0.8, 0.1), (0.2, 0.2, 0.6)]
        work: dict = {}

        def submit() -> None:
            g = rng.choice([1, 1, 1, 2, 2, 4, 8])
            info = s.submit(JobSubmit(["train.py"], tmp, user=f"u{rng.randrange(4)}", gpus=g,
                                      steps=rng.randint(100, 10000)))
            work[info.id] = rng.uniform(600, 20000)  # seconds of running it needs
            c.members.create_job(info.id, 1, 64)
            p = stage[rng.randrange(len(stage))]
            c.profiles.put(info.id, ProfileReport(StageProfile(0, 20, 5, sum(p), dict(zip(
                ("load", "compute", "sync"), p)))))

        for _ in range(jobs):
            submit()
        times = []
        for k in range(ticks):
            clock.advance(30.0)
            _play_daemons(s, work, 30.0, rng, submit)
            t0 = time.perf_counter()
            s.sched.tick()
            times.append(time.perf_counter() - t0)
            s.nodes.release()
            s._flush()
        c.close()
        return times


def _play_daemons(s, work: dict, dt: float, rng, submit) -> None:
    """What node daemons would report after ``dt`` seconds: released tasks run, withdrawn ones
    exit with the preempted code, jobs whose work ran out finish (and new ones arrive)."""
    for e in list(s.table.running.values()):
        work[e.key] -= dt
    for n in s.nodes.by_index:
        states = []
        for t in n.tasks:
            if not t.wanted and t.alive:
                states.append(TaskState(t.job, t.run, "exited", 75))
            elif t.alive and work.get(t.job, 1) <= 0:
                states.append(TaskState(t.job, t.run, "exited", 0))
            elif t.state == "released":
                states.append(TaskState(t.job, t.run, "running"))
        finished = s.nodes.report(n, states, s.clock.now())
        s._exits(finished)
        for x in finished:
            if x.code == 0 and rng.random() < 0.9:
                submit()


def real_cycles(reps: int, slurm_conf: str = "") -> dict:
    from elastictrain.launcher.local_cluster import LocalCluster

    out = {"preempt": [], "resume": [], "start": []}
    engine = dict(slurm_conf=slurm_conf, partition="one") if slurm_conf else {}
    # Tiresias' first queue (GPU-seconds): the long job must pass it before the short job comes.
    # (The audit saw start_to_first_step get 0 of 3 samples with a first queue of 6 GPU-s: a start
    # that took over 3 s counted as service then, and demoted the short job before its first step.
    # Start-up is no longer service, nor preemptible; these queues stay as they were measured with.)
    first = 20 if slurm_conf else 12
    with tempfile.TemporaryDirectory(prefix="et-bench-cluster-") as tmp, \
            LocalCluster(tmp, "tiresias-l", "--thresholds", str(first), nodes=1, slots=2, **engine) as c:
        for r in range(reps):
            def cmd(name, epochs, samples):
                return [WORKER, "--ckpt-dir", os.path.join(tmp, f"ckpt-{name}"), "--out",
                        os.path.join(tmp, f"{name}.json"), "--epochs", str(epochs), "--samples", str(samples),
                        "--step-sleep", "0.05"]

            long = c.submit(f"long{r}", 2, cmd(f"long{r}", 2, 4800 if slurm_conf else 2400))
            c.wait(lambda st: any(j.id == long and j.step > 10 and j.attained_gpu > first + 2 for j in st.jobs), 120,
                   "the long job to train past the first queue")
            short = c.submit(f"short{r}", 2, cmd(f"short{r}", 1, 200))
            c.wait(lambda st: all(j.status == "finished" for j in st.jobs if j.id in (long, short)), 180,
                   "both jobs to finish")
            ev = c.events()
            t = {}
            for e in ev:
                if e.job in (long, short):
                    t.setdefault((e.job, e.kind, e.detail.get("run")), e.time)
            for key, job, end, begin, run in (("preempt", long, "exit", "preempt", 1),
                                              ("resume", long, "first_step", "resume", 2),
                                              ("start", short, "first_step", "start", 1)):
                missing = [k for k in ((job, begin, run), (job, end, run)) if k not in t]
                if missing:  # each figure on its own: one missing event costs only its own sample
                    seen = sorted({(e.kind, e.detail.get("run")) for e in ev if e.job == job})
                    print(f"cycle {r}: no {key} sample: event(s) {missing} missing; {job} had {seen}",
                          file=sys.stderr)
                else:
                    out[key].append(t[(job, end, run)] - t[(job, begin, run)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--policy", default=None, help="only these (comma-separated)")
    args = ap.parse_args()
    ticks = 60 if args.quick else 200
    register("noop", lambda **kw: Keep(**kw), (), replace=True)
    names = args.policy.split(",") if args.policy else ["noop"] + [n for n in registered() if n != "noop"]
    try:
        from tqdm import tqdm
        names_iter = tqdm(names, desc="policies", file=sys.stderr)
    except ImportError:
        names_iter = names
    rows = []
    for name in names_iter:
        times = tick_latency(name, ticks)
        rows.append((name, pct(times, 0.5) * 1e3, pct(times, 0.99) * 1e3, max(times) * 1e3))
    base = rows[0][2] if rows and rows[0][0] == "noop" else None
    print(f"# one scheduling step, 1,000 jobs on 64 nodes x 8 GPUs, {ticks} ticks each")
    print(f"scheduler_tick_samples: {ticks} ticks per policy (p99 is the {pct_rank(ticks, 0.99)}th of {ticks}: "
          "with few ticks it rests on one or two samples; run without --quick for 200)")
    for name, p50, p99, most in rows:
        print(f"scheduler_tick_{name}_p50: {p50:.2f} ms")
        print(f"scheduler_tick_{name}_p99: {p99:.2f} ms")
        print(f"scheduler_tick_{name}_max: {most:.2f} ms")
        if base and name != "noop":
            print(f"scheduler_tick_{name}_p99_vs_noop: {p99 / base:.2f} x")
    worst = max(rows, key=lambda r: r[2])
    print(f"scheduler_tick_worst_p99: {worst[2]:.2f} ms ({worst[0]}; target <= 50 ms)")
    worst = max(rows, key=lambda r: r[3])
    print(f"scheduler_tick_worst_max: {worst[3]:.2f} ms ({worst[0]}; the first tick places the whole queue)")
    reps = 3 if args.quick else 5
    cyc = real_cycles(reps)
    print(f"# real processes: tiresias-l, 1 node x 2 CPU slots, {reps} preempt/resume cycles")
    for key, name in (("preempt", "preempt_to_exit"), ("resume", "resume_to_first_step"),
                      ("start", "start_to_first_step")):
        xs = cyc[key]
        if xs:
            print(f"{name}_median: {statistics.median(xs):.3f} s")
            print(f"{name}_max: {max(xs):.3f} s")
        print(f"{name}_samples: {len(xs)} of {reps}")
    if cyc["resume"] and cyc["start"]:
        print(f"resume_vs_first_start: {statistics.median(cyc['resume']) / statistics.median(cyc['start']):.2f} x")
    slurm_part(reps, cyc)


def slurm_part(reps: int, nodes: dict) -> None:
    """Part 3: the same cycles through a real Slurm, beside the node daemons' figures."""
    sys.path.insert(0, os.path.dirname(HERE))
    from tests.integration.slurm_kit import SlurmKit, missing

    names = (("preempt", "preempt_to_exit"), ("resume", "resume_to_first_step"), ("start", "start_to_first_step"))
    why = missing()
    kit = None
    if not why:
        root = tempfile.mkdtemp(prefix="et-bench-slurm-")
        os.chmod(root, 0o755)
        kit = SlurmKit(root)
        try:
            kit.start()
        except Exception as exc:  # noqa: BLE001 - reported, and the part is skipped
            why = f"Slurm did not start: {exc}"
    if why:
        print(f"# Slurm part skipped: {why}")
        for _, name in names:
            print(f"slurm_{name}_samples: 0 of {reps}")
        return
    try:
        cyc = real_cycles(reps, kit.conf)
    finally:
        kit.stop()
    print(f"# real processes through Slurm 22.05 (--backend slurm, 1 node x 2 GPUs), {reps} cycles")
    for key, name in names:
        xs = cyc[key]
        if xs:
            print(f"slurm_{name}_median: {statistics.median(xs):.3f} s")
            print(f"slurm_{name}_max: {max(xs):.3f} s")
            if nodes[key]:
                print(f"slurm_vs_nodes_{name}: {statistics.median(xs) / statistics.median(nodes[key]):.2f} x")
        print(f"slurm_{name}_samples: {len(xs)} of {reps}")


if __name__ == "__main__":
    main()
