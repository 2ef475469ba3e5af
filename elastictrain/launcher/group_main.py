"""The worker of ``etrun --group``: several training scripts interleaved in one process.

``etrun`` starts this module once per local rank (``python -m
elastictrain.launcher.group_main SCRIPT [ARGS] : SCRIPT [ARGS] ...``) with the worker
environment torchrun gives. It:

1. initializes ``torch.distributed`` once (gloo, from that environment) where torch is
   installed, and creates one process group per job, in the same order on every rank, so each
   job's collectives pair only with the same job on the other ranks;
2. runs each script in its own thread of an
   :class:`~elastictrain.runtime.interleave.InterleaveGroup` (Muri's phase-shifted slots), as
   ``__main__``, with its own ``sys.argv`` and a :class:`~elastictrain.runtime.jobctx.JobContext`
   (its name, its process group; its datasets are named ``<job>.<dataset>`` at the coordinator);
3. agrees on the slot offsets across ranks (rank 0's choice), installs the SIGTERM/SIGUSR1
   handlers in the main thread and forwards them to every job's checkpointer;
4. when a job fails here, tells the other ranks through the store, and cancels the job there at
   its next stage; the other jobs go on;
5. starts every line a job prints with ``[job] ``;
6. prints one line per job and exits 0 if every job succeeded, 75 if every unfinished job stopped
   for preemption, else 1 (and writes the failures to ``TORCHELASTIC_ERROR_FILE``).

A group the scheduler formed (cluster mode, ``ET_GROUP_MEMBERS``) runs jobs that exist at the
coordinator on their own: rank 0 opens each job's next generation (under the job's own id, so its
datasets, commits, steps and profiles stay its own, grouped or not) and every rank binds it to
the job's thread. Each job's outcome is sent as it happens (``finished`` from rank 0, ``failed``
from any rank), so the scheduler ends it while the rest of the group trains on; a job the
scheduler ended (cancelled) is cancelled here within a second, and counts as no failure.

Scripts must get their process group from ``elastictrain_torch.init_process_group()`` (and
pass it to DDP); calling ``torch.distributed.init_process_group`` from a job is refused with
that advice. Jobs share the process's global RNG; each job's set-up (before its first stage) runs
alone, in job order, from the RNG state the process started with, so every rank of a job builds
the same data (see ``runtime/setup_turns.py``); training starts once every job has set up.
"""

from __future__ import annotations

import builtins
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional, Sequence

from .. import PREEMPTED_EXIT_CODE
from ..errors import ConfigError
from ..runtime import jobctx
from ..runtime.interleave import GroupJob, InterleaveGroup, JobResult
from .runner import exit_status, write_error

__all__ = ["GroupSpec", "parse_group", "main"]

SEPARATOR = ":"


@dataclass(frozen=True)
class GroupSpec:
    name: str
    script: str
    args: tuple[str, ...]


def parse_group(tokens: Sequence[str]) -> list[GroupSpec]:
    """``a.py b.py`` (no arguments) or ``a.py --x 1 : b.py --y 2`` into 2 to 4 jobs; names are
    the scripts' base names (``a``, ``b``; repeated names get ``-2``, ``-3``).

    Raises:
        ConfigError: fewer than 2 or more than 4 jobs, or an empty part.
    """
    tokens = list(tokens)
    if SEPARATOR in tokens:
        parts, cur = [], []
        for t in tokens:
            if t == SEPARATOR:
                parts.append(cur)
                cur = []
            else:
                cur.append(t)
        parts.append(cur)
        if any(not p for p in parts):
            raise ConfigError("etrun --group: an empty job between ':' separators; write "
                              "`etrun --group a.py --lr 0.1 : b.py --steps 50`")
    else:
        parts = [[t] for t in tokens]
    if not 2 <= len(parts) <= 4:
        raise ConfigError(f"etrun --group interleaves 2 to 4 scripts, got {len(parts)}; separate scripts that "
                          "take arguments with ':' (`etrun --group a.py --lr 0.1 : b.py`)")
    specs, seen = [], {}
    for p in parts:
        base = os.path.splitext(os.path.basename(p[0]))[0] or "job"
        base = "".join(c if c.isalnum() or c in "._-" else "-" for c in base).lstrip("._-") or "job"
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}-{seen[base]}"
        specs.append(GroupSpec(name, p[0], tuple(p[1:])))
    return specs


def _run_script(spec: GroupSpec, group, own: Optional["_Member"] = None) -> int:
    """Run one script as ``__main__`` in this thread; its exit status (0 when it returns)."""
    path = os.path.abspath(spec.script)
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec")
    except OSError as exc:
        raise ConfigError(f"job {spec.name}: cannot read {spec.script}: {exc.strerror}") from None
    ctx = jobctx.JobContext(spec.name, [path, *spec.args], process_group=group)
    if own is not None:
        ctx.job_id, ctx.generation, ctx.restart_reason = own.job, own.generation, own.reason
    scope = {"__name__": "__main__", "__file__": path, "__builtins__": builtins, "__package__": None,
             "__spec__": None}
    with jobctx.bound(ctx):
        try:
            exec(code, scope)
        except SystemExit as exc:
            return exit_status(exc.code)
    return 0


class _ExitStatus(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"exited with status {code}")
        self.code = code


class _Distributed:
    """The default group (for the runner's own agreement) and one group per job."""

    def __init__(self, names: list[str], timeout: float) -> None:
        import torch.distributed as dist

        self.dist = dist
        if not dist.is_initialized():
            dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
        self.rank = dist.get_rank()
        self.groups = {n: dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout)) for n in names}
        try:
            from torch.distributed.distributed_c10d import _get_default_store

            self.store = _get_default_store()
        except Exception:  # noqa: BLE001 - no cross-rank cancellation without a store
            self.store = None
        self._guard()

    def _guard(self) -> None:
        """Refuse ``dist.init_process_group`` from a job (it would collide with the group's own)
        and make ``dist.destroy_process_group()`` from a job a no-op (the runner owns it)."""
        dist = self.dist
        init, destroy = dist.init_process_group, dist.destroy_process_group

        def guarded_init(*a, **kw):
            ctx = jobctx.current()
            if ctx is not None:
                raise ConfigError(f"job {ctx.name!r} runs inside etrun --group: get its process group from "
                                  "elastictrain_torch.init_process_group() and pass it to DDP(process_group=...) "
                                  "and to collectives (group=...)")
            return init(*a, **kw)

        def guarded_destroy(group=None):
            if jobctx.current() is not None and group in (None, dist.group.WORLD):
                return None
            return destroy(group)

        dist.init_process_group, dist.destroy_process_group = guarded_init, guarded_destroy
        self._restore = (init, destroy)

    def agree(self, offsets: tuple) -> list[int]:
        box = [list(offsets)]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def mark_failed(self, name: str, detail: str) -> None:
        if self.store is not None:
            self.store.set(f"et_group/failed/{name}", detail[:500])

    def failed_elsewhere(self, names: list[str]) -> dict[str, str]:
        out = {}
        if self.store is None:
            return out
        for n in names:
            key = f"et_group/failed/{n}"
            if self.store.check([key]):
                out[n] = self.store.get(key).decode(errors="replace")
        return out

    def close(self) -> None:
        init, destroy = self._restore
        self.dist.init_process_group, self.dist.destroy_process_group = init, destroy
        try:
            destroy()
        except Exception:  # noqa: BLE001 - a peer may be gone already
            pass


@dataclass
class _Member:
    job: str
    run: int
    reason: str
    generation: int = 0


class _Scheduled:
    """The jobs of a group the scheduler formed (``ET_GROUP_MEMBERS``: a JSON list of
    ``{"job", "run", "reason"}``, one per script, in order)."""

    @staticmethod
    def parse(raw: str, n: int) -> list[_Member]:
        import json

        try:
            members = [_Member(str(m["job"]), int(m["run"]), str(m["reason"])) for m in json.loads(raw)]
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"ET_GROUP_MEMBERS must be a JSON list of {{job, run, reason}}: {exc}") from None
        if len(members) != n:
            raise ConfigError(f"ET_GROUP_MEMBERS names {len(members)} jobs for {n} scripts")
        return members

    def __init__(self, members: list[_Member], names: list[str], dist: Optional[_Distributed]) -> None:
        from ..runtime.client import CoordinatorClient

        url = os.environ.get("ET_COORDINATOR")
        if not url:
            raise ConfigError("ET_GROUP_MEMBERS needs ET_COORDINATOR (the group runs under etrun)")
        self.client = CoordinatorClient(url, timeout=10.0, retry_for=30.0)
        self.by_name = dict(zip(names, members))
        self.cancelled: set[str] = set()
        self.handled: set[str] = set()  # failures the scheduler knows of (it requeues or ends the job)
        self._sent: set[str] = set()
        self._lock = threading.Lock()
        rank = dist.rank if dist is not None else 0
        world = int(os.environ.get("WORLD_SIZE", "1"))
        failure = os.environ.get("ET_RESTART_REASON") == "failure"  # etrun restarted the whole group
        gens = []
        if rank == 0:
            for m in members:
                row = self.client.job(m.job)
                reason = "failure" if failure else m.reason
                gens.append(self.client.open_generation(m.job, row.generation, world, reason).generation)
        if dist is not None:
            box = [gens]
            dist.dist.broadcast_object_list(box, src=0)
            gens = box[0]
        for m, g in zip(members, gens):
            m.generation = g
        self.rank = rank

    def result(self, name: str, status: str, detail: str = "") -> None:
        """Tell the scheduler job ``name``'s outcome (once; finished only from rank 0)."""
        from ..errors import ElasticTrainError
        from ..wire import MemberResult

        if (status == "finished" and self.rank != 0) or name in self.cancelled:
            return
        with self._lock:
            if name in self._sent:
                return
            self._sent.add(name)
        m = self.by_name[name]
        try:
            self.client.member_result(m.job, MemberResult(m.run, status, detail[-4000:]))
            if status == "failed":
                self.handled.add(name)
        except ElasticTrainError as exc:  # the group's exit code still tells the scheduler
            print(f"[etrun-group] could not report job {name} {status}: {exc}", file=sys.stderr, flush=True)

    def ended_elsewhere(self, done: set) -> dict[str, str]:
        """Jobs the scheduler ended (cancelled) or moved on from while they run here."""
        from ..errors import ElasticTrainError

        out = {}
        for name, m in self.by_name.items():
            if name in done or name in self.cancelled:
                continue
            try:
                info = self.client.cluster_job(m.job)
            except ElasticTrainError:
                continue
            if info.status == "cancelled" or (info.run != m.run and info.status != "finished"):
                out[name] = f"job {m.job} is {info.status} at the scheduler (run {info.run})"
        return out


def _distributed(names: list[str], timeout: float) -> Optional[_Distributed]:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or "MASTER_ADDR" not in os.environ:
        return None
    return _Distributed(names, timeout)


def _summary(results: list[JobResult], cancelled: frozenset = frozenset()) -> tuple[int, list[str], list[JobResult]]:
    """Exit status, one line per job, and the failed jobs (preempted ones, and ``cancelled``:
    ones the scheduler cancelled or was told failed, are not failures here)."""
    lines, failed, preempted = [], [], []
    for r in results:
        if r.ok:
            lines.append(f"[etrun-group] job {r.name}: ok ({r.iterations} iterations, {r.seconds:.2f} s)")
            continue
        if r.name in cancelled:
            lines.append(f"[etrun-group] job {r.name}: ended by the scheduler after {r.iterations} iterations "
                         f"({type(r.error).__name__}: {r.error})")
            continue
        code = r.error.code if isinstance(r.error, _ExitStatus) else None
        if code == PREEMPTED_EXIT_CODE:
            preempted.append(r.name)
            lines.append(f"[etrun-group] job {r.name}: preempted after {r.iterations} iterations")
        else:
            failed.append(r)
            lines.append(f"[etrun-group] job {r.name}: FAILED after {r.iterations} iterations: "
                         f"{type(r.error).__name__}: {r.error}")
    if failed:
        return 1, lines, failed
    return (PREEMPTED_EXIT_CODE if preempted else 0), lines, failed


def main(argv: Optional[Sequence[str]] = None) -> int:
    specs = parse_group(sys.argv[1:] if argv is None else argv)
    raw = os.environ.get("ET_GROUP_MEMBERS")
    members = _Scheduled.parse(raw, len(specs)) if raw else None
    if members is not None:  # the scheduler's jobs go by their ids (output lines start with `[<id>] `)
        specs = [GroupSpec(m.job, s.script, s.args) for s, m in zip(specs, members)]
    names = [s.name for s in specs]
    timeout = float(os.environ.get("ET_GROUP_TIMEOUT", "300"))
    probe = int(os.environ.get("ET_GROUP_PROBE", "3"))
    jobctx.install_argv_proxy()
    sys.stdout, sys.stderr = jobctx.PrefixedStream(sys.stdout), jobctx.PrefixedStream(sys.stderr)
    for s in specs:  # a script imports its neighbours, as `python a.py` would let it
        d = os.path.dirname(os.path.abspath(s.script))
        if d not in sys.path:
            sys.path.insert(0, d)
    dist = _distributed(names, timeout)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda *_: jobctx.notify_preempt())
    sched = _Scheduled(members, names, dist) if members is not None else None
    done: set = set()

    def failed(name: str, detail: str) -> None:
        if dist is not None:
            dist.mark_failed(name, detail)
        if sched is not None:
            sched.result(name, "failed", detail)

    def job_fn(spec: GroupSpec):
        def fn():
            try:
                try:
                    code = _run_script(spec, dist.groups[spec.name] if dist else None,
                                       sched.by_name[spec.name] if sched else None)
                except BaseException as exc:
                    failed(spec.name, f"rank {dist.rank if dist else 0}: {type(exc).__name__}: {exc}")
                    raise
                if code != 0:
                    if code != PREEMPTED_EXIT_CODE:
                        failed(spec.name, f"rank {dist.rank if dist else 0}: exited with status {code}")
                    raise _ExitStatus(code)
                if sched is not None:
                    sched.result(spec.name, "finished")
            finally:
                done.add(spec.name)
        return fn

    group = InterleaveGroup([GroupJob(s.name, job_fn(s)) for s in specs], probe=probe,
                            agree=dist.agree if dist is not None else None)
    stop = threading.Event()
    if dist is not None and dist.store is not None:
        def watch() -> None:  # a job that failed on another rank can never finish here
            cancelled: set = set()
            while not stop.wait(0.2):
                for name, detail in dist.failed_elsewhere([n for n in names if n not in cancelled]).items():
                    cancelled.add(name)
                    if sched is not None:
                        sched.handled.add(name)  # the failing rank tells the scheduler
                    group.cancel(name, f"job {name} failed on another rank ({detail})")

        threading.Thread(target=watch, name="et-group-watch", daemon=True).start()
    if sched is not None:
        def watch_scheduler() -> None:  # a job cancelled at the scheduler stops here; the others go on
            while not stop.wait(1.0):
                for name, why in sched.ended_elsewhere(done).items():
                    sched.cancelled.add(name)
                    group.cancel(name, why)

        threading.Thread(target=watch_scheduler, name="et-group-scheduler", daemon=True).start()
    t0 = time.monotonic()
    try:
        results = group.run()
    finally:
        stop.set()
    # a failure the scheduler was told of is its to handle: etrun must not restart the whole group for it
    code, lines, bad = _summary(results, frozenset(sched.cancelled | sched.handled) if sched is not None
                                else frozenset())
    for line in lines:
        print(line, flush=True)
    print(f"[etrun-group] {len(results)} jobs in {time.monotonic() - t0:.2f} s, slot offsets {group.offsets}",
          flush=True)
    err_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if err_file and bad:
        write_error(err_file, "; ".join(f"job {r.name}: {type(r.error).__name__}: {r.error}" for r in bad),
                    bad[0].traceback)
    if dist is not None:
        dist.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
