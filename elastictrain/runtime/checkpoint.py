"""Checkpoint/resume hooks: snapshot in memory, persist in the background, atomic and verified.

``save(step)`` has a short blocking part: every array leaf of the state (tensors, numpy
arrays) is copied into one reusable host buffer (allocated once, with transparent huge
pages; pinned memory when the torch glue sees CUDA), and the rest of the state (numbers,
strings, lists, dicts, with their structure) is encoded to JSON. A background thread then
writes the buffer to ``rank<r>.bin.tmp``, fsyncs, renames it, and writes this rank's
manifest ``rank<r>.json`` (sizes, CRC-32 per 64 MiB chunk, the tensor table, the structure,
the data cursor of the same step) the same way. Then, if a shard iterator is attached, the
data cursor captured at the blocking part is committed with the coordinator under the
checkpoint's id.

A checkpoint directory ``step-<step>-g<generation>`` is *complete* when the manifest of every
rank that saves is there and every checksum verifies. The manifest itself ends with a SHA-256
trailer over its JSON and is checked against a schema (types, ranges, the tensor table within
the data file), so a flipped byte anywhere in it makes the checkpoint corrupt, never a crash and
never a silently different state. ``restore()`` picks the newest complete checkpoint (and, with
a coordinator, the newest one whose data commit is complete), skipping and naming any that is
truncated, corrupt or fails to load for any reason; if none is valid it says so and the job
starts fresh. After a save is durable, rank 0 deletes checkpoints older than the newest ``keep``
*committed* ones (with a coordinator; complete ones without), and never the newest committed
one, however many uncommitted ones are newer.

A save asked for while the previous one is still persisting is never dropped: with
``on_busy="wait"`` (default) it waits for the previous one, with ``"raise"`` it raises
:class:`CheckpointBusyError`; either way ``stats`` counts it (``busy_waits``, ``busy_wait_s``).
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import json
import logging
import mmap
import os
import signal
import threading
import time
import weakref
import zlib
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Optional

import msgspec
import numpy as np

from ..errors import ConfigError, ElasticTrainError
from .storage import CHUNK as _CHUNK
from .storage import open_storage

__all__ = ["Checkpointer", "CheckpointBusyError", "CheckpointWriteError", "CheckpointInfo", "register_leaf", "SaveStats",
           "ManifestError"]

log = logging.getLogger(__name__)

#: seconds a process that exits (its script returned or raised) waits for a persist in flight
EXIT_WAIT = 60.0
_LIVE: "weakref.WeakSet[Checkpointer]" = weakref.WeakSet()


@atexit.register
def _finish_persists_at_exit() -> None:
    """The persist thread is a daemon: without this, a script that raises a few steps after a save
    (an error, torch's OutOfMemoryError) would exit with that save half written or uncommitted,
    and the restart would resume from the one before. Atexit hooks run before daemon threads stop."""
    for c in list(_LIVE):
        if not c._durable.is_set():
            log.warning("exiting while a checkpoint persists: waiting up to %.0f s for it", EXIT_WAIT)
            if not c._durable.wait(EXIT_WAIT):
                log.error("the checkpoint in flight did not finish within %.0f s: it is lost", EXIT_WAIT)
_ALIGN = 64
FORMAT = 2  # 2: the manifest ends with a SHA-256 trailer (1: no trailer, still read)
_TRAILER = b"\n#sha256:"


class _Tensor(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    dtype: str
    shape: list[Annotated[int, msgspec.Meta(ge=0)]]
    offset: Annotated[int, msgspec.Meta(ge=0)]
    nbytes: Annotated[int, msgspec.Meta(ge=0)]
    kind: str


class _Manifest(msgspec.Struct, forbid_unknown_fields=True):
    """One rank's manifest, as written by :meth:`Checkpointer._snapshot` and ``_persist``."""

    format: int
    name: str
    step: Annotated[int, msgspec.Meta(ge=0)]
    rank: Annotated[int, msgspec.Meta(ge=0)]
    world_size: Annotated[int, msgspec.Meta(ge=1)]
    sharded: bool
    generation: int
    time: float
    size: Annotated[int, msgspec.Meta(ge=0)]
    tensors: list[_Tensor]
    skeleton: Any
    extra: Any
    cursor: Optional[list[list[int]]]
    chunks: list[int]
    chunk_size: Annotated[int, msgspec.Meta(ge=1)]
    job: str = ""  # the job that wrote it ("" without a coordinator, or before this field)


class ManifestError(ValueError):
    """A manifest is missing, truncated, corrupt or inconsistent; the message says how."""


def _manifest_bytes(snap: dict) -> bytes:
    body = json.dumps(snap).encode()
    return body + _TRAILER + hashlib.sha256(body).hexdigest().encode() + b"\n"


def _parse_manifest(raw: bytes, name: str, rank: int) -> dict:
    """The manifest's content, checked; raises ManifestError (never anything else)."""
    try:
        body, sep, digest = raw.rpartition(_TRAILER)
        if sep:
            if digest.strip() != hashlib.sha256(body).hexdigest().encode():
                raise ManifestError("its SHA-256 trailer does not match its content (corrupt)")
        else:  # format 1: written before manifests carried a digest
            body = raw
        m = msgspec.convert(json.loads(body), _Manifest)
        if sep and m.format < 2:
            raise ManifestError(f"format {m.format} with a digest trailer")
        if m.name != name or m.rank != rank:
            raise ManifestError(f"it describes {m.name} rank {m.rank}, not {name} rank {rank}")
        for t in m.tensors:
            if t.offset + t.nbytes > m.size:
                raise ManifestError(f"tensor {t.path} lies outside the data file")
        # (no arrays: no chunks; earlier versions wrote one checksum of nothing, which stays readable)
        if len(m.chunks) != (m.size + m.chunk_size - 1) // m.chunk_size and not (m.size == 0 and m.chunks == [0]):
            raise ManifestError(f"{len(m.chunks)} chunk checksums for {m.size} bytes")
        return msgspec.to_builtins(m)
    except ManifestError:
        raise
    except Exception as exc:  # a damaged manifest can fail in any way; all of them mean "corrupt"
        raise ManifestError(f"unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None


class CheckpointBusyError(ElasticTrainError):
    """A save was asked for while the previous one was still persisting (``on_busy="raise"``)."""


class CheckpointOwnerError(ConfigError):
    """A checkpoint written by another job (its manifest names the job)."""


class CheckpointWriteError(ElasticTrainError):
    """A save could not be written (the message names the step and the directory)."""


# ---------------------------------------------------------------------------- array leaves
@dataclass(frozen=True)
class _LeafKind:
    """How to move one kind of array between the state and raw bytes (torch registers its own)."""

    match: Callable[[Any], bool]
    describe: Callable[[Any], tuple[str, tuple[int, ...], int]]  # dtype name, shape, nbytes
    copy_into: Callable[[Any, memoryview, Any], None]  # (leaf, destination bytes, buffer owner)
    rebuild: Callable[[str, tuple[int, ...], memoryview, str], Any]  # dtype, shape, bytes, kind tag
    tag: str


_KINDS: list[_LeafKind] = []


def register_leaf(kind: _LeafKind) -> None:
    """Teach the checkpointer a new array type (``elastictrain_torch`` registers torch tensors)."""
    _KINDS.insert(0, kind)


def _np_copy(x: np.ndarray, dst: memoryview, _owner) -> None:
    np.frombuffer(dst, dtype=np.uint8).reshape(-1)[:] = np.ascontiguousarray(x).reshape(-1).view(np.uint8)


_KINDS.append(_LeafKind(
    match=lambda x: isinstance(x, np.ndarray) and x.dtype != object,
    describe=lambda x: (x.dtype.str, tuple(x.shape), x.nbytes),
    copy_into=_np_copy,
    rebuild=lambda dtype, shape, raw, _tag: np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy(),
    tag="numpy",
))


def _kind_of(x) -> Optional[_LeafKind]:
    for k in _KINDS:
        if k.match(x):
            return k
    return None


# ---------------------------------------------------------------------------- structure encoding
def _encode(obj, leaves: list, path: str):
    """JSON-able structure with array leaves replaced by references (no pickle)."""
    kind = _kind_of(obj)
    if kind is not None:
        leaves.append((path, obj, kind))
        return {"__leaf": len(leaves) - 1}
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, float)):
        if isinstance(obj, float) and not np.isfinite(obj):
            return {"__float": repr(obj)}
        return obj
    if isinstance(obj, (np.integer, np.floating, np.bool_)):
        return {"__np": obj.dtype.str, "v": obj.item() if np.isfinite(obj) else repr(obj.item())}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, leaves, f"{path}.{k}") for k, v in obj.items()}
        return {"__dict": [[_encode(k, leaves, f"{path}[key]"), _encode(v, leaves, f"{path}[{k!r}]")]
                           for k, v in obj.items()]}
    if isinstance(obj, list):
        return [_encode(v, leaves, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"__tuple": [_encode(v, leaves, f"{path}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, (bytes, bytearray)):
        return {"__bytes": base64.b64encode(bytes(obj)).decode()}
    raise ConfigError(f"checkpoint state at {path or 'the root'} has a value of type {type(obj).__name__} that "
                      "cannot be saved; use arrays/tensors, numbers, strings, lists, tuples and dicts "
                      "(or convert it in your state_dict())")


def _decode(obj, leaves: list):
    if isinstance(obj, list):
        return [_decode(v, leaves) for v in obj]
    if isinstance(obj, dict):
        if "__leaf" in obj:
            return leaves[obj["__leaf"]]
        if "__tuple" in obj:
            return tuple(_decode(v, leaves) for v in obj["__tuple"])
        if "__dict" in obj:
            return {_decode(k, leaves): _decode(v, leaves) for k, v in obj["__dict"]}
        if "__bytes" in obj:
            return base64.b64decode(obj["__bytes"])
        if "__float" in obj:
            return float(obj["__float"])
        if "__np" in obj:
            v = obj["v"]
            return np.dtype(obj["__np"]).type(float(v) if isinstance(v, str) else v)
        return {k: _decode(v, leaves) for k, v in obj.items()}
    return obj


# ---------------------------------------------------------------------------- the checkpointer
@dataclass
class SaveStats:
    saves: int = 0
    last_blocking_s: float = 0.0
    first_blocking_s: float = 0.0
    last_persist_s: float = 0.0
    busy_waits: int = 0
    busy_wait_s: float = 0.0
    failures: int = 0
    events: list = field(default_factory=list)


@dataclass(frozen=True)
class CheckpointInfo:
    name: str
    step: int
    path: str
    extra: dict


class Checkpointer:
    """Save and restore a training state.

    Args:
        directory: where ``step-*`` directories go (local or shared filesystem path); inside
            ``etrun --group``, ``<directory>/<job name>``, and for a relative path under the
            scheduler (a node daemon's job), ``<directory>/<job id>``, so jobs never share one.
            A checkpoint's manifest names its job; another job's is never restored.
        state: ``{name: object}``; objects with ``state_dict()``/``load_state_dict()`` are saved
            through them, anything else (dicts of arrays, numbers...) is saved as is and handed
            back by :meth:`restore`.
        rank, world_size, generation: this process's place in the job (default: from the env).
        sharded: True: every rank saves its own part (states differ, e.g. optimizer shards);
            False: only rank 0 saves (states are identical, e.g. DDP) and every rank loads it.
        keep: complete checkpoints kept.
        shards: a :class:`ShardIterator` whose data cursor is committed with each checkpoint and
            restored from it.
        job: the :class:`Job` (from ``et.init()``) to ask which checkpoints are committed.
        on_busy: ``"wait"`` or ``"raise"`` when a save finds the previous one still persisting.
        async_persist: False persists inside :meth:`save` (simpler, slower).
        fsync: fsync files and directories (leave on: without it a power loss may lose a save).
    """

    def __init__(self, directory: str, state: dict[str, Any], *, rank: Optional[int] = None,
                 world_size: Optional[int] = None, generation: Optional[int] = None, sharded: bool = False,
                 keep: int = 3, shards=None, job=None, on_busy: str = "wait", async_persist: bool = True,
                 fsync: bool = True) -> None:
        if on_busy not in ("wait", "raise"):
            raise ConfigError(f"on_busy must be 'wait' or 'raise', got {on_busy!r}")
        if keep < 1:
            raise ConfigError(f"keep must be >= 1, got {keep}")
        from .jobctx import current

        ctx = current()
        jid = getattr(job, "job_id", None) or os.environ.get("ET_JOB_ID") or ""
        if ctx is not None and ctx.job_id is None:  # inside etrun --group: each job its own directory, whatever
            directory = directory.rstrip("/") + "/" + ctx.name  # it passed (a scheduler's group runs jobs of
            # their own: their directories are their own, the same grouped or alone, so a job resumes either way)
        elif os.environ.get("ET_NODE_NAME") and not os.path.isabs(directory):
            # under the scheduler (a node daemon started this worker), a relative directory is the
            # job's own: two jobs submitted from one directory with the same "checkpoints" never mix
            if jid:
                directory = os.path.join(directory, jid)
        self.dir = directory
        self.store = open_storage(directory)
        self.state = state
        self.rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        self.world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
        self.generation = int(os.environ.get("ET_GENERATION", 0)) if generation is None else generation
        self.sharded, self.keep, self.shards, self.job = sharded, keep, shards, job
        # whose checkpoints these are: restoring another job's is refused (two jobs, one directory)
        self.job_id = jid if job is not None or shards is not None else ""
        self.on_busy, self.async_persist, self.fsync = on_busy, async_persist, fsync
        self.stats = SaveStats()
        self._buf: Optional[mmap.mmap] = None
        self._pending: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._preempt = threading.Event()
        # hooks for framework glue (elastictrain_torch sets them):
        self.alloc_buffer: Optional[Callable[[int], Any]] = None  # e.g. pinned host memory
        self.copy_fence: Optional[Callable[[], Callable[[], None]]] = None  # after async device copies
        self.agree: Optional[Callable[[bool], bool]] = None  # e.g. all-reduce a flag across ranks
        # in-process recovery (elastictrain_torch.elastic.run): raises MembershipChanged when the
        # job formed a newer generation; checked at every save() and preempted()
        self.membership_check: Optional[Callable[[], None]] = None
        self._reserving: Optional[threading.Thread] = None
        self._threads: list[threading.Thread] = []
        self._prune_lock = threading.Lock()
        self._durable = threading.Event()
        self._durable.set()
        _LIVE.add(self)
        # etrun names a file per worker that exists while a background persist runs, so that a
        # launcher stopping this worker gives the persist time to finish (see _run_bg)
        self._marker = os.environ.get("ET_PERSIST_MARKER") or None
        self._term_deferred = False
        # the last save's name: a second save at one step (same generation) is a no-op, so one
        # checkpoint is never written or committed twice
        self._last_name: Optional[str] = None

    def reserve(self, nbytes: int) -> None:
        """Allocate and fault in the host buffer in the background, so that the first save only
        copies. (Faulting in fresh memory costs 0.3-1 s per GiB on a VM: more than the copy.)"""
        if not self.saves_here or nbytes <= 0 or (self._buf is not None and len(self._buf) >= nbytes):
            return

        def work() -> None:
            self._buf = self._allocate(nbytes, populate=True)

        self._reserving = threading.Thread(target=work, name="et-ckpt-reserve", daemon=True)
        self._reserving.start()

    def state_nbytes(self) -> int:
        """Bytes the array leaves of the current state take in the buffer."""
        leaves: list = []
        _encode(self._collect(), leaves, "")
        return sum((k.describe(x)[2] + _ALIGN - 1) // _ALIGN * _ALIGN for _, x, k in leaves)

    # ------------------------------------------------------------------ saving
    @property
    def saves_here(self) -> bool:
        return self.sharded or self.rank == 0

    def _collect(self) -> dict:
        return {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in self.state.items()}

    def save(self, step: int, extra: Optional[dict] = None) -> str:
        """Snapshot now, persist in the background; returns the checkpoint's name.

        A second save at the same step (in one generation) is a no-op that returns the first
        one's name: the checkpoint of a step is written and committed once, with the state of
        that first save (a loop that saves every N steps and at each epoch's end saves twice
        when an epoch ends on a multiple of N; restoring either way resumes correctly).

        Raises:
            CheckpointBusyError: the previous save is still persisting and ``on_busy="raise"``.
            ElasticTrainError: the previous background persist failed (its error is re-raised once).
        """
        t0 = time.perf_counter()
        if self.membership_check is not None:
            self.membership_check()
        name = f"step-{step:09d}-g{self.generation}"
        if name == self._last_name:  # e.g. a save every N steps and one at an epoch's end that falls on N
            self._raise_bg()
            log.debug("step %d is already saved as %s: this save is a no-op", step, name)
            return name
        self._wait_previous()
        self._report(step)
        if self.saves_here:
            problem = self.store.writable()
            if problem is not None:
                raise CheckpointWriteError(f"cannot save step {step}: {problem}; fix its permissions or pass "
                                           "another directory")
        self._last_name = name
        part = self.shards.cursor(step) if self.shards is not None else None
        snapshot, fence = None, None
        if self.saves_here:
            snapshot = self._snapshot(step, name, extra or {}, part)
            fence = self.copy_fence() if self.copy_fence is not None else None
        blocking = time.perf_counter() - t0
        self.stats.saves += 1
        self.stats.last_blocking_s = blocking
        if self.stats.saves == 1:
            self.stats.first_blocking_s = blocking
        durable = self._durable = threading.Event()  # this save's own: an older thread cannot set it
        work = lambda: self._persist(name, step, snapshot, part, durable, fence)  # noqa: E731
        if self.async_persist:
            self._defer_sigterm()
            self._pending = threading.Thread(target=self._run_bg, args=(work, durable, step), name="et-ckpt-persist",
                                             daemon=True)
            self._pending.start()
            self._threads = [t for t in self._threads if t.is_alive()] + [self._pending]
        else:
            try:
                work()
            except BaseException:
                self._last_name = None
                raise
            finally:
                durable.set()
        return name

    def _wait_previous(self) -> None:
        # the buffer is free once the previous save is durable; its pruning of old checkpoints
        # may go on beside this save
        if not self._durable.is_set():
            if self.on_busy == "raise":
                raise CheckpointBusyError("the previous checkpoint is still being persisted; save less often, "
                                          "or use on_busy='wait'")
            t = time.perf_counter()
            self._durable.wait()
            waited = time.perf_counter() - t
            self.stats.busy_waits += 1
            self.stats.busy_wait_s += waited
            self.stats.events.append({"event": "save_waited_for_previous", "seconds": waited})
            (log.warning if waited > 0.05 else log.debug)("checkpoint save waited %.2f s for the previous one to "
                                                          "persist", waited)
        self._raise_bg()

    def _raise_bg(self) -> None:
        if self._error is not None:
            (step, err), self._error = self._error, None
            raise CheckpointWriteError(f"the checkpoint of step {step} was not saved: writing it to {self.dir} "
                                       f"failed ({err})") from err

    def _run_bg(self, work, durable: threading.Event, step: int) -> None:
        if self._marker:  # written here, not in save(): the training thread does no extra I/O
            try:
                with open(self._marker, "w") as f:
                    f.write(str(os.getpid()))
            except OSError:
                pass
        try:
            work()
        except BaseException as exc:  # handed to the training thread at its next save() or wait()
            self.stats.failures += 1
            self._last_name = None  # a later save of the same step tries again
            self._error = (step, exc)
            log.error("checkpoint of step %d: persist failed: %s", step, exc)
        finally:
            durable.set()
            self._end_persist()

    def _defer_sigterm(self) -> None:
        """If SIGTERM would kill this process outright (no handler), install one that lets a
        background persist finish first (its process then exits with 128 + SIGTERM). The
        launcher's marker file is written by the persist thread itself (see _run_bg)."""
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_term_while_persisting)

    def _on_term_while_persisting(self, signum, _frame) -> None:
        if self._durable.is_set():  # nothing in flight: die as SIGTERM would have
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        log.warning("SIGTERM during a checkpoint persist: exiting once it is durable")
        self._term_deferred = True

    def _end_persist(self) -> None:
        if self._marker:
            try:
                os.unlink(self._marker)
            except OSError:
                pass
        if self._term_deferred:
            logging.shutdown()
            os._exit(128 + signal.SIGTERM)

    def wait(self) -> None:
        """Block until the last save is durable (and committed); old checkpoints may still be
        being deleted in the background (see :meth:`close`)."""
        self._durable.wait()
        flush = getattr(getattr(self.job, "_steps", None), "flush", None)
        if flush is not None:
            flush()  # the scheduler sees the last step before the job exits
        self._raise_bg()

    def close(self) -> None:
        """Wait for every background task, the deletion of old checkpoints included."""
        self.wait()
        for t in self._threads:
            t.join()
        self._threads = []

    def _snapshot(self, step: int, name: str, extra: dict, part) -> dict:
        leaves: list = []
        skeleton = _encode(self._collect(), leaves, "")
        table, offset = [], 0
        for path, leaf, kind in leaves:
            dtype, shape, nbytes = kind.describe(leaf)
            table.append({"path": path, "dtype": dtype, "shape": list(shape), "offset": offset, "nbytes": nbytes,
                          "kind": kind.tag})
            offset += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        size = max(offset, 1)
        if self._reserving is not None:
            self._reserving.join()
            self._reserving = None
        if self._buf is None or len(self._buf) < size:
            self._buf = self._allocate(size, populate=False)
        view = memoryview(self._buf)
        for (path, leaf, kind), t in zip(leaves, table):
            kind.copy_into(leaf, view[t["offset"]:t["offset"] + t["nbytes"]], self._buf)
        return {"format": FORMAT, "name": name, "job": self.job_id, "step": step, "rank": self.rank,
                "world_size": self.world_size,
                "sharded": self.sharded, "generation": self.generation, "time": time.time(), "size": offset,
                "tensors": table, "skeleton": skeleton, "extra": _encode(extra, [], "extra"),
                "cursor": None if part is None else [[u.shard_id, u.lease_id, u.offset] for u in part.updates]}

    def _allocate(self, size: int, populate: bool):
        if self.alloc_buffer is not None:
            return self.alloc_buffer(size)
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        if populate and hasattr(mmap, "MAP_POPULATE"):
            flags |= mmap.MAP_POPULATE  # fault everything in now, in the kernel, in one go
        return mmap.mmap(-1, size, flags=flags)

    def _persist(self, name: str, step: int, snap: Optional[dict], part, durable: threading.Event,
                 fence: Optional[Callable[[], None]] = None) -> None:
        t0 = time.perf_counter()
        st = self.store
        d = st.join(st.root, name)
        if snap is not None:
            if fence is not None:
                fence()  # device-to-host copies issued in save() have landed
            st.makedirs(d)
            data = memoryview(self._buf)[:snap["size"]]
            snap["chunks"] = st.write(st.join(d, f"rank{self.rank}.bin"), data, self.fsync)
            snap["chunk_size"] = _CHUNK
            st.write(st.join(d, f"rank{self.rank}.json"), _manifest_bytes(snap), self.fsync)
            if self.fsync:
                st.sync_dir(d)
                st.sync_dir(st.root)
        if part is not None:  # durable first, then the data cursor of the same step
            self.shards.commit(name, step, self.world_size, part)
        self.stats.last_persist_s = time.perf_counter() - t0
        durable.set()
        if self.rank == 0:
            with self._prune_lock:  # a persist thread of the next save may prune beside this one
                self._prune()

    def _prune(self) -> None:
        """Keep the newest ``keep`` restorable checkpoints (committed, with a coordinator;
        complete, without) and whatever is newer; delete what is older, incomplete ones too. The
        newest committed checkpoint is never deleted. If the coordinator cannot say what is
        committed, nothing is deleted this time."""
        listed = self._list()
        committed = self._committed()
        if committed is False:
            return
        kept = [c for c in listed if (committed is None or c[1] in committed)
                and self._verify(c[2], quick=True) is None]
        if len(kept) < self.keep:
            return
        oldest = listed.index(kept[self.keep - 1])  # listed is newest first
        for c in listed[oldest + 1:]:
            self.store.rmtree(c[2])

    def _committed(self):
        """Names of committed checkpoints; None without a coordinator; False if it cannot say."""
        if self.job is None or self.shards is None:
            return None
        try:
            return {c.checkpoint for c in self.job.client.commits(self.job.job_id, self.shards.spec.name).commits}
        except ElasticTrainError as exc:
            log.warning("not pruning old checkpoints: the coordinator did not say which are committed (%s)", exc)
            return False

    # ------------------------------------------------------------------ restoring
    def _list(self) -> list[tuple[int, str, str]]:
        """``(step, name, path)`` of every ``step-*`` directory, newest first (step, then generation)."""
        out = []
        for entry in self.store.subdirs(self.store.root):
            parts = entry.split("-")
            if len(parts) == 3 and parts[0] == "step" and parts[1].isdigit() and parts[2][1:].isdigit():
                out.append((int(parts[1]), int(parts[2][1:]), entry, self.store.join(self.store.root, entry)))
        out.sort(reverse=True)
        return [(step, name, path) for step, _gen, name, path in out]

    def _manifest(self, path: str, rank: int) -> dict:
        """Rank ``rank``'s manifest in ``path``, checked; raises ManifestError."""
        st = self.store
        try:
            raw = st.read_bytes(st.join(path, f"rank{rank}.json"))
        except (OSError, ValueError) as exc:
            raise ManifestError(f"missing or unreadable ({exc.__class__.__name__})") from None
        return _parse_manifest(raw, os.path.basename(path.rstrip("/")), rank)

    def _verify(self, path: str, quick: bool = False) -> Optional[str]:
        """None if the checkpoint at ``path`` is complete and intact, else the reason. Never
        raises: whatever fails while verifying makes the checkpoint invalid."""
        try:
            return self._check(path, quick)
        except Exception as exc:  # e.g. a storage error mid-read
            return f"verifying it failed ({type(exc).__name__}: {exc})"

    def _check(self, path: str, quick: bool) -> Optional[str]:
        st = self.store
        try:
            head = self._manifest(path, 0)
        except ManifestError as exc:
            return f"rank 0's manifest is {exc}"
        ranks = range(head["world_size"]) if head["sharded"] else [0]
        for r in ranks:
            try:
                m = head if r == 0 else self._manifest(path, r)
            except ManifestError as exc:
                return f"rank {r}'s manifest is {exc}"
            binp = st.join(path, f"rank{r}.bin")
            try:
                size = st.size(binp)
            except OSError:
                return f"rank {r}'s data file is missing"
            if size != m["size"]:
                return f"rank {r}'s data file has {size} bytes, the manifest says {m['size']} (truncated?)"
            if quick:
                continue
            for i, (chunk, want) in enumerate(zip(st.read_chunks(binp, m["chunk_size"]), m["chunks"])):
                if zlib.crc32(chunk) != want:
                    return f"rank {r}'s data fails its checksum in chunk {i} (corrupt)"
        return None

    def latest(self, skip: frozenset = frozenset()) -> Optional[CheckpointInfo]:
        """The newest complete, intact (and, with a job, committed) checkpoint, or None."""
        committed = None
        if self.job is not None and self.shards is not None:
            committed = {c.checkpoint for c in self.job.client.commits(self.job.job_id, self.shards.spec.name).commits}
        for step, name, path in self._list():
            if name in skip:
                continue
            reason = self._verify(path)
            if reason is None and committed is not None and name not in committed:
                log.warning("skipping checkpoint %s: the coordinator at %s has no commit of its data cursor (a save "
                            "cut off before every rank committed, or another coordinator's checkpoint: relaunch with "
                            "the same command, --log-dir or ET_STATE_DIR as the run that wrote it, or point "
                            "ET_COORDINATOR at the coordinator it ran with); restoring it would repeat or lose "
                            "samples", path, getattr(self.job.client, "url", "?"))
                continue
            if reason is None:
                try:
                    m = self._manifest(path, 0)
                    self._check_owner(name, m)
                    return CheckpointInfo(name, step, path, _decode(m["extra"], []))
                except CheckpointOwnerError as exc:
                    reason = str(exc)
                except Exception as exc:
                    reason = f"its extra data does not decode ({type(exc).__name__})"
            self._skipped(name, path, reason)
        return None

    def _check_owner(self, name: str, manifest: dict) -> None:
        """Raises CheckpointOwnerError if ``manifest`` was written by another job than this one."""
        owner = manifest.get("job") or ""
        if owner and self.job_id and owner != self.job_id:
            raise CheckpointOwnerError(
                f"checkpoint {name} belongs to job {owner!r}, not to this job {self.job_id!r}: two jobs share the "
                f"directory {self.dir}; give each job its own checkpoint directory (under a scheduler the default "
                "is per job), or run the same command (or --rdzv-id) as the job that wrote it")

    def _skipped(self, name: str, path: str, reason: str) -> None:
        log.warning("skipping checkpoint %s: %s", path, reason)
        self.stats.events.append({"event": "checkpoint_skipped", "name": name, "reason": reason})

    def restore(self, info: Optional[CheckpointInfo] = None) -> Optional[CheckpointInfo]:
        """Load the newest valid checkpoint into ``state``; None (and a log line) if there is none.

        Objects with ``load_state_dict`` are loaded in place; other entries of ``state`` are
        replaced by their saved values. An entry the checkpoint lacks is an error, unless its object
        says ``checkpoint_optional = True`` (random states: it is left as it is). With ``shards``, the coordinator's data cursor is reset to
        the one committed with this checkpoint. ``info``: a result of :meth:`latest` to restore, so
        that the newest checkpoint is not searched and checksummed a second time.
        """
        if info is not None:  # named by the caller: another job's is an error, not a skip
            self._check_owner(info.name, self._manifest(info.path, 0))
        info = info or self.latest()  # a caller that already looked (and verified) passes it
        bad: set = set()
        while info is not None:  # a checkpoint that fails to load makes way for the next newest
            try:
                saved = self._load(info)
                break
            except ConfigError:
                raise  # the caller's state does not match the checkpoint: a mistake to report, not skip
            except Exception as exc:
                self._skipped(info.name, info.path, f"it failed to load ({type(exc).__name__}: {str(exc)[:200]})")
                bad.add(info.name)
                info = self.latest(skip=frozenset(bad))
        if info is None:
            log.warning("no valid checkpoint in %s: starting fresh", self.dir)
            # every rank asks: the first call of a generation resets the cursor, later ones are
            # no-ops, so no rank can lease a shard before the reset
            if self.shards is not None and self.job is not None:
                self.job.restore(self.shards.spec.name, None)
            return None
        for k, v in list(self.state.items()):
            if k not in saved and getattr(v, "checkpoint_optional", False):
                log.info("checkpoint %s has no entry %r: it stays as it is", info.name, k)
                continue  # (random states a run inside etrun --group did not save: torch glue's RNGState)
            if k not in saved:
                raise ConfigError(f"checkpoint {info.name} has no entry {k!r} (it has {sorted(saved)})")
            if hasattr(v, "load_state_dict"):
                v.load_state_dict(saved[k])
            else:
                self.state[k] = saved[k]
        for k in saved:  # entries the caller did not name are handed back as saved
            self.state.setdefault(k, saved[k])
        if self.shards is not None and self.job is not None:
            self.job.restore(self.shards.spec.name, info.name)
        log.info("restored checkpoint %s (step %d)", info.name, info.step)
        return info

    def _load(self, info: CheckpointInfo) -> dict:
        """The saved state of ``info`` (this rank's part), rebuilt from its data file."""
        r = self.rank if self.sharded else 0
        st = self.store
        m = self._manifest(info.path, r)
        mv = memoryview(st.read_all(st.join(info.path, f"rank{r}.bin")))
        if len(mv) != m["size"]:
            raise ManifestError(f"rank {r}'s data file has {len(mv)} bytes, not {m['size']}")
        kinds = {k.tag: k for k in _KINDS}
        leaves = []
        for t in m["tensors"]:
            kind = kinds.get(t["kind"])
            if kind is None:
                raise ConfigError(f"checkpoint {info.name} holds {t['kind']} arrays: import the glue that "
                                  f"saved them (e.g. `import elastictrain_torch`) before restoring")
            leaves.append(kind.rebuild(t["dtype"], tuple(t["shape"]), mv[t["offset"]:t["offset"] + t["nbytes"]],
                                       t["kind"]))
        saved = _decode(m["skeleton"], leaves)
        if not isinstance(saved, dict):
            raise ManifestError("its state is not a mapping")
        return saved

    def _report(self, step: int) -> None:
        report = getattr(self.job, "report_step", None)
        if report is not None:
            report(step)

    # ------------------------------------------------------------------ preemption
    def install_preemption_handler(self, signals: tuple = (signal.SIGTERM, signal.SIGUSR1)) -> None:
        """On these signals, ask for a checkpoint at the next step boundary (see :meth:`preempted`).
        Off the main thread (a job of ``etrun --group``), the group's main thread owns the signal
        handlers and forwards them here."""
        if threading.current_thread() is not threading.main_thread():
            from .jobctx import on_preempt

            on_preempt(self._preempt.set)
            return
        for s in signals:
            signal.signal(s, lambda *_: self._preempt.set())

    def rebase(self, rank: int, world_size: int, generation: int) -> None:
        """This worker's new place after in-process recovery; waits for a persist in flight."""
        self.wait_quietly()
        self.rank, self.world_size, self.generation = rank, world_size, generation

    def wait_quietly(self) -> None:
        """Wait for a persist in flight; its failure is logged, not raised (teardown paths)."""
        self._durable.wait()
        try:
            self._raise_bg()
        except Exception as exc:  # noqa: BLE001
            log.warning("the last checkpoint did not persist: %s", exc)

    def request_preemption(self) -> None:
        """Ask for a checkpoint-and-stop at the next step boundary (e.g. a coordinator decision)."""
        self._preempt.set()

    @property
    def preemption_requested(self) -> bool:
        return self._preempt.is_set()

    def preempted(self, step: int, extra: Optional[dict] = None) -> bool:
        """Call at each step boundary. If preemption was asked for (on any rank, with the torch
        glue): save, wait until durable, and return True; the caller then exits with
        ``elastictrain.PREEMPTED_EXIT_CODE``."""
        if self.membership_check is not None:
            self.membership_check()
        self._report(step)
        flag = self._preempt.is_set()
        if self.agree is not None:
            flag = self.agree(flag)
        if not flag:
            return False
        self.save(step, extra)
        self.wait()
        return True
