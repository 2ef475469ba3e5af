"""Durable coordinator state behind a small interface, with SQLite as the embedded default.

The coordinator keeps its working state in memory and writes every change through a
:class:`Store` transaction *before* it changes memory or answers: a reply is only ever
sent for state that is already committed. After ``kill -9`` the coordinator reloads
everything with :meth:`Store.load`.

SQLite runs in WAL mode. ``synchronous=NORMAL`` (the default here) keeps every committed
transaction across a crash of the coordinator *process* (``kill -9``, OOM); use
``sync="full"`` to also survive a power loss or kernel crash, at the cost of an fsync
per change.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol

from ..errors import ConfigError

__all__ = ["Store", "Tx", "SQLiteStore", "LoadedState", "JobRow", "DatasetRow", "LiveRow", "PartRow",
           "CommitRow", "ProfileRow", "EventRow", "LogRow", "open_store"]

#: scheduled jobs' records read per query at a start (LoadedState.cluster_jobs)
LOAD_PAGE = 500


@dataclass
class JobRow:
    job: str
    generation: int
    world_size: int
    min_workers: int
    max_workers: int
    reason: str


@dataclass
class DatasetRow:
    job: str
    name: str
    spec: bytes
    fresh: int
    lease_seq: int
    base_checkpoint: Optional[str]
    restored_from: Optional[str]
    restored_generation: int


@dataclass
class LiveRow:
    job: str
    ds: str
    shard_id: int
    state: str
    offset: int
    lease_id: int
    worker: int
    generation: int
    request_id: str


@dataclass
class PartRow:
    job: str
    ds: str
    checkpoint: str
    worker: int
    step: int
    generation: int
    world_size: int
    updates: bytes


@dataclass
class CommitRow:
    job: str
    ds: str
    checkpoint: str
    seq: int
    step: int
    generation: int
    frontier: int
    partial: bytes
    time: float


@dataclass
class ProfileRow:
    """A worker's latest profile report (msgpack of :class:`~elastictrain.wire.ProfileReport`)."""

    job: str
    worker: int
    report: bytes
    time: float


@dataclass
class EventRow:
    """One entry of the scheduler's event log (``detail``: JSON)."""

    seq: int
    time: float
    kind: str
    job: str
    node: str
    detail: str


@dataclass
class LogRow:
    job: str
    seq: int
    node: str
    run: int
    data: bytes


@dataclass
class LoadedState:
    jobs: list[JobRow] = field(default_factory=list)
    datasets: list[DatasetRow] = field(default_factory=list)
    live: list[LiveRow] = field(default_factory=list)
    parts: list[PartRow] = field(default_factory=list)
    commits: list[CommitRow] = field(default_factory=list)
    profiles: list[ProfileRow] = field(default_factory=list)
    #: cluster mode: scheduled jobs and nodes (msgpack records), rendezvous rounds, key/values.
    #: The jobs are read in pages as they are consumed, once, at the start (a long history's
    #: records are not all held at once; their order is the store's, not submission order)
    cluster_jobs: Iterable[tuple[str, bytes]] = ()
    nodes: list[tuple[str, bytes]] = field(default_factory=list)
    rdzv: list[tuple[str, bytes]] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)
    last_event: int = 0
    log_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)  # job -> (bytes, last seq)


class Tx(Protocol):
    """The writes one coordinator state change is made of; all or nothing."""

    def put_job(self, row: JobRow) -> None: ...
    def put_dataset(self, row: DatasetRow) -> None: ...
    def put_live(self, row: LiveRow) -> None: ...
    def delete_all_live(self, job: str, ds: str) -> None: ...
    def put_part(self, row: PartRow) -> None: ...
    def delete_part(self, job: str, ds: str, checkpoint: str, worker: int) -> None: ...
    def delete_all_parts(self, job: str, ds: str) -> None: ...
    def put_commit(self, row: CommitRow) -> None: ...
    def delete_commits_after(self, job: str, ds: str, seq: int) -> None: ...
    def prune_commits(self, job: str, ds: str, keep: int) -> None: ...
    def put_profile(self, row: ProfileRow) -> None: ...
    def put_cluster_job(self, job: str, seq: int, status: str, record: bytes) -> None: ...
    def put_node(self, name: str, index: int, record: bytes) -> None: ...
    def put_rdzv(self, job: str, record: bytes) -> None: ...
    def delete_rdzv(self, job: str) -> None: ...
    def delete_all_rdzv(self) -> None: ...
    def put_meta(self, key: str, value: str) -> None: ...
    def delete_meta(self, key: str) -> None: ...
    def add_event(self, row: EventRow) -> None: ...
    def fold_event(self, seq: int, detail: str) -> None: ...
    def add_log(self, row: LogRow) -> None: ...
    def prune_log(self, job: str, below_seq: int) -> None: ...
    def delete_logs(self, job: str) -> None: ...
    def delete_events_below(self, seq: int) -> None: ...
    def add_gpu_span(self, job: str, service: int, t0: Optional[float], t1: Optional[float], gpus: int,
                     run: Optional[int]) -> None: ...
    def clear_open_gpu_spans(self, job: str, service: int) -> None: ...


class Store(Protocol):
    """A durable home for coordinator state. Implementations: :class:`SQLiteStore`."""

    kind: str

    def load(self) -> LoadedState: ...
    def transaction(self) -> contextlib.AbstractContextManager[Tx]: ...
    def load_commit(self, job: str, ds: str, checkpoint: str) -> Optional[CommitRow]: ...
    def read_events(self, after: int, limit: int, job: Optional[str] = None) -> list[EventRow]: ...
    def event_at(self, seq: int) -> Optional[tuple[int, float]]: ...
    def newest_event(self) -> int: ...
    def read_gpu_time(self, since: Optional[float] = None, until: Optional[float] = None,
                      open_only: bool = False) -> list[tuple]: ...
    def read_logs(self, job: str, after: int, limit_bytes: int) -> list[LogRow]: ...
    def log_seq_at(self, job: str, keep_bytes: int) -> int: ...
    def log_bytes(self, job: str, run: int) -> int: ...
    def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
  job TEXT PRIMARY KEY, generation INTEGER NOT NULL, world_size INTEGER NOT NULL,
  min_workers INTEGER NOT NULL, max_workers INTEGER NOT NULL, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS datasets (
  job TEXT NOT NULL, name TEXT NOT NULL, spec BLOB NOT NULL, fresh INTEGER NOT NULL,
  lease_seq INTEGER NOT NULL, base_checkpoint TEXT, restored_from TEXT,
  restored_generation INTEGER NOT NULL, PRIMARY KEY (job, name));
CREATE TABLE IF NOT EXISTS live (
  job TEXT NOT NULL, ds TEXT NOT NULL, shard_id INTEGER NOT NULL, state TEXT NOT NULL,
  offset INTEGER NOT NULL, lease_id INTEGER NOT NULL, worker INTEGER NOT NULL,
  generation INTEGER NOT NULL, request_id TEXT NOT NULL, PRIMARY KEY (job, ds, shard_id));
CREATE TABLE IF NOT EXISTS parts (
  job TEXT NOT NULL, ds TEXT NOT NULL, checkpoint TEXT NOT NULL, worker INTEGER NOT NULL,
  step INTEGER NOT NULL, generation INTEGER NOT NULL, world_size INTEGER NOT NULL,
  updates BLOB NOT NULL, PRIMARY KEY (job, ds, checkpoint, worker));
CREATE TABLE IF NOT EXISTS commits (
  job TEXT NOT NULL, ds TEXT NOT NULL, checkpoint TEXT NOT NULL, seq INTEGER NOT NULL,
  step INTEGER NOT NULL, generation INTEGER NOT NULL, frontier INTEGER NOT NULL,
  partial BLOB NOT NULL, time REAL NOT NULL, PRIMARY KEY (job, ds, checkpoint));
CREATE TABLE IF NOT EXISTS profiles (
  job TEXT NOT NULL, worker INTEGER NOT NULL, report BLOB NOT NULL, time REAL NOT NULL,
  PRIMARY KEY (job, worker));
CREATE TABLE IF NOT EXISTS cluster_jobs (
  id TEXT PRIMARY KEY, seq INTEGER NOT NULL, status TEXT NOT NULL, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (name TEXT PRIMARY KEY, idx INTEGER NOT NULL, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS rdzv (job TEXT PRIMARY KEY, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY, time REAL NOT NULL, kind TEXT NOT NULL, job TEXT NOT NULL, node TEXT NOT NULL,
  detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_job ON events (job, seq);
CREATE TABLE IF NOT EXISTS gpu_time (
  job TEXT NOT NULL, service INTEGER NOT NULL, t0 REAL, t1 REAL, gpus INTEGER NOT NULL, run INTEGER);
CREATE INDEX IF NOT EXISTS gpu_time_end ON gpu_time (t1);
CREATE INDEX IF NOT EXISTS gpu_time_job ON gpu_time (job, service);
CREATE TABLE IF NOT EXISTS logs (
  job TEXT NOT NULL, seq INTEGER NOT NULL, node TEXT NOT NULL, run INTEGER NOT NULL, data BLOB NOT NULL,
  PRIMARY KEY (job, seq));
"""


def gpu_time_query(mark: str, since: Optional[float], until: Optional[float], open_only: bool) -> tuple[str, tuple]:
    """The spans of GPU time (``gpu_time``: ``(job, service, from, to, GPUs, run)``, ``to`` None while
    open) still open, and unless ``open_only`` the closed ones that overlap ``[since, until)``, in one
    query on both databases (``mark``: their parameter marker)."""
    cols = "SELECT job, service, t0, t1, gpus, run FROM gpu_time"
    if open_only:
        return f"{cols} WHERE t1 IS NULL", ()
    lo, hi = -1e300 if since is None else float(since), 1e300 if until is None else float(until)
    return f"{cols} WHERE t1 IS NULL UNION ALL {cols} WHERE t1 > {mark} AND t0 < {mark}", (lo, hi)


#: 2 adds cluster mode's tables (scheduled jobs, nodes, rendezvous rounds, events, logs); a
#: version-1 file is upgraded in place (the new tables are created empty)
_SCHEMA_VERSION = "2"
_UPGRADABLE = ("1",)


def keyset_pages(fetch: Callable[[Any], list], first: Any, page: int) -> Iterator[tuple]:
    """Every row of a table read a page at a time: ``fetch(last)`` gives the (at most ``page``)
    rows whose key, their first column, follows ``last`` in key order, starting after ``first``."""
    last = first
    while True:
        rows = fetch(last)
        yield from rows
        if len(rows) < page:
            return
        last = rows[-1][0]


class _SQLiteTx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._c = conn

    def put_job(self, r: JobRow) -> None:
        self._c.execute("INSERT OR REPLACE INTO jobs VALUES (?,?,?,?,?,?)",
                        (r.job, r.generation, r.world_size, r.min_workers, r.max_workers, r.reason))

    def put_dataset(self, r: DatasetRow) -> None:
        self._c.execute("INSERT OR REPLACE INTO datasets VALUES (?,?,?,?,?,?,?,?)",
                        (r.job, r.name, r.spec, r.fresh, r.lease_seq, r.base_checkpoint,
                         r.restored_from, r.restored_generation))

    def put_live(self, r: LiveRow) -> None:
        self._c.execute("INSERT OR REPLACE INTO live VALUES (?,?,?,?,?,?,?,?,?)",
                        (r.job, r.ds, r.shard_id, r.state, r.offset, r.lease_id, r.worker,
                         r.generation, r.request_id))

    def delete_all_live(self, job: str, ds: str) -> None:
        self._c.execute("DELETE FROM live WHERE job=? AND ds=?", (job, ds))

    def put_part(self, r: PartRow) -> None:
        self._c.execute("INSERT OR REPLACE INTO parts VALUES (?,?,?,?,?,?,?,?)",
                        (r.job, r.ds, r.checkpoint, r.worker, r.step, r.generation, r.world_size,
                         r.updates))

    def delete_part(self, job: str, ds: str, checkpoint: str, worker: int) -> None:
        self._c.execute("DELETE FROM parts WHERE job=? AND ds=? AND checkpoint=? AND worker=?",
                        (job, ds, checkpoint, worker))

    def delete_all_parts(self, job: str, ds: str) -> None:
        self._c.execute("DELETE FROM parts WHERE job=? AND ds=?", (job, ds))

    def put_commit(self, r: CommitRow) -> None:
        self._c.execute("INSERT OR REPLACE INTO commits VALUES (?,?,?,?,?,?,?,?,?)",
                        (r.job, r.ds, r.checkpoint, r.seq, r.step, r.generation, r.frontier,
                         r.partial, r.time))

    def delete_commits_after(self, job: str, ds: str, seq: int) -> None:
        self._c.execute("DELETE FROM commits WHERE job=? AND ds=? AND seq>?", (job, ds, seq))

    def prune_commits(self, job: str, ds: str, keep: int) -> None:
        self._c.execute(
            "DELETE FROM commits WHERE job=? AND ds=? AND seq <= "
            "(SELECT COALESCE(MAX(seq), 0) FROM commits WHERE job=? AND ds=?) - ?",
            (job, ds, job, ds, keep))

    def put_profile(self, r: ProfileRow) -> None:
        self._c.execute("INSERT OR REPLACE INTO profiles VALUES (?,?,?,?)", (r.job, r.worker, r.report, r.time))

    def put_cluster_job(self, job: str, seq: int, status: str, record: bytes) -> None:
        self._c.execute("INSERT OR REPLACE INTO cluster_jobs VALUES (?,?,?,?)", (job, seq, status, record))

    def put_node(self, name: str, index: int, record: bytes) -> None:
        self._c.execute("INSERT OR REPLACE INTO nodes VALUES (?,?,?)", (name, index, record))

    def put_rdzv(self, job: str, record: bytes) -> None:
        self._c.execute("INSERT OR REPLACE INTO rdzv VALUES (?,?)", (job, record))

    def delete_rdzv(self, job: str) -> None:
        self._c.execute("DELETE FROM rdzv WHERE job=?", (job,))

    def delete_all_rdzv(self) -> None:
        self._c.execute("DELETE FROM rdzv")

    def put_meta(self, key: str, value: str) -> None:
        self._c.execute("INSERT OR REPLACE INTO meta VALUES (?,?)", (key, value))

    def delete_meta(self, key: str) -> None:
        self._c.execute("DELETE FROM meta WHERE key=?", (key,))

    def add_event(self, r: EventRow) -> None:
        self._c.execute("INSERT INTO events VALUES (?,?,?,?,?,?)", (r.seq, r.time, r.kind, r.job, r.node, r.detail))

    def fold_event(self, seq: int, detail: str) -> None:
        self._c.execute("UPDATE events SET detail=? WHERE seq=?", (detail, seq))

    def add_log(self, r: LogRow) -> None:
        self._c.execute("INSERT INTO logs VALUES (?,?,?,?,?)", (r.job, r.seq, r.node, r.run, r.data))

    def prune_log(self, job: str, below_seq: int) -> None:
        self._c.execute("DELETE FROM logs WHERE job=? AND seq<?", (job, below_seq))

    def delete_logs(self, job: str) -> None:
        self._c.execute("DELETE FROM logs WHERE job=?", (job,))

    def delete_events_below(self, seq: int) -> None:
        self._c.execute("DELETE FROM events WHERE seq<?", (seq,))

    def add_gpu_span(self, job: str, service: int, t0: Optional[float], t1: Optional[float], gpus: int,
                     run: Optional[int]) -> None:
        self._c.execute("INSERT INTO gpu_time VALUES (?,?,?,?,?,?)", (job, service, t0, t1, gpus, run))

    def clear_open_gpu_spans(self, job: str, service: int) -> None:
        self._c.execute("DELETE FROM gpu_time WHERE job=? AND service=? AND t1 IS NULL", (job, service))


class SQLiteStore:
    """SQLite in WAL mode; one coordinator process per file (enforced with a lock file).

    Raises:
        ConfigError: the file is already used by another running coordinator, or
            cannot be opened.
    """

    kind = "sqlite"

    def __init__(self, path: str, sync: str = "normal") -> None:
        if sync not in ("normal", "full"):
            raise ConfigError(f"sqlite sync mode must be 'normal' or 'full', got {sync!r}")
        self.path = os.path.abspath(path)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(self._lock_fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._lock_fd)
            raise ConfigError(
                f"database {self.path} is in use by another coordinator (pid {owner}); "
                "stop that coordinator or pass a different --db"
            ) from None
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, str(os.getpid()).encode(), 0)
        try:
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={sync.upper()}")
            self._conn.execute("PRAGMA busy_timeout=5000")
            self._conn.executescript(_SCHEMA)
            row = self._conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        except sqlite3.DatabaseError as exc:
            self.close()
            raise ConfigError(f"cannot open database {self.path}: {exc}; pass a different --db "
                              "or move the broken file away") from exc
        if row is None:
            self._conn.execute("INSERT INTO meta VALUES ('schema', ?)", (_SCHEMA_VERSION,))
        elif row[0] in _UPGRADABLE:
            self._conn.execute("UPDATE meta SET value=? WHERE key='schema'", (_SCHEMA_VERSION,))
        elif row[0] != _SCHEMA_VERSION:
            self.close()
            raise ConfigError(f"database {self.path} has schema version {row[0]}, this coordinator "
                              f"reads version {_SCHEMA_VERSION}; use a matching elastictrain release")

    def load(self) -> LoadedState:
        c = self._conn
        return LoadedState(
            jobs=[JobRow(*r) for r in c.execute("SELECT * FROM jobs")],
            datasets=[DatasetRow(*r) for r in c.execute("SELECT * FROM datasets")],
            live=[LiveRow(*r) for r in c.execute("SELECT * FROM live")],
            parts=[PartRow(*r) for r in c.execute("SELECT * FROM parts")],
            commits=[CommitRow(*r) for r in c.execute(
                "SELECT job, ds, checkpoint, seq, step, generation, frontier, x'', time "
                "FROM commits ORDER BY seq")],
            profiles=[ProfileRow(*r) for r in c.execute("SELECT * FROM profiles ORDER BY job, worker")],
            cluster_jobs=self._cluster_jobs(),
            nodes=[(r[0], r[1]) for r in c.execute("SELECT name, record FROM nodes ORDER BY idx")],
            rdzv=[(r[0], r[1]) for r in c.execute("SELECT job, record FROM rdzv")],
            meta={k: v for k, v in c.execute("SELECT key, value FROM meta")},
            last_event=c.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0],
            log_bytes={r[0]: (r[1], r[2]) for r in c.execute(
                "SELECT job, SUM(LENGTH(data)), MAX(seq) FROM logs GROUP BY job")},
        )

    def _cluster_jobs(self, page: int = LOAD_PAGE) -> Iterator[tuple[str, bytes]]:
        """(id, record) of every scheduled job, read ``page`` rows at a time in rowid order (each
        page a statement of its own: none stays open between them)."""
        c = self._conn
        for r in keyset_pages(lambda last: c.execute("SELECT rowid, id, record FROM cluster_jobs WHERE rowid>? "
                                                     "ORDER BY rowid LIMIT ?", (last, page)).fetchall(), 0, page):
            yield r[1], r[2]

    def read_events(self, after: int, limit: int, job: Optional[str] = None) -> list[EventRow]:
        if job is None:
            rows = self._conn.execute("SELECT * FROM events WHERE seq>? ORDER BY seq LIMIT ?", (after, limit))
        else:
            rows = self._conn.execute("SELECT * FROM events WHERE job=? AND seq>? ORDER BY seq LIMIT ?",
                                      (job, after, limit))
        return [EventRow(*r) for r in rows]

    def event_at(self, seq: int) -> Optional[tuple[int, float]]:
        """(number, time) of the first event numbered ``seq`` or later; None if there is none."""
        row = self._conn.execute("SELECT seq, time FROM events WHERE seq>=? ORDER BY seq LIMIT 1", (seq,)).fetchone()
        return (row[0], row[1]) if row else None

    def newest_event(self) -> int:
        return self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]

    def read_gpu_time(self, since: Optional[float] = None, until: Optional[float] = None,
                      open_only: bool = False) -> list[tuple]:
        return [tuple(r) for r in self._conn.execute(*gpu_time_query("?", since, until, open_only))]

    def read_logs(self, job: str, after: int, limit_bytes: int) -> list[LogRow]:
        out, size = [], 0
        for r in self._conn.execute("SELECT * FROM logs WHERE job=? AND seq>? ORDER BY seq", (job, after)):
            if out and size + len(r[4]) > limit_bytes:
                break
            out.append(LogRow(*r))
            size += len(r[4])
        return out

    def log_seq_at(self, job: str, keep_bytes: int) -> int:
        """The oldest log seq of ``job`` such that it and what follows fit in ``keep_bytes``."""
        size, keep = 0, 0
        for seq, n in self._conn.execute("SELECT seq, LENGTH(data) FROM logs WHERE job=? ORDER BY seq DESC", (job,)):
            size += n
            if size > keep_bytes:
                break
            keep = seq
        return keep

    def log_bytes(self, job: str, run: int) -> int:
        """Bytes of ``job``'s output kept from run ``run``."""
        return self._conn.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM logs WHERE job=? AND run=?",
                                  (job, run)).fetchone()[0]

    def load_commit(self, job: str, ds: str, checkpoint: str) -> Optional[CommitRow]:
        r = self._conn.execute("SELECT * FROM commits WHERE job=? AND ds=? AND checkpoint=?",
                               (job, ds, checkpoint)).fetchone()
        return CommitRow(*r) if r else None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Tx]:
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            yield _SQLiteTx(c)
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def close(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            conn.close()
            self._conn = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def open_store(url: str, sync: str = "normal") -> Store:
    """Open a store from a path or URL: ``PATH`` or ``sqlite:///PATH``.

    Raises:
        ConfigError: the scheme is not supported.
    """
    if url.startswith("sqlite:///"):
        return SQLiteStore(url[len("sqlite:///"):], sync=sync)
    if "://" in url:
        raise ConfigError(f"store {url!r}: only sqlite:///PATH (or a plain path) is supported")
    return SQLiteStore(url, sync=sync)

