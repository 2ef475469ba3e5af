"""Start and stop a coordinator as a child process (used by ``etrun``, tests and benchmarks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

from ..errors import CoordinatorUnavailableError

__all__ = ["CoordinatorProcess"]


class CoordinatorProcess:
    """A real ``elastictrain coordinator`` server process.

    Args:
        db: SQLite file; reused across :meth:`restart` so state survives.
        token_file: created with a random token if missing.
        port: 0 picks a free port on first start; restarts reuse the same port.
    """

    def __init__(self, db: str, token_file: str, host: str = "127.0.0.1", port: int = 0,
                 log_file: Optional[str] = None, extra_args: tuple[str, ...] = (),
                 env: Optional[dict] = None) -> None:
        self.db, self.token_file, self.host, self.port = db, token_file, host, port
        self.env_extra = dict(env or {})
        self.log_file = log_file
        self.extra_args = extra_args
        self.proc: Optional[subprocess.Popen] = None
        self.url: Optional[str] = None

    def start(self, timeout: float = 30.0) -> str:
        fd, ready = tempfile.mkstemp(prefix="et-ready-", suffix=".json")
        os.close(fd)
        os.unlink(ready)
        cmd = [sys.executable, "-m", "elastictrain", "coordinator", "--host", self.host,
               "--port", str(self.port), "--db", self.db, "--token-file", self.token_file,
               "--ready-file", ready, *self.extra_args]
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        env = dict(os.environ)
        env.update(self.env_extra)
        env.pop("ET_TOKEN", None)
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if self.log_file else None,
                                     env=env)
        if self.log_file:
            out.close()
        deadline = time.monotonic() + timeout
        while not os.path.exists(ready):
            if self.proc.poll() is not None:
                raise CoordinatorUnavailableError(
                    f"coordinator exited with code {self.proc.returncode} during start-up"
                    + (f"; see {self.log_file}" if self.log_file else ""))
            if time.monotonic() > deadline:
                self.kill()
                raise CoordinatorUnavailableError(f"coordinator did not start within {timeout} s")
            time.sleep(0.01)
        with open(ready) as f:
            self.url = json.load(f)["url"]
        os.unlink(ready)
        self.port = int(self.url.rsplit(":", 1)[1])
        return self.url

    @property
    def token(self) -> str:
        with open(self.token_file) as f:
            return f.read().strip()

    def kill(self) -> None:
        """``kill -9``: no chance to clean up."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def restart(self, timeout: float = 30.0) -> str:
        self.kill()
        return self.start(timeout)

    def __enter__(self) -> "CoordinatorProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
