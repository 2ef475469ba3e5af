"""``etrun``: a drop-in for ``torchrun`` driven by the elastictrain coordinator.

Layered as torchrun is: :func:`get_args_parser` -> :func:`config_from_args` ->
:class:`LaunchConfig` -> :func:`launch`. Every flag takes both spellings
(``--nproc-per-node`` / ``--nproc_per_node``) and an environment variable ``ET_<FLAG>``
(``ET_NPROC_PER_NODE``); an unknown flag is rejected with the closest known one.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import shutil
import sys
from importlib.util import find_spec
from typing import Optional, Sequence

from ..errors import ConfigError
from .config import (DEFAULT_PRELOAD, LaunchConfig, command_digest, parse_endpoint, parse_nnodes, parse_nproc, parse_rdzv_conf,
                     parse_signals, parse_size, parse_std_spec)

__all__ = ["get_args_parser", "config_from_args", "launch", "main"]

log = logging.getLogger("etrun")
_BACKENDS = ("elastictrain", "c10d", "static", "etcd", "etcd-v2")


class _Parser(argparse.ArgumentParser):
    def known_flags(self) -> list[str]:
        return [s for a in self._actions for s in a.option_strings]

    def error(self, message: str):  # argparse's hook; add a suggestion for unknown flags
        flags = self.known_flags()
        for token in message.replace(",", " ").split():
            token = token.rstrip(":")  # ("argument --nnodes: invalid value": a known flag, no suggestion)
            if token.startswith("-") and token not in flags:
                close = _closest(token.split("=")[0], flags)
                if close:
                    message += f" (did you mean {close}?)"
                break
        super().error(message)


def _closest(token: str, flags: list[str]) -> Optional[str]:
    """The known flag ``token`` most likely misspells, or None: names are compared without their
    dashes (``--profile`` is not ``--role``), and a unique known flag it begins is taken."""
    bare = token.lstrip("-").replace("_", "-")
    longs = {f.lstrip("-"): f for f in flags if f.startswith("--") and "_" not in f}
    starts = [f for name, f in longs.items() if name.startswith(bare)]
    if len(bare) >= 3 and len(starts) == 1:
        return starts[0]
    close = difflib.get_close_matches(bare, list(longs), n=1, cutoff=0.8)
    return longs[close[0]] if close else None


def _env(flag: str, default):
    return os.environ.get("ET_" + flag.upper().replace("-", "_"), default)


def _add(p: argparse.ArgumentParser, flag: str, *short: str, **kw) -> None:
    names = list(short) + [f"--{flag}"]
    if "-" in flag:
        names.append("--" + flag.replace("-", "_"))
    if kw.get("action") in ("store_true",):
        kw["default"] = str(_env(flag, "")).lower() in ("1", "true", "yes")
    else:
        kw["default"] = _env(flag, kw.get("default"))
    p.add_argument(*names, **kw)


def get_args_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="etrun", allow_abbrev=False,
                description="Launch an elastic, fault-tolerant training job (torchrun-compatible).")
    # ---- torchrun's flags
    _add(p, "nnodes", default="1:1", help="N or MIN:MAX agents (nodes)")
    _add(p, "nproc-per-node", default="1", help="workers per node: a number, auto, cpu or gpu")
    _add(p, "rdzv-backend", default="elastictrain", choices=_BACKENDS,
         help="elastictrain (default): --rdzv-endpoint is a running coordinator; c10d or static: as torchrun, "
         "the node that owns --rdzv-endpoint HOST:PORT hosts the coordinator there, the others join it")
    _add(p, "rdzv-endpoint", default="", help="HOST:PORT or URL of the coordinator (same as --coordinator)")
    _add(p, "rdzv-id", default=None, help="job id shared by every agent of the job (TORCHELASTIC_RUN_ID)")
    _add(p, "rdzv-conf", default="", help="key=value,...: agent_timeout, join_timeout, last_call_timeout, poll_interval, "
         "is_host (c10d: 1 hosts the coordinator, 0 joins), run (set by the node daemon)")
    _add(p, "standalone", action="store_true", help="single node with an embedded coordinator")
    _add(p, "max-restarts", type=int, default=0, help="worker-failure restarts before the job fails")
    _add(p, "monitor-interval", type=float, default=0.1, help="seconds between worker checks")
    _add(p, "start-method", default="spawn", choices=["spawn", "fork", "forkserver"],
         help="accepted for compatibility; workers are always fresh processes")
    _add(p, "event-log-handler", default="null",
         help="accepted for compatibility; etrun's events go to the coordinator's event log")
    _add(p, "role", default="default", help="worker role (ROLE_NAME)")
    _add(p, "log-dir", default=None, help="per-rank logs, error files and the embedded coordinator's db")
    _add(p, "redirects", "-r", default="0", help="0|1|2|3 or 0:1,1:2: streams to log files only")
    _add(p, "tee", "-t", default="0", help="0|1|2|3 or 0:1,1:2: streams to log files and the console")
    _add(p, "local-ranks-filter", default="", help="local ranks whose output reaches the console, e.g. 0,1")
    _add(p, "duplicate-stdout-filters", default="",
         help="comma-separated words: workers' stdout lines containing one are also written to "
         "filtered_stdout.log in the attempt's log directory")
    _add(p, "duplicate-stderr-filters", default="", help="the same for stderr (filtered_stderr.log)")
    _add(p, "node-rank", type=int, default=-1, help="fixed node rank (default: assigned by the coordinator)")
    _add(p, "master-addr", default="127.0.0.1", help="for --nnodes 1 without a coordinator")
    _add(p, "master-port", type=int, default=None, help="fixed MASTER_PORT (default: a free port per generation)")
    _add(p, "local-addr", default=None, help="this node's address as other nodes reach it")
    _add(p, "logs-specs", default=None, help="accepted for compatibility; etrun lays out logs itself (--log-dir)")
    _add(p, "numa-binding", default=None, choices=["node", "socket", "exclusive", "core-complex"],
         help="bind each worker to the CPUs of its GPU's NUMA node (node); without GPUs it is ignored "
         "with a warning")
    _add(p, "profile", type=int, default=0, metavar="N",
         help="a profiling run: train N iterations after --profile-warmup, then print each worker's stage and "
         "communication profiles (as `elastictrain profile -n N -- etrun ...`); 0: off")
    _add(p, "profile-warmup", type=int, default=5, metavar="W", help="with --profile: iterations before measuring")
    _add(p, "signals-to-handle", default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
         help="signals the agent handles: the node leaves the job and the signal goes on to the workers "
         "(SIGINT and SIGHUP as SIGTERM, so workers checkpoint); e.g. add SIGUSR1 under Slurm")
    _add(p, "virtual-local-rank", action="store_true",
         help="every worker sees LOCAL_RANK=0 and only its own GPU (CUDA_VISIBLE_DEVICES)")
    _add(p, "module", "-m", action="store_true", help="run the entrypoint as a module (python -m)")
    _add(p, "no-python", action="store_true", help="run the entrypoint as a program, not a Python script")
    _add(p, "run-path", action="store_true", help="run the script with runpy.run_path")
    # ---- ours
    _add(p, "coordinator", default=os.environ.get("ET_COORDINATOR"), help="URL of a running coordinator")
    _add(p, "token-file", default=os.environ.get("ET_TOKEN_FILE"), help="the coordinator's token file")
    p.add_argument("--shutdown-grace", "--shutdown_grace", "--shutdown-timeout", "--shutdown_timeout",
                   dest="shutdown_grace", type=float,
                   default=_env("shutdown-grace", os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", 60.0)),
                   help="seconds workers get after SIGTERM to checkpoint before SIGKILL (torchrun's "
                   "--shutdown-timeout; default 60, or $TORCH_ELASTIC_SHUTDOWN_TIMEOUT)")
    _add(p, "restart-grace", type=float, default=3.0,
         help="seconds surviving workers get after SIGTERM when the group restarts")
    _add(p, "warm-spares", type=int, default=-1,
         help="pre-started interpreters kept for fast restarts (-1: one per local worker, 0: none)")
    _add(p, "preload", default=",".join(DEFAULT_PRELOAD),
         help="modules the zygote (or warm spares) import ahead (comma-separated; default: what a DDP step imports)")
    _add(p, "zygote", default="on", choices=("on", "off", "keep"),
         help="on (default, Linux): one process imports --preload once at launch and every worker is forked "
         "from it (a worker, a replacement, is ready in milliseconds); keep: the same process is kept between "
         "launches of this user and environment, so the next launch skips the imports too; off: warm spares "
         "(--warm-spares)")
    _add(p, "zygote-idle", type=float, default=600.0,
         help="--zygote keep: seconds a kept zygote waits with no etrun and no worker before it exits (default 600)")
    _add(p, "memory-limit", default=None,
         help="each worker's memory limit (RLIMIT_DATA), e.g. 2G; after an out-of-memory failure the next "
         "generation gets twice as much, up to --max-memory-limit")
    _add(p, "memory-enforce", default="rlimit", choices=("rlimit", "cgroup"),
         help="how --memory-limit is enforced: rlimit (the worker's data segment; running out raises in it) or "
         "cgroup (a memory cgroup per worker, all its memory counted; the kernel kills it past the limit and "
         "etrun tells that OOM kill apart; needs write access to etrun's memory cgroup, e.g. root)")
    _add(p, "oom-policy", default="fail", choices=("fail", "accumulate"),
         help="after a GPU out-of-memory failure: fail (restart as any failure), or accumulate: every worker's "
         "micro-batch halves and gradient accumulation doubles (ET_ACCUMULATE; the global batch stays), up to "
         "--max-accumulate")
    _add(p, "max-accumulate", type=int, default=64, help="the most micro-batches per step --oom-policy accumulate "
         "may reach; out of memory there fails the job")
    _add(p, "max-memory-limit", default=None,
         help="the largest limit the doubling may reach (default: this machine's memory); a worker that runs out "
         "of memory there fails the job")
    _add(p, "group", action="store_true",
         help="interleave 2-4 scripts in one process per local rank (Muri): `--group a.py b.py`, or with "
         "arguments `--group a.py --lr 0.1 : b.py --steps 9`")
    _add(p, "horovod", default="auto", choices=["auto", "on", "off"],
         help="give the workers Horovod's gloo environment (HOROVOD_RANK, ...) and serve its rendezvous, "
         "elastic recovery included (auto: when Horovod is installed; single-node jobs)")
    p.add_argument("training_script", help="the script (or module / program) to run")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def _coordinator_url(args) -> Optional[str]:
    if args.standalone:
        return None
    url = args.coordinator or args.rdzv_endpoint or None
    if url and not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url


def _hosted_endpoint(args, max_nodes: int) -> Optional[tuple[str, int]]:
    """torchrun's habits where one of the nodes serves the rendezvous: ``--rdzv-backend c10d``
    (or ``static``) with ``--rdzv-endpoint HOST:PORT``, or the classic multi-node static launch
    ``--nnodes 2 --node-rank R --master-addr A --master-port P``. None: not such a launch."""
    if args.standalone or args.coordinator:
        return None
    if args.rdzv_backend in ("etcd", "etcd-v2"):
        raise ConfigError(f"--rdzv-backend {args.rdzv_backend}: etcd is not supported; use c10d with "
                          "--rdzv-endpoint HOST:PORT (one node hosts the rendezvous), or a coordinator")
    if args.rdzv_backend in ("c10d", "static") and args.rdzv_endpoint:
        return parse_endpoint(args.rdzv_endpoint)
    if not args.rdzv_endpoint and max_nodes > 1 and args.master_port:
        return parse_endpoint(f"{args.master_addr}:{args.master_port}", "--master-addr/--master-port")
    return None


def _warn_ignored(args) -> None:
    if args.event_log_handler not in (None, "null"):
        log.warning("--event-log-handler %s is ignored: etrun's events go to the coordinator's event log "
                    "(`elastictrain status`)", args.event_log_handler)
    if args.logs_specs:
        log.warning("--logs-specs %s is ignored: etrun writes logs under --log-dir itself", args.logs_specs)
    if args.numa_binding and not _gpus_visible():
        log.warning("--numa-binding %s is ignored: no GPU is visible, so there is no GPU to bind near",
                    args.numa_binding)


def _gpus_visible() -> bool:
    from .config import _gpu_count

    return _gpu_count() > 0


def _filters(value: str) -> tuple[str, ...]:
    return tuple(x for x in (v.strip() for v in str(value).split(",")) if x)


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """Validate parsed flags into a :class:`LaunchConfig`.

    Raises:
        ConfigError: a flag's value is invalid; the message names the flag.
    """
    lo, hi = parse_nnodes(str(args.nnodes))
    if args.standalone:
        lo = hi = 1
    nproc = parse_nproc(str(args.nproc_per_node))
    conf = parse_rdzv_conf(args.rdzv_conf)
    filt = None
    if args.local_ranks_filter:
        try:
            filt = frozenset(int(x) for x in str(args.local_ranks_filter).split(","))
        except ValueError:
            raise ConfigError(f"--local-ranks-filter {args.local_ranks_filter!r}: use ranks like 0,1") from None
    hosted = _hosted_endpoint(args, hi)
    if hosted is not None and args.rdzv_id in (None, "none"):
        run_id = "none"  # torchrun's default id, the same on every node
    else:
        # no id given: one derived from the working directory and the command (torchrun draws a
        # random one), so that the same command run again is the same job and resumes it
        run_id = args.rdzv_id if args.rdzv_id not in (None, "none") else \
            "et-" + command_digest(args.training_script, args.training_script_args, bool(args.module))
    is_host = conf.get("is_host")
    if is_host is not None:
        if is_host.lower() not in ("0", "1", "true", "false"):
            raise ConfigError(f"--rdzv-conf is_host={is_host!r}: use 1 (this node hosts) or 0 (it joins)")
        is_host = is_host.lower() in ("1", "true")
    master_port = int(args.master_port) if args.master_port else None
    if hosted is not None and master_port == hosted[1]:
        master_port = None  # the coordinator listens there; the workers' store takes a free port
    _warn_ignored(args)
    entrypoint, script_args, module = args.training_script, tuple(args.training_script_args), bool(args.module)
    if args.group:
        if args.module or args.no_python:
            raise ConfigError("--group runs Python scripts; it cannot be combined with --module or --no-python")
        from .group_main import parse_group

        parse_group([entrypoint, *script_args])  # refuse a bad job list here, not in every worker
        entrypoint, script_args, module = "elastictrain.launcher.group_main", (entrypoint, *script_args), True
    if args.zygote == "keep" and not float(args.zygote_idle) > 0:
        raise ConfigError(f"--zygote keep needs --zygote-idle > 0 seconds, got {args.zygote_idle!r}")
    return LaunchConfig(
        entrypoint=entrypoint, args=script_args,
        min_nodes=lo, max_nodes=hi, nproc_per_node=nproc, run_id=run_id,
        coordinator=None if hosted else _coordinator_url(args), token_file=args.token_file, role=args.role,
        max_restarts=int(args.max_restarts), monitor_interval=float(args.monitor_interval),
        poll_interval=float(conf.get("poll_interval", 0.2)),
        agent_timeout=float(conf.get("agent_timeout", 10.0)), join_timeout=float(conf.get("join_timeout", 600)),
        last_call=float(conf.get("last_call_timeout", 1.0)), run=_int_conf(conf, "run"),
        start_method=args.start_method, log_dir=args.log_dir,
        redirects=parse_std_spec(str(args.redirects), nproc, "--redirects"),
        tee=parse_std_spec(str(args.tee), nproc, "--tee"), local_ranks_filter=filt,
        node_rank=int(args.node_rank), master_addr=args.master_addr,
        master_port=master_port, local_addr=args.local_addr,
        module=module, no_python=bool(args.no_python), run_path=bool(args.run_path),
        shutdown_grace=float(args.shutdown_grace), restart_grace=float(args.restart_grace),
        warm_spares=int(args.warm_spares), preload=tuple(x for x in str(args.preload).split(",") if x),
        zygote=args.zygote != "off", zygote_keep=float(args.zygote_idle) if args.zygote == "keep" else 0.0,
        rdzv_host=hosted, is_host=is_host, virtual_local_rank=bool(args.virtual_local_rank),
        numa_binding=args.numa_binding if args.numa_binding and _gpus_visible() else None,
        signals=parse_signals(str(args.signals_to_handle)),
        stdout_filters=_filters(args.duplicate_stdout_filters), stderr_filters=_filters(args.duplicate_stderr_filters),
        horovod=_horovod(args), horovod_required=args.horovod == "on", **_memory_limits(args),
        oom_policy=args.oom_policy, max_accumulate=_accumulate_limit(args.max_accumulate),
    )


def check_entrypoint(cfg: LaunchConfig) -> None:
    """A script or program that is not there fails the launch at once, naming the path (every
    restart would fail the same way; torchrun restarts it ``--max-restarts`` times)."""
    if cfg.module and cfg.entrypoint == "elastictrain.launcher.group_main":
        from .group_main import parse_group

        for spec in parse_group(cfg.args):
            _check_script(spec.script, "--group script")
    elif cfg.no_python:
        _check_program(cfg.entrypoint)
    elif not cfg.module:
        _check_script(cfg.entrypoint, "training script")
    else:  # -m: its top-level package, found as the worker's `python -m` will (the working directory first)
        top = cfg.entrypoint.split(".")[0]
        sys.path.insert(0, os.getcwd())
        try:
            found = find_spec(top) is not None  # (a top-level name: nothing is imported to find it)
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path.pop(0)
        if not found:
            raise ConfigError(f"-m {cfg.entrypoint}: no module named {top!r} in the working directory or this "
                              f"Python's path ({sys.executable}); install it or run etrun from its directory")


def _check_script(path: str, what: str) -> None:
    """A script that is not there fails the launch at once (every restart would fail the same way)."""
    if not os.path.isfile(path):
        where = "" if os.path.isabs(path) else f" (looked in {os.getcwd()})"
        raise ConfigError(f"the {what} {path} does not exist{where}; check the path, or run etrun from the "
                          "directory it is relative to")


def _check_program(name: str) -> None:
    """``--no-python``: the program must be there and executable."""
    found = (name if os.path.isfile(name) and os.access(name, os.X_OK) else None) if os.sep in name else \
        shutil.which(name)
    if found is None:
        raise ConfigError(f"--no-python: the program {name} was not found or is not executable"
                          f"{'' if os.sep in name else ' on PATH'}; check the name, or give its path")


def _horovod(args) -> bool:
    if args.horovod == "off":
        return False
    if args.group:
        if args.horovod == "on":
            raise ConfigError("--horovod on cannot run with --group: Horovod keeps one context per process (its "
                              "global state), so two Horovod jobs cannot share a process")
        return False
    installed = find_spec("horovod") is not None
    if args.horovod == "on" and not installed:
        raise ConfigError("--horovod on: Horovod is not installed in this environment; build it with `make horovod`")
    return installed


def _accumulate_limit(n: int) -> int:
    if not 1 <= n <= 4096:
        raise ConfigError(f"--max-accumulate must be in [1, 4096], got {n}")
    return n


def _memory_limits(args) -> dict:
    if args.memory_limit is None:
        if args.max_memory_limit is not None:
            raise ConfigError("--max-memory-limit needs --memory-limit (the limit to start from)")
        if args.memory_enforce != "rlimit":
            raise ConfigError("--memory-enforce cgroup needs --memory-limit (the limit to start from)")
        return {}
    limit = parse_size(args.memory_limit, "--memory-limit")
    if args.max_memory_limit is not None:
        top = parse_size(args.max_memory_limit, "--max-memory-limit")
    else:
        import psutil

        top = max(limit, psutil.virtual_memory().total)
    if top < limit:
        raise ConfigError(f"--max-memory-limit {args.max_memory_limit} is below --memory-limit {args.memory_limit}")
    return {"memory_limit": limit, "max_memory_limit": top, "memory_enforce": args.memory_enforce}


def _int_conf(conf: dict, key: str) -> int:
    try:
        value = int(conf.get(key, 0))
    except ValueError:
        raise ConfigError(f"--rdzv-conf {key}={conf[key]!r}: use a whole number") from None
    if value < 0:
        raise ConfigError(f"--rdzv-conf {key} must be >= 0, got {value}")
    return value


def launch(config: LaunchConfig) -> int:
    """Run the job to its end; returns the process exit code."""
    from .agent import Agent

    return Agent(config).run()


def main(argv: Optional[Sequence[str]] = None) -> int:
    level = os.environ.get("ET_LOG_LEVEL", "").upper()
    logging.basicConfig(level=level or "WARNING", format="[etrun] %(levelname)s %(message)s")
    log.setLevel(level or "INFO")  # generations, restarts and the rendezvous are shown by default
    parser = get_args_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    try:
        if args.profile:
            return _profiling_run(args, argv)
        config = config_from_args(args)
        check_entrypoint(config)
        return launch(config)
    except ConfigError as exc:
        print(f"etrun: error: {exc}", file=sys.stderr)
        return 2


def _profiling_run(args, argv: list) -> int:
    """``--profile N``: this same launch, without the two flags, under ``elastictrain profile``."""
    if not 1 <= args.profile <= 1_000_000 or not 0 <= args.profile_warmup <= 1_000_000:
        raise ConfigError(f"--profile must be 1 to 1000000 iterations and --profile-warmup 0 to 1000000, got "
                          f"{args.profile} and {args.profile_warmup}")
    rest, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == args.training_script:  # the script and its own arguments: kept as they are
            rest += argv[i:]
            break
        name = a.split("=", 1)[0].replace("_", "-")
        if name in ("--profile", "--profile-warmup"):
            i += 1 if "=" in a else 2
            continue
        rest.append(a)
        i += 1
    from argparse import Namespace

    from ..cli import _profile

    return _profile(Namespace(cmd=[sys.executable, "-m", "elastictrain.launcher.cli", *rest],
                              iterations=args.profile, warmup=args.profile_warmup, json=None, timeout=None))


if __name__ == "__main__":
    sys.exit(main())

