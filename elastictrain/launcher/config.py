"""``LaunchConfig``: everything ``etrun`` needs, validated once (torchrun's layering)."""

from __future__ import annotations

import glob
import os
import shutil
from dataclasses import dataclass, field
from typing import Optional

from ..errors import ConfigError

__all__ = ["LaunchConfig", "parse_nnodes", "parse_nproc", "parse_std_spec", "parse_rdzv_conf", "Std"]


class Std:
    """Which streams go to files (redirects) or to files and the console (tee), as torchrun."""

    NONE, OUT, ERR, ALL = 0, 1, 2, 3


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
    preload: tuple[str, ...] = ("torch",)
    run: int = 0  # cluster mode: the scheduler's run this agent belongs to (--rdzv-conf run=N)

    def __post_init__(self) -> None:
        if not 1 <= self.min_nodes <= self.max_nodes:
            raise ConfigError(f"--nnodes {self.min_nodes}:{self.max_nodes}: need 1 <= MIN <= MAX")
        if self.nproc_per_node < 1:
            raise ConfigError(f"--nproc-per-node must be >= 1, got {self.nproc_per_node}")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.monitor_interval <= 0 or self.shutdown_grace < 0:
            raise ConfigError("--monitor-interval must be > 0 and --shutdown-grace >= 0")
        if self.module and self.no_python:
            raise ConfigError("--module and --no-python cannot be used together")
        if self.max_nodes > 1 and self.coordinator is None:
            raise ConfigError("--nnodes with more than one node needs a shared coordinator: start "
                              "`elastictrain coordinator` and pass --coordinator http://HOST:PORT "
                              "(or --rdzv-endpoint HOST:PORT) to every etrun")

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
