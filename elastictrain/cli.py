"""``elastictrain <command>``: the operator's and researcher's entry point.

Commands:
    coordinator   run the coordinator service (with --policy: the live scheduler too)
    node          run a node daemon that runs the jobs the coordinator places on this machine
    submit        queue a job; status: the cluster or one job; cancel; logs [-f]
    simulate      replay a cluster trace through scheduling policies
    profile       run a training script for N iterations and print its stage and comm profiles
    fairness      Gandiva-fair's fair-share experiments (homogeneous, heterogeneous with trading)
    version       print the package version
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from typing import Optional, Sequence

from . import __version__
from .errors import ConfigError, ElasticTrainError

__all__ = ["main", "get_parser"]


def _env(name: str, default):
    return os.environ.get(name, default)


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elastictrain", description="elastic training coordinator and tools")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("coordinator", help="run the coordinator service")
    c.add_argument("--host", default=_env("ET_HOST", "127.0.0.1"), help="address to listen on [ET_HOST]")
    c.add_argument("--port", type=int, default=int(_env("ET_PORT", 7707)),
                   help="port to listen on; 0 picks a free one [ET_PORT]")
    c.add_argument("--db", default=_env("ET_DB", "elastictrain.db"),
                   help="SQLite file or sqlite:///PATH holding all state; or postgresql://USER@HOST/DB, which "
                   "several coordinators may share (one leads, the others stand by; docs/coordinator.md) [ET_DB]")
    c.add_argument("--lease", type=float, default=float(_env("ET_LEASE", "5")),
                   help="--db postgresql://: seconds a leader's lease lasts; a standby takes over about this "
                   "long after the leader dies [ET_LEASE]")
    c.add_argument("--advertise-url", default=_env("ET_ADVERTISE_URL", None),
                   help="--db postgresql://: the address clients reach this coordinator at (a standby names "
                   "the leader by it; default: the address it listens on) [ET_ADVERTISE_URL]")
    c.add_argument("--token-file", default=_env("ET_TOKEN_FILE", None),
                   help="bearer token file (created with a random token if missing); or set ET_TOKEN")
    c.add_argument("--sync", choices=("normal", "full"), default=_env("ET_DB_SYNC", "normal"),
                   help="normal: survives a killed process; full: also a power loss [ET_DB_SYNC]")
    c.add_argument("--ready-file", default=None, help="write {url, pid} as JSON here once listening")
    c.add_argument("--log-level", default=_env("ET_LOG_LEVEL", "info"),
                   help="debug, info (the default: listening, scheduling events as JSON lines), warning, error")
    c.add_argument("--public-read", action="store_true",
                   help="answer GET requests without the token (every route needs it by default)")
    c.add_argument("--allow-insecure-token-file", action="store_true",
                   help="accept a token file that other users can read (refused by default)")
    c.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a request's head may take to arrive (slow clients get 408)")
    c.add_argument("--body-timeout", type=float, default=30.0, help="seconds a request's body may take to arrive")
    c.add_argument("--keep-alive", type=float, default=30.0, help="seconds an idle connection stays open")
    c.add_argument("--max-connections", type=int, default=1000, help="connections open at once; more are closed")
    c.add_argument("--max-connections-per-client", type=int, default=None,
                   help="connections open at once from one client address (default: 80%% of --max-connections)")
    c.add_argument("--max-header-bytes", type=int, default=65536, help="largest request head (more: 431)")
    c.add_argument("--policy", default=_env("ET_POLICY", None),
                   help="run the live scheduler with this policy (e.g. tiresias-l, fifo, srtf, muri-s, gandiva-fair); "
                   "without it the coordinator only serves etrun jobs [ET_POLICY]")
    c.add_argument("--interval", type=float, default=5.0, help="with --policy: also decide every N seconds")
    c.add_argument("--backend", choices=["nodes", "slurm", "ray", "kubernetes"], default=_env("ET_BACKEND", "nodes"),
                   help="with --policy: who runs the jobs: our node daemons (`elastictrain node`), Slurm (a run is "
                   "one Slurm job on the decided nodes; docs/slurm.md), Ray (a placement group with one actor per "
                   "node; docs/ray.md) or Kubernetes (one pod per node; docs/kubernetes.md) [ET_BACKEND]")
    c.add_argument("--slurm-partition", default=_env("ET_SLURM_PARTITION", None),
                   help="--backend slurm: the partition whose nodes are the cluster, or several comma-separated "
                   "(a run goes to one holding all its nodes) [ET_SLURM_PARTITION]")
    c.add_argument("--slurm-reservation", default=None, help="--backend slurm: also run inside this reservation")
    c.add_argument("--slurm-accounts", action="store_true",
                   help="--backend slurm: charge a job's runs to the Slurm account named as its project (submit -A: "
                   "sbatch --account), so that sacct and sreport count them there; Slurm must know the accounts "
                   "(sacctmgr) where it enforces associations. Default: the Slurm default account of the job's "
                   "user")
    c.add_argument("--slurm-python", default=None,
                   help="--backend slurm: the Python the compute nodes run etrun with (default: this one)")
    c.add_argument("--ray-address", default=_env("ET_RAY_ADDRESS", None),
                   help="--backend ray: the Ray cluster's HOST:PORT, as `ray start --head` printed [ET_RAY_ADDRESS]")
    c.add_argument("--k8s-namespace", default=_env("ET_K8S_NAMESPACE", None),
                   help="--backend kubernetes: the namespace the runs' pods go to (default: the coordinator's own "
                   "pod's, else 'default') [ET_K8S_NAMESPACE]")
    c.add_argument("--k8s-image", default=_env("ET_K8S_IMAGE", None),
                   help="--backend kubernetes: the container image the runs' pods run (with elastictrain and the "
                   "job's code installed) [ET_K8S_IMAGE]")
    c.add_argument("--k8s-python", default=None, help="--backend kubernetes: the image's Python (default python3)")
    c.add_argument("--k8s-service-account", default=None,
                   help="--backend kubernetes: the service account the runs' pods run as (default: the namespace's)")
    c.add_argument("--k8s-kueue-queue", default=None, metavar="LOCALQUEUE",
                   help="--backend kubernetes: admit each run's pods through this Kueue LocalQueue as one pod group "
                   "(all or none; docs/kubernetes.md)")
    c.add_argument("--k8s-kueue-queue-per-project", action="store_true",
                   help="--backend kubernetes: a job charged to a project (submit -A) goes through the Kueue "
                   "LocalQueue named as the project (Kueue's quotas and accounting by team); others through "
                   "--k8s-kueue-queue")
    c.add_argument("--k8s-scheduler-name", default=None,
                   help="--backend kubernetes: the pods' scheduler (default: the cluster's)")
    c.add_argument("--engine-cpus-per-worker", "--slurm-cpus-per-worker", dest="engine_cpus_per_worker", type=int,
                   default=int(_env("ET_ENGINE_CPUS_PER_WORKER", "0") or 0), metavar="N",
                   help="--backend slurm|ray|kubernetes on nodes without GPUs: schedule their CPUs, N per worker (a "
                   "node offers CPUs // N worker slots; a run asks for N CPUs per worker: Slurm --cpus-per-task, a Ray "
                   "CPU bundle, a pod's cpu request) [ET_ENGINE_CPUS_PER_WORKER]")
    c.add_argument("--engine-state-dir", "--slurm-state-dir", dest="engine_state_dir", default=None,
                   help="--backend slurm|ray|kubernetes: where the runs' scripts and outputs and the coordinator id "
                   "are kept (default: <kind>-runs beside --db; for Slurm on a filesystem the nodes share)")
    c.add_argument("--engine-coordinator-url", "--slurm-coordinator-url", dest="engine_coordinator_url",
                   default=None,
                   help="--backend slurm|ray|kubernetes: the URL the engine's nodes reach this coordinator at "
                   "(default: the address it listens on; with --host 0.0.0.0, this host's name)")
    c.add_argument("--node-timeout", type=float, default=15.0,
                   help="with --policy: seconds without a poll before a node counts as lost")
    c.add_argument("--quota-gpus", type=int, default=0, metavar="N",
                   help="with --policy: every user's jobs may count at most N GPUs at once (each admitted job at its "
                   "--gpus; more wait to be admitted); `elastictrain users quota NAME` sets a user's own (0: no limit)")
    c.add_argument("--quota-jobs", type=int, default=0, metavar="N",
                   help="with --policy: every user may have at most N jobs admitted at once (0: no limit)")
    c.add_argument("--notify-allow", action="append", default=[], metavar="PATTERN",
                   help="with --policy: URLs jobs may ask for notifications at (submit --notify), as shell patterns, "
                   "e.g. 'https://hooks.slack.com/*'; repeatable (none: no notifications)")
    c.add_argument("--retain", default=_env("ET_RETAIN", "0"), metavar="SPAN",
                   help="with --policy: delete scheduler events, and the output of jobs that ended, once they are "
                   "older than this (90d, 12h, 30m; 0: keep them forever, the default); job records and GPU-time "
                   "accounting stay (docs/coordinator.md) [ET_RETAIN]")
    c.add_argument("--quota-borrow", action="store_true",
                   help="with --policy and quotas: a job over its user's quota is admitted anyway, on the GPUs the "
                   "jobs within their quotas leave, and preempted first when they need them (Kueue's borrowing); "
                   "it counts against the quota once there is room")
    c.add_argument("--priority-preemption", action="store_true",
                   help="with --policy: jobs of a higher `submit --priority` take GPUs from lower ones (preempting "
                   "them; the policy decides within each priority); only the admin may submit above priority 0. "
                   "Without it, priority orders only each user's admission under a quota")
    c.add_argument("--job-env-allow", action="append", default=[], metavar="PATTERN",
                   help="with --policy: also let submitted jobs set environment variables matching this shell "
                   "pattern (repeatable; loader variables such as LD_* and PYTHONPATH stay refused; "
                   "docs/security.md)")
    c.add_argument("--straggler-factor", type=float, default=1.5,
                   help="a rank is a straggler when its own work per step (non-sync et.stage spans) is above this "
                   "times its peers' median ...")
    c.add_argument("--straggler-windows", type=int, default=3,
                   help="... for this many monitor samples in a row")
    c.add_argument("--straggler-cooldown", type=float, default=60.0,
                   help="seconds a straggler's node sits out (doubled each time it is excluded again); 0: flag only")
    _policy_options(c)

    from .cluster_cli import add_commands

    add_commands(sub)

    m = sub.add_parser("simulate", help="replay a cluster trace through scheduling policies")
    m.add_argument("--trace", required=True, help="trace file (Tiresias CSV, Muri CSV, Gavel .trace, native CSV)")
    m.add_argument("--cluster", required=True, help="cluster spec CSV, a short form like n8g8, or GPU types "
                   "like v100:3x4+k80:16x8 (nodes x GPUs each)")
    m.add_argument("--policy", default="tiresias-l,srsf,fifo",
                   help="comma-separated: yarn-cs|fifo, fifo-be, srtf, srsf, tiresias-l, tiresias-g, gandiva-ts, "
                   "gandiva-fair, gandiva-fair-notrade, gandiva-fair-global, muri-s, muri-l, muri-l-worst, "
                   "muri-l-noblossom")
    m.add_argument("--out", default=None, help="directory for summary.json/csv, per-job CSVs and PNG plots")
    m.add_argument("--preset", default="default", help="engine settings: default, or muri (the Muri "
                   "reference simulator's restart and speed model)")
    m.add_argument("--format", default="auto", help="trace format: auto, tiresias, muri, gavel, native")
    m.add_argument("--interval", type=float, default=None, help="also decide every N seconds (e.g. 360)")
    m.add_argument("--restart-cost", default=None, help="'muri' (table by model and GPUs) or seconds")
    _policy_options(m)
    m.add_argument("--spread-slowdown", type=float, default=1.0,
                   help="slowdown of a skew-sensitive job placed across nodes (1: none)")
    m.add_argument("--migration-cost", type=float, default=0.0,
                   help="seconds a running job loses when a decision moves it (gandiva-fair migrations)")
    m.add_argument("--outage", action="append", default=[], metavar="NODE:START:END",
                   help="node NODE (0-based) is lost from START to END seconds (END 'inf': for good); its jobs are "
                   "preempted; repeatable")
    m.add_argument("--maintenance", action="append", default=[], metavar="NODE:START:END",
                   help="as --outage, but planned: the policies know of it from the start (backfill and multifactor "
                   "start nothing there that would still run then), as `nodes drain NAME --at`; repeatable")
    m.add_argument("--cordon", action="append", default=[], metavar="NODE:START:END",
                   help="as --maintenance, but the node's running jobs run on: it takes nothing new from START to "
                   "END, as `nodes cordon NAME --at`; repeatable")
    m.add_argument("--checkpoint-every", type=float, default=None, metavar="SECONDS",
                   help="with --outage: a job lost with its node goes back to its last checkpoint, one every SECONDS "
                   "of training (default: it loses nothing)")
    m.add_argument("--priority-preemption", action="store_true",
                   help="as `coordinator --priority-preemption`: each policy runs once per job priority (the native "
                   "trace's priority column), highest first, preempting lower priorities for higher ones")
    m.add_argument("--quota-gpus", type=int, default=0, metavar="N",
                   help="as `coordinator --quota-gpus`: each user's admitted jobs count at most N GPUs (the trace's "
                   "user column); the others wait outside the policy's view, and their wait counts (0: no limit)")
    m.add_argument("--quota-jobs", type=int, default=0, metavar="N",
                   help="as `coordinator --quota-jobs`: each user has at most N jobs admitted (0: no limit)")
    m.add_argument("--tickets", default=None, metavar="USER=N,...",
                   help="gandiva-fair, multifactor: users' tickets (the trace's user column; others have 1), as "
                   "`users set`")
    m.add_argument("--project-tickets", default=None, metavar="PROJECT=N,...",
                   help="gandiva-fair: projects' tickets (the native trace's project column), as `projects set "
                   "--tickets`: each is one share beside the users, split among its users with jobs")
    m.add_argument("--no-progress", action="store_true")
    m.add_argument("--parallel", type=int, default=1, help="run up to N policies at once, in separate processes")

    pr = sub.add_parser("profile", help="run a training command for N iterations; print its stage and "
                        "communication profiles", usage="elastictrain profile [-n N] [--warmup W] [--json FILE] "
                        "-- COMMAND ...")
    pr.add_argument("-n", "--iterations", type=int, default=20, help="iterations measured after the warm-up")
    pr.add_argument("--warmup", type=int, default=5, help="iterations run before measuring")
    pr.add_argument("--json", default=None, help="also write the reports (a list, one per worker) here")
    pr.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    pr.add_argument("cmd", nargs=argparse.REMAINDER, help="the training command (after --)")

    f = sub.add_parser("fairness", help="Gandiva-fair's fair-share experiments: per-user share over time and in "
                       "total, as a table, CSV and PNG")
    f.add_argument("experiment", nargs="?", choices=("homogeneous", "heterogeneous"),
                   help="a simulated experiment, or none with --from-coordinator")
    f.add_argument("--from-coordinator", default=None, metavar="URL",
                   help="report a live cluster instead: each user's GPU time against its tickets, from the "
                   "coordinator's event log (--window seconds per window)")
    f.add_argument("--token-file", default=os.environ.get("ET_TOKEN_FILE"),
                   help="with --from-coordinator: the coordinator's token file [ET_TOKEN_FILE; or set ET_TOKEN]")
    f.add_argument("--trace", default=None, help="homogeneous: trace whose GPU counts the users' jobs are drawn "
                   "from (default: the shipped traces/tiresias/60_job.csv)")
    f.add_argument("--throughputs", default=None, help="heterogeneous: Gavel's simulation_throughputs.json "
                   "(default: the shipped traces/gavel/simulation_throughputs.json.gz)")
    f.add_argument("--policy", default="gandiva-fair", help="homogeneous: the policy (gandiva-fair, "
                   "gandiva-fair-global, ...)")
    f.add_argument("--hours", type=float, default=None, help="simulated hours (24 homogeneous, 12 heterogeneous)")
    f.add_argument("--window", type=float, default=3600.0, help="seconds per report window")
    f.add_argument("--migration-cost", type=float, default=0.0, help="seconds a migrated running job loses")
    f.add_argument("--out", default=None, help="write fairness_total.csv, fairness_timeline.csv, fairness.png here")

    tr = sub.add_parser("trace", help="make traces: `trace synth` writes a Philly-like synthetic trace")
    tsub = tr.add_subparsers(dest="trace_command", required=True)
    sy = tsub.add_parser("synth", help="a synthetic trace resampled from the shipped Philly-derived traces "
                         "(see elastictrain/sim/synth.py for where the distributions come from)")
    sy.add_argument("--jobs", type=int, required=True, help="number of jobs")
    sy.add_argument("--seed", type=int, default=0)
    sy.add_argument("--out", required=True, help="the trace file (native format; .gz to compress)")
    sy.add_argument("--gpus", type=int, default=64, help="the cluster's GPUs the load is relative to (default 64)")
    sy.add_argument("--load", type=float, default=0.9, help="offered GPU-seconds per second / GPUs (default 0.9)")
    sy.add_argument("--users", type=int, default=8, help="users the jobs are spread over (fair-share policies)")
    sy.add_argument("--priorities", type=_int_list, default=(), metavar="P,P,...",
                    help="each job draws one of these priorities (repeat one to weigh it: 0,0,0,5 gives a quarter "
                    "of the jobs priority 5), for simulate --priority-preemption")
    sy.add_argument("--elastic", type=float, default=0.0, metavar="FRACTION",
                    help="this fraction of the jobs is elastic: half to twice its GPUs, with a serial fraction "
                    "drawn from 0..0.3 (synthetic: Philly has no scaling data), for simulate --policy autoscale")
    ex = tsub.add_parser("export", help="a live cluster's jobs as a trace the simulator replays (submit times, "
                         "GPUs, steps, measured seconds per step, users)")
    ex.add_argument("--coordinator", default=os.environ.get("ET_COORDINATOR", "http://127.0.0.1:7707"),
                    help="the coordinator's URL [ET_COORDINATOR, else http://127.0.0.1:7707]")
    ex.add_argument("--token-file", default=os.environ.get("ET_TOKEN_FILE"),
                    help="the coordinator's token file [ET_TOKEN_FILE; or set ET_TOKEN]")
    ex.add_argument("--out", required=True, help="the trace file (native format; .gz to compress)")

    sub.add_parser("version", help="print the version")
    return p


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"give whole numbers separated by commas, e.g. 0,0,0,5; not {text!r}") \
            from None


def _exempt_seconds(text: str) -> float:
    from .scheduling.loop import MAX_MIN_RUN

    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0.0 <= v <= MAX_MIN_RUN:
        raise argparse.ArgumentTypeError(f"--preempt-exempt {text!r}: give seconds from 0 (off) to {MAX_MIN_RUN:.0f}")
    return v


def _policy_options(p: argparse.ArgumentParser) -> None:
    """The policies' options, shared by ``simulate`` and ``coordinator --policy``."""
    p.add_argument("--preempt-starting", action="store_true",
                   help="let a decision preempt a job before its run's first training step (by default it runs on "
                   "until it has trained one, and the start that wanted its GPUs waits)")
    p.add_argument("--preempt-exempt", type=_exempt_seconds, default=0.0, metavar="SECONDS",
                   help="Slurm's PreemptExemptTime: a run is not preempted until it has run this long (0, the "
                   "default: off); what wants its GPUs waits, whatever the policy or priority. Fewer restarts, "
                   "slower response")
    p.add_argument("--placement", default=None, help="count, consolidated, spread or skew (policy default)")
    p.add_argument("--thresholds", default=None, help="Tiresias queue limits in GPU-seconds, e.g. 3250,7200")
    p.add_argument("--promote-knob", type=float, default=None, help="Tiresias PROMOTEKNOB (0: off)")
    p.add_argument("--packlimit", type=float, default=None, help="Tiresias PACKLIMIT for skew placement")
    p.add_argument("--distribution", default=None, help="job GPU-time samples CSV for tiresias-g")
    p.add_argument("--quantum", type=float, default=None, help="time slice of gandiva-ts and gandiva-fair, seconds")
    p.add_argument("--stretch", type=int, default=None,
                   help="gandiva-fair (simulator): after the one-quantum decision at an arrival or an end, each quantum "
                   "spans N quanta until the next arrival or end (default 1: every quantum decided; fewer decisions "
                   "and preemptions, coarser slices; 64 replays a 50,000-job trace in under a minute)")
    p.add_argument("--reservations", type=int, default=None,
                   help="backfill: how many waiting jobs that do not fit get a reservation that the jobs behind them "
                   "must not delay (default 1: EASY backfill; Slurm reserves for each of the first bf_max_job_test)")
    p.add_argument("--grow", action="store_true", default=None,
                   help="backfill, multifactor: grow running elastic jobs (--gpus MIN:MAX, with --steps or --epochs) "
                   "onto GPUs the queue leaves idle, where no reservation moves (off by default, as in Slurm: it "
                   "pays for jobs that scale well; docs/cluster.md, Backfill)")
    p.add_argument("--priority-weights", default=None, metavar="FACTOR=N,...",
                   help="multifactor: the weights of age, fairshare, size and qos, as Slurm's PriorityWeight* (default "
                   "age=1000,fairshare=10000,size=1000,qos=1000; those not given keep theirs)")
    p.add_argument("--priority-half-life", type=float, default=None, metavar="SECONDS",
                   help="multifactor: past GPU time counts half after this long (Slurm's PriorityDecayHalfLife; "
                   "default 604800, 7 days)")
    p.add_argument("--priority-max-age", type=float, default=None, metavar="SECONDS",
                   help="multifactor: the wait at which the age factor is full (Slurm's PriorityMaxAge; default 7 "
                   "days)")
    p.add_argument("--priority-favor-small", action="store_true", default=None,
                   help="multifactor: the size factor favours small jobs (Slurm's PriorityFavorSmall)")
    p.add_argument("--scale-threshold", type=float, default=None,
                   help="autoscale: least marginal efficiency of a step of workers that pays (default 0.3)")
    p.add_argument("--rate-window", type=float, default=None,
                   help="autoscale: seconds of training one throughput measurement covers (default 10)")
    p.add_argument("--scale-drop", type=float, default=None,
                   help="autoscale: re-check a settled job when its throughput falls by this fraction (default 0.2)")
    p.add_argument("--scale-step", type=int, default=None, help="autoscale: workers per step (default 1)")
    p.add_argument("--memory-headroom", type=float, default=None,
                   help="autoscale: each worker's memory limit is this times the largest resident memory its job's "
                   "workers reported, at least 1 GiB, from the job's next start (default 2; 0: no limits)")
    p.add_argument("--finish-hold", type=float, default=None,
                   help="muri: a running job with at most this fraction of its iterations left, and less time left "
                   "than its restart (start-up) costs, keeps its place and group until it ends (default 0.05; 0: "
                   "the paper's rule)")
    p.add_argument("--scale-cooldown", type=float, default=None,
                   help="autoscale: seconds after a job settles during which its size is not checked again "
                   "(default 300)")
    p.add_argument("--yield-threshold", type=float, default=None,
                   help="autoscale: when a job waits, settled jobs give back steps whose marginal efficiency is "
                   "below this (default 0.7; 0: never)")


def _engine_config(args):
    """``--backend``: None for the node daemons, else the engine's settings.

    Raises:
        ConfigError: an engine without ``--policy``, or without what it needs to find its cluster.
    """
    from .errors import ConfigError

    if args.backend == "nodes":
        return None
    from .coordinator.server import KubernetesEngineConfig, RayEngineConfig, SlurmEngineConfig

    if not args.policy:
        raise ConfigError(f"--backend {args.backend} carries out a scheduler's decisions: give --policy NAME too "
                          "(e.g. --policy tiresias-l)")
    from .engines.api import check_cpus_per_worker

    url = args.engine_coordinator_url
    cpus = check_cpus_per_worker(args.engine_cpus_per_worker)
    if args.backend == "ray":
        if not args.ray_address:
            raise ConfigError("--backend ray needs --ray-address HOST:PORT (the address `ray start --head` printed)")
        return RayEngineConfig(args.ray_address, args.engine_state_dir, url, cpus_per_worker=cpus)
    if args.backend == "kubernetes":
        if not args.k8s_image:
            raise ConfigError("--backend kubernetes needs --k8s-image IMAGE: an image with elastictrain and the jobs' "
                              "code (docs/kubernetes.md)")
        from .engines.k8s_manifests import default_namespace

        return KubernetesEngineConfig(args.k8s_namespace or default_namespace(), args.k8s_image, args.k8s_python,
                                      args.k8s_service_account, args.k8s_kueue_queue, args.k8s_scheduler_name,
                                      args.engine_state_dir, url, cpus_per_worker=cpus,
                                      kueue_per_project=args.k8s_kueue_queue_per_project)
    if not args.slurm_partition:
        raise ConfigError("--backend slurm needs --slurm-partition NAME (`sinfo -s` lists the partitions)")
    return SlurmEngineConfig(args.slurm_partition, args.engine_state_dir, args.slurm_python,
                             args.slurm_reservation, url, cpus_per_worker=cpus, accounts=args.slurm_accounts)


def _limits(args):
    from .coordinator.protocol import Limits
    from .errors import ConfigError

    checks = [("--header-timeout", args.header_timeout, 0.1, 3600), ("--body-timeout", args.body_timeout, 0.1, 3600),
              ("--keep-alive", args.keep_alive, 0.1, 3600), ("--max-connections", args.max_connections, 1, 1_000_000),
              ("--max-header-bytes", args.max_header_bytes, 1024, 1 << 24)]
    per_client = args.max_connections_per_client
    if per_client is None:
        per_client = max(1, args.max_connections * 4 // 5)
    checks.append(("--max-connections-per-client", per_client, 1, 1_000_000))
    for flag, value, lo, hi in checks:
        if not lo <= value <= hi:  # NaN fails too
            raise ConfigError(f"{flag} must be in [{lo}, {hi}], got {value}")
    return Limits(args.header_timeout, args.body_timeout, args.max_header_bytes, args.max_connections, args.keep_alive,
                  max_per_client=per_client)


def _span(text: str, flag: str) -> float:
    """Seconds in a span such as ``90d``, ``12h``, ``30m``, ``45s`` (cluster_cli.span_seconds, as
    ``history -S`` reads them) or ``3600`` (seconds)."""
    from .cluster_cli import span_seconds

    t = str(text).strip().lower()
    value = span_seconds(t)
    if value is None:
        try:
            value = float(t)
        except ValueError:
            value = float("nan")
    if not (value >= 0 and math.isfinite(value)):
        raise ConfigError(f"{flag} {text!r}: give a span such as 90d, 12h, 30m or 3600 (seconds); 0 for none")
    return value


def _policy_values(args) -> dict:
    from .errors import ConfigError

    try:
        thresholds = tuple(float(x) for x in args.thresholds.split(",")) if args.thresholds else None
    except ValueError:
        raise ConfigError(f"--thresholds {args.thresholds!r}: use numbers separated by commas, e.g. 3250,7200") from None
    return {"placement": args.placement, "packlimit": args.packlimit, "promote_knob": args.promote_knob,
            "distribution": args.distribution, "quantum": args.quantum, "thresholds": thresholds,
            "threshold": args.scale_threshold, "rate_window": args.rate_window, "drop": args.scale_drop,
            "step": args.scale_step, "yield_threshold": args.yield_threshold, "stretch": args.stretch,
            "memory_headroom": args.memory_headroom, "cooldown": args.scale_cooldown,
            "finish_hold": args.finish_hold, "reservations": args.reservations, "grow": args.grow,
            "weights": _weights(args.priority_weights), "half_life": args.priority_half_life,
            "max_age": args.priority_max_age, "favor_small": args.priority_favor_small}


def _name_numbers(text: str) -> list[tuple[str, str, float]]:
    """``NAME=N,...`` as (the part, NAME, N) each; N is NaN where it is not a number (the caller
    says what it wants)."""
    out = []
    for part in filter(None, text.split(",")):
        name, _, num = part.partition("=")
        try:
            value = float(num)
        except ValueError:
            value = math.nan
        out.append((part, name, value))
    return out


def _weights(text: Optional[str]) -> Optional[dict]:
    """``--priority-weights age=N,...`` as {factor: weight} (the policy checks names and ranges)."""
    if text is None:
        return None
    out = {}
    for part, name, value in _name_numbers(text):
        if math.isnan(value):
            raise ConfigError(f"--priority-weights {part!r}: write FACTOR=N, e.g. fairshare=10000")
        out[name.strip()] = value
    return out


def _env_patterns(given: list) -> list:
    import re

    out = []
    for item in given:
        for p in item.split(","):
            p = p.strip()
            if not re.fullmatch(r"[A-Za-z0-9_*?\[\]]{1,128}", p):
                raise ConfigError(f"--job-env-allow {p!r}: give a shell pattern of variable names, e.g. MYLAB_*")
            out.append(p)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = get_parser().parse_args(argv)
    try:
        if args.command == "coordinator":
            from .coordinator.server import ServerConfig, serve

            logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
            cluster = None
            retain = _span(args.retain, "--retain")
            if args.policy:
                from .coordinator.notify import check_patterns
                from .coordinator.scheduler import ClusterConfig
                from .policies.api import check_registered

                check_registered(args.policy)
                cluster = ClusterConfig(args.policy, _policy_values(args), args.interval, args.node_timeout,
                                        job_env_allow=tuple(_env_patterns(args.job_env_allow)),
                                        protect_startup=not args.preempt_starting, min_run=args.preempt_exempt,
                                        quota_gpus=args.quota_gpus, quota_jobs=args.quota_jobs,
                                        priority_preemption=args.priority_preemption,
                                        quota_borrow=args.quota_borrow,
                                        notify_allow=check_patterns(args.notify_allow), retain=retain)
            elif retain:
                raise ConfigError("--retain needs --policy: without it the coordinator keeps no event log nor jobs' "
                                  "output")
            engine = _engine_config(args)
            serve(ServerConfig(engine=engine, host=args.host, port=args.port, db=args.db, token_file=args.token_file,
                               lease=args.lease, advertise_url=args.advertise_url,
                               sync=args.sync, ready_file=args.ready_file, public_read=args.public_read,
                               cluster=cluster, allow_insecure_token_file=args.allow_insecure_token_file,
                               limits=_limits(args), stragglers=(args.straggler_factor, args.straggler_windows,
                                                                 args.straggler_cooldown)))
        elif args.command in ("node", "submit", "status", "cancel", "hold", "release", "update", "requeue", "logs",
                              "events", "users", "nodes", "history", "projects"):
            from .cluster_cli import run_command

            return run_command(args)
        elif args.command == "simulate":
            _simulate(args)
        elif args.command == "profile":
            return _profile(args)
        elif args.command == "fairness":
            _fairness(args)
        elif args.command == "trace" and args.trace_command == "export":
            _trace_export(args)
        elif args.command == "trace":
            from .sim.synth import synthesize, write_native

            jobs = synthesize(args.jobs, args.seed, args.gpus, args.load, args.users, priorities=args.priorities,
                              elastic=args.elastic)
            print(f"wrote {write_native(jobs, args.out)}: {len(jobs)} jobs over {jobs[-1].submit_time / 3600:.1f} h, "
                  f"offered load {args.load:g} x {args.gpus} GPUs")
        elif args.command == "version":
            print(__version__)
    except ElasticTrainError as exc:
        print(f"elastictrain: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _stage_table(stages, last: str, cell) -> str:
    """Per-worker stage times in ms, with a last column ``last`` filled by ``cell(profile)``."""
    from ._text import table

    rows = [("worker", "iteration ms", "load ms", "preprocess ms", "compute ms", "sync ms", last)]
    for st in stages:
        rows.append((str(st.worker), f"{st.iteration_seconds * 1e3:.2f}",
                     *(f"{st.stages.get(k, 0.0) * 1e3:.2f}" for k in ("load", "preprocess", "compute", "sync")),
                     cell(st)))
    return table(rows)


def _profile(args) -> int:
    import glob
    import json
    import subprocess
    import tempfile

    import msgspec

    from ._text import table
    from .errors import ConfigError
    from .runtime.profiler import load_report

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ConfigError("give the training command after --, e.g. elastictrain profile -n 20 -- python train.py")
    if args.iterations < 1 or args.warmup < 0:
        raise ConfigError("--iterations must be >= 1 and --warmup >= 0")
    with tempfile.TemporaryDirectory(prefix="et-profile-") as tmp:
        env = dict(os.environ, ET_PROFILE_ITERATIONS=str(args.iterations), ET_PROFILE_WARMUP=str(args.warmup),
                   ET_PROFILE_OUT=os.path.join(tmp, "profile"))
        try:
            rc = subprocess.run(cmd, env=env, timeout=args.timeout).returncode
        except FileNotFoundError:
            raise ConfigError(f"cannot run {cmd[0]!r}: no such program") from None
        except subprocess.TimeoutExpired:
            raise ConfigError(f"the command did not finish {args.warmup + args.iterations} iterations in "
                              f"{args.timeout:.0f} s (raise --timeout, or lower -n)") from None
        paths = sorted(glob.glob(os.path.join(tmp, "profile.*.json")))
        if not paths:
            print(f"elastictrain: error: the command exited with status {rc} before {args.warmup} + "
                  f"{args.iterations} iterations of et.stage(...) spans completed; annotate the training loop "
                  "with et.stage and run enough steps", file=sys.stderr)
            return rc or 2
        reports = [load_report(p) for p in paths]
    print(_stage_table([r.stage for r in reports], "device timed", lambda st: "yes" if st.device else "no"))
    comm = [r.comm for r in reports if r.comm is not None]
    if comm:
        print()
        rows = [("worker", "collectives/it", "MB/it", "ms/collective", "tensors", "model MB", "skew")]
        for c in comm:
            rows.append((str(c.worker), f"{c.collectives_per_iteration:.1f}", f"{c.bytes_per_iteration / 1e6:.3f}",
                         f"{c.seconds_per_collective * 1e3:.3f}", str(c.tensor_count), f"{c.total_bytes / 1e6:.3f}",
                         f"{c.skew:.3f}"))
        print(table(rows))
    text = json.dumps([msgspec.to_builtins(r) for r in reports], indent=2, sort_keys=True)
    print()
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


def _outages(specs: list, flag: str = "--outage") -> tuple:
    """``--outage NODE:START:END`` (or ``flag``'s) as (node, start, end); the engine checks the numbers."""
    out = []
    for spec in specs:
        parts = spec.split(":")
        try:
            if len(parts) != 3:
                raise ValueError
            out.append((int(parts[0]), float(parts[1]), float(parts[2])))
        except ValueError:
            raise ConfigError(f"{flag} {spec!r}: write NODE:START:END (a node index and seconds, e.g. 3:3600:7200, "
                              "or 3:3600:inf for a node that never comes back)") from None
    return tuple(out)


def _ticket_map(flag: str, text: str, kind: str) -> dict[str, float]:
    """``NAME=N,...`` as {name: tickets}.

    Raises:
        ConfigError: a bad name, or a number not in (0, 1000000]."""
    from .model import check_name

    out = {}
    for part, name, value in _name_numbers(text):
        if not 0 < value <= 1_000_000:
            raise ConfigError(f"{flag} {part!r}: write {kind.upper()}=N with N in (0, 1000000], e.g. {kind}1=2")
        out[check_name(kind, name)] = value
    return out


def _simulate(args) -> None:
    from .sim.report import bins_table, by_priority, comparison_table, summarize, write_outputs
    from .sim.run import SimConfig, simulate

    opts = _policy_values(args)
    for flag, key, kind in (("--tickets", "tickets", "user"), ("--project-tickets", "project_tickets", "project")):
        given = getattr(args, key)
        if given is not None:
            opts[key] = _ticket_map(flag, given, kind)
    cfg = SimConfig(args.trace, args.cluster, [p for p in args.policy.split(",") if p], args.preset, args.format,
                    args.interval, args.restart_cost, opts, args.spread_slowdown, args.migration_cost,
                    protect_startup=not args.preempt_starting, min_run=args.preempt_exempt,
                    outages=_outages(args.outage), checkpoint_every=args.checkpoint_every,
                    maintenance=_outages(args.maintenance, "--maintenance"),
                    cordons=_outages(args.cordon, "--cordon"),
                    priority_preemption=args.priority_preemption, quota_gpus=args.quota_gpus,
                    quota_jobs=args.quota_jobs)
    results = simulate(cfg, progress=not args.no_progress, parallel=args.parallel)
    for r in results:
        for jid, why in r.extra.get("rejected", ())[:5]:
            print(f"elastictrain: {r.policy}: job {jid} never runs: {why}", file=sys.stderr)
        if len(r.extra.get("rejected", ())) > 5:
            print(f"elastictrain: {r.policy}: {len(r.extra['rejected'])} jobs in all never run", file=sys.stderr)
    print(comparison_table([summarize(r) for r in results]))
    print()
    print(bins_table(results))
    lines = by_priority(results)
    if lines:
        print()
        print("\n".join(lines))
    if cfg.outages or cfg.maintenance:
        print()
        what = " and maintenance" if cfg.maintenance and cfg.outages else " maintenance" if cfg.maintenance else \
            " outages"
        for r in results:
            lost = f", {r.extra['outage_lost_seconds']:.0f} s of work lost with them" if cfg.checkpoint_every else ""
            print(f"{r.policy}: {r.extra['outage_preemptions']} jobs preempted by node{what}{lost}")
    if args.out:
        for p in write_outputs(results, args.out):
            print(f"wrote {p}")


def _trace_export(args) -> None:
    from .runtime.client import CoordinatorClient, token_from_file
    import shlex

    from .sim.export import cluster_form, first_submit, jobs_to_trace, outages_from_events
    from .sim.synth import write_native
    from .usage import all_events

    token = token_from_file(args.token_file, "--token-file") if args.token_file else (os.environ.get("ET_TOKEN") or None)
    client = CoordinatorClient(args.coordinator, token, timeout=30.0, retry_for=10.0)
    records = client.cluster_jobs(ended="all").jobs
    jobs, left_out = jobs_to_trace(records)
    if not jobs:
        raise ConfigError("no job has a measured step time yet (a job needs two step reports): nothing to export")
    print(f"wrote {write_native(jobs, args.out)}: {len(jobs)} jobs over {jobs[-1].submit_time:.1f} s"
          + (f"; left out (no measured step time): {', '.join(left_out)}" if left_out else ""))
    nodes = client.cluster_status(ended=0).nodes
    outages = outages_from_events(all_events(client), nodes, first_submit(records))
    form = cluster_form(nodes)
    flags = "".join(f" --outage {n}:{a:g}:{b:g}" for n, a, b in outages)
    print(f"replay: elastictrain simulate --trace {shlex.quote(args.out)} --cluster {form or 'SPEC'}{flags}"
          + ("" if form else "  # SPEC: the nodes differ in ways no short form says; write a cluster CSV"))


def _live_fairness(args) -> None:
    from ._text import table
    from .runtime.client import CoordinatorClient, token_from_file
    from .sim.fairness_live import live_fairness, write_live_report
    from .usage import all_events

    token = token_from_file(args.token_file, "--token-file") if args.token_file else (os.environ.get("ET_TOKEN") or None)
    client = CoordinatorClient(args.from_coordinator, token, timeout=30.0, retry_for=10.0)
    events = all_events(client)
    users = client.users(600.0)
    now = client.cluster_status(ended=0).now
    try:  # (the projects' tickets: a user's login may not read them; its report is then by users' tickets)
        listed = client.projects().projects
        projects = {p.name: p.tickets for p in listed if p.tickets}
        parents = {p.name: p.parent for p in listed if p.parent}
        members = {f"{p.name}/{u}": w for p in listed if p.tickets for u, w in p.shares.items()}
    except ElasticTrainError:
        projects, parents, members = {}, {}, {}
    r = live_fairness(events, {u.user: u.tickets for u in users.users if u.set}, users.default_tickets,
                      args.window, now, projects, parents, members)
    print(f"live cluster at {args.from_coordinator}: {len(events)} events over {r.end - r.start:.0f} s, "
          f"{len(r.timeline)} window(s) of {args.window:g} s")
    rows = [("user", "tickets", "GPU-s", "entitled GPU-s", "received / entitled")]
    rows += [(u, f"{r.tickets[u]:g}", f"{r.received[u]:.1f}", f"{r.entitled[u]:.1f}", f"{r.ratio(u):.3f}")
             for u in r.users]
    print(table(rows))
    if args.out:
        for p in write_live_report(r, args.out):
            print(f"wrote {p}")


def _fairness(args) -> None:
    from ._text import table
    from .errors import ConfigError
    from .sim.fairness import HETERO_CLUSTER, HETERO_USERS, heterogeneous, homogeneous, write_report

    from .sim.traces import SHIPPED

    if not (0 < args.window <= 10 ** 7):
        raise ConfigError(f"--window must be in (0, 10000000] seconds, got {args.window}")
    if args.from_coordinator:
        if args.experiment:
            raise ConfigError("give an experiment or --from-coordinator, not both")
        return _live_fairness(args)
    if not args.experiment:
        raise ConfigError("name an experiment (homogeneous or heterogeneous), or pass --from-coordinator URL")
    if args.experiment == "homogeneous":
        trace = args.trace or os.path.join(SHIPPED, "tiresias", "60_job.csv")
        if not os.path.exists(trace) and not os.path.exists(trace + ".gz"):
            raise ConfigError(f"--trace {trace}: no such file; give a Tiresias, Muri or native trace")
        r = homogeneous(trace, hours=args.hours or 24.0, policy=args.policy, window=args.window,
                        migration_cost=args.migration_cost)
        print(f"{args.policy}: 70 users, one job each (GPU counts drawn from {os.path.basename(trace)}), 48 GPUs, "
              f"{args.hours or 24.0:g} h; utilization {r.utilization:.3f}, {r.migrations} migrations")
        rows = [("GPUs per job", "users", "GPU time / fair share")]
        rows += [(str(g), str(r.users_by_class[g]), f"{v:.3f}") for g, v in r.share_by_class.items()]
    else:
        throughputs = args.throughputs or os.path.join(SHIPPED, "gavel", "simulation_throughputs.json.gz")
        if not os.path.exists(throughputs) and not os.path.exists(throughputs + ".gz"):
            raise ConfigError(f"--throughputs {throughputs}: no such file; give Gavel's simulation_throughputs.json "
                              "(shipped as traces/gavel/simulation_throughputs.json.gz, the default)")
        r = heterogeneous(throughputs, hours=args.hours or 12.0, window=args.window,
                          migration_cost=args.migration_cost)
        print(f"cluster {HETERO_CLUSTER} (nodes, GPUs each); {r.trades} trades; rates after the first hour")
        rows = [("user", "job type", "V100/K80", "P100/K80", "agnostic", "traded", "gain")]
        for u in r.agnostic:
            sp = r.speedup[u]
            rows.append((u, HETERO_USERS[u], f"{sp['v100']:.2f}", f"{sp['p100']:.2f}", f"{r.agnostic[u]:.2f}",
                         f"{r.traded[u]:.2f}", f"{r.gain[u] * 100:+.1f}%"))
    print(table(rows))
    if args.out:
        for p in write_report(r, args.out):
            print(f"wrote {p}")
