"""``LaunchConfig``: everything ``etrun`` needs, validated once (torchrun's layering)."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import signal
from dataclasses import dataclass, field
from typing import Optional

from ..errors import ConfigError

__all__ = ["LaunchConfig", "command_digest", "parse_nnodes", "parse_nproc", "parse_std_spec", "parse_rdzv_conf", "parse_signals",
           "parse_endpoint", "Std", "size_text"]


class Std:
    """Which streams go to files (redirects) or to files and the console (tee), as torchrun."""

    NONE, OUT, ERR, ALL = 0, 1, 2, 3


#: what a DDP training step imports, measured with ``python -X importtime`` after ``import torch``
#: (torch 2.13: DDP pulls torch._dynamo, and with it sympy, about 1-2 s on a small machine);
#: tests/unit/launcher/test_preload.py fails when a torch release makes this list short. (With
#: torch._dynamo imported ahead, a script that destroys its process group before its DDP model is
#: freed deadlocked at exit about one run in four: runner._keep_destroyed_groups prevents it.)
DEFAULT_PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch.optim", "torch._dynamo",
                   "elastictrain_torch")


def command_digest(entrypoint: str, args, module: bool = False) -> str:
    """12 hex digits of the working directory and the command (``etrun`` names a job without
    ``--rdzv-id``, and keeps its state, by it: the same command run again is the same job)."""
    entry = os.path.abspath(entrypoint) if os.path.exists(entrypoint) else entrypoint
    key = "\0".join([os.getcwd(), "-m" if module else "", entry, *args])
    return hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class LaunchConfig:
    entrypoint: str
    args: tuple[str, ...]
    min_nodes: int = 1
    max_nodes: int = 1
    nproc_per_node: int = 1
    run_id: str = "default"
    coordinator: Optional[str] = None  # None: embedded
    token_file: Optional[str] = None
    role: str = "default"
    max_restarts: int = 0
    monitor_interval: float = 0.1
    poll_interval: float = 0.2
    agent_timeout: float = 10.0
    join_timeout: float = 600.0
    last_call: float = 1.0
    start_method: str = "spawn"
    log_dir: Optional[str] = None
    redirects: dict[int, int] = field(default_factory=dict)  # local rank -> Std
    tee: dict[int, int] = field(default_factory=dict)
    local_ranks_filter: Optional[frozenset[int]] = None
    node_rank: int = -1
    master_addr: str = "127.0.0.1"
    master_port: Optional[int] = None
    local_addr: Optional[str] = None
    module: bool = False
    no_python: bool = False
    run_path: bool = False
    shutdown_grace: float = 60.0
    restart_grace: float = 3.0
    warm_spares: int = -1  # -1: one per local worker when the entrypoint is Python
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    zygote: bool = True  # workers forked from one process that imported the preload list (zygote.py)
    zygote_keep: float = 0.0  # > 0: that process is kept between launches, this many idle seconds (zygote_keep.py)
    run: int = 0  # cluster mode: the scheduler's run this agent belongs to (--rdzv-conf run=N)
    # torchrun's c10d/static habit: the agent that can listen on this (host, port) serves the
    # coordinator there, embedded; the others join it (None: --coordinator or --standalone)
    rdzv_host: Optional[tuple[str, int]] = None
    is_host: Optional[bool] = None  # --rdzv-conf is_host=1/0 forces the choice
    virtual_local_rank: bool = False  # every worker sees LOCAL_RANK=0 and one GPU
    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    numa_binding: Optional[str] = None  # torchrun's modes; applied where a GPU is visible
    stdout_filters: tuple[str, ...] = ()  # lines of any worker containing one go to filtered_stdout.log
    stderr_filters: tuple[str, ...] = ()
    # each worker's data-segment limit (RLIMIT_DATA) in bytes; doubled after an out-of-memory
    # failure up to max_memory_limit, as DLRover's OOM plan does (None: no limit)
    memory_limit: Optional[int] = None
    max_memory_limit: Optional[int] = None
    # how the limit is enforced: "rlimit" (RLIMIT_DATA: running out raises in the worker) or
    # "cgroup" (a memory cgroup per worker: the kernel kills it, etrun tells, launcher/memcg.py)
    memory_enforce: str = "rlimit"
    # GPU out of memory: "fail", or "accumulate" (the job's micro-batch halves, its accumulation
    # doubles, up to max_accumulate; the global batch stays)
    oom_policy: str = "fail"
    max_accumulate: int = 64
    # Horovod's gloo environment and rendezvous for the workers (launcher/horovod.py); required: --horovod on
    # (on several nodes, a node 0 without a rendezvous is an error; with auto, Horovod is off for that generation)
    horovod: bool = False
    horovod_required: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.min_nodes <= self.max_nodes:
            raise ConfigError(f"--nnodes {self.min_nodes}:{self.max_nodes}: need 1 <= MIN <= MAX")
        if self.nproc_per_node < 1:
            raise ConfigError(f"--nproc-per-node must be >= 1, got {self.nproc_per_node}")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if not 0 <= self.zygote_keep <= 7 * 86400:  # (NaN fails it too)
            raise ConfigError(f"--zygote-idle must be 0 to 604800 seconds, got {self.zygote_keep!r}")
        if self.monitor_interval <= 0 or self.shutdown_grace < 0:
            raise ConfigError("--monitor-interval must be > 0 and --shutdown-grace >= 0")
        if self.module and self.no_python:
            raise ConfigError("--module and --no-python cannot be used together")
        if self.max_nodes > 1 and self.coordinator is None and self.rdzv_host is None:
            raise ConfigError("--nnodes with more than one node needs a shared coordinator: start "
                              "`elastictrain coordinator` and pass --coordinator http://HOST:PORT to every "
                              "etrun, or let one node host it as torchrun does: --rdzv-backend c10d "
                              "--rdzv-endpoint HOST:PORT (HOST is one of the nodes)")

    @property
    def python_entry(self) -> bool:
        return not self.no_python


def parse_nnodes(value: str) -> tuple[int, int]:
    try:
        if ":" in value:
            lo, hi = value.split(":", 1)
            return int(lo), int(hi)
        return int(value), int(value)
    except ValueError:
        raise ConfigError(f"--nnodes {value!r}: use N or MIN:MAX, e.g. 1:4") from None


def _gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") or os.path.exists("/proc/driver/nvidia"):
        return len(glob.glob("/dev/nvidia[0-9]*"))
    return 0


def parse_nproc(value: str) -> int:
    """An int, ``auto`` (GPUs if any, else CPUs), ``cpu`` or ``gpu``; torch is never imported."""
    if value == "cpu":
        return os.cpu_count() or 1
    if value == "gpu":
        n = _gpu_count()
        if n == 0:
            raise ConfigError("--nproc-per-node gpu: no GPU is visible; use a number or `cpu`")
        return n
    if value == "auto":
        return _gpu_count() or os.cpu_count() or 1
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"--nproc-per-node {value!r}: use a number, auto, cpu or gpu") from None


def parse_std_spec(value: str, nproc: int, flag: str) -> dict[int, int]:
    """torchrun's ``-r``/``-t`` value: ``3`` for every rank, or ``0:1,1:2`` per local rank."""
    value = value.strip()
    try:
        if ":" not in value:
            std = int(value)
            if std not in range(4):
                raise ValueError
            return {r: std for r in range(nproc)}
        out = {}
        for item in value.split(","):
            rank, std = item.split(":")
            if int(std) not in range(4):
                raise ValueError
            out[int(rank)] = int(std)
        return out
    except ValueError:
        raise ConfigError(f"{flag} {value!r}: use 0 (none), 1 (stdout), 2 (stderr), 3 (both), "
                          "or per local rank like 0:3,1:1") from None


def parse_rdzv_conf(value: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (x.strip() for x in value.split(","))):
        if "=" not in item:
            raise ConfigError(f"--rdzv-conf item {item!r}: use key=value pairs separated by commas")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def parse_signals(value: str) -> tuple[int, ...]:
    """torchrun's ``--signals-to-handle``: ``SIGTERM,SIGINT,SIGUSR1`` (names or numbers)."""
    out = []
    for item in filter(None, (x.strip() for x in value.split(","))):
        name = item.upper()
        try:
            sig = signal.Signals(int(name)) if name.isdigit() else signal.Signals[name if name.startswith("SIG")
                                                                                   else "SIG" + name]
        except (KeyError, ValueError):
            raise ConfigError(f"--signals-to-handle {item!r}: not a signal; use names like SIGTERM,SIGUSR1") from None
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            raise ConfigError(f"--signals-to-handle {sig.name}: this signal cannot be handled or forwarded")
        out.append(int(sig))
    if not out:
        raise ConfigError("--signals-to-handle is empty; name at least one signal, e.g. SIGTERM")
    return tuple(dict.fromkeys(out))


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def size_text(n: int) -> str:
    """``n`` bytes as people write it: 1 GiB, 512 MiB."""
    for unit, div in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= div:
            return f"{n / div:.4g} {unit}"
    return f"{n} B"


def parse_size(value: str, flag: str) -> int:
    """``512M``, ``2G``, ``1.5GiB`` or a number of bytes; at least 64 MiB, at most 1 PiB."""
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ConfigError(f"{flag} {value!r}: give a size like 512M, 2G or 1.5GiB")
    size = int(float(m.group(1)) * _UNITS[unit])
    if not 64 * 2**20 <= size <= 2**50:
        raise ConfigError(f"{flag} {value!r}: must be between 64 MiB and 1 PiB")
    return size


def parse_endpoint(value: str, flag: str = "--rdzv-endpoint") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) -> (host, port); torchrun's default port 29400 when absent."""
    host, port = value.strip(), "29400"
    if host.startswith("["):
        end = host.find("]")
        host, rest = host[1:end], host[end + 1:]
        if rest.startswith(":"):
            port = rest[1:]
    elif host.count(":") == 1:
        host, port = host.split(":")
    try:
        num = int(port)
    except ValueError:
        num = -1
    if not host or not 0 < num < 65536:
        raise ConfigError(f"{flag} {value!r}: use HOST:PORT with a port in 1..65535, e.g. node0:29400")
    return host, num
