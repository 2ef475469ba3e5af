"""A zygote kept between launches (``etrun --zygote keep``): the next etrun forks its workers at once.

A per-launch zygote (:mod:`.zygote`) pays the preload's imports (torch, torch._dynamo: 2-3 s on a
small machine) at every launch. A *kept* one outlives the etrun that started it: the next etrun
of the same user, with the same Python, preload list and import-time environment, connects to it
and its workers are forks from the first moment. It retires after ``--zygote-idle`` seconds
(default 600) with no etrun connected and no worker alive.

Where it lives: a Unix socket ``zygote-<key>.sock`` in a directory only its user can enter
(``$ET_ZYGOTE_DIR``, which a node daemon sets for its tasks so that their zygotes are its own,
else ``$XDG_RUNTIME_DIR/elastictrain``, else ``<tmp>/elastictrain-<uid>``; one that is not a private
directory of this user is refused, and etrun falls back to a per-launch zygote). The key is a
digest of what the imports could depend on: the Python executable and version, the preload list
and the zygote's environment, which is the launch's variables that configure Python, torch or its
native libraries (:data:`IMPORT_ENV`), plus the user's ``PATH``, ``HOME`` and locale
(:func:`zygote_env`); a launch that differs in any of them gets its own zygote. (So the zygote's
imports see the same environment whichever launch started it, and it holds none of a launch's
other variables: a job's tokens stay out of it.) The zygote also
checks each connecting peer's uid. Its own output goes to ``zygote-<key>.log`` beside the socket.

What a worker keeps from the zygote is what it keeps from a per-launch one: the imported
modules. Its environment, directory, arguments, signals and output are the launch's (the runner
applies them after the fork). A client that goes (closes, or is killed) takes its workers with it.
``python -m elastictrain.launcher.zygote --stop`` stops this user's kept zygotes.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from typing import Optional

__all__ = ["IMPORT_ENV", "zygote_env", "key", "socket_dir", "connect", "serve_kept", "stop_all"]

log = logging.getLogger("etrun")

#: environment variables (exact names, and prefixes ending in ``_``) that may change what an
#: import does: they select the zygote, with the Python executable and the preload list
IMPORT_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONDONTWRITEBYTECODE",
              "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONOPTIMIZE", "LD_LIBRARY_PATH", "LD_PRELOAD", "VIRTUAL_ENV",
              "TORCH_", "PYTORCH_", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "CUDA_", "NCCL_", "HF_", "TF_",
              "XLA_", "NUMEXPR_", "TRITON_", "ET_PRELOAD",
              # and the user's basics, which the zygote needs to run at all
              "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_", "TZ", "TMPDIR")
_CONNECT_TIMEOUT = 10.0  # seconds a newly started zygote may take to listen (it listens before importing)
_started: list = []  # the kept zygotes this process started (kept referenced: they outlive our wait)


def _relevant(name: str) -> bool:
    if name.endswith("_VISIBLE_DEVICES"):  # read when the device is first used, in the worker (below)
        return False
    return any(name.startswith(p) if p.endswith("_") else name == p for p in IMPORT_ENV)


def zygote_env(env: dict[str, str]) -> dict[str, str]:
    """The kept zygote's environment: the launch's variables named by :data:`IMPORT_ENV`, less the
    device lists (``CUDA_VISIBLE_DEVICES`` and the like). Those are read when a process first uses
    its GPUs (the CUDA driver's init), which happens in the worker after the fork, with the
    worker's own environment: the zygote never touches a GPU. Leaving them out lets a job resumed
    on other GPUs of the node fork from the same zygote."""
    return {k: v for k, v in env.items() if _relevant(k)}


def key(preload: tuple[str, ...], env: dict[str, str]) -> str:
    """The digest naming the zygote for this Python, preload list and import-time environment."""
    parts = [sys.executable, sys.version, list(preload), sorted(zygote_env(env).items())]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def socket_dir() -> str:
    """This user's private directory for kept zygotes, created if missing.

    Raises:
        OSError: it exists but is not a directory of this user that only this user can enter.
    """
    uid = os.getuid()
    given = os.environ.get("ET_ZYGOTE_DIR", "")  # a node daemon's own (elastictrain node: node_zygote_dir)
    run = os.environ.get("XDG_RUNTIME_DIR", "")
    path = given or (os.path.join(run, "elastictrain") if run and private_dir(run, uid) else
                     os.path.join(tempfile.gettempdir(), f"elastictrain-{uid}"))
    if len(path) > 60 and not given:  # a Unix socket's path is at most 107 bytes
        path = f"/tmp/elastictrain-{uid}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    if not private_dir(path, uid):
        raise OSError(errno.EPERM, f"{path} is not a directory that only user {uid} can enter "
                      "(remove it, or set XDG_RUNTIME_DIR to a private directory)")
    return path


def private_dir(path: str, uid: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077


def connect(preload: tuple[str, ...], env: dict[str, str], idle: float) -> socket.socket:
    """A connection to this launch's kept zygote, started first if there is none (the caller then
    waits for its ``R``, sent once its imports are done).

    Raises:
        OSError: no private directory, or the zygote could not be started or reached.
    """
    d = socket_dir()
    name = key(preload, env)
    path = os.path.join(d, f"zygote-{name}.sock")
    sock = _reuse(path)
    if sock is not None:
        return sock
    with open(os.path.join(d, f"zygote-{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one etrun starts it; the others connect to it
        sock = _reuse(path)  # another etrun started it meanwhile
        if sock is not None:
            return sock
        try:
            os.unlink(path)  # a socket nobody listens on: its zygote died
        except FileNotFoundError:
            pass
        out = open(os.path.join(d, f"zygote-{name}.log"), "ab")
        proc = subprocess.Popen([sys.executable, "-u", "-m", "elastictrain.launcher.zygote", "--keep", path,
                                 ",".join(preload), repr(float(idle))],
                                env=zygote_env(env), cwd="/", stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)
        out.close()
        _started.append(proc)
        deadline = time.monotonic() + _CONNECT_TIMEOUT
        while True:
            sock = _try(path)
            if sock is not None:
                log.info("started a kept zygote (pid %d, %s)", proc.pid, path)
                return sock
            if proc.poll() is not None or time.monotonic() > deadline:
                raise OSError(errno.ECONNREFUSED, f"the kept zygote did not start (see {path[:-5]}.log)")
            time.sleep(0.01)


def _reuse(path: str) -> Optional[socket.socket]:
    sock = _try(path)
    if sock is not None:
        log.info("forking workers from the kept zygote %s", path)
    return sock


def _try(path: str) -> Optional[socket.socket]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
    except OSError:
        s.close()
        return None
    return s


def serve_kept(path: str, preload: list[str], idle: float) -> None:
    """The kept zygote's main: listen on ``path`` (before importing, so etruns can connect while it
    imports), serve until idle, then remove the socket."""
    from .zygote import _serve

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    with open(path[:-5] + ".pid", "w") as f:
        f.write(f"{os.getpid()}\n")
    ino = os.stat(path).st_ino

    def retire() -> None:
        try:
            if os.stat(path).st_ino == ino:  # not a successor's socket
                os.unlink(path)
                os.unlink(path[:-5] + ".pid")
        except OSError:
            pass

    try:
        _serve(None, preload, listener=listener, idle=idle, retire=retire)
    finally:
        retire()
        listener.close()


def stop_all(timeout: float = 10.0, directory: Optional[str] = None) -> int:
    """SIGTERM every kept zygote of this user (its workers die with it), or those of the socket
    ``directory`` given; returns how many."""
    try:
        d = directory or socket_dir()
    except OSError:
        return 0
    if not os.path.isdir(d):
        return 0
    pids = []
    for name in os.listdir(d):
        if not (name.startswith("zygote-") and name.endswith(".pid")):
            continue
        try:
            pid = int(open(os.path.join(d, name)).read().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"elastictrain.launcher.zygote\0--keep" not in f.read():
                    continue  # the pid was reused
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
        except (OSError, ValueError):
            continue
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}") and not _zombie(pid):
            time.sleep(0.02)
    return len(pids)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
