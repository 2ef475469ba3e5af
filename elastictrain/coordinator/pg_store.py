"""The coordinator's state in PostgreSQL (``--db postgresql://...``): the same tables and the same
transactions as :class:`~elastictrain.coordinator.store.SQLiteStore`, for a coordinator that must
outlive its machine (a leader and standbys on one database, :mod:`.leader`).

**Group commit.** The coordinator changes its memory and writes a transaction for each request,
one request at a time. Against SQLite a commit costs tens of microseconds; against a server it
costs a round trip. So here a transaction's statements are queued, and every reply waits
(:meth:`PostgresStore.barrier`) until everything queued before it is committed. One commit is in
flight at a time, in a thread; the transactions of every request served meanwhile go together in
the next (one round trip: ``BEGIN``, the fence, the statements, ``COMMIT``, pipelined). No reply is
sent for state that is not durable, as with SQLite, and under load many requests share a commit.

**Fencing.** Each commit first calls ``et_fence(term)``, which holds the leader row (``FOR
SHARE``) and raises unless this coordinator's term is current and its lease unexpired. A leader
that was paused past its lease, or deposed, commits nothing more. A commit that fails for any
reason leaves the coordinator's memory ahead of the database, so it is fatal: ``on_fatal`` is
called (the server exits; a standby, or the restarted process, reloads from the database).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Optional

from ..errors import ConfigError, CoordinatorUnavailableError
from .store import _SCHEMA as _SQLITE_SCHEMA
from .store import (
    LOAD_PAGE, CommitRow, DatasetRow, EventRow, JobRow, LiveRow, LoadedState, LogRow, PartRow, ProfileRow,
    _SCHEMA_VERSION, gpu_time_query, keyset_pages,
)

__all__ = ["PostgresStore", "FencedError"]

log = logging.getLogger(__name__)

def _postgres_schema(sqlite_schema: str) -> str:
    """SQLite's tables (store.py, the one definition) in PostgreSQL's types."""
    out = re.sub(r"\bINTEGER\b", "BIGINT", sqlite_schema)
    out = re.sub(r"\bREAL\b", "DOUBLE PRECISION", out)
    out = re.sub(r"\bBLOB\b", "BYTEA", out)
    return re.sub(r"(?<=[ (,])offset(?= )", '"offset"', out)  # a reserved word in PostgreSQL


# the tables, then what only PostgreSQL has: the leader's lease row and the fence every commit calls
_SCHEMA = _postgres_schema(_SQLITE_SCHEMA) + """
CREATE TABLE IF NOT EXISTS et_leader (
  id INTEGER PRIMARY KEY CHECK (id = 1), term BIGINT NOT NULL, holder TEXT NOT NULL, url TEXT NOT NULL,
  expires TIMESTAMPTZ NOT NULL);
INSERT INTO et_leader VALUES (1, 0, '', '', now() - interval '1 day') ON CONFLICT (id) DO NOTHING;
CREATE OR REPLACE FUNCTION et_fence(t BIGINT) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
  PERFORM 1 FROM et_leader WHERE id = 1 AND term = t AND expires > now() FOR SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'elastictrain: leadership term % is over; this coordinator may not write', t
      USING ERRCODE = 'ET001';
  END IF;
END $f$;
"""

_UPSERT = {  # table -> (columns, primary key)
    "jobs": ("job, generation, world_size, min_workers, max_workers, reason", "job"),
    "datasets": ("job, name, spec, fresh, lease_seq, base_checkpoint, restored_from, restored_generation",
                 "job, name"),
    "live": ('job, ds, shard_id, state, "offset", lease_id, worker, generation, request_id', "job, ds, shard_id"),
    "parts": ("job, ds, checkpoint, worker, step, generation, world_size, updates", "job, ds, checkpoint, worker"),
    "commits": ("job, ds, checkpoint, seq, step, generation, frontier, partial, time", "job, ds, checkpoint"),
    "profiles": ("job, worker, report, time", "job, worker"),
    "cluster_jobs": ("id, seq, status, record", "id"),
    "nodes": ("name, idx, record", "name"),
    "rdzv": ("job, record", "job"),
    "meta": ("key, value", "key"),
}


def _upsert_sql(table: str) -> str:
    cols, pk = _UPSERT[table]
    names = [c.strip() for c in cols.split(",")]
    keys = {k.strip() for k in pk.split(",")}
    sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in names if c not in keys)
    marks = ", ".join(["%s"] * len(names))
    return f"INSERT INTO {table} ({cols}) VALUES ({marks}) ON CONFLICT ({pk}) DO UPDATE SET {sets}"


_SQL = {t: _upsert_sql(t) for t in _UPSERT}


class FencedError(CoordinatorUnavailableError):
    """This coordinator's leadership term is over: it may not write."""


class _PGTx:
    """Collects one transaction's statements (sent with the next commit)."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, tuple]] = []

    def _put(self, table: str, values: tuple) -> None:
        self.ops.append((_SQL[table], values))

    def put_job(self, r: JobRow) -> None:
        self._put("jobs", (r.job, r.generation, r.world_size, r.min_workers, r.max_workers, r.reason))

    def put_dataset(self, r: DatasetRow) -> None:
        self._put("datasets", (r.job, r.name, r.spec, r.fresh, r.lease_seq, r.base_checkpoint, r.restored_from,
                               r.restored_generation))

    def put_live(self, r: LiveRow) -> None:
        self._put("live", (r.job, r.ds, r.shard_id, r.state, r.offset, r.lease_id, r.worker, r.generation,
                           r.request_id))

    def delete_all_live(self, job: str, ds: str) -> None:
        self.ops.append(("DELETE FROM live WHERE job=%s AND ds=%s", (job, ds)))

    def put_part(self, r: PartRow) -> None:
        self._put("parts", (r.job, r.ds, r.checkpoint, r.worker, r.step, r.generation, r.world_size, r.updates))

    def delete_part(self, job: str, ds: str, checkpoint: str, worker: int) -> None:
        self.ops.append(("DELETE FROM parts WHERE job=%s AND ds=%s AND checkpoint=%s AND worker=%s",
                         (job, ds, checkpoint, worker)))

    def delete_all_parts(self, job: str, ds: str) -> None:
        self.ops.append(("DELETE FROM parts WHERE job=%s AND ds=%s", (job, ds)))

    def put_commit(self, r: CommitRow) -> None:
        self._put("commits", (r.job, r.ds, r.checkpoint, r.seq, r.step, r.generation, r.frontier, r.partial, r.time))

    def delete_commits_after(self, job: str, ds: str, seq: int) -> None:
        self.ops.append(("DELETE FROM commits WHERE job=%s AND ds=%s AND seq>%s", (job, ds, seq)))

    def prune_commits(self, job: str, ds: str, keep: int) -> None:
        self.ops.append(("DELETE FROM commits WHERE job=%s AND ds=%s AND seq <= "
                         "(SELECT COALESCE(MAX(seq), 0) FROM commits WHERE job=%s AND ds=%s) - %s",
                         (job, ds, job, ds, keep)))

    def put_profile(self, r: ProfileRow) -> None:
        self._put("profiles", (r.job, r.worker, r.report, r.time))

    def put_cluster_job(self, job: str, seq: int, status: str, record: bytes) -> None:
        self._put("cluster_jobs", (job, seq, status, record))

    def put_node(self, name: str, index: int, record: bytes) -> None:
        self._put("nodes", (name, index, record))

    def put_rdzv(self, job: str, record: bytes) -> None:
        self._put("rdzv", (job, record))

    def delete_rdzv(self, job: str) -> None:
        self.ops.append(("DELETE FROM rdzv WHERE job=%s", (job,)))

    def delete_all_rdzv(self) -> None:
        self.ops.append(("DELETE FROM rdzv", ()))

    def put_meta(self, key: str, value: str) -> None:
        self._put("meta", (key, value))

    def delete_meta(self, key: str) -> None:
        self.ops.append(("DELETE FROM meta WHERE key=%s", (key,)))

    def add_event(self, r: EventRow) -> None:
        self.ops.append(("INSERT INTO events VALUES (%s,%s,%s,%s,%s,%s)",
                         (r.seq, r.time, r.kind, r.job, r.node, r.detail)))

    def fold_event(self, seq: int, detail: str) -> None:
        self.ops.append(("UPDATE events SET detail=%s WHERE seq=%s", (detail, seq)))

    def add_log(self, r: LogRow) -> None:
        self.ops.append(("INSERT INTO logs VALUES (%s,%s,%s,%s,%s)", (r.job, r.seq, r.node, r.run, r.data)))

    def prune_log(self, job: str, below_seq: int) -> None:
        self.ops.append(("DELETE FROM logs WHERE job=%s AND seq<%s", (job, below_seq)))

    def delete_logs(self, job: str) -> None:
        self.ops.append(("DELETE FROM logs WHERE job=%s", (job,)))

    def delete_events_below(self, seq: int) -> None:
        self.ops.append(("DELETE FROM events WHERE seq<%s", (seq,)))

    def add_gpu_span(self, job: str, service: int, t0: Optional[float], t1: Optional[float], gpus: int,
                     run: Optional[int]) -> None:
        self.ops.append(("INSERT INTO gpu_time VALUES (%s,%s,%s,%s,%s,%s)", (job, service, t0, t1, gpus, run)))

    def clear_open_gpu_spans(self, job: str, service: int) -> None:
        self.ops.append(("DELETE FROM gpu_time WHERE job=%s AND service=%s AND t1 IS NULL", (job, service)))


class PostgresStore:
    """A :class:`~elastictrain.coordinator.store.Store` in PostgreSQL.

    Args:
        url: ``postgresql://USER@HOST:PORT/DATABASE`` (libpq's URL; a password in it, or in
            ``~/.pgpass`` / ``PGPASSWORD``).
        sync: ``normal`` or ``full``, accepted for the CLI's sake; PostgreSQL always answers for a
            commit once it is on the database's disk (``synchronous_commit=on``): with group
            commit, that costs no throughput here (``benchmarks/coordinator_throughput.py``).
        on_fatal: called with the exception when a commit fails (default: raise it).

    Raises:
        ConfigError: psycopg is not installed, or the database cannot be reached.
    """

    kind = "postgresql"

    def __init__(self, url: str, sync: str = "normal", on_fatal: Optional[Callable[[BaseException], None]] = None,
                 connect_timeout: float = 10.0) -> None:
        if sync not in ("normal", "full"):
            raise ConfigError(f"sync mode must be 'normal' or 'full', got {sync!r}")
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise ConfigError("--db postgresql://... needs psycopg: pip install 'elastictrain[postgres]'") from None
        self.url, self.sync, self.on_fatal = url, sync, on_fatal
        self.term: Optional[int] = None  # the leadership term every commit is fenced by (None: unfenced)
        self._psycopg = psycopg
        setup = "SET synchronous_commit = on"

        def configure(conn) -> None:
            conn.autocommit = True
            conn.execute(setup)
            conn.execute("SET statement_timeout = 30000")  # every read and commit is bounded in time

        try:  # the writer (one commit in flight at a time) and the readers, from one pool
            # check: a standby's connections may sit idle for days before it leads
            self._pool = ConnectionPool(url, min_size=1, max_size=4, configure=configure, open=True,
                                        check=ConnectionPool.check_connection,
                                        timeout=connect_timeout, kwargs={"connect_timeout": int(connect_timeout)})
            self._pool.wait(timeout=connect_timeout)
        except Exception as exc:  # psycopg_pool.PoolTimeout, psycopg.OperationalError
            with contextlib.suppress(Exception):
                self._pool.close()
            raise ConfigError(f"cannot reach the database at {_safe(url)}: {exc}; check the URL, that PostgreSQL runs "
                              "there and that this account may connect") from None
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(770701)")  # two coordinators starting at once
            conn.execute(_SCHEMA)
            row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('schema', %s) ON CONFLICT (key) DO NOTHING", (_SCHEMA_VERSION,))
            elif row[0] != _SCHEMA_VERSION:
                raise ConfigError(f"database {_safe(url)} has schema version {row[0]}, this coordinator reads "
                                  f"version {_SCHEMA_VERSION}; use a matching elastictrain release")
        self._writer = threading.Lock()  # one commit at a time
        self._pending: list[list[tuple[str, tuple]]] = []
        self._queued = 0  # transactions queued so far
        self._durable = 0  # ... of which committed
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._wake: Optional[asyncio.Event] = None
        self._task: Optional[asyncio.Task] = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="et-pg-commit")
        self._dead: Optional[BaseException] = None

    # ------------------------------------------------------------------ writes
    @contextlib.contextmanager
    def transaction(self) -> Iterator[_PGTx]:
        if self._dead is not None:
            raise FencedError(f"this coordinator can no longer write ({self._dead})")
        tx = _PGTx()
        yield tx  # an exception inside: nothing was sent, nothing is queued
        if not tx.ops:
            return
        if self._task is None:  # no group commit running (start-up, tools, tests): commit now
            self._commit([tx.ops])
            return
        self._pending.append(tx.ops)
        self._queued += 1
        self._wake.set()

    async def barrier(self) -> None:
        """Wait until every transaction queued so far is committed.

        Raises:
            FencedError: a commit failed (this coordinator may not go on).
        """
        if self._dead is not None:
            raise FencedError(f"this coordinator can no longer write ({self._dead})")
        if self._durable >= self._queued:
            return
        fut = self._loop.create_future()
        self._waiters.append((self._queued, fut))
        await fut

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Commit in groups from now on (the server calls this once its loop runs)."""
        self._loop, self._wake = loop, asyncio.Event()
        self._task = loop.create_task(self._flusher())

    async def _flusher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch, upto = self._pending, self._queued
                self._pending = []
                try:
                    await self._loop.run_in_executor(self._thread, self._commit, batch)
                except BaseException as exc:  # noqa: BLE001 - every waiter learns of it; then fatal
                    self._fail(exc)
                    return
                self._done(upto)

    def _done(self, upto: int) -> None:
        self._durable = max(self._durable, upto)
        keep = []
        for seq, fut in self._waiters:
            if seq <= self._durable:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((seq, fut))
        self._waiters = keep

    def _fail(self, exc: BaseException) -> None:
        self._dead = exc
        log.critical("a commit failed (%s): this coordinator's memory is ahead of the database; it stops", exc)
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(FencedError(f"the commit failed: {exc}"))
        self._waiters = []
        if self.on_fatal is not None:
            self.on_fatal(exc)

    def _commit(self, batch: list[list[tuple[str, tuple]]]) -> None:
        """One PostgreSQL transaction for ``batch`` (fenced), in one round trip."""
        with self._writer, self._pool.connection() as conn:
            cur = conn.cursor()
            try:
                with conn.pipeline():
                    cur.execute("BEGIN")
                    if self.term is not None:
                        cur.execute("SELECT et_fence(%s)", (self.term,))
                    for ops in batch:
                        for sql, params in ops:
                            cur.execute(sql, params)
                    cur.execute("COMMIT")
            except self._psycopg.Error as exc:
                with contextlib.suppress(Exception):
                    conn.execute("ROLLBACK")
                if getattr(exc, "sqlstate", None) == "ET001":
                    raise FencedError(str(exc).splitlines()[0]) from None
                if self._task is None and self.on_fatal is None:
                    raise
                raise CoordinatorUnavailableError(f"the database refused a commit: {exc}") from None

    def _settle(self) -> None:
        """Commit what is queued, now (before a read: it must see every write made so far)."""
        if self._pending:
            batch, upto = self._pending, self._queued
            self._pending = []
            try:
                self._commit(batch)
            except BaseException as exc:  # noqa: BLE001
                self._fail(exc)
                raise
            self._done(upto)

    # ------------------------------------------------------------------ reads
    def _rows(self, sql: str, params: tuple = ()) -> list:
        self._settle()
        with self._writer, self._pool.connection() as conn:  # after any commit in flight
            return conn.execute(sql, params).fetchall()

    def load(self) -> LoadedState:
        q = self._rows
        return LoadedState(
            jobs=[JobRow(*r) for r in q("SELECT * FROM jobs")],
            datasets=[DatasetRow(r[0], r[1], bytes(r[2]), *r[3:]) for r in q("SELECT * FROM datasets")],
            live=[LiveRow(*r) for r in q("SELECT * FROM live")],
            parts=[PartRow(*r[:7], bytes(r[7])) for r in q("SELECT * FROM parts")],
            commits=[CommitRow(*r[:7], b"", r[7]) for r in q(
                "SELECT job, ds, checkpoint, seq, step, generation, frontier, time FROM commits ORDER BY seq")],
            profiles=[ProfileRow(r[0], r[1], bytes(r[2]), r[3]) for r in q(
                "SELECT * FROM profiles ORDER BY job, worker")],
            cluster_jobs=self._cluster_jobs(),
            nodes=[(r[0], bytes(r[1])) for r in q("SELECT name, record FROM nodes ORDER BY idx")],
            rdzv=[(r[0], bytes(r[1])) for r in q("SELECT job, record FROM rdzv")],
            meta={k: v for k, v in q("SELECT key, value FROM meta")},
            last_event=q("SELECT COALESCE(MAX(seq), 0) FROM events")[0][0],
            log_bytes={r[0]: (int(r[1]), r[2]) for r in q(
                "SELECT job, SUM(octet_length(data)), MAX(seq) FROM logs GROUP BY job")},
        )

    def _cluster_jobs(self, page: int = LOAD_PAGE) -> Iterator[tuple[str, bytes]]:
        """(id, record) of every scheduled job, read ``page`` rows at a time in id order (the
        primary key's index: each page a query of its own; every id follows "")."""
        for r in keyset_pages(lambda last: self._rows("SELECT id, record FROM cluster_jobs WHERE id>%s ORDER BY id "
                                                      "LIMIT %s", (last, page)), "", page):
            yield r[0], bytes(r[1])

    def read_gpu_time(self, since: Optional[float] = None, until: Optional[float] = None,
                      open_only: bool = False) -> list[tuple]:
        return [tuple(r) for r in self._rows(*gpu_time_query("%s", since, until, open_only))]

    def read_events(self, after: int, limit: int, job: Optional[str] = None) -> list[EventRow]:
        if job is None:
            rows = self._rows("SELECT * FROM events WHERE seq>%s ORDER BY seq LIMIT %s", (after, limit))
        else:
            rows = self._rows("SELECT * FROM events WHERE job=%s AND seq>%s ORDER BY seq LIMIT %s", (job, after, limit))
        return [EventRow(*r) for r in rows]

    def event_at(self, seq: int) -> Optional[tuple[int, float]]:
        """(number, time) of the first event numbered ``seq`` or later; None if there is none."""
        rows = self._rows("SELECT seq, time FROM events WHERE seq>=%s ORDER BY seq LIMIT 1", (seq,))
        return (rows[0][0], rows[0][1]) if rows else None

    def newest_event(self) -> int:
        return self._rows("SELECT COALESCE(MAX(seq), 0) FROM events", ())[0][0]

    def read_logs(self, job: str, after: int, limit_bytes: int) -> list[LogRow]:
        out, size = [], 0
        for r in self._rows("SELECT * FROM logs WHERE job=%s AND seq>%s ORDER BY seq LIMIT 10000", (job, after)):
            data = bytes(r[4])
            if out and size + len(data) > limit_bytes:
                break
            out.append(LogRow(r[0], r[1], r[2], r[3], data))
            size += len(data)
        return out

    def log_seq_at(self, job: str, keep_bytes: int) -> int:
        size, keep = 0, 0
        for seq, n in self._rows("SELECT seq, octet_length(data) FROM logs WHERE job=%s ORDER BY seq DESC", (job,)):
            size += n
            if size > keep_bytes:
                break
            keep = seq
        return keep

    def log_bytes(self, job: str, run: int) -> int:
        return int(self._rows("SELECT COALESCE(SUM(octet_length(data)), 0) FROM logs WHERE job=%s AND run=%s",
                              (job, run))[0][0])

    def load_commit(self, job: str, ds: str, checkpoint: str) -> Optional[CommitRow]:
        rows = self._rows("SELECT * FROM commits WHERE job=%s AND ds=%s AND checkpoint=%s", (job, ds, checkpoint))
        if not rows:
            return None
        r = rows[0]
        return CommitRow(*r[:7], bytes(r[7]), r[8])

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._dead is None:
            with contextlib.suppress(Exception):
                self._settle()
        self._thread.shutdown(wait=True)
        self._pool.close()


def _safe(url: str) -> str:
    """``url`` without a password."""
    import re

    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)
