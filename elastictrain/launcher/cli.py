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
import sys
import uuid
from typing import Optional, Sequence

from ..errors import ConfigError
from .config import LaunchConfig, parse_nnodes, parse_nproc, parse_rdzv_conf, parse_std_spec

__all__ = ["get_args_parser", "config_from_args", "launch", "main"]

log = logging.getLogger("etrun")


class _Parser(argparse.ArgumentParser):
    def known_flags(self) -> list[str]:
        return [s for a in self._actions for s in a.option_strings]

    def error(self, message: str):  # argparse's hook; add a suggestion for unknown flags
        flags = self.known_flags()
        for token in message.replace(",", " ").split():
            if token.startswith("-") and token not in flags:
                close = difflib.get_close_matches(token.split("=")[0], flags, n=1, cutoff=0.5)
                if close:
                    message += f" (did you mean {close[0]}?)"
                break
        super().error(message)


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
    _add(p, "rdzv-backend", default="elastictrain",
         help="accepted for compatibility; rendezvous always goes through the coordinator")
    _add(p, "rdzv-endpoint", default="", help="HOST:PORT or URL of the coordinator (same as --coordinator)")
    _add(p, "rdzv-id", default=None, help="job id shared by every agent of the job (TORCHELASTIC_RUN_ID)")
    _add(p, "rdzv-conf", default="", help="key=value,...: agent_timeout, join_timeout, last_call_timeout, poll_interval, run (set by the "
         "node daemon)")
    _add(p, "standalone", action="store_true", help="single node with an embedded coordinator")
    _add(p, "max-restarts", type=int, default=0, help="worker-failure restarts before the job fails")
    _add(p, "monitor-interval", type=float, default=0.1, help="seconds between worker checks")
    _add(p, "start-method", default="spawn", choices=["spawn", "fork", "forkserver"],
         help="accepted for compatibility; workers are always fresh processes")
    _add(p, "role", default="default", help="worker role (ROLE_NAME)")
    _add(p, "log-dir", default=None, help="per-rank logs, error files and the embedded coordinator's db")
    _add(p, "redirects", "-r", default="0", help="0|1|2|3 or 0:1,1:2: streams to log files only")
    _add(p, "tee", "-t", default="0", help="0|1|2|3 or 0:1,1:2: streams to log files and the console")
    _add(p, "local-ranks-filter", default="", help="local ranks whose output reaches the console, e.g. 0,1")
    _add(p, "node-rank", type=int, default=-1, help="fixed node rank (default: assigned by the coordinator)")
    _add(p, "master-addr", default="127.0.0.1", help="for --nnodes 1 without a coordinator")
    _add(p, "master-port", type=int, default=None, help="fixed MASTER_PORT (default: a free port per generation)")
    _add(p, "local-addr", default=None, help="this node's address as other nodes reach it")
    _add(p, "module", "-m", action="store_true", help="run the entrypoint as a module (python -m)")
    _add(p, "no-python", action="store_true", help="run the entrypoint as a program, not a Python script")
    _add(p, "run-path", action="store_true", help="run the script with runpy.run_path")
    # ---- ours
    _add(p, "coordinator", default=os.environ.get("ET_COORDINATOR"), help="URL of a running coordinator")
    _add(p, "token-file", default=os.environ.get("ET_TOKEN_FILE"), help="the coordinator's token file")
    _add(p, "shutdown-grace", type=float, default=60.0,
         help="seconds workers get after SIGTERM to checkpoint before SIGKILL")
    _add(p, "restart-grace", type=float, default=3.0,
         help="seconds surviving workers get after SIGTERM when the group restarts")
    _add(p, "warm-spares", type=int, default=-1,
         help="pre-started interpreters kept for fast restarts (-1: one per local worker, 0: none)")
    _add(p, "preload", default="torch", help="modules warm spares import ahead (comma-separated)")
    _add(p, "group", action="store_true",
         help="interleave 2-4 scripts in one process per local rank (Muri): `--group a.py b.py`, or with "
         "arguments `--group a.py --lr 0.1 : b.py --steps 9`")
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
    run_id = args.rdzv_id if args.rdzv_id not in (None, "none") else uuid.uuid4().hex[:12]
    entrypoint, script_args, module = args.training_script, tuple(args.training_script_args), bool(args.module)
    if args.group:
        if args.module or args.no_python:
            raise ConfigError("--group runs Python scripts; it cannot be combined with --module or --no-python")
        from .group_main import parse_group

        parse_group([entrypoint, *script_args])  # refuse a bad job list here, not in every worker
        entrypoint, script_args, module = "elastictrain.launcher.group_main", (entrypoint, *script_args), True
    return LaunchConfig(
        entrypoint=entrypoint, args=script_args,
        min_nodes=lo, max_nodes=hi, nproc_per_node=nproc, run_id=run_id,
        coordinator=_coordinator_url(args), token_file=args.token_file, role=args.role,
        max_restarts=int(args.max_restarts), monitor_interval=float(args.monitor_interval),
        poll_interval=float(conf.get("poll_interval", 0.2)),
        agent_timeout=float(conf.get("agent_timeout", 10.0)), join_timeout=float(conf.get("join_timeout", 600)),
        last_call=float(conf.get("last_call_timeout", 1.0)), run=_int_conf(conf, "run"),
        start_method=args.start_method, log_dir=args.log_dir,
        redirects=parse_std_spec(str(args.redirects), nproc, "--redirects"),
        tee=parse_std_spec(str(args.tee), nproc, "--tee"), local_ranks_filter=filt,
        node_rank=int(args.node_rank), master_addr=args.master_addr,
        master_port=int(args.master_port) if args.master_port else None, local_addr=args.local_addr,
        module=module, no_python=bool(args.no_python), run_path=bool(args.run_path),
        shutdown_grace=float(args.shutdown_grace), restart_grace=float(args.restart_grace),
        warm_spares=int(args.warm_spares), preload=tuple(x for x in str(args.preload).split(",") if x),
    )


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
    logging.basicConfig(level=os.environ.get("ET_LOG_LEVEL", "WARNING").upper(),
                        format="[etrun] %(levelname)s %(message)s")
    parser = get_args_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        return launch(config)
    except ConfigError as exc:
        print(f"etrun: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
