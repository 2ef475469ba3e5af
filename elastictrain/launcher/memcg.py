"""Memory cgroups for etrun's workers: a limit the kernel enforces, and an OOM kill told apart
from any other kill.

A worker killed by the kernel's OOM killer dies of SIGKILL and leaves no Python exception, so
its exit status alone looks like any ``kill -9``. The memory cgroup it ran in counts OOM kills
(``oom_kill`` in ``memory.events`` on cgroup v2, in ``memory.oom_control`` on v1): a count that
went up while the worker ran says why it died.

``etrun --memory-limit N --memory-enforce cgroup`` puts each worker in a memory cgroup of its own
(``etrun-<agent pid>-<local rank>`` under etrun's own), limited to N; the kernel kills a worker
that goes past it, etrun sees the count go up and doubles the limit for the next generation, as
DLRover doubles a pod's memory. That needs write access to etrun's memory cgroup (root, or a
delegated subtree such as ``systemd-run --user -p Delegate=yes``). Without it, ``--memory-enforce
rlimit`` (the default) caps each worker's data segment instead, and the node's own cgroup still
tells a kernel OOM kill from another kill.
"""

from __future__ import annotations

import errno
import os
from typing import Optional

from ..errors import ConfigError

__all__ = ["own_memory_cgroup", "oom_kills", "join", "WorkerCgroup"]

_ROOT = "/sys/fs/cgroup"


def own_memory_cgroup(pid: str = "self") -> Optional[str]:
    """The directory of the memory cgroup process ``pid`` is in (v1's memory hierarchy, or the
    v2 unified one), or None where there is none to read."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:  # v1: "4:memory:/path"
        parts = line.split(":", 2)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            path = os.path.join(_ROOT, "memory", parts[2].lstrip("/"))
            return path if os.path.isdir(path) else None
    for line in lines:  # v2: "0::/path"
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
            path = os.path.join(_ROOT, parts[2].lstrip("/"))
            if os.path.exists(os.path.join(path, "memory.events")):
                return path
    return None


def oom_kills(path: Optional[str]) -> Optional[int]:
    """How many processes the kernel's OOM killer has killed in the memory cgroup at ``path``
    (None: not known)."""
    if not path:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            with open(os.path.join(path, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and value.strip().isdigit():
                        return int(value)
        except OSError:
            continue
    return None


def join(path: str, pid: int) -> bool:
    """Move process ``pid`` into the cgroup at ``path``; False if it is gone or not allowed."""
    try:
        _write(os.path.join(path, "cgroup.procs"), str(pid))
        return True
    except OSError:
        return False


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class WorkerCgroup:
    """The memory cgroup one local worker slot runs in, across generations."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.v2 = not path.startswith(os.path.join(_ROOT, "memory") + os.sep)

    @classmethod
    def create(cls, name: str, limit: int) -> "WorkerCgroup":
        """Make (or reuse) the cgroup ``name`` under this process's memory cgroup, limited to
        ``limit`` bytes.

        Raises:
            ConfigError: there is no memory cgroup to put it under, or no permission to.
        """
        parent = own_memory_cgroup()
        if parent is None:
            raise ConfigError("--memory-enforce cgroup: this machine shows no memory cgroup for etrun (/proc/self/"
                              "cgroup); use --memory-enforce rlimit")
        path = os.path.join(parent, name)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--memory-enforce cgroup: cannot make a memory cgroup under {parent} "
                              f"({os.strerror(exc.errno or errno.EACCES)}): run etrun as root or in a delegated "
                              "cgroup (systemd-run -p Delegate=yes), or use --memory-enforce rlimit") from None
        cg = cls(path)
        if cg.v2 and not os.path.exists(os.path.join(path, "memory.max")):
            try:  # the memory controller must be enabled for the children of etrun's cgroup
                _write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
            except OSError as exc:
                cg.remove()
                raise ConfigError(f"--memory-enforce cgroup: the memory controller is not enabled below {parent} "
                                  f"and cannot be ({os.strerror(exc.errno or errno.EACCES)}); use "
                                  "--memory-enforce rlimit") from None
        cg.set_limit(limit)
        return cg

    def set_limit(self, limit: int) -> None:
        if self.v2:
            _write(os.path.join(self.path, "memory.max"), str(limit))
            try:  # no swapping past it either: the limit is the worker's memory
                _write(os.path.join(self.path, "memory.swap.max"), "0")
            except OSError:
                pass
            return
        mem, memsw = (os.path.join(self.path, n) for n in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"))
        # v1 keeps memsw >= mem: raise memsw first when growing, mem first when shrinking
        for order in ((memsw, mem), (mem, memsw)):
            try:
                for p in order:
                    if os.path.exists(p):
                        _write(p, str(limit))
                return
            except OSError:
                continue
        _write(mem, str(limit))  # without swap accounting: the memory limit alone (raises if refused)

    def oom_kills(self) -> Optional[int]:
        return oom_kills(self.path)

    def join(self, pid: int) -> bool:
        """Move process ``pid`` (and, from then on, its children) into the cgroup."""
        return join(self.path, pid)

    def remove(self) -> None:
        """Remove the cgroup (once its processes are gone; a failure is left for the next run)."""
        try:
            os.rmdir(self.path)
        except OSError:
            pass
