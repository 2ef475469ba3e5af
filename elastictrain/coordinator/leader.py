"""Leadership among coordinators that share one PostgreSQL database: one leader, any number of
standbys, and a term that fences every write.

The leader holds a lease: the row ``et_leader`` names its term, its address and when the lease
expires, by the *database's* clock (so the coordinators' clocks never matter). It renews the lease
every ``lease / 4`` seconds. A standby takes the row once the lease has expired, with the next term.
Every commit of the leader calls ``et_fence(term)`` (see :mod:`.pg_store`), which holds the row and
fails unless the term is still current and the lease unexpired, so a leader that was paused (a
SIGSTOP, a long GC, a frozen VM) past its lease commits nothing when it wakes: the renewal fails
too, and it exits. The standby that took over then loads the state from the database, which holds
every write any leader ever answered for.

A PostgreSQL advisory lock would not do: it belongs to a session, and a paused process's session
stays open, so a standby would wait forever behind a leader that will never answer.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import ConfigError

__all__ = ["Leadership", "LeaderInfo"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaderInfo:
    term: int
    url: str
    expires_in: float  # seconds (negative: expired)


class Leadership:
    """One coordinator's part in the election (``url``: the address clients reach it at)."""

    def __init__(self, db_url: str, url: str, lease: float = 5.0) -> None:
        if not 1.0 <= lease <= 300.0:
            raise ConfigError(f"--lease must be in [1, 300] seconds, got {lease}")
        import psycopg

        self.db_url, self.url, self.lease = db_url, url, lease
        self.holder = uuid.uuid4().hex
        self.term: Optional[int] = None
        self._psycopg = psycopg
        self._conn = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _db(self):
        if self._conn is None or self._conn.closed:
            self._conn = self._psycopg.connect(self.db_url, autocommit=True, connect_timeout=5)
            self._conn.execute("SET statement_timeout = %s" % int(max(1000, self.lease * 1000 / 2)))
        return self._conn

    def current(self) -> Optional[LeaderInfo]:
        """The leader the database names (None: it cannot be read now)."""
        try:
            row = self._db().execute(
                "SELECT term, url, EXTRACT(EPOCH FROM expires - now()) FROM et_leader WHERE id = 1").fetchone()
        except self._psycopg.Error:
            self._conn = None
            return None
        return LeaderInfo(int(row[0]), row[1], float(row[2])) if row else None

    def try_acquire(self) -> Optional[int]:
        """Become the leader if the lease has expired; the new term, or None."""
        try:
            row = self._db().execute(
                "UPDATE et_leader SET term = term + 1, holder = %s, url = %s, "
                "expires = now() + make_interval(secs => %s) WHERE id = 1 AND expires < now() RETURNING term",
                (self.holder, self.url, self.lease)).fetchone()
        except self._psycopg.Error as exc:
            log.warning("could not try for leadership: %s", exc)
            self._conn = None
            return None
        if row is None:
            return None
        self.term = int(row[0])
        return self.term

    def renew(self) -> bool:
        """Extend the lease; False when it is lost (expired, or taken by another). A failed
        statement is tried once more on a fresh connection: a dropped connection is not a lost lease."""
        for attempt in (1, 2):
            try:
                row = self._db().execute(
                    "UPDATE et_leader SET expires = now() + make_interval(secs => %s) "
                    "WHERE id = 1 AND term = %s AND holder = %s AND expires > now() RETURNING term",
                    (self.lease, self.term, self.holder)).fetchone()
                return row is not None
            except self._psycopg.Error as exc:
                log.warning("lease renewal failed (try %d of 2): %s", attempt, exc)
                self._conn = None
        return False

    def keep(self, on_lost: Callable[[str], None]) -> None:
        """Renew the lease in a thread until :meth:`close`; ``on_lost(why)`` once it is lost."""
        def loop() -> None:
            while not self._stop.wait(self.lease / 4):
                t0 = time.monotonic()
                if not self.renew():
                    on_lost(f"the lease of term {self.term} could not be renewed (another coordinator leads, "
                            "or this one was paused past its lease)")
                    return
                took = time.monotonic() - t0
                if took > self.lease / 2:
                    log.warning("renewing the lease took %.1f s (lease %.1f s)", took, self.lease)

        self._thread = threading.Thread(target=loop, name="et-lease", daemon=True)
        self._thread.start()

    def resign(self) -> None:
        """Give the lease up now (a clean stop): a standby takes over at once."""
        if self.term is None:
            return
        try:
            self._db().execute("UPDATE et_leader SET expires = now() - interval '1 second' "
                               "WHERE id = 1 AND term = %s AND holder = %s", (self.term, self.holder))
        except self._psycopg.Error:
            pass

    def close(self) -> None:
        self._stop.set()
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
