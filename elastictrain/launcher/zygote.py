"""A zygote: one process per node that imports what a worker imports once, and forks workers.

Without it every worker (and every warm spare) is a fresh interpreter that pays ``import torch``
(about 1-2 s, more when several import at once on a small machine): at launch, and again for a
replacement after a failure unless a warm spare is ready. With it, ``etrun`` starts one zygote
at launch (``python -m elastictrain.launcher.zygote``), which imports the preload list and then
only forks: a worker is ready in milliseconds, 1 s or 1 hour into training.

``--zygote keep`` keeps the zygote between launches instead (:mod:`.zygote_keep`): the next etrun
of the same user and environment connects to it, and its workers are forks from the first moment.

Protocol (a ``SOCK_SEQPACKET`` socket pair, one message per packet): etrun sends ``F`` with three
file descriptors (the worker's stdin, stdout and stderr); the zygote forks and answers ``P
<pid>``; when a child exits, ``X <pid> <wait status>``. At start: ``R`` (ready) or ``U <why>``
(unsafe to fork: etrun falls back to warm spares and says why).

The forked worker is what a spare runner is (:mod:`.runner`): in a session of its own (so
etrun's ``killpg`` reaches it and its children), its stdio on etrun's pipes, signal handlers
back to the defaults, the random generators of ``random`` and numpy reseeded; it reads its
command (environment, working directory, script) from stdin and becomes the worker. It dies
with the zygote, and the zygote with etrun (each watches its parent), so nothing outlives a
killed etrun.

Fork safety: the zygote is single-threaded in Python (no thread of its own, a ``select`` loop);
native threads that libraries start at import (torch's) are theirs to make fork-safe, as for
the fork that starts every DataLoader worker. If a preloaded module starts a Python thread, the
zygote refuses (``U``). Only Linux uses it (macOS: fork after such imports is unsafe).
"""

from __future__ import annotations

import logging
import os
import queue
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Optional

from .parent_death import set_pdeathsig

__all__ = ["ZygotePool", "ForkedProcess", "available"]

log = logging.getLogger("etrun")
_READY_TIMEOUT = 300.0  # seconds the zygote may take to import the preload list


def available() -> str:
    """"" where a zygote can run here, else why not."""
    if not sys.platform.startswith("linux"):
        return f"fork after importing torch is not safe on {sys.platform}"
    if not hasattr(socket, "send_fds"):
        return "this Python cannot pass file descriptors (3.9+ is needed)"
    return ""


# ---------------------------------------------------------------------- the zygote process
def _die_with_parent(parent: int) -> None:
    """SIGKILL from the kernel when the parent dies: no thread, no GIL needed (a worker stuck in a
    native destructor holding the GIL cannot run a watcher thread)."""
    set_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:  # it died before the call
        os._exit(0)


def _import(preload: list[str]) -> str:
    """Import the preload list; "" where forking is then safe, else why not."""
    from .runner import import_preload

    import_preload(preload)
    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        return f"importing {','.join(preload)} started Python threads ({names}): forking is unsafe"
    return ""


def _serve(first: Optional[socket.socket], preload: list[str], listener: Optional[socket.socket] = None,
           idle: float = 0.0, retire=None) -> None:
    """Import, then fork workers on request until there is no one left to serve.

    Per launch (``first``: etrun's end of a socket pair): one client; the zygote retires when it
    closes its end, or dies with etrun. Kept (``listener``: a Unix socket etruns connect to, see
    :mod:`.zygote_keep`): any number of clients, one after another or at once; a client that goes
    (closes or dies) takes its workers with it (their process groups get SIGKILL), and the zygote
    retires after ``idle`` seconds with no client and no worker: it calls ``retire`` (which
    removes its socket's name, so the next etrun starts a new zygote), serves whoever connected
    just before, and exits when they have gone."""
    why = _import(preload)
    clients: list[socket.socket] = []
    if first is not None:
        clients.append(first)
        first.send(f"U {why}".encode() if why else b"R")
        if why:
            return
    if listener is not None and why:  # tell whoever is already waiting, then retire
        listener.setblocking(False)
        for c in _admit(listener, f"U {why}".encode(), every=True):
            c.close()
        return
    kept = listener is not None
    parent = None if kept else os.getppid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select through the wakeup fd
    stop = []
    if kept:
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    owner: dict[int, socket.socket] = {}  # live fork -> the client that asked for it
    quiet_since = time.monotonic()
    while not stop:
        watch = [*clients, wake_r] + ([listener] if listener is not None else [])
        try:
            ready, _, _ = select.select(watch, [], [], 0.5)
        except InterruptedError:
            ready = []
        if parent is not None and os.getppid() != parent:  # etrun is gone: so are we (our children follow us)
            os._exit(0)
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        while True:  # reap, and report every child that exited to the client that asked for it
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            c = owner.pop(pid, None)
            if c is not None and c in clients:
                _send(c, f"X {pid} {status}".encode())
        if listener is not None and listener in ready:
            clients += _admit(listener, b"R")
        for c in [c for c in clients if c in ready]:
            try:
                msg, fds, _flags, _addr = socket.recv_fds(c, 64, 3)
            except OSError:
                msg, fds = b"", []
            if not msg:  # the client closed its end, or died
                clients.remove(c)
                c.close()
                if not kept:  # per launch: retire (our children follow us)
                    return
                for pid in [p for p, o in owner.items() if o is c]:
                    del owner[pid]
                    for kill in (os.killpg, os.kill):
                        try:
                            kill(pid, signal.SIGKILL)
                        except (ProcessLookupError, PermissionError):
                            pass
                continue
            if msg == b"F" and len(fds) == 3:
                pid = os.fork()
                if pid == 0:
                    _child(fds, [*clients, *([listener] if listener is not None else [])], (wake_r, wake_w))
                for fd in fds:
                    os.close(fd)
                owner[pid] = c
                _send(c, f"P {pid}".encode())
            else:
                for fd in fds:
                    os.close(fd)
        if kept:
            if clients or owner:
                quiet_since = time.monotonic()
            elif listener is None:  # retired, and the last client has gone
                return
            elif time.monotonic() - quiet_since >= idle:
                if retire is not None:
                    retire()
                listener.setblocking(False)  # an etrun that connected just before: served, not dropped
                clients += _admit(listener, b"R", every=True)
                listener.close()
                listener = None


def _admit(listener: socket.socket, hello: bytes, every: bool = False) -> list:
    """Accept one waiting connection (``every``: all of them, from a non-blocking listener) of a
    peer running as this user, and greet it with ``hello``. (The socket's directory is private;
    the uid check is a second line of defence.)"""
    out = []
    while True:
        try:
            c, _ = listener.accept()
        except OSError:
            return out
        if _peer_uid(c) in (os.getuid(), None):
            _send(c, hello)
            out.append(c)
        else:
            c.close()
        if not every:
            return out


def _send(c: socket.socket, msg: bytes) -> None:
    try:
        c.send(msg)
    except OSError:  # it is gone: its end is read as closed at the next select
        pass


def _peer_uid(c: socket.socket) -> Optional[int]:
    try:
        _pid, uid, _gid = struct.unpack("3i", c.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                           struct.calcsize("3i")))
        return uid
    except (OSError, AttributeError):
        return None


def _child(fds: list[int], socks: list, wake: tuple) -> None:
    """In the forked child: become a fresh spare runner, then the worker."""
    code = 70
    try:
        _die_with_parent(_zygote_pid)
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for fd in wake:
            os.close(fd)
        for s in socks:
            s.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        np = sys.modules.get("numpy")
        if np is not None:  # as a fresh interpreter's: its own entropy (random reseeds itself at fork)
            np.random.seed()
        from .runner import serve

        serve()
        code = 0
    except SystemExit as exc:
        from .runner import exit_status

        code = exit_status(exc.code)
    except BaseException:  # noqa: BLE001 - the worker's own errors are reported by runner.serve
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


_zygote_pid = os.getpid()


def main() -> None:
    """``python -m elastictrain.launcher.zygote FD PRELOAD [ETRUN_PID]`` (per launch: FD is its
    end of etrun's socket pair), or ``--keep SOCKET PRELOAD IDLE`` (kept: :mod:`.zygote_keep`
    starts it), or ``--stop`` (stop this user's kept zygotes)."""
    global _zygote_pid
    _zygote_pid = os.getpid()
    if sys.argv[1:2] == ["--stop"]:
        from .zygote_keep import stop_all

        n = stop_all()
        print(f"stopped {n} kept zygote{'s' * (n != 1)}")
        return
    if sys.argv[1:2] == ["--keep"]:
        from .zygote_keep import serve_kept

        _exit_after(lambda: serve_kept(sys.argv[2], [m for m in sys.argv[3].split(",") if m], float(sys.argv[4])))
    if len(sys.argv) > 3 and sys.argv[3].isdigit():  # etrun's pid
        _die_with_parent(int(sys.argv[3]))
    sock = socket.socket(fileno=int(sys.argv[1]))
    preload = [m for m in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if m]
    _exit_after(lambda: _serve(sock, preload), sock)


def _exit_after(serve, sock: Optional[socket.socket] = None) -> None:
    """Serve, then exit without the interpreter's teardown: with torch imported it takes about a
    second, and etrun waits for this exit before its own (every preemption paid it; so did
    ``--stop``). There is nothing else to finish: stdio is flushed here."""
    code = 0
    try:
        serve()
    except BaseException:  # noqa: BLE001 - said, then the exit status says it
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        if sock is not None:
            sock.close()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# ---------------------------------------------------------------------- etrun's side
class ForkedProcess:
    """A worker forked by the zygote, with the parts of :class:`subprocess.Popen` that etrun
    uses (its exit status comes from the zygote, which is its parent)."""

    def __init__(self, pool: "ZygotePool", pid: int, stdin, stdout, stderr) -> None:
        self._pool, self.pid = pool, pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.args = ["zygote-fork", str(pid)]
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.returncode = self._pool._exit_of(self.pid)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            code = self._pool._wait_exit(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ZygotePool:
    """Workers forked from a zygote, behind the interface of :class:`~.workers.SparePool`
    (``take``, ``fill``, ``fill_later``, ``close``). Where the zygote cannot be used (``why``),
    ``fallback`` (today's warm spares) serves instead."""

    def __init__(self, preload: tuple[str, ...], env: dict[str, str], fallback=None, keep: float = 0.0) -> None:
        self._fallback = fallback
        self.why = ""  # why the zygote is not used ("" while it is)
        self._ready = threading.Event()
        self._lock = threading.Lock()  # one fork request at a time
        self._cond = threading.Condition()
        self._exits: dict[int, int] = {}
        self._live: set[int] = set()
        self._pids: "queue.Queue[int]" = queue.Queue()
        self._dead = False
        self._said = False  # the fallback was reported
        self._proc: Optional[subprocess.Popen] = None  # None: a kept zygote (keep > 0, .zygote_keep)
        sock = None
        if keep > 0:
            from .zygote_keep import connect

            try:
                sock = self._sock = connect(preload, env, keep)
            except OSError as exc:
                log.warning("--zygote keep: %s; this launch starts its own zygote", exc.strerror or exc)
        if sock is None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._sock = ours
            self._proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "elastictrain.launcher.zygote", str(theirs.fileno()),
                 ",".join(preload), str(os.getpid())],
                pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL, start_new_session=True)
            theirs.close()
        self._reader = threading.Thread(target=self._read, name="et-zygote", daemon=True)
        self._reader.start()

    # ---------------------------------------------------------------- messages
    def _read(self) -> None:
        while True:
            try:
                msg = self._sock.recv(256)
            except OSError:
                msg = b""
            if not msg:
                break
            kind, _, rest = msg.decode(errors="replace").partition(" ")
            if kind == "R":
                self._ready.set()
            elif kind == "U":
                self.why = rest
                self._ready.set()
            elif kind == "P":
                self._pids.put(int(rest))
            elif kind == "X":
                pid, status = (int(x) for x in rest.split())
                with self._cond:
                    self._exits[pid] = os.waitstatus_to_exitcode(status)
                    self._live.discard(pid)
                    self._cond.notify_all()
        # the zygote is gone: its children die with it (they watch their parent); say so
        with self._cond:
            self._dead = True
            for pid in list(self._live):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                self._exits.setdefault(pid, -signal.SIGKILL)
            self._live.clear()
            self._cond.notify_all()
        if not self._ready.is_set():
            self.why = self.why or f"the zygote exited at start ({self._proc.wait() if self._proc else 'kept'})"
            self._ready.set()
        self._pids.put(-1)

    def _exit_of(self, pid: int) -> Optional[int]:
        with self._cond:
            return self._exits.get(pid)

    def _wait_exit(self, pid: int, timeout: Optional[float]) -> Optional[int]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while pid not in self._exits:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)
            return self._exits[pid]

    # ---------------------------------------------------------------- SparePool's interface
    def usable(self, timeout: float = _READY_TIMEOUT) -> bool:
        """Whether workers come from the zygote (waits until it has imported its preload list)."""
        if not self._ready.wait(timeout):
            self.why = f"the zygote did not finish its imports in {timeout:.0f} s"
        usable = not self.why and not self._dead
        if not usable and not self._said:
            self._said = True
            log.warning("zygote not used (%s); workers start as warm spares or fresh interpreters", self.why)
        return usable

    def take(self):
        """A worker process waiting for its command on stdin, forked from the zygote (or a
        spare of the fallback pool, or None: the caller starts a fresh interpreter)."""
        if not self.usable():
            return self._fallback.take() if self._fallback is not None else None
        fds = []
        try:
            in_r, in_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            fds = [in_r, in_w, out_r, out_w, err_r, err_w]
            with self._lock:
                socket.send_fds(self._sock, [b"F"], [in_r, out_w, err_w])
                pid = self._pids.get(timeout=30)
            if pid < 0:
                raise OSError("the zygote exited")
        except (OSError, queue.Empty) as exc:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            log.warning("the zygote did not fork a worker (%s); starting a fresh interpreter", exc)
            return None
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        with self._cond:
            self._live.add(pid)
        return ForkedProcess(self, pid, os.fdopen(in_w, "wb"), os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))

    def fill(self) -> None:
        if self._fallback is not None and self.why:
            self._fallback.fill()

    def fill_later(self, delay: float) -> None:
        if self._fallback is not None and self._ready.is_set() and self.why:
            self._fallback.fill_later(delay)

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        if self._proc is not None:  # (a kept zygote stays: it retires when idle)
            if not self._ready.is_set():  # still importing its preload list (seconds of torch): it forked
                self._proc.kill()  # nothing yet, and would notice the closed socket only after the imports
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reader.join(5)
        if self._fallback is not None:
            self._fallback.close()


if __name__ == "__main__":
    main()
