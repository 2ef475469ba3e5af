"""The cluster commands: ``node``, ``submit``, ``status``, ``cancel``, ``logs`` (Slurm's habits:
``sbatch``, ``squeue``, ``scancel``; Ray's ``job logs -f``).

Every command finds the coordinator with ``--coordinator URL`` (default ``$ET_COORDINATOR``) and
its token with ``--token-file F`` (default ``$ET_TOKEN_FILE``, or ``$ET_TOKEN``).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import socket
import statistics
import sys
import time
from typing import Optional

import msgspec

from ._text import table
from .errors import ConfigError, ConflictError, NotFoundError
from .model import JOB_STATES, check_gpu_type, check_states

__all__ = ["add_commands", "run_command"]

_ENDED = ("finished", "failed", "cancelled")


def _connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--coordinator", default=os.environ.get("ET_COORDINATOR", "http://127.0.0.1:7707"),
                   help="the coordinator's URL [ET_COORDINATOR, else http://127.0.0.1:7707]")
    p.add_argument("--token-file", default=os.environ.get("ET_TOKEN_FILE"),
                   help="the coordinator's token file [ET_TOKEN_FILE; or set ET_TOKEN]")


def add_commands(sub) -> None:
    n = sub.add_parser("node", help="run a node daemon: offer this machine's GPUs (or CPU slots) to the coordinator")
    _connection(n)
    size = n.add_mutually_exclusive_group()
    size.add_argument("--gpus", type=int, default=None, help="GPUs to offer (default: every GPU found)")
    size.add_argument("--slots", type=int, default=None, help="CPU-only machine: worker slots to offer (a slot counts "
                      "as one GPU)")
    n.add_argument("--name", default=os.environ.get("ET_NODE_NAME") or socket.gethostname(),
                   help="node name, unique in the cluster [ET_NODE_NAME, else the host name]")
    n.add_argument("--gpu-type", default=None, help="GPU type to report (default: the name the driver gives)")
    n.add_argument("--state-dir", default=None, help="task logs and pid files (default: ./elastictrain-node-NAME)")
    n.add_argument("--poll-wait", type=float, default=5.0, help="seconds a poll may wait for new work (long poll)")
    n.add_argument("--warm-spares", type=int, default=-1, help="etrun's --warm-spares for the jobs run here")
    n.add_argument("--zygote", choices=("on", "off", "keep"), default=None,
                   help="etrun's --zygote for the jobs run here. keep: one zygote per job account and environment is "
                   "kept between the tasks (it retires after 10 idle minutes), so a job started, resumed or "
                   "restarted here forks its workers at once; on: one zygote per task; off: none. Default: keep "
                   "for the jobs that run as this daemon's own account, on for those run as another account "
                   "(a process of theirs that outlives their job is theirs to want)")

    s = sub.add_parser("submit", help="queue a job for the scheduler; prints its id",
                       usage="elastictrain submit [options] -- script.py [args ...]")
    _connection(s)
    s.add_argument("--gpus", default="1", help="workers (one per GPU or slot): N, or MIN:MAX for an elastic job")
    s.add_argument("--nnodes", default=None, help="torchrun's MIN:MAX nodes, with --nproc-per-node: the job runs "
                   "on MIN*K..MAX*K workers")
    s.add_argument("--nproc-per-node", type=int, default=None, help="workers per node, with --nnodes")
    s.add_argument("--name", default=None, help="job name (default: the script's)")
    s.add_argument("--user", default=os.environ.get("ET_USER") or "default",
                   help="admin only: submit for this user (its fair share, its UNIX account); a user's credential "
                   "is always its own user [ET_USER]")
    s.add_argument("--priority", type=int, default=0,
                   help="-1000..1000: orders the user's own jobs for admission under a quota; on a coordinator "
                   "run with --priority-preemption, a higher priority also takes GPUs from lower ones (above 0: "
                   "admin only, unless `users quota NAME --max-priority N` lets the user)")
    s.add_argument("--workdir", default=os.getcwd(), help="where the script runs on every node (default: here)")
    s.add_argument("--steps", type=int, default=None, help="training steps in all (lets SRTF-like policies know the "
                   "remaining work)")
    s.add_argument("--epochs", type=int, default=None, help="epochs in all (progress is measured from the shards)")
    s.add_argument("--max-restarts", type=int, default=3, help="worker-failure restarts before the job fails")
    s.add_argument("--grace", type=float, default=30.0, help="seconds to checkpoint when preempted")
    s.add_argument("--profile-steps", type=int, default=20,
                   help="iterations of the stage profile taken at the job's first start (muri groups on it)")
    s.add_argument("--profile", default=None, metavar="FILE",
                   help="the job's stage profile, as `elastictrain profile --json FILE` wrote it (muri groups on it "
                   "from the job's first start; a profile the workers measure replaces it)")
    s.add_argument("--reprofile", action="store_true",
                   help="profile the job again even if a job with the same command was profiled before")
    s.add_argument("--env", action="append", default=[], metavar="K=V", help="environment for the job (repeatable)")
    s.add_argument("-m", "--module", action="store_true", help="run the entrypoint as a module (python -m)")
    s.add_argument("--dry-run", action="store_true",
                   help="submit nothing: print what a run of the job would be (with --backend slurm: its batch "
                   "script, as TorchX's dryrun does)")
    s.add_argument("--backend", choices=["slurm", "kubernetes"], default="slurm",
                   help="--dry-run: the engine whose objects to print: slurm (the batch script) or kubernetes (the "
                   "pods and the credential's Secret, as YAML for kubectl)")
    s.add_argument("--slurm-partition", default=os.environ.get("ET_SLURM_PARTITION", "PARTITION"),
                   help="--dry-run: the partition [ET_SLURM_PARTITION]")
    s.add_argument("--engine-cpus-per-worker", "--slurm-cpus-per-worker", dest="engine_cpus_per_worker", type=int,
                   default=0, metavar="N", help="--dry-run: nodes without GPUs, N CPUs per worker (as the coordinator's "
                   "option)")
    s.add_argument("--slurm-accounts", action="store_true",
                   help="--dry-run: the project (-A) is the Slurm account (as the coordinator's option)")
    s.add_argument("--k8s-image", default=os.environ.get("ET_K8S_IMAGE", "IMAGE"),
                   help="--dry-run --backend kubernetes: the image [ET_K8S_IMAGE]")
    s.add_argument("--k8s-namespace", default=os.environ.get("ET_K8S_NAMESPACE", "default"),
                   help="--dry-run --backend kubernetes: the namespace [ET_K8S_NAMESPACE]")
    s.add_argument("--nodes", default=None, metavar="N1:G1,N2:G2",
                   help="--dry-run: the placement to show (default: one node, n1, with all the job's GPUs)")
    s.add_argument("--after", action="append", default=[], metavar="JOB[:any|:notok]|singleton",
                   help="run only once JOB finished (JOB:any: once it ended, however; JOB:notok: once it failed or "
                   "was cancelled); repeatable, or JOB,JOB (Slurm's --dependency=afterok / afterany / afternotok). "
                   "If JOB ends otherwise, this job is cancelled, saying why. "
                   "singleton: once every earlier job of this --name and user ended (one at a time)")
    s.add_argument("--hold", action="store_true", help="submit on hold: it runs after `elastictrain release JOB`")
    s.add_argument("-W", "--wait", action="store_true",
                   help="return only once the job (every task of an array) ended, with exit status 0 if it finished, "
                   "else its exit code (1 without one, or cancelled), as sbatch --wait")
    s.add_argument("-A", "--project", "--account", dest="project", default=None, metavar="NAME",
                   help="the project whose quota it counts against (Slurm's --account; default: the first project "
                   "that lists the user, if any; `elastictrain projects list`)")
    s.add_argument("-C", "--gpu-type", "--constraint", dest="gpu_type", default=None, metavar="TYPE",
                   help="run only on nodes of this GPU type: a node's type (`elastictrain nodes list` shows them) or "
                   "some of its words, ignoring case (a100 runs on 'NVIDIA A100-SXM4-80GB' nodes); as Slurm's "
                   "--gres=gpu:TYPE:N or a Kubernetes node selector; a100|h100: nodes of either (Slurm's "
                   "--constraint; a gang may span both); [a100|h100]: the whole gang on one of them")
    s.add_argument("--notify", default=None, metavar="URL",
                   help="POST a JSON notification (with a Slack-style text line) to URL when the job ends, or as "
                   "--notify-on says (Slurm's --mail-user, as a webhook); the coordinator must allow the URL "
                   "(coordinator --notify-allow)")
    s.add_argument("--notify-on", default=None, metavar="TYPES",
                   help="what --notify is told of, comma-separated (Slurm's --mail-type): begin, end (finished, "
                   "failed, cancelled, timed out), fail, requeue (preempted, drained, its node lost), all "
                   "(default: end)")
    s.add_argument("--gres", type=gres_spec, default=None, metavar="gpu[:TYPE][:N]",
                   help="Slurm's spelling of --gpu-type and --gpus: gpu:a100:4 is --gpu-type a100 --gpus 4")
    s.add_argument("--begin", type=begin_time, default=None, metavar="TIME",
                   help="do not start it before TIME (Slurm's --begin): now+90m, now+2h, now+1d, 16:00 (today, or "
                   "tomorrow if past), 2026-11-28 or 2026-11-28T08:00 (local time)")
    s.add_argument("-t", "--time", type=slurm_time, default=None, metavar="LIMIT",
                   help="the most time it may hold GPUs in all its runs, in Slurm's format (MINUTES, MM:SS, "
                   "HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); then it is stopped (it checkpoints) and fails as TIMEOUT. "
                   "Without --steps/--epochs, SRTF-like policies take the rest of it as its work left")
    s.add_argument("--array", default=None, metavar="SPEC",
                   help="a job array (Slurm's --array): one job per index, e.g. 0-7, 1,3,5 or 0-15:2; %%N runs at most "
                   "N at once (0-99%%8). Each task sees ET_ARRAY_TASK_ID; prints the tasks' ids (ID_INDEX)")
    s.add_argument("cmd", nargs=argparse.REMAINDER, help="the script and its arguments, after --")

    st = sub.add_parser("status", help="the cluster (nodes, queue, running and preempted jobs), or one job")
    _connection(st)
    st.add_argument("job", nargs="?", default=None, help="a job id (same as --job)")
    st.add_argument("--job", dest="job_opt", default=None, help="show one job")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--all", action="store_true", help="list every finished job, not the last 10")
    st.add_argument("--start", action="store_true",
                    help="when each job is expected to start and end (squeue --start): the coordinator simulates its "
                    "policy from the cluster as it is now (no new submissions, the work left it knows or assumes)")
    _filters(st)
    st.add_argument("--users", action="store_true",
                    help="each user's share of the GPU-seconds used over --window against its tickets' entitlement")
    st.add_argument("--window", type=float, default=600.0, help="seconds the --users shares cover (default 600)")

    from .projects_cli import add_parser as add_projects

    add_projects(sub, _connection)
    us = sub.add_parser("users", help="users' tickets (Gandiva-fair shares GPU time by them), quotas and credentials")
    _connection(us)
    usub = us.add_subparsers(dest="users_command", required=True)
    uset = usub.add_parser("set", help="set a user's tickets")
    uset.add_argument("name")
    uset.add_argument("--tickets", type=float, required=True, help="a number > 0; users not set have the default")
    uquota = usub.add_parser("quota", help="(admin) a user's quota: the most GPUs and jobs its admitted jobs may hold "
                             "(more wait to be admitted), and the highest priority it may submit at")
    uquota.add_argument("name")
    uquota.add_argument("--gpus", type=int, default=None, help="GPUs, counting each admitted job at its --gpus "
                        "(left out: no limit)")
    uquota.add_argument("--jobs", type=int, default=None, help="jobs admitted at once (left out: no limit)")
    uquota.add_argument("--default", action="store_true",
                        help="drop the user's own quota and highest priority: the coordinator's --quota-gpus/"
                        "--quota-jobs apply again, and priorities up to 0")
    uquota.add_argument("--unlimited", action="store_true", help="no limit for this user, whatever the default")
    uquota.add_argument("--max-priority", type=int, default=None, metavar="N",
                        help="with --priority-preemption: the user may give its jobs priorities up to N (0..1000; "
                        "default 0), as a Slurm association's allowed QOS. It leaves the limits as they are")
    ulist = usub.add_parser("list", help="every user's tickets, entitlement and share (as status --users)")
    ulist.add_argument("--window", type=float, default=600.0, help="seconds the shares cover (default 600)")
    ulist.add_argument("--json", action="store_true", help="machine-readable output")
    uadd = usub.add_parser("add", help="(admin) give a user a credential (shown once; any earlier one is revoked)")
    uadd.add_argument("name")
    uadd.add_argument("--unix-user", default=None, help="the UNIX account its jobs run as on the nodes (default: NAME)")
    uadd.add_argument("--allow-root", action="store_true", help="let its jobs run as root (refused by default)")
    uadd.add_argument("--token-out", default=None, metavar="FILE",
                      help="write the token to FILE (mode 0600) instead of printing it")
    urev = usub.add_parser("revoke", help="(admin) revoke a user's credential and account")
    urev.add_argument("name")
    uacc = usub.add_parser("accounts", help="(admin) users with credentials, their UNIX accounts, and node credentials")
    uacc.add_argument("--json", action="store_true", help="machine-readable output")
    usub.add_parser("whoami", help="who the coordinator takes this credential for")

    nd = sub.add_parser("nodes", help="the nodes (list), and (admin) node credentials (a node daemon may only "
                        "register, poll and report its own node) and cordons")
    _connection(nd)
    nsub = nd.add_subparsers(dest="nodes_command", required=True)
    nlist = nsub.add_parser("list", help="every node: state, GPU type, slots used and free, jobs (sinfo -N)")
    nlist.add_argument("--json", action="store_true", help="machine-readable output")
    nadd = nsub.add_parser("add", help="a credential for node NAME (shown once; any earlier one is revoked)")
    nadd.add_argument("name")
    nadd.add_argument("--token-out", default=None, metavar="FILE",
                      help="write the token to FILE (mode 0600) instead of printing it")
    nrev = nsub.add_parser("revoke", help="revoke node NAME's credential")
    nrev.add_argument("name")
    for verb, what in (("cordon", "place nothing new on node NAME for a while (what runs there keeps running: "
                                  "kubectl cordon, Slurm's drain)"),
                       ("drain", "cordon node NAME and requeue the jobs running there: they checkpoint and resume "
                                 "on other nodes (kubectl drain)")):
        ncor = nsub.add_parser(verb, help=what)
        ncor.add_argument("name")
        ncor.add_argument("--for", dest="seconds", type=_cordon_seconds, default=86_400.0, metavar="SECONDS",
                          help="how long nothing new goes there (default 86400: a day; at most 30 days); "
                          "`nodes uncordon` lifts it sooner")
        ncor.add_argument("--reason", default="", help="shown in status and the event log")
        ncor.add_argument("--at", default=None, metavar="TIME",
                          help="not now but from TIME (as submit --begin: now+2h, 22:00, 2026-12-01T06:00), for "
                          "--for seconds: a maintenance window (Slurm's flags=maint reservation). Until then the "
                          "node runs as usual, but backfill starts nothing there that would still run then; "
                          "`nodes uncordon` cancels it")
    nunc = nsub.add_parser("uncordon", help="lift node NAME's cordon")
    nunc.add_argument("name")

    c = sub.add_parser("cancel", help="cancel jobs (their workers are stopped): by id, or every job the filters "
                       "match (scancel -u USER -t PD)")
    _connection(c)
    c.add_argument("jobs", nargs="*", metavar="job",
                   help="job ids, or a job array's (every task still queued or running)")
    _filters(c, "only")
    for verb, what in (("hold", "keep a waiting job from running until it is released (scontrol hold)"),
                       ("release", "let a held job run (scontrol release)")):
        h = sub.add_parser(verb, help=what)
        _connection(h)
        h.add_argument("jobs", nargs="*", metavar="job",
                       help=f"job ids, or a job array's (every {'waiting' if verb == 'hold' else 'held'} task)")
        _filters(h, "only")

    rq = sub.add_parser("requeue", help="stop a running job and queue it again (scontrol requeue): it checkpoints, and "
                        "the policy places it again")
    _connection(rq)
    rq.add_argument("jobs", nargs="*", metavar="job", help="job ids, or a job array's (every running task)")
    _filters(rq, "only")
    rq.add_argument("--hold", action="store_true",
                    help="and hold it once it has stopped, its GPUs free for others until `elastictrain release JOB` "
                    "(scontrol requeuehold)")

    up = sub.add_parser("update", help="change a job's priority or time limit, waiting or running, or a waiting job's "
                        "begin time (scontrol update)",
                        description="Change a job's priority or time limit, or a waiting job's begin time (Slurm's "
                        "scontrol update). A user may "
                        "lower its own job's time limit, and set its priority as at submission; on a coordinator run "
                        "with --priority-preemption, to at most its highest (0 unless `users quota --max-priority` "
                        "says more) or below its current one. Only the admin may raise a time limit, or a priority "
                        "beyond that. There, a raised job may preempt lower ones at once, and a lowered one may be "
                        "preempted.")
    _connection(up)
    up.add_argument("job", help="a job id, or a job array's (every task not ended)")
    up.add_argument("--priority", type=int, default=None, metavar="N", help="-1000..1000 (see submit --priority)")
    up.add_argument("-t", "--time", type=_time_or_unlimited, default=None, metavar="LIMIT",
                    help="the most time it may hold GPUs in all its runs, in Slurm's format (see submit --time), "
                    "or UNLIMITED (admin); below what it has held, its run stops now as TIMEOUT")
    up.add_argument("--gpus", default=None, metavar="N|MIN:MAX",
                    help="a waiting job's workers (Slurm's NumNodes=), as submit --gpus; within the quotas")
    up.add_argument("--gpu-type", default=None, metavar="TYPE",
                    help="a waiting job's GPU type (see submit --gpu-type; Slurm's Gres=); any: run anywhere")
    up.add_argument("--begin", type=begin_time, default=None, metavar="TIME",
                    help="a waiting job's begin time (Slurm's StartTime=), as submit --begin; now lets it start at "
                    "once")

    lg = sub.add_parser("logs", help="a job's output: every rank, as etrun --tee prints it")
    _connection(lg)
    lg.add_argument("job")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")

    hi = sub.add_parser("history", help="every job's accounting, as sacct shows it: submit, start, end, elapsed, "
                        "state, exit code, restarts by reason, GPU-hours")
    _connection(hi)
    _filters(hi)
    hi.add_argument("-j", "--jobs", default=None, metavar="ID[,ID]",
                    help="only these jobs (a job array's id: every task), as sacct -j")
    hi.add_argument("-S", "--since", "--starttime", default=None,
                    help="only jobs submitted since: a date (2026-11-26 or 2026-11-26T14:00) or a span ago (90m, 2h, "
                    "7d), as sacct -S")
    hi.add_argument("-E", "--until", "--endtime", default=None,
                    help="only jobs submitted before: a date or a span ago, as sacct -E")
    hi.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output (default table)")
    hi.add_argument("--by", choices=("user", "project"), default=None,
                    help="one line per user or project instead of per job, as sreport's utilization by account: "
                    "jobs, how they ended, GPU-hours and their share, waits (median, 95th percentile), preemptions; "
                    "with --since/--until, the GPU-hours are those that fell within that period (from the event "
                    "log, whenever the jobs were submitted), as sreport counts")

    ev = sub.add_parser("events", help="the scheduler's event log: starts, preemptions, resizes, plans, failures")
    _connection(ev)
    ev.add_argument("--job", default=None, help="only this job's events")
    ev.add_argument("--kind", default=None, help="only events of these kinds, comma-separated (e.g. plan,resize)")
    ev.add_argument("--json", action="store_true", help="one JSON object per line")
    ev.add_argument("-f", "--follow", action="store_true", help="keep printing new events (Ctrl-C to stop)")


def _filters(p: argparse.ArgumentParser, verb: str = "only") -> None:
    """squeue's, sacct's and scancel's job filters (see :func:`_match`)."""
    p.add_argument("-u", "--user", default=None, help=f"{verb} this user's jobs (comma-separated for several)")
    p.add_argument("--me", action="store_true", help=f"{verb} my jobs (the token's user), as squeue --me")
    p.add_argument("-t", "--state", default=None,
                   help=f"{verb} jobs in these states, comma-separated: " + ",".join(JOB_STATES)
                   + " (or Slurm's: PENDING/PD, RUNNING/R, COMPLETED/CD, FAILED/F, CANCELLED/CA)")
    p.add_argument("-A", "--project", "--account", dest="project", default=None,
                   help=f"{verb} jobs charged to these projects (comma-separated)")
    p.add_argument("-n", "--name", default=None, help=f"{verb} jobs of these names (comma-separated), as squeue -n")


def _match(args, client) -> dict:
    """The ``--user``/``--me``/``--state``/``--project``/``--name`` filter of ``status``, ``history``
    and ``cancel``: each a set of names (None: any), as the listings take it
    (:meth:`CoordinatorClient.cluster_status`)."""
    states = None
    if args.state:
        try:
            states = check_states(args.state)
        except ConfigError as exc:
            raise ConfigError(f"--state {args.state!r}: {exc}") from None
    users = set(u for u in args.user.split(",") if u) if args.user else None
    if args.me:
        users = (users or set()) | {client.whoami().name}
    projects = set(p for p in args.project.split(",") if p) if args.project else None
    names = set(n for n in args.name.split(",") if n) if args.name else None
    return {"user": users, "state": states, "project": projects, "name": names}


def _keep(match: dict):
    """:func:`_match`'s filter as a predicate on ClusterJobInfo."""
    users, states, projects, names = (match[k] for k in ("user", "state", "project", "name"))
    return lambda j: ((states is None or j.status in states) and (users is None or j.user in users)
                      and (projects is None or j.project in projects) and (names is None or j.name in names))


def _filtered(args) -> bool:
    """Whether any of :func:`_filters`' filters is given."""
    return bool(args.user or args.me or args.state or args.project or args.name)


def _bulk(args, client, call, skip: tuple, said, none_left) -> int:
    """``call`` (job id -> ClusterJobInfo) on each job ``args`` selects, printing ``said(info)``:
    each id given (a job array's id: each of its tasks whose status is not in ``skip``, as scontrol
    does; ``none_left(array, tasks)`` is the 409's message where none is left), or with filters,
    every job they match (restricted to the ids given, and their arrays' tasks) whose status is not
    in ``skip``, as scancel -u/-t/-A/-n. With filters, a job that changed meanwhile (a 409) is
    passed over; with filters or several ids, one refused (a 403, a 404) is said on stderr and the
    rest go on (exit status 1). A user's filters without ``-u`` select its own jobs.

    Raises:
        ConfigError: no id and no filter."""
    from .errors import ElasticTrainError

    def act(job):
        info = call(job)
        print(said(info))
        return info

    def single(job):
        infos, tasks = _each_task(client, job, act, skip)
        if tasks is not None and not infos:
            raise ConflictError(none_left(job, len(tasks)))

    if not args.jobs and not _filtered(args):
        raise ConfigError(f"{args.command}: give job ids, or filters (-u USER, --me, -t STATE, -A PROJECT, -n NAME) "
                          "to act on every job they match")
    if not _filtered(args):
        if len(args.jobs) == 1:
            single(args.jobs[0])
            return 0
        failed = 0
        for job in args.jobs:
            try:
                single(job)
            except ElasticTrainError as exc:
                print(f"elastictrain: error: job {job}: {exc}", file=sys.stderr)
                failed += 1
        return 1 if failed else 0
    match = _match(args, client)
    keep = _keep(match)
    wanted = set(args.jobs)
    me = client.whoami()  # a user's filter without -u selects its own jobs (the others would be refused)
    mine = me.name if me.role == "user" and not args.user else None
    picked = [j for j in client.cluster_jobs(ended=0, **match).jobs if keep(j) and j.status not in skip
              and (not wanted or j.id in wanted or j.id.rpartition("_")[0] in wanted)
              and (mine is None or j.user == mine)]
    if not picked:
        print(f"no job to {args.command} matches")
        return 0
    failed = 0
    for j in picked:
        try:
            act(j.id)
        except ConflictError:
            continue  # (it changed meanwhile: ended, started, ...)
        except ElasticTrainError as exc:
            print(f"elastictrain: error: job {j.id}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def _client(args, timeout: float = 10.0):
    from .runtime.client import CoordinatorClient, token_from_file

    token = token_from_file(args.token_file, "--token-file") if args.token_file else (os.environ.get("ET_TOKEN") or None)
    return CoordinatorClient(args.coordinator, token, timeout=timeout, retry_for=10.0)


def run_command(args) -> int:
    return {"node": _node, "submit": _submit, "status": _status, "cancel": _cancel, "hold": _hold, "release": _hold,
            "update": _update, "requeue": _requeue, "logs": _logs,
            "events": _events, "users": _users, "nodes": _nodes, "history": _history,
            "projects": _projects}[args.command](args)


def _projects(args) -> int:
    from .projects_cli import run

    return run(args, _client(args))


# ---------------------------------------------------------------------- node
def _node(args) -> int:
    import logging

    from .launcher.node import NodeConfig, NodeDaemon, detect_gpus

    logging.basicConfig(level=os.environ.get("ET_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.slots is not None:
        slots, kind, gpu_type = args.slots, "slot", args.gpu_type or "cpu"
    else:
        found, name = detect_gpus()
        if found == 0:
            raise ConfigError("no GPU found (pynvml and nvidia-smi see none); on a CPU-only machine pass --slots N")
        if args.gpus is not None and not 1 <= args.gpus <= found:
            raise ConfigError(f"--gpus {args.gpus}: this machine has {found} GPU(s)")
        slots, kind, gpu_type = args.gpus or found, "gpu", args.gpu_type or name
    cfg = NodeConfig(args.coordinator, args.token_file, args.name, slots, kind, gpu_type,
                     args.state_dir or f"elastictrain-node-{args.name}", args.poll_wait, args.warm_spares,
                     args.zygote)
    return NodeDaemon(cfg).run()


# ---------------------------------------------------------------------- submit
def _submit(args) -> int:
    from .wire import JobSubmit

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ConfigError("give the script after --, e.g. elastictrain submit --gpus 2 -- train.py --lr 0.1")
    gpu_type = args.gpu_type
    if args.gres is not None:
        t, n = args.gres
        if t and gpu_type and t != gpu_type:
            raise ConfigError(f"--gres names GPU type {t} and --gpu-type {gpu_type}: give one")
        if args.gpus not in ("1", str(n)):
            raise ConfigError(f"--gres asks for {n} GPU(s) and --gpus for {args.gpus}: give one")
        gpu_type, args.gpus = gpu_type or t, str(n)
    if gpu_type is not None:
        check_gpu_type(gpu_type)  # (the coordinator checks it too: here the message names the forms)
    lo, hi = _worker_range(args)
    env = {}
    for item in args.env:
        if "=" not in item:
            raise ConfigError(f"--env {item!r}: use KEY=VALUE")
        k, v = item.split("=", 1)
        env[k] = v
    workdir = os.path.abspath(args.workdir)
    script = cmd[0]
    if not args.module and not os.path.exists(os.path.join(workdir, script)):
        raise ConfigError(f"{script} is not in the work directory {workdir}; pass --workdir, or run submit from "
                          "the directory the script's path is relative to")
    try:
        req = msgspec.convert({"command": cmd, "workdir": workdir, "name": args.name, "user": args.user,
                               "priority": args.priority, "gpus": hi, "min_gpus": lo if lo != hi else None,
                               "env": env, "steps": args.steps, "epochs": args.epochs,
                               "max_restarts": args.max_restarts, "grace": args.grace, "module": args.module,
                               "profile_steps": args.profile_steps, "reprofile": args.reprofile,
                               "stage_times": _stage_file(args.profile) if args.profile else None,
                               "after": [a for item in args.after for a in item.split(",") if a],
                               "hold": args.hold, "array": args.array, "time_limit": args.time,
                               "begin": args.begin, "project": args.project, "gpu_type": gpu_type,
                               "notify": args.notify, "notify_on": _notify_on(args.notify_on)},
                              JobSubmit)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid job: {exc}") from None
    if args.dry_run:
        print(_dry_run_script(args, req), end="")
        return 0
    client = _client(args)
    if req.array is not None:  # one id per line, for scripts (the tasks' ids: ID_INDEX)
        ids = [j.id for j in client.submit_array(req).jobs]
    else:
        ids = [client.submit(req).id]
    print("\n".join(ids), flush=True)
    return _wait_for(client, ids) if args.wait else 0


def _wait_for(client, ids: list[str], every: float = 1.0) -> int:
    """``submit --wait`` (sbatch --wait): until every job ended; 0 if all finished, else the
    highest exit code among those that failed (1 for a failure without one, or a cancellation)."""
    left, worst = list(ids), 0
    while left:
        time.sleep(every)
        for job in list(left):
            info = client.cluster_job(job)
            if info.status not in _ENDED:
                continue
            left.remove(job)
            if info.status != "finished":
                code = info.exit_code if info.exit_code and 0 < info.exit_code < 256 else 1
                worst = max(worst, code)
                print(f"job {job} {info.status}: {info.reason or '-'}", file=sys.stderr)
    return worst


def _dry_run_script(args, req) -> str:
    """What the engine would make of the first run of ``req``: Slurm's batch script, or the
    Kubernetes objects (the run's credential is minted at launch: a placeholder stands for it)."""
    from .engines.api import RunLaunch, check_cpus_per_worker
    from .engines.slurm import SlurmAdapter
    from .wire import Task

    placement = []
    for part in (args.nodes or f"n1:{req.gpus}").split(","):
        node, _, g = part.partition(":")
        if not node or not g.isdigit() or int(g) < 1:
            raise ConfigError(f"--nodes {args.nodes!r}: use NODE:GPUS[,NODE:GPUS...], e.g. n1:2,n2:1")
        placement.append((node, int(g)))
    job = req.name or "JOB"
    tasks = tuple(Task(job, 1, g, [], len(placement), list(req.command), req.workdir, dict(req.env), req.max_restarts,
                       req.grace, req.module) for _, g in placement)
    nodes = tuple(n for n, _ in placement)
    cpus = check_cpus_per_worker(args.engine_cpus_per_worker)
    if args.backend == "kubernetes":
        from .engines.k8s_manifests import manifests_yaml, run_objects

        tasks = tuple(Task(**{**msgspec.structs.asdict(t), "token": "WORKER-CREDENTIAL-MINTED-AT-LAUNCH"})
                      for t in tasks)
        secret, pods = run_objects(RunLaunch(job, 1, nodes, tasks, req.project or ""), image=args.k8s_image,
                                   coordinator=args.coordinator, namespace=args.k8s_namespace,
                                   cpus_per_worker=cpus)
        return manifests_yaml([secret, *pods])
    adapter = SlurmAdapter(args.slurm_partition, args.coordinator, "STATE_DIR",
                           token_file=args.token_file or "TOKEN_FILE", cpus_per_worker=cpus,
                           accounts=args.slurm_accounts)
    return adapter.script(RunLaunch(job, 1, nodes, tasks, req.project or ""))


def _worker_range(args) -> tuple[int, int]:
    if args.nnodes is not None or args.nproc_per_node is not None:
        per = args.nproc_per_node or 1
        lo, hi = _min_max(args.nnodes or "1")
        return lo * per, hi * per
    return _min_max(str(args.gpus))


def _min_max(raw: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX`` (``--gpus``, ``--nnodes``), as two whole numbers with 1 <= MIN <= MAX."""
    try:
        lo, hi = (int(x) for x in (raw.split(":", 1) if ":" in raw else (raw, raw)))
    except ValueError:
        raise ConfigError(f"{raw!r}: give N, or MIN:MAX for an elastic job (--gpus, --nnodes)") from None
    if not 1 <= lo <= hi:
        raise ConfigError(f"workers {lo}:{hi}: need 1 <= MIN <= MAX")
    return lo, hi


# ---------------------------------------------------------------------- status
def _status(args) -> int:
    client = _client(args)
    job = args.job_opt or args.job
    if args.users:
        return _user_table(client, args.window, args.json)
    if args.start:
        return _forecast(client, job, args.json)
    if job:
        return _job_status(client, job, args.json)
    match = _match(args, client) if _filtered(args) else {}
    try:  # (ended jobs: the last 10 the filter matches unless --all; a long history makes a big reply)
        st = client.cluster_status(ended="all" if args.all else 10, **match)
    except ConflictError:  # no scheduler: the jobs etrun and the library created
        return _job_list(client, args.json)
    keep = _keep(match) if match else None
    jobs = [j for j in st.jobs if keep is None or keep(j)]
    if args.json:
        print(msgspec.json.encode(msgspec.structs.replace(st, jobs=jobs)).decode())
        return 0
    print(f"policy {st.policy}: {len(st.nodes)} node(s), {sum(n.slots for n in st.nodes if n.state == 'up')} "
          f"slot(s) up, {st.decisions} decisions" + (f", {st.failures} failed" if st.failures else ""))
    if st.nodes:
        print()
        _node_table(st)
    now = st.now
    groups = [("running", [j for j in jobs if j.status == "running"]),
              ("queued", [j for j in jobs if j.status in ("queued", "preempted")])]
    ended = [j for j in jobs if j.status in _ENDED]
    groups.append(("ended", ended if args.all else ended[-10:]))
    prio = any(j.priority for j in st.jobs)  # (a column only where some job has a priority, or a project)
    proj = any(j.project for j in st.jobs)
    for title, jobs in groups:
        if not jobs:
            continue
        print()
        rows = [("id", "name", "user", *("project",) * proj, *("prio",) * prio, "state", "gpus", "attained GPU-s",
                 "waited s", "step", "placement", "policy", "reason")]
        for j in jobs:
            state = j.status + (" (stopping)" if j.stopping else "")
            waited = (j.start_time or now) - j.submit_time
            rows.append((j.id, j.name, j.user, *(j.project or "-",) * proj, *(str(j.priority),) * prio, state,
                         _gpus(j), f"{j.attained_gpu:.1f}",
                         f"{waited:.1f}", f"{j.step}" + (f"/{j.steps}" if j.steps else ""), _where(j) or "-",
                         " ".join(f"{k}={v}" for k, v in j.info.items()) or "-", _short(j.reason) or "-"))
        print(f"{title}:")
        print(table(rows, right_align=False))
    if st.ended_omitted or len(ended) > 10 and not args.all:
        print(f"\n{st.ended_omitted + max(0, len(ended) - 10)} earlier ended job(s) not shown: `status --all`, or "
              "`history`")
    return 0


def _expected(client, job: str) -> str:
    """One job's line of the forecast (``status --start``), for ``status JOB``."""
    from .sim.forecast import when

    try:
        f = client.cluster_forecast()
    except (ConflictError, NotFoundError):
        return "no forecast (this coordinator runs no policy)"
    j = next((x for x in f.jobs if x.id == job), None)
    if j is None or j.why:
        return f"no forecast: {j.why if j is not None else 'not in the job table'}"
    start = "runs now" if j.status == "running" else f"starts {when(None if j.start is None else j.start - f.now)}"
    end = f"ends {when(j.end - f.now)}" if j.end is not None else "does not end within the forecast"
    assumed = f" (assuming {'; '.join(j.assumed)})" if j.assumed else ""
    return f"{start}, {end}{assumed}; `status --start` for every job"


def _forecast(client, job: Optional[str], as_json: bool) -> int:
    from .sim.forecast import when

    f = client.cluster_forecast()
    jobs = [j for j in f.jobs if job is None or j.id == job]
    if job is not None and not jobs:
        raise NotFoundError(f"no job {job!r} waits or runs; `elastictrain status` lists them")
    if as_json:
        print(msgspec.json.encode(msgspec.structs.replace(f, jobs=jobs)).decode())
        return 0
    print(f"forecast: policy {f.policy} simulated from now, with no new submissions ({f.wall:.2f} s); it covers "
          + ("every job to its end" if f.complete else f"the next {when(f.until - f.now)[3:] or '0s'} only"))
    rows = [("id", "name", "user", "state", "gpus", "start", "end", "assumes")]
    for j in jobs:
        start = "running" if j.status == "running" else when(None if j.start is None else j.start - f.now)
        end = when(None if j.end is None else j.end - f.now)
        rows.append((j.id, j.name, j.user, j.status, str(j.gpus), start if not j.why else "-", end,
                     "; ".join(j.assumed) or "-"))
    print(table(rows, right_align=False))
    for j in jobs:
        if j.why:
            print(f"  job {j.id}: {j.why}")
    if f.stopped:
        print(f"  the simulation stopped early ({f.stopped}); the times above are what it got to")
    return 0


def _show_token(cred, out) -> None:
    if out:
        from .coordinator.server import write_token_file

        write_token_file(out, cred.token)
        print(f"{cred.role} {cred.name}: token written to {out} (mode 0600)")
    else:
        print(f"{cred.role} {cred.name}: token (shown once; keep it in a file of mode 0600 and pass --token-file):")
        print(cred.token)


def _cordon_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 1.0 <= v <= 30 * 86_400.0:
        raise argparse.ArgumentTypeError(f"--for must be 1 to 2592000 seconds (30 days), not {text}")
    return v


def _node_table(st) -> None:
    """The nodes of a ``ClusterStatus``, a row each (``status`` and ``nodes list``)."""
    rows = [("node", "state", "kind", "type", "slots", "used", "free", "jobs")]
    for n in st.nodes:
        state = n.state if not n.cordoned_until else f"cordoned {max(0.0, n.cordoned_until - st.now):.0f} s"
        rows.append((n.name, state, n.kind, n.gpu_type or "-", str(n.slots), str(n.used),
                     str(max(0, n.slots - n.used) if n.state == "up" and not n.cordoned_until else 0),
                     ",".join(n.jobs) or "-"))
    print(table(rows, right_align=False))
    for n in st.nodes:
        if n.cordoned_until:
            print(f"  node {n.name} is cordoned (nothing new is placed there): {n.cordon_why}")
        if n.maint_start:
            print(f"  node {n.name}: maintenance planned from {_clock(n.maint_start)} to {_clock(n.maint_end)}"
                  + (" (drain)" if n.maint_drain else ""))


def _clock(t: float) -> str:
    """A UNIX time as local date and time to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _nodes(args) -> int:
    client = _client(args)
    if args.nodes_command == "list":
        st = client.cluster_status(ended=0)
        if args.json:
            print(msgspec.json.encode(st.nodes).decode())
        elif st.nodes:
            _node_table(st)
        else:
            print("no nodes: start `elastictrain node` on a machine (or give the coordinator an engine)")
        return 0
    if args.nodes_command == "add":
        _show_token(client.add_node(args.name), args.token_out)
    elif args.nodes_command in ("cordon", "drain"):
        drain = args.nodes_command == "drain"
        at = None
        if args.at is not None:
            try:
                at = begin_time(args.at)
            except argparse.ArgumentTypeError as exc:
                raise ConfigError(str(exc).replace("--begin", "--at")) from None
        n = client.cordon(args.name, args.seconds, args.reason[:256], drain, at)
        if n.maint_start:
            print(f"node {n.name}: maintenance planned from {_clock(n.maint_start)} to {_clock(n.maint_end)}; "
                  + ("its jobs are requeued then" if drain else "its jobs keep running then")
                  + "; until then nothing starts there that would still run then (under backfill)")
            return 0
        print(f"node {n.name}: cordoned for {n.cordoned_until - time.time():.0f} s (nothing new is placed there); "
              + ("its jobs are requeued: they checkpoint and resume elsewhere" if drain else
                 f"its {len(n.jobs)} job(s) keep running"))
    elif args.nodes_command == "uncordon":
        print(f"node {client.cordon(args.name, 0.0).name}: not cordoned")
    else:
        client.revoke("node", args.name)
        print(f"node {args.name}: credential revoked")
    return 0


def _users(args) -> int:
    client = _client(args)
    if args.users_command == "add":
        _show_token(client.add_user(args.name, args.unix_user or "", args.allow_root), args.token_out)
        return 0
    if args.users_command == "revoke":
        client.revoke("user", args.name)
        print(f"user {args.name}: credential and account revoked")
        return 0
    if args.users_command == "whoami":
        w = client.whoami()
        extra = f", runs as {w.unix_user}" if w.unix_user else f", jobs {','.join(w.jobs)} run {w.run}" if w.jobs else ""
        print(f"{w.role} {w.name}{extra}")
        return 0
    if args.users_command == "accounts":
        acc = client.accounts()
        if args.json:
            print(msgspec.json.encode(acc).decode())
            return 0
        rows = [("user", "UNIX account", "may run as root")]
        rows += [(a.user, a.unix_user, "yes" if a.allow_root else "no") for a in acc.users]
        print(table(rows, right_align=False))
        print("node credentials: " + (", ".join(acc.nodes) or "none"))
        return 0
    if args.users_command == "quota":  # the coordinator checks the name and the numbers (a 400 with the reason)
        given = args.gpus is not None or args.jobs is not None
        prio = args.max_priority is not None
        if given + args.default + args.unlimited > 1 or not (given or args.default or args.unlimited or prio) \
                or (args.default and prio):
            print("elastictrain users quota: give --gpus N and/or --jobs N, or --unlimited, and/or --max-priority N; "
                  "or --default alone", file=sys.stderr)
            return 2
        if given or args.default or args.unlimited:
            ul = client.set_quota(args.name, args.gpus, args.jobs, args.default)
        if prio:  # (apart: alone, it leaves the limits as they are)
            ul = client.set_quota(args.name, max_priority=args.max_priority)
        mine = next((u for u in ul.users if u.user == args.name), None)
        if mine is not None:
            print(f"user {args.name}: quota {_quota_text(mine)}")
        return _user_table(client, 600.0, False)
    if args.users_command == "set":  # the coordinator checks the name and the number (a 400 with the reason)
        client.set_user(args.name, args.tickets)
        print(f"user {args.name}: {args.tickets:g} tickets")
        return _user_table(client, 600.0, False)
    return _user_table(client, args.window, args.json)


def _user_table(client, window: float, as_json: bool) -> int:
    ul = client.users(window)
    if as_json:
        print(msgspec.json.encode(ul).decode())
        return 0
    note = "" if ul.tickets_used else " (this policy does not share by tickets; shares are shown as measured)"
    print(f"users over the last {ul.window:.0f} s; default tickets {ul.default_tickets:g}{note}")
    rows = [("user", "tickets", "entitled", "share", "share/entitled", "GPU-s", "running GPUs", "jobs")]
    for u in ul.users:
        ratio = f"{u.share / u.entitled:.2f}" if u.entitled > 0 else "-"
        rows.append((u.user, f"{u.tickets:g}" + ("" if u.set else " (default)"), f"{u.entitled:.1%}",
                     f"{u.share:.1%}", ratio, f"{u.gpu_seconds:.1f}", str(u.running_gpus), str(u.jobs)))
    if any(u.fairshare is not None for u in ul.users):  # multifactor: sshare's effective usage and factor
        rows = [r + q for r, q in zip(rows, [("usage (decayed)", "fairshare")] + [
            (f"{u.usage:.1%}", f"{u.fairshare:.3f}") if u.fairshare is not None else ("-", "-") for u in ul.users])]
    if any(u.quota_gpus is not None or u.quota_jobs is not None or u.max_priority for u in ul.users):
        rows = [r + q for r, q in zip(rows, [("quota", "admitted GPUs", "waiting for quota")] + [
            (_quota_text(u), str(u.admitted_gpus), str(u.waiting_for_quota)) for u in ul.users])]
    print(table(rows, right_align=False))
    return 0


def _quota_text(u) -> str:
    from .coordinator.quotas import Quota

    return Quota(u.quota_gpus, u.quota_jobs).text() + ("" if u.quota_own else " (default)") + (
        f"; priority up to {u.max_priority}" if u.max_priority else "")


def _job_list(client, as_json: bool) -> int:
    jobs = client.jobs()
    if as_json:
        print(msgspec.json.encode(jobs).decode())
        return 0
    if not jobs:
        print(f"no jobs at {client.url}")
        return 0
    rows = [("job", "state", "generation", "world size", "nodes", "datasets")]
    for j in jobs:
        rows.append((j.job, j.status or "-", str(j.generation), str(j.world_size) if _live(j) else "-",
                     f"{j.nodes} of {j.min_nodes}:{j.max_nodes}" if j.max_nodes else "-",
                     ",".join(j.datasets) or "-"))
    print(table(rows, right_align=False))
    return 0


def _live(j) -> bool:
    return j.status in ("", "running")


def _job_status(client, job: str, as_json: bool) -> int:
    info = rdzv = None
    try:
        info = client.cluster_job(job)
    except (ConflictError, NotFoundError):
        pass
    try:
        rdzv = client.job(job)
    except NotFoundError:
        if info is None:
            raise NotFoundError(f"no job {job!r} at {client.url}") from None
    datasets = [client.dataset(job, name) for name in rdzv.datasets] if rdzv else []
    profiles = client.profiles(job).reports if rdzv else []
    rlist = client.resources(job) if rdzv else None
    resources = rlist.workers if rlist is not None else []
    stragglers = rlist.stragglers if rlist is not None else []
    if as_json:
        print(msgspec.json.encode({"job": info, "rendezvous": rdzv, "datasets": datasets,
                                   "profiles": profiles, "resources": resources,
                                   "stragglers": stragglers,
                                   "shares": rlist.shares if rlist is not None else None}).decode())
        return 0
    if info is not None:
        print(f"job {info.id} ({info.name}) of {info.user}: {info.status}" + (" (stopping)" if info.stopping else "")
              + (f"; priority {info.priority}" if info.priority else "")
              + (f"; project {info.project}" if info.project else "")
              + (f"; GPU type {info.gpu_type}" if info.gpu_type else ""))
        print(f"  command: {shlex.join(info.command)}  (in {info.workdir})")
        now = f" (this run: {info.workers})" if info.min_gpus != info.gpus and info.workers else ""
        print(f"  workers: {_gpus(info)}{now}; placement: {_where(info) or '-'}; run {info.run}; preemptions "
              f"{info.preemptions}; restarts {info.restarts}/{info.max_restarts}")
        it = f"{info.iteration_time:.3f} s" if info.iteration_time else "not measured yet"
        rate = f"; throughput {info.rate:.1f} samples/s" if info.rate else ""
        print(f"  attained {info.attained:.1f} s, {info.attained_gpu:.1f} GPU-s; step {info.step}"
              f"{'/' + str(info.steps) if info.steps else ''}; iteration time {it}{rate}")
        if info.info:
            print("  policy: " + ", ".join(f"{k} {v}" for k, v in info.info.items()))
        if info.reason:
            print(f"  reason: {info.reason}")
        if info.status in ("queued", "preempted", "running"):
            print(f"  expected: {_expected(client, info.id)}")
    if rdzv is not None:
        live = (info is None or info.status == "running") and _live(rdzv)
        where = f"generation {rdzv.generation}, world size {rdzv.world_size}" if live else \
            f"last generation {rdzv.generation} (world size {rdzv.world_size})"
        if rdzv.max_nodes:
            where += f"; nodes {rdzv.nodes} (--nnodes {rdzv.min_nodes}:{rdzv.max_nodes})"
        if info is None:
            state = f"{rdzv.status}" + (f": {rdzv.detail}" if rdzv.detail and not live else "") if rdzv.status else ""
            print(f"job {rdzv.job}: " + (state + "\n  " if state else "") + where)
        else:
            print("  " + where)
    if datasets:
        rows = [("dataset", "epochs", "todo", "doing", "done", "total", "finished", "last commit")]
        for d in datasets:
            rows.append((d.spec.name, str(d.spec.epochs), str(d.todo), str(d.doing), str(d.done), str(d.total),
                         "yes" if d.finished else "no", d.last_commit or "-"))
        print(table(rows, right_align=False))
        ended = rdzv is not None and not _live(rdzv)
        for d in datasets:
            if ended and not d.finished and d.doing:
                print(f"  {d.spec.name}: {d.doing} shard(s) were leased and never committed: the job ended without "
                      "committing or closing its iterator; they go back to todo when their leases expire")
    if resources:
        print(_resource_table(resources))
    for f in stragglers:
        print(f"  straggler: rank {f.worker} works {f.slowdown:.2f}x slower than its peers' median (node "
              f"{f.agent or '-'}: {f.action})")
    shares = rlist.shares if rlist is not None else None
    if shares is not None:
        cut = ", ".join(f"rank {r} {w:.2f}" for r, w in enumerate(shares.weights) if w < 1.0)
        print(f"  batch shares (version {shares.version}, from step {shares.from_step}): {cut or 'equal'}; "
              "the others a full share")
    if any(r.stage is not None for r in profiles):
        from .cli import _stage_table

        print()
        skew = {r.comm.worker: f"{r.comm.skew:.3f}" for r in profiles if r.comm is not None}
        print(_stage_table([r.stage for r in profiles if r.stage is not None], "comm skew",
                           lambda st: skew.get(st.worker, "-")))
    return 0


def _resource_table(workers) -> str:
    """Each worker's latest resource sample (``ET_MONITOR_PERIOD``), GPU columns or why not."""
    def mib(v):
        return "-" if v is None else f"{v / 2**20:.0f} MiB"
    rows = [("worker", "age", "cpu %", "rss", "read", "written", "step", "step time", "own work", "gpu")]
    now = time.time()
    absent = set()
    for w in workers:
        s = w.latest
        if s.gpu_util is not None:
            gpu = f"{s.gpu_util:.0f}% {mib(s.gpu_mem_used)}/{mib(s.gpu_mem_total)} {s.gpu_power_w or 0:.0f} W"
            if s.torch_peak_bytes is not None:
                gpu += f", torch peak {mib(s.torch_peak_bytes)}"
        else:
            gpu = "-"
            absent.add(s.gpu_absent or "not reported")
        rows.append((str(w.worker), f"{max(0.0, now - s.t):.0f} s", f"{s.cpu_percent:.0f}", mib(s.rss_bytes),
                     mib(s.read_bytes), mib(s.write_bytes), "-" if s.step is None else str(s.step),
                     "-" if s.step_time is None else f"{s.step_time:.3f} s",
                     "-" if s.busy_time is None else f"{s.busy_time:.3f} s", gpu))
    text = table(rows, right_align=False)
    if absent:
        text += "\n  no GPU figures: " + "; ".join(sorted(absent))
    return text + f"\n  ({workers[0].history if workers else 0} samples kept per worker)"


def _gpus(j) -> str:
    """Its workers (N, or MIN:MAX), and the GPU type it needs: 4 (a100)."""
    n = str(j.gpus) if j.min_gpus == j.gpus else f"{j.min_gpus}:{j.gpus}"
    return f"{n} ({j.gpu_type})" if j.gpu_type else n


def _where(j) -> str:
    return " ".join(f"{p.node}:{p.slots}" for p in j.placement)


def _short(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


# ---------------------------------------------------------------------- cancel, logs
_SPAN = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def span_seconds(text: str) -> Optional[float]:
    """Seconds in a span such as 90m, 2h, 7d or 30s (a number and a unit); None where ``text`` is not one."""
    t = text.strip()
    if t[:-1].replace(".", "", 1).isdigit() and t[-1:] in _SPAN:
        return float(t[:-1]) * _SPAN[t[-1]]
    return None


def _since(text: str, now: float, flag: str = "--since") -> float:
    """``--since`` (or ``flag``): a date, a date and time (local), or a span before ``now`` (90m, 2h, 7d)."""
    t = text.strip()
    ago = span_seconds(t)
    if ago is not None:
        return now - ago
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S"):
        try:
            return time.mktime(time.strptime(t, fmt))
        except ValueError:
            pass
    raise ConfigError(f"{flag} {text!r}: give a date (2026-11-26), a date and time (2026-11-26T14:00) or a span "
                      "ago (90m, 2h, 7d)")


def _history_rows(jobs, now: float) -> list[dict]:
    """One accounting row per job (times are seconds since the epoch; elapsed: from its first
    start to its end, or to now while it has not ended)."""
    out = []
    for j in jobs:
        restarts = dict(j.runs_by_reason)
        failures = j.restarts - restarts.get("failure", 0)  # etrun's own restarts after worker failures
        if failures > 0:
            restarts["worker_failure"] = failures
        end = j.end_time if j.status in _ENDED else None
        out.append({"id": j.id, "name": j.name, "user": j.user, "gpus": j.gpus, "state": j.status,
                    "submit": j.submit_time, "start": j.start_time, "end": end,
                    "elapsed": None if j.start_time is None else round((end or now) - j.start_time, 3),
                    "waited": round((j.start_time or end or now) - j.submit_time, 3),
                    "exit_code": j.exit_code, "runs": j.run, "preemptions": j.preemptions, "restarts": restarts,
                    "gpu_hours": round(j.attained_gpu / 3600, 6), "project": j.project or None})
    return out


def summarize_history(rows: list[dict], by: str, hours: Optional[dict] = None) -> list[dict]:
    """``_history_rows`` summed per ``by`` (``user`` or ``project``; "-" for jobs of none), the most
    GPU-hours first: jobs, finished, failed (timeouts included), cancelled, GPU-hours and their
    share of all, waits of the jobs that started (median and 95th percentile, seconds), preemptions.
    ``hours``: each user's or project's GPU-hours in a period instead of its rows' (one with GPU-hours
    there but no row gets a line of its own: its jobs were submitted before the period)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r[by] or "-", []).append(r)
    if hours is None:
        hours = {name: sum(r["gpu_hours"] for r in rs) for name, rs in groups.items()}
    for name, h in hours.items():
        if h > 0:
            groups.setdefault(name, [])
    total = sum(hours.values())
    out = []
    for name, rs in groups.items():
        waits = sorted(r["waited"] for r in rs if r["start"] is not None)
        got = hours.get(name, 0.0)

        def q(p):  # (nearest rank; the median of an even count is the mean of the middle two)
            if not waits:
                return None
            if p == 0.5:
                return round(statistics.median(waits), 3)
            return round(waits[min(len(waits) - 1, math.ceil(p * len(waits)) - 1)], 3)

        out.append({by: name, "jobs": len(rs), "finished": sum(r["state"] == "finished" for r in rs),
                    "failed": sum(r["state"] == "failed" for r in rs),
                    "cancelled": sum(r["state"] == "cancelled" for r in rs), "gpu_hours": round(got, 6),
                    "share": round(got / total, 6) if total > 0 else 0.0, "wait_median": q(0.5),
                    "wait_p95": q(0.95), "preemptions": sum(r["preemptions"] for r in rs)})
    out.sort(key=lambda r: (-r["gpu_hours"], r[by]))
    return out


def _history(args) -> int:
    client = _client(args)
    match = _match(args, client)
    keep = _keep(match)
    try:
        st = client.cluster_status(ended="all", **match)  # (its time is the coordinator's clock)
    except ConflictError:
        raise ConfigError(f"the coordinator at {client.url} runs no scheduler: history covers the jobs it schedules "
                          "(start it with --policy, and submit with `elastictrain submit`)") from None
    since = _since(args.since, st.now) if args.since else None
    until = _since(args.until, st.now, "--until") if args.until else None
    if since is not None and until is not None and until <= since:
        raise ConfigError(f"--until {args.until!r} is not after --since {args.since!r}: give a period that ends "
                          "after it begins")
    ids = set(args.jobs.split(",")) if args.jobs else None
    listed = [j for j in st.jobs if keep(j) and (ids is None or j.id in ids or j.id.split("_")[0] in ids)]
    jobs = [j for j in listed if (since is None or j.submit_time >= since) and (until is None or j.submit_time < until)]
    rows = _history_rows(sorted(jobs, key=lambda j: j.submit_time), st.now)
    if args.by:
        hours = None
        if since is not None or until is not None:  # sreport: the GPU time that fell within the period
            hours = _period_hours(client, listed, args.by, since, until)
        return _history_summary(args, summarize_history(rows, args.by, hours))
    fields = ("id", "name", "user", "gpus", "state", "submit", "start", "end", "elapsed", "waited", "exit_code",
              "runs", "restarts", "gpu_hours", "project")

    def when(t):
        return "-" if t is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))

    def span(s):
        if s is None:
            return "-"
        s = int(s)
        return (f"{s // 86400}-" if s >= 86400 else "") + f"{s % 86400 // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"

    def text(r, k):
        v = r[k]
        if k in ("submit", "start", "end"):
            return when(v)
        if k in ("elapsed", "waited"):
            return span(v)
        if k == "restarts":
            return ",".join(f"{a}:{n}" for a, n in sorted(v.items())) or "-"
        if k == "gpu_hours":
            return f"{v:.3f}"
        return "-" if v is None else str(v)

    filtered = args.state or args.user or args.me or args.project or since or ids
    return _print_records(args.format, fields, rows, text, "no jobs" + (" match" if filtered else
                                                                          f" at {args.coordinator}"))


def _period_hours(client, jobs, by: str, since: Optional[float], until: Optional[float]) -> dict:
    """GPU-hours of ``jobs``' service (from each run's first step, as their own GPU-hours count) that
    fell within ``[since, until)``, per user or project, from the coordinator's spans of GPU time
    (``GET /v1/cluster/usage``: coordinator/gpu_time.py)."""
    seconds = {u.job: u.service_gpu_seconds for u in client.gpu_time(since, until).jobs}
    out: dict[str, float] = {}
    for j in jobs:
        s = seconds.get(j.id)
        if s:
            name = (j.user if by == "user" else j.project) or "-"
            out[name] = out.get(name, 0.0) + s / 3600
    return out


def _history_summary(args, sums: list[dict]) -> int:
    fields = (args.by, "jobs", "finished", "failed", "cancelled", "gpu_hours", "share", "wait_median", "wait_p95",
              "preemptions")

    def text(r, k):
        v = r[k]
        if v is None:
            return "-"
        return f"{v:.3f}" if k == "gpu_hours" else f"{v:.1%}" if k == "share" else \
            f"{v:.0f}s" if k.startswith("wait") else str(v)
    return _print_records(args.format, fields, sums, text, "no jobs match")


def _print_records(fmt: str, fields: tuple, rows: list[dict], text, empty: str) -> int:
    """``rows`` as JSON lines, CSV (None as "", a dict as JSON) or a table of ``text(row, field)``
    (``empty`` where there are none)."""
    import csv
    import json

    if fmt == "json":
        for r in rows:
            print(json.dumps(r, sort_keys=True))
    elif fmt == "csv":
        w = csv.writer(sys.stdout)
        w.writerow(fields)
        for r in rows:
            w.writerow(["" if r[k] is None else json.dumps(r[k], sort_keys=True) if isinstance(r[k], dict) else r[k]
                        for k in fields])
    elif not rows:
        print(empty)
    else:
        print(table([fields] + [tuple(text(r, k) for k in fields) for r in rows], right_align=False))
    return 0


def _cancel(args) -> int:
    client = _client(args)
    # a job array's id: each of its tasks still queued or running (as scancel; one that ended meanwhile is passed over)
    return _bulk(args, client, client.cancel, _ENDED, lambda info: f"job {info.id} cancelled",
                 lambda job, n: f"job array {job}: each of its {n} tasks has ended; nothing to cancel")


def _requeue(args) -> int:
    client = _client(args)
    then = " on hold: `elastictrain release` lets it run again" if args.hold else ": it checkpoints and is placed again"
    # a job array's id: each of its running tasks
    return _bulk(args, client, lambda job: client.requeue_job(job, args.hold), ("queued", "preempted") + _ENDED,
                 lambda info: f"job {info.id} requeued{then}",
                 lambda job, n: f"job array {job}: no task of its {n} is running; nothing to requeue")


def _update(args) -> int:
    from .wire import JobUpdate

    if args.priority is None and args.time is None and args.begin is None and args.gpus is None and \
            args.gpu_type is None:
        raise ConfigError("update: nothing to change; give --priority N, --time LIMIT, --begin TIME, --gpus N or "
                          "--gpu-type TYPE")
    lo, hi = _min_max(args.gpus) if args.gpus is not None else (None, None)
    kind = None if args.gpu_type is None else "" if args.gpu_type.lower() == "any" else check_gpu_type(args.gpu_type)
    client = _client(args)
    try:
        req = msgspec.convert({"priority": args.priority, "time_limit": args.time, "begin": args.begin, "gpus": hi,
                               "min_gpus": lo if lo != hi else None, "gpu_type": kind}, JobUpdate)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"update: {exc}") from None
    waiting_only = args.begin is not None or args.gpus is not None or kind is not None
    # a job array's id: each of its tasks not ended (as scontrol update on an array; --begin, --gpus: those waiting)
    infos, _ = _each_task(client, args.job, lambda job: client.update_job(job, req),
                          _ENDED + (("running",) if waiting_only else ()),
                          none_left_missing=True)
    for info in infos:
        limit = info.info.get("time_limit", "none")
        begin = f", begin {info.info['begin']}" if "begin" in info.info else ""
        size = f", gpus {_gpus(info)}" if args.gpus is not None or kind is not None else ""
        print(f"job {info.id} updated: priority {info.priority}, time limit {limit}{begin}{size} ({info.status})")
    return 0


def _time_or_unlimited(text: str) -> float:
    """``--time`` of ``update``: Slurm's format, or UNLIMITED / INFINITE (0: no limit)."""
    return 0.0 if text.strip().lower() in ("unlimited", "infinite") else slurm_time(text)


def gres_spec(text: str) -> tuple:
    """Slurm's GPU GRES request, ``gpu``, ``gpu:N``, ``gpu:TYPE`` or ``gpu:TYPE:N``: (TYPE or
    None, N) (N: 1 where left out)."""
    parts = text.split(":")
    count = int(parts.pop()) if len(parts) > 1 and parts[-1].isdigit() else 1
    if parts[0] != "gpu" or len(parts) > 2 or not 1 <= count <= 65536 or (len(parts) == 2 and not parts[1]):
        raise argparse.ArgumentTypeError(f"{text!r}: use gpu:N or gpu:TYPE:N (Slurm's GRES form, e.g. gpu:a100:4)")
    return (parts[1] if len(parts) == 2 else None), count


def slurm_time(text: str) -> float:
    """Seconds from Slurm's ``--time`` format: ``MINUTES``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``,
    ``D-HH:MM``, ``D-HH:MM:SS``."""
    fix = (f"--time {text!r}: use Slurm's format: MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS "
           "(e.g. 90, 1:30:00, 2-00)")
    days, dash, rest = text.strip().partition("-")
    if not dash:
        days, rest = "0", text.strip()
    parts = rest.split(":")
    if not (days.isdigit() and 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
        raise argparse.ArgumentTypeError(fix)
    n = [int(p) for p in parts]
    if dash:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, m, s = (n + [0, 0])[:3]
    else:  # MINUTES, MM:SS, HH:MM:SS
        h, m, s = (0, n[0], 0) if len(n) == 1 else (0, n[0], n[1]) if len(n) == 2 else tuple(n)
    seconds = ((int(days) * 24 + h) * 60 + m) * 60 + s
    if not 0 < seconds <= 366 * 86_400:
        raise argparse.ArgumentTypeError(f"--time {text!r}: between 1 second and 366 days")
    return float(seconds)


def _notify_on(text: Optional[str]) -> list:
    """``--notify-on begin,end``: the types, checked (the message names them all)."""
    from .coordinator.notify import check_types

    given = [t.strip().lower() for t in (text or "").split(",") if t.strip()]
    return check_types(given) if given else []


def begin_time(text: str, now: Optional[float] = None) -> float:
    """``--begin``: the UNIX time from Slurm's forms: ``now``, ``now+SPAN`` (90m, 2h, 1d, 30s), ``HH:MM[:SS]``
    (today, or tomorrow if it has passed), ``YYYY-MM-DD`` or ``YYYY-MM-DDTHH:MM[:SS]`` (local time)."""
    now = time.time() if now is None else now
    t = text.strip()
    if t.lower() == "now":
        return now
    if t.lower().startswith("now+"):
        span = t[4:]
        ahead = span_seconds(span)
        if ahead is not None:
            return now + ahead
        if span.isdigit():  # Slurm's now+N is seconds
            return now + float(span)
    for fmt in ("%H:%M", "%H:%M:%S"):
        try:
            hms = time.strptime(t, fmt)
        except ValueError:
            continue
        day = time.localtime(now)
        at = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, hms.tm_hour, hms.tm_min, hms.tm_sec, 0, 0, -1))
        return at if at > now else at + 86_400.0
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"):
        try:
            return time.mktime(time.strptime(t, fmt))
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(f"--begin {text!r}: give now+SPAN (now+90m, now+2h, now+1d), a time of day "
                                     "(16:00), a date (2026-11-28) or a date and time (2026-11-28T08:00)")


def _array_tasks(client, job: str) -> list:
    """The tasks of job array ``job`` (ids ``JOB_INDEX``), in index order; none where it is not one."""
    tasks = client.cluster_jobs(ended="all", array=job).jobs
    return sorted(tasks, key=lambda j: int(j.id[len(job) + 1:]))


def _each_task(client, job: str, act, skip: tuple, none_left_missing: bool = False) -> tuple[list, Optional[list]]:
    """``act(job)``; where ``job`` is a job array's id, ``act`` on each of its tasks whose status is
    not in ``skip`` (one that changed meanwhile, a 409, is passed over), as scontrol does. Returns
    the answers, and the array's tasks (None: ``job`` was a job). A job that is not there, nor an
    array (or, with ``none_left_missing``, an array with no task left to act on), stays a 404."""
    try:
        return [act(job)], None
    except NotFoundError:
        tasks = _array_tasks(client, job)
        if not tasks or (none_left_missing and all(j.status in skip for j in tasks)):
            raise
    infos = []
    for j in tasks:
        if j.status in skip:
            continue
        try:
            infos.append(act(j.id))
        except ConflictError:
            continue
    return infos, tasks


def _hold(args) -> int:
    client = _client(args)
    hold = args.command == "hold"
    # a job array's id: each of its waiting (hold) or held (release) tasks, as scontrol
    return _bulk(args, client, client.hold_job if hold else client.release_job, ("running",) + _ENDED,
                 lambda info: f"job {info.id} {'held' if hold else 'released'}: {info.reason or info.status}",
                 lambda job, n: f"job array {job}: no task of its {n} is " + (
                     "waiting, so none can be held (a hold applies to waiting tasks)" if hold else "on hold"))


def _events(args) -> int:
    import msgspec

    from .model import check_name

    if args.job is not None:
        check_name("--job", args.job)
    kinds = set(args.kind.split(",")) if args.kind else None
    client = _client(args)
    after = 0
    while True:
        page = client.events(after, args.job)
        for e in page.events:
            if kinds is None or e.kind in kinds:
                if args.json:
                    print(msgspec.json.encode(e).decode())
                else:
                    detail = " ".join(f"{k}={v}" for k, v in e.detail.items())
                    print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e.time))}  {e.kind:<10} "
                          f"{e.job or '-'}  {e.node or '-'}  {detail}")
        sys.stdout.flush()
        after = page.next
        if page.events:
            continue
        if not args.follow:
            return 0
        time.sleep(1.0)


def _logs(args) -> int:
    client = _client(args)
    after = 0
    out = sys.stdout.buffer
    while True:
        page = client.job_logs(args.job, after)
        for chunk in page.chunks:
            out.write(chunk.data)
        out.flush()
        after = page.next
        if page.chunks:
            continue
        if not args.follow or page.ended:
            return 0
        time.sleep(0.5)


def _stage_file(path: str) -> dict:
    """Mean stage seconds per iteration over the workers in an `elastictrain profile --json` file."""
    import json

    try:
        with open(path) as f:
            reports = json.load(f)
        stages = [r["stage"]["stages"] for r in reports if r.get("stage")]
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(f"--profile {path}: not a profile written by `elastictrain profile --json` ({exc})") from None
    if not stages:
        raise ConfigError(f"--profile {path}: it holds no stage profile")
    names = sorted({k for s in stages for k in s})
    return {k: sum(float(s.get(k, 0.0)) for s in stages) / len(stages) for k in names}
