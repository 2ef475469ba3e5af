"""TorchX's scheduler interface over elastictrain's coordinator: ``torchx run -s elastictrain``.

A TorchX app becomes one coordinator job (``elastictrain submit``), which the coordinator's policy
queues, places, preempts, resumes and resizes, and which ``etrun`` runs on every node it is placed
on. ``torchx status``, ``log``, ``cancel`` and ``list`` read and act on the same job.

What an app may be: one role, whose command is ``torchrun`` (what ``dist.ddp`` builds, directly or
as ``bash -c "torchrun ..."``) or ``python`` running a script or a module (``utils.python``). A
torchrun command gives the job its workers, ``--nnodes MIN:MAX`` times ``--nproc-per-node``
(elastic between the two); its rendezvous flags are dropped, because the coordinator forms every
generation. A ``python`` role runs ``num_replicas`` workers (``min_replicas`` at least). Any
other command is refused with the reason: etrun runs Python training scripts.

Macros: ``${app_id}`` is the app's name (the coordinator numbers the job only once it is
submitted); ``${replica_id}`` and ``${rank0_env}`` belong to the torchrun flags that are dropped,
and in a script's own arguments they are refused (etrun sets ``GROUP_RANK`` and ``MASTER_ADDR``).
"""

from __future__ import annotations

import os
import re
import shlex
import time
from datetime import datetime
from typing import Any, Iterable, Mapping, Optional

import msgspec

from torchx.schedulers.api import DescribeAppResponse, ListAppResponse, Scheduler, Stream, split_lines
from torchx.specs import AppDef, AppDryRunInfo, AppState, Role, RoleStatus, ReplicaStatus, macros, runopts

from elastictrain.errors import ConfigError
from elastictrain.launcher.cli import get_args_parser
from elastictrain.wire import JobSubmit

__all__ = ["ElastictrainScheduler", "create_scheduler", "job_request", "STATES"]

#: the coordinator's job states as TorchX's (a preempted job waits to resume: pending, as TorchX says of preemption)
STATES = {"queued": AppState.PENDING, "preempted": AppState.PENDING, "running": AppState.RUNNING,
          "finished": AppState.SUCCEEDED, "failed": AppState.FAILED, "cancelled": AppState.CANCELLED}
_TORCHRUN = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def _is_python(exe: str) -> bool:
    return re.fullmatch(r"python(\d+(\.\d+)?)?", os.path.basename(exe)) is not None


def _command(role: Role) -> list[str]:
    """The role's argv, ``bash -c "..."`` unwrapped."""
    argv = [role.entrypoint, *role.args]
    if os.path.basename(argv[0]) in ("bash", "sh") and len(argv) == 3 and argv[1] == "-c":
        try:
            argv = shlex.split(argv[2])
        except ValueError as exc:
            raise ConfigError(f"role {role.name}: its shell command does not parse ({exc})") from None
    if not argv:
        raise ConfigError(f"role {role.name}: an empty command")
    return argv


def _no_node_macros(args: list[str], what: str) -> None:
    for a in args:
        for m in ("${replica_id}", "${rank0_env}"):
            if m in a:
                raise ConfigError(f"{what}: {m} in the script's arguments is not supported here: etrun sets GROUP_RANK "
                                  "(the node's rank) and MASTER_ADDR in every worker's environment; read them there")


def job_request(app: AppDef, cfg: Mapping[str, Any]) -> JobSubmit:
    """The coordinator job for ``app`` (see the module docstring), validated as the coordinator
    validates a submission.

    Raises:
        ConfigError: an app this scheduler cannot run, saying why and what to do.
    """
    if len(app.roles) != 1:
        raise ConfigError(f"app {app.name}: the elastictrain scheduler runs apps of one role (a training job), not "
                          f"{len(app.roles)} ({', '.join(r.name for r in app.roles)})")
    role = macros.Values(img_root=app.roles[0].image or "", app_id=app.name, replica_id=macros.replica_id,
                         rank0_env=macros.rank0_env).apply(app.roles[0])
    argv = _command(role)
    exe = os.path.basename(argv[0])
    module = False
    restarts = role.max_retries
    if exe in _TORCHRUN or (_is_python(argv[0]) and len(argv) > 2 and argv[1] == "-m" and argv[2] in _TORCHRUN):
        rest = argv[1:] if exe in _TORCHRUN else argv[3:]
        try:
            args = get_args_parser().parse_args(rest)
        except SystemExit:
            raise ConfigError(f"role {role.name}: etrun does not take this torchrun command: {shlex.join(rest)}") \
                from None
        if args.no_python:
            raise ConfigError(f"role {role.name}: --no-python: etrun runs Python training scripts")
        try:
            per = int(args.nproc_per_node)
            lo, _, hi = str(args.nnodes).partition(":")
            lo, hi = int(lo), int(hi or lo)
        except ValueError:
            raise ConfigError(f"role {role.name}: give --nproc-per-node as a number and --nnodes as N or MIN:MAX "
                              f"(got {args.nproc_per_node!r}, {args.nnodes!r})") from None
        if not (per >= 1 and 0 <= lo <= hi and hi >= 1):
            raise ConfigError(f"role {role.name}: need --nproc-per-node >= 1 and 0 <= MIN <= MAX nodes, MAX >= 1 "
                              f"(got {args.nproc_per_node!r}, {args.nnodes!r})")
        workers, least = hi * per, max(lo, 1) * per
        command, module = [args.training_script, *args.training_script_args], bool(args.module)
        if any(a in ("--max-restarts", "--max_restarts") or a.startswith(("--max-restarts=", "--max_restarts="))
               for a in rest):
            restarts = max(restarts, args.max_restarts)
    elif _is_python(argv[0]):
        rest = [a for a in argv[1:] if a != "-u"]  # (unbuffered: etrun's workers' output is line-buffered anyway)
        if not rest or (rest[0].startswith("-") and rest[0] != "-m") or (rest[0] == "-m" and len(rest) < 2):
            raise ConfigError(f"role {role.name}: run a script (python train.py ...) or a module (python -m pkg ...), "
                              f"got {shlex.join(argv)}")
        module = rest[0] == "-m"
        command = rest[1:] if module else rest
        workers = role.num_replicas
        least = role.min_replicas if role.min_replicas else workers
    else:
        raise ConfigError(f"role {role.name}: the elastictrain scheduler runs Python training scripts under etrun: "
                          f"use a torchrun command (the dist.ddp component) or python SCRIPT/-m MODULE "
                          f"(utils.python), not {exe}")
    _no_node_macros(command, f"role {role.name}")
    # (LOGLEVEL is torchrun's own, which TorchX's components set: etrun does not read it)
    env = {k: v for k, v in role.env.items() if k != "LOGLEVEL"}
    req = {"command": command, "workdir": cfg.get("workdir") or os.getcwd(), "name": _job_name(app.name),
           "gpus": workers, "env": env, "max_restarts": restarts, "module": module}
    if least < workers:
        req["min_gpus"] = least
    for key, field in (("priority", "priority"), ("project", "project"), ("gpu_type", "gpu_type"),
                       ("steps", "steps"), ("epochs", "epochs"), ("grace", "grace"), ("time_limit", "time_limit"),
                       ("user", "user")):
        v = cfg.get(key)
        if v not in (None, ""):
            req[field] = v
    try:
        return msgspec.convert(req, JobSubmit)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"app {app.name}: the coordinator would refuse it: {exc}") from None


def _job_name(name: str) -> str:
    """The app's name as a job name the coordinator takes (letters, digits, ``._-``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)[:64].strip("-.") or "torchx"


class ElastictrainScheduler(Scheduler[Mapping[str, Any]]):
    """``torchx run -s elastictrain``: apps become jobs of an elastictrain coordinator."""

    def __init__(self, session_name: str, client: Any = None) -> None:
        super().__init__("elastictrain", session_name)
        self._client, self._client_cfg = client, None

    # ------------------------------------------------------------------ run options
    def _run_opts(self) -> runopts:
        o = runopts()
        o.add("coordinator", type_=str, default=os.environ.get("ET_COORDINATOR", "http://127.0.0.1:7707"),
              help="the coordinator's URL [ET_COORDINATOR]")
        o.add("token_file", type_=str, default=os.environ.get("ET_TOKEN_FILE"),
              help="the coordinator's token file [ET_TOKEN_FILE; or set ET_TOKEN]")
        o.add("workdir", type_=str, default=None, help="where the script runs on every node (default: here)")
        o.add("priority", type_=int, default=None, help="-1000..1000, as elastictrain submit --priority")
        o.add("project", type_=str, default=None, help="the project its quota counts against (submit -A)")
        o.add("gpu_type", type_=str, default=None, help="run only on nodes of this GPU type (submit -C)")
        o.add("steps", type_=int, default=None, help="training steps in all (for SRTF-like policies)")
        o.add("epochs", type_=int, default=None, help="epochs in all (progress is measured from the shards)")
        o.add("time_limit", type_=float, default=None, help="seconds it may hold GPUs in all (submit --time)")
        o.add("grace", type_=float, default=None, help="seconds to checkpoint when preempted (submit --grace)")
        o.add("user", type_=str, default=None, help="admin only: submit for this user (submit --user)")
        return o

    def _connect(self, cfg: Optional[Mapping[str, Any]] = None):
        if self._client is not None and (cfg is None or self._client_cfg == _key(cfg)):
            return self._client
        from elastictrain.runtime.client import CoordinatorClient, token_from_file

        cfg = cfg if cfg is not None else self.run_opts().resolve({})
        token = token_from_file(cfg["token_file"], "token_file") if cfg.get("token_file") else \
            (os.environ.get("ET_TOKEN") or None)
        self._client, self._client_cfg = CoordinatorClient(cfg["coordinator"], token, timeout=10.0, retry_for=10.0), \
            _key(cfg)
        return self._client

    # ------------------------------------------------------------------ submit
    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, Any]) -> AppDryRunInfo:
        req = job_request(app, cfg)
        return AppDryRunInfo({"request": req, "coordinator": cfg["coordinator"], "token_file": cfg.get("token_file")},
                             lambda r: f"POST {r['coordinator']}/v1/cluster/jobs\n"
                             + msgspec.json.format(msgspec.json.encode(r["request"]), indent=2).decode())

    def schedule(self, dryrun_info: AppDryRunInfo) -> str:
        r = dryrun_info.request
        return self._connect({"coordinator": r["coordinator"], "token_file": r["token_file"]}).submit(r["request"]).id

    def _validate(self, app: AppDef, scheduler: str, cfg: Any = None) -> None:
        pass  # (a role's resource is not needed: the workers count is the job's size; job_request checks the rest)

    # ------------------------------------------------------------------ read and act
    def _job(self, app_id: str):
        from elastictrain.errors import NotFoundError

        try:
            return self._connect().cluster_job(app_id)
        except NotFoundError:
            return None

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        j = self._job(app_id)
        if j is None:
            return None
        state = STATES.get(j.status, AppState.UNKNOWN)
        nodes = [p.node for p in j.placement] or [""]
        role = Role(name=j.name, image="", entrypoint=j.command[0], args=list(j.command[1:]), num_replicas=len(nodes),
                    min_replicas=None)
        replicas = [ReplicaStatus(id=i, state=state, role=j.name, hostname=n) for i, n in enumerate(nodes)]
        return DescribeAppResponse(app_id=app_id, state=state, num_restarts=max(j.run - 1, 0), msg=j.reason or "",
                                   roles=[role], roles_statuses=[RoleStatus(j.name, replicas)],
                                   ui_url=self._connect().url.rstrip("/") + "/ui",
                                   metadata={"user": j.user, "workers": str(j.workers or j.gpus),
                                             "gpus": f"{j.min_gpus}:{j.gpus}" if j.min_gpus < j.gpus else str(j.gpus),
                                             "runs": str(j.run), "preemptions": str(j.preemptions)})

    def list(self, cfg: Optional[Mapping[str, Any]] = None) -> list[ListAppResponse]:
        return [ListAppResponse(app_id=j.id, state=STATES.get(j.status, AppState.UNKNOWN), name=j.name,
                                app_handle=f"elastictrain://{self.session_name}/{j.id}")
                for j in self._connect().cluster_jobs().jobs]

    def _cancel_existing(self, app_id: str) -> None:
        self._connect().cancel(app_id)

    def log_iter(self, app_id: str, role_name: str, k: int = 0, regex: Optional[str] = None,
                 since: Optional[datetime] = None, until: Optional[datetime] = None, should_tail: bool = False,
                 streams: Optional[Stream] = None) -> Iterable[str]:
        """The output of replica ``k`` (the ``k``-th node of the job's current or last placement;
        with one, every node's), stdout and stderr together, as ``elastictrain logs`` has it;
        ``should_tail`` follows it until the job ends. ``since``/``until`` are not supported."""
        if streams not in (None, Stream.COMBINED):
            raise ValueError("the elastictrain scheduler keeps stdout and stderr as one stream: ask for combined")
        j = self._job(app_id)
        if j is None:
            raise ValueError(f"no job {app_id} at the coordinator")
        nodes = [p.node for p in j.placement]
        node = nodes[k] if len(nodes) > 1 and 0 <= k < len(nodes) else None
        lines = self._lines(app_id, node, should_tail)
        return (line for line in lines if regex is None or re.search(regex, line))

    def _lines(self, app_id: str, node: Optional[str], follow: bool) -> Iterable[str]:
        client, after, tail = self._connect(), 0, ""
        while True:
            page = client.job_logs(app_id, after)
            after = page.next
            text = tail + "".join(c.data.decode("utf-8", "replace") for c in page.chunks
                                  if node is None or c.node == node)
            lines = split_lines(text)
            tail = lines.pop() if lines and not lines[-1].endswith("\n") else ""
            yield from lines
            if page.chunks:
                continue
            if not follow or page.ended:
                if tail:
                    yield tail
                return
            time.sleep(0.5)


def _key(cfg: Mapping[str, Any]) -> tuple:
    return (cfg.get("coordinator"), cfg.get("token_file"))


def create_scheduler(session_name: str, **kwargs: Any) -> ElastictrainScheduler:
    return ElastictrainScheduler(session_name, client=kwargs.get("client"))
