"""A private PostgreSQL server on one machine, for the tests and benchmarks: Debian's binaries,
``initdb`` into a temporary directory and ``pg_ctl start`` on a free loopback port, run as an
unprivileged account (PostgreSQL refuses to run as root).

    with LocalPostgres() as pg:
        url = pg.create_database("t1")   # postgresql://et@127.0.0.1:PORT/t1
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Optional

from ..errors import ConfigError

__all__ = ["LocalPostgres", "find_postgres"]


def find_postgres() -> Optional[str]:
    """The directory of Debian's PostgreSQL binaries (the newest), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return os.path.dirname(found[-1]) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPostgres:
    """Args: ``fsync``: keep PostgreSQL's default (True) or turn it off (faster tests that do not
    measure durability)."""

    def __init__(self, fsync: bool = True) -> None:
        self.bin = find_postgres()
        if self.bin is None:
            raise ConfigError("PostgreSQL is not installed: apt-get install postgresql (make postgres does)")
        self.fsync = fsync
        self.dir = tempfile.mkdtemp(prefix="et-pg-")
        self.port = _free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:  # the server must not run as root: Debian's postgres account runs it
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise ConfigError("running as root and there is no 'postgres' account to run PostgreSQL as") from None
            os.chmod(self.dir, 0o755)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "server.log")

    def _run(self, *cmd: str, timeout: float = 120) -> str:
        r = subprocess.run([*self._as, *cmd], capture_output=True, text=True, timeout=timeout, cwd=self.dir)
        if r.returncode != 0:
            raise ConfigError(f"{' '.join(cmd[:2])} failed: {(r.stderr or r.stdout).strip()[-800:]}")
        return r.stdout

    def start(self) -> "LocalPostgres":
        self._run(os.path.join(self.bin, "initdb"), "-D", self.data, "-U", "et", "-A", "trust", "-E", "UTF8",
                  "--no-instructions")
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=300"
        if not self.fsync:
            opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run(os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-l", self.log, "-o", opts, "-w", "-t", "60",
                  "start")
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://et@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            try:
                self._run(os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-m", "immediate", "-w", "stop",
                          timeout=60)
            except (ConfigError, subprocess.SubprocessError):
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LocalPostgres":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_ready(self, timeout: float = 30.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
