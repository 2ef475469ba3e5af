"""The coordinator client: keep-alive connections (:mod:`.http_pool`), typed messages, retries.

Every call the client makes is safe to repeat (leases carry a request id, progress and
commits carry absolute offsets, restores and generations are compare-and-set), so the
client retries every transport failure (connection refused or reset, timeouts, a reply cut
off mid-body) and 5xx answers with exponential backoff and
full jitter until ``retry_for`` seconds have passed; then it raises
:class:`CoordinatorUnavailableError` naming the address. A 4xx is never retried: it is
raised as the matching :mod:`elastictrain.errors` class.
"""

from __future__ import annotations

import os
import random
import threading
import time
import urllib.parse
from typing import Iterable, Optional, TypeVar, Union

import msgspec

from ..errors import ConfigError, CoordinatorUnavailableError, InterruptedCallError, error_from_status
from ..model import DatasetSpec
from ..wire import (
    AgentAction, AgentJoin, AgentPoll, AgentReport, ClusterForecast, ClusterJobInfo, ClusterJobList, ClusterStatus,
    CommitList, CommitReply, CommitRequest, DatasetInfo, Error, EventList, GenerationCreate, GenerationInfo,
    GpuTimeList, Health, JobCreate, JobInfo, JobList, JobRequeue, JobSubmit, JobUpdate, LeaseReply, LeaseRequest,
    LogList, MemberResult, NodeCordon, NodeInfo, NodeLeave, NodePoll, NodeRegister, NodeTasks, ProfileList,
    ProfileReport, ProgressReply, ProgressRequest, ProjectList, ProjectSet, ReleaseReply, ReleaseRequest, RestoreReply,
    ResourceList, ResourceReport, RestoreRequest, ShardUpdate, StepInfo, StepReport, UserList, UserQuota, UserTickets,
    Version, AccountCreate, AccountList, Credential, WhoAmI,
)
from .http_pool import HttpPool, TransportError, check_address

__all__ = ["CoordinatorClient", "read_token", "token_from_file", "write_token_file"]

T = TypeVar("T")
_ENC = msgspec.msgpack.Encoder()
#: jobs per page of a listing (:meth:`CoordinatorClient.cluster_status`; kubectl's --chunk-size is
#: 500 too): the coordinator's other clients wait for a page, about 10 ms of ended jobs here
PAGE = 500
_RETRY_STATUS = {500, 502, 503, 504}


def token_from_file(path: str, what: str = "the token file") -> str:
    """The token stored in ``path``.

    Raises:
        ConfigError: the file cannot be read (the message names ``what`` and the path).
    """
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from exc


def write_token_file(path: str, token: str) -> None:
    """Write ``token`` to ``path`` with mode 0600 (replacing what is there, atomically)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)


def read_token() -> Optional[str]:
    """The token handed to workers: the file named by ``ET_TOKEN_FILE``, else ``ET_TOKEN``."""
    path = os.environ.get("ET_TOKEN_FILE")
    if path:
        return token_from_file(path, "ET_TOKEN_FILE")
    return os.environ.get("ET_TOKEN") or None


class CoordinatorClient:
    """Typed calls to a coordinator at ``url`` (e.g. ``http://127.0.0.1:7707``).

    Args:
        token: bearer token for mutating calls; default: :func:`read_token`.
        timeout: seconds one HTTP attempt may take.
        retry_for: seconds to keep retrying an unreachable or failing coordinator.
        cancel: an event that, once set, ends a retrying call at once with
            :class:`~elastictrain.errors.InterruptedCallError` (a launcher sets it on SIGINT/SIGTERM).
    """

    def __init__(self, url: str, token: Optional[str] = "", *, timeout: float = 10.0,
                 retry_for: Optional[float] = None, cancel: Optional[threading.Event] = None) -> None:
        self.urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        for u in self.urls or [url]:
            why = check_address(u)
            if why:
                raise ConfigError(f"coordinator address {u!r}: {why} (e.g. http://127.0.0.1:7707; several: "
                                  "comma-separated, e.g. http://a:7707,http://b:7707)")
        self.url = self.urls[0]
        self.token = read_token() if token == "" else token
        self.timeout = timeout
        self.retry_for = float(os.environ.get("ET_RETRY_FOR", 60.0)) if retry_for is None else retry_for
        self._http = HttpPool()
        self._headers = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
        if self.token:
            self._headers["Authorization"] = f"Bearer {self.token}"
        self._decoders: dict[type, msgspec.msgpack.Decoder] = {}
        self.cancel_event = cancel

    # ------------------------------------------------------------------ transport
    def _call(self, method: str, path: str, reply: type[T], body: object = None, timeout: Optional[float] = None) -> T:
        data = None if body is None else _ENC.encode(body)
        deadline = time.monotonic() + self.retry_for
        attempt, last = 0, ""
        timeout = self.timeout if timeout is None else timeout
        while True:
            try:
                r = self._http.request(method, self.url + path, data, self._headers, min(2.0, timeout), timeout)
                if r.status == 200:
                    dec = self._decoders.get(reply)
                    if dec is None:
                        dec = self._decoders[reply] = msgspec.msgpack.Decoder(reply)
                    try:
                        return dec.decode(r.content)
                    except msgspec.ValidationError as exc:  # well-formed, wrong schema: not retried
                        raise CoordinatorUnavailableError(
                            f"coordinator at {self.url} answered {method} {path} with a body that is not a "
                            f"{reply.__name__} ({exc}); is that address an elastictrain coordinator of a "
                            "compatible version?") from None
                    except msgspec.DecodeError as exc:  # a body cut short: retried like a reset connection
                        raise TransportError(f"reply body cut short: {exc}") from None
                if r.status == 503:  # a standby, or a leader that stopped: try the leader it names
                    self._next_address(r.headers.get("x-et-leader"))
                if r.status not in _RETRY_STATUS:
                    try:
                        err = msgspec.msgpack.decode(r.content, type=Error)
                        raise error_from_status(r.status, err.error, err.reason)
                    except (msgspec.DecodeError, msgspec.ValidationError):
                        raise error_from_status(r.status, "", r.text[:200]) from None
                last = f"HTTP {r.status}"
            except TransportError as exc:  # refused, reset, timed out, or a reply cut off mid-body (a
                # coordinator killed while answering: the body ends early, or a msgpack body is short)
                last = str(exc)[:120]
                self._http.close()  # drop a half-dead keep-alive connection
                self._next_address(None)
            attempt += 1
            delay = random.uniform(0, min(2.0, 0.05 * 2 ** min(attempt, 10)))
            if self.cancel_event is not None and self.cancel_event.is_set():
                raise InterruptedCallError(f"{method} {path} to {self.url} given up: interrupted ({last})")
            if time.monotonic() + delay > deadline:
                raise CoordinatorUnavailableError(
                    f"coordinator at {self.url} did not answer {method} {path} for {self.retry_for:.0f} s "
                    f"({attempt} attempts, last: {last}); check that `elastictrain coordinator` is running "
                    "there, that ET_COORDINATOR points at it, and that the port is reachable")
            if self.cancel_event is not None:
                if self.cancel_event.wait(delay):
                    raise InterruptedCallError(f"{method} {path} to {self.url} given up: interrupted ({last})")
            else:
                time.sleep(delay)

    @property
    def addresses(self) -> str:
        """Every coordinator address this client knows, comma-separated (for another client)."""
        return ",".join(self.urls)

    def _next_address(self, hint: Optional[str]) -> None:
        """Of several coordinators: the one a standby named as leader, else the next in the list."""
        if len(self.urls) < 2 and not hint:
            return
        hint = (hint or "").rstrip("/")
        if hint and hint.startswith(("http://", "https://")) and hint != self.url:
            if hint not in self.urls:
                self.urls.append(hint)
            self.url = hint
        elif len(self.urls) > 1:
            self.url = self.urls[(self.urls.index(self.url) + 1) % len(self.urls)]
        else:
            return
        self._http.close()

    def __enter__(self) -> "CoordinatorClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ service
    def health(self) -> Health:
        return self._call("GET", "/v1/health", Health)

    def version(self) -> Version:
        return self._call("GET", "/v1/version", Version)

    # ------------------------------------------------------------------ jobs
    def create_job(self, job: str, min_workers: int = 1, max_workers: int = 1) -> JobInfo:
        return self._call("POST", "/v1/jobs", JobInfo, JobCreate(job, min_workers, max_workers))

    def job(self, job: str) -> JobInfo:
        return self._call("GET", f"/v1/jobs/{job}", JobInfo)

    def jobs(self, page: Optional[int] = PAGE) -> list[JobInfo]:
        """Every job the coordinator knows (``GET /v1/jobs``), by name (in pages of ``page``, joined;
        None: in one reply)."""
        return self._follow("/v1/jobs", "", page, self._call("GET", "/v1/jobs" + _page("", page, ""), JobList),
                            JobList)[0]

    def open_generation(self, job: str, expected: int, world_size: int, reason: str = "start") -> GenerationInfo:
        return self._call("POST", f"/v1/jobs/{job}/generations", GenerationInfo,
                          GenerationCreate(expected, world_size, reason))

    # ------------------------------------------------------------------ resource use
    def report_resources(self, job: str, report: ResourceReport) -> ResourceList:
        return self._call("POST", f"/v1/jobs/{job}/resources", ResourceList, report)

    def resources(self, job: str) -> ResourceList:
        """Every worker's latest resource sample of ``job`` (and how many the coordinator keeps)."""
        return self._call("GET", f"/v1/jobs/{job}/resources", ResourceList)

    # ------------------------------------------------------------------ profiles
    def report_profile(self, job: str, report: ProfileReport) -> ProfileList:
        """Store ``report`` as its worker's latest profile of ``job``; returns all of the job's."""
        return self._call("POST", f"/v1/jobs/{job}/profiles", ProfileList, report)

    def profiles(self, job: str) -> ProfileList:
        return self._call("GET", f"/v1/jobs/{job}/profiles", ProfileList)

    # ------------------------------------------------------------------ datasets
    def register_dataset(self, job: str, spec: DatasetSpec) -> DatasetInfo:
        """Register ``spec`` (idempotent).

        Raises:
            ConfigError: the coordinator shards the dataset otherwise than ``spec`` says (one of
                an older release, which drops a field it does not know, such as ``taper``).
        """
        info = self._call("POST", f"/v1/jobs/{job}/datasets", DatasetInfo, spec)
        if info.spec != spec:
            raise ConfigError(f"dataset {spec.name!r} of job {job!r}: the coordinator registered {info.spec}, not "
                              f"{spec}: it is of an older release that drops what it does not know; upgrade "
                              "it, or leave those fields at their defaults")
        return info

    def dataset(self, job: str, name: str) -> DatasetInfo:
        return self._call("GET", f"/v1/jobs/{job}/datasets/{name}", DatasetInfo)

    def commits(self, job: str, name: str) -> CommitList:
        return self._call("GET", f"/v1/jobs/{job}/datasets/{name}/commits", CommitList)

    def lease(self, job: str, name: str, generation: int, worker: int, request_id: str,
              max_epoch: Optional[int] = None, held: int = 0, rate: float = 0.0) -> LeaseReply:
        """The next shard. ``held``/``rate``: what the worker still holds and how fast it consumes (a
        prefetch may then be answered ``later``, see :class:`~elastictrain.wire.LeaseReply`)."""
        return self._call("POST", f"/v1/jobs/{job}/datasets/{name}/lease", LeaseReply,
                          LeaseRequest(generation, worker, request_id, max_epoch, held, rate))

    def progress(self, job: str, name: str, generation: int, worker: int,
                 updates: list[ShardUpdate]) -> ProgressReply:
        return self._call("POST", f"/v1/jobs/{job}/datasets/{name}/progress", ProgressReply,
                          ProgressRequest(generation, worker, updates))

    def commit(self, job: str, name: str, generation: int, worker: int, world_size: int, checkpoint: str,
               step: int, updates: list[ShardUpdate]) -> CommitReply:
        return self._call("POST", f"/v1/jobs/{job}/datasets/{name}/commit", CommitReply,
                          CommitRequest(generation, worker, world_size, checkpoint, step, updates))

    def restore(self, job: str, name: str, generation: int, checkpoint: Optional[str]) -> RestoreReply:
        return self._call("POST", f"/v1/jobs/{job}/datasets/{name}/restore", RestoreReply,
                          RestoreRequest(generation, checkpoint))

    def release(self, job: str, name: str, generation: int, worker: int) -> ReleaseReply:
        return self._call("POST", f"/v1/jobs/{job}/datasets/{name}/release", ReleaseReply,
                          ReleaseRequest(generation, worker))

    # ------------------------------------------------------------------ agents (etrun)
    def agent_join(self, job: str, req: AgentJoin) -> AgentAction:
        return self._call("POST", f"/v1/jobs/{job}/agents/join", AgentAction, req)

    def agent_poll(self, job: str, agent: str, generation: int, wait: float = 0.0) -> AgentAction:
        """The agent's state; with ``wait`` > 0 the coordinator holds the answer until the job
        changes or ``wait`` seconds pass (a long poll)."""
        return self._call("POST", f"/v1/jobs/{job}/agents/poll", AgentAction, AgentPoll(agent, generation, wait),
                          timeout=None if wait <= 0 else max(self.timeout, wait + 5.0))

    def agent_report(self, job: str, agent: str, generation: int, event: str, detail: str = "",
                     accumulate: int = 0, memory_limit: int = 0) -> AgentAction:
        return self._call("POST", f"/v1/jobs/{job}/agents/report", AgentAction,
                          AgentReport(agent, generation, event, detail, accumulate, memory_limit))

    # ------------------------------------------------------------------ progress
    def report_step(self, job: str, worker: int, step: int, generation: Optional[int] = None) -> StepInfo:
        return self._call("POST", f"/v1/jobs/{job}/steps", StepInfo, StepReport(worker, step, generation))

    # ------------------------------------------------------------------ cluster mode
    def submit(self, req: JobSubmit) -> ClusterJobInfo:
        return self._call("POST", "/v1/cluster/jobs", ClusterJobInfo, req)

    def cluster_status(self, ended: Union[int, str, None] = None, array: str = "", since: Optional[float] = None,
                       until: Optional[float] = None, page: Optional[int] = PAGE,
                       **match: Union[str, Iterable[str], None]) -> ClusterStatus:
        """The policy, the nodes and the jobs: every job that has not ended, and of the ended ones
        the ``ended`` that ended last (an int, ``"all"``, or None: the coordinator's default, 1000);
        ``array``: only that job array's tasks; ``since``/``until``: only jobs submitted then
        (epoch seconds); ``user``, ``state``, ``project``, ``name`` (each a name, comma-separated
        names or a list; states ours or Slurm's): only jobs with any of them, as squeue's -u, -t,
        -A, -n (``ended`` then counts the ended jobs they match). ``ended_omitted`` says how many
        ended jobs were left out.

        The jobs come in pages of ``page`` (the coordinator builds one page at a time, and answers
        its other clients in between: a history of 100,000 jobs does not hold it up for a second),
        joined here into one listing; ``page=None``: in one reply."""
        query = _listing(ended, array, since, until, match)
        st = self._call("GET", "/v1/cluster" + _page(query, page, ""), ClusterStatus)
        if not st.next:
            return st
        jobs, last = self._follow("/v1/cluster/jobs", query, page, st, ClusterJobList)
        return msgspec.structs.replace(st, jobs=jobs, ended_omitted=last.ended_omitted, next="")

    def cluster_jobs(self, ended: Union[int, str, None] = None, array: str = "", since: Optional[float] = None,
                     until: Optional[float] = None, page: Optional[int] = PAGE,
                     **match: Union[str, Iterable[str], None]) -> ClusterJobList:
        """The jobs :meth:`cluster_status` lists, without the nodes (in pages of ``page``, joined)."""
        query = _listing(ended, array, since, until, match)
        first = self._call("GET", "/v1/cluster/jobs" + _page(query, page, ""), ClusterJobList)
        if not first.next:
            return first
        jobs, last = self._follow("/v1/cluster/jobs", query, page, first, ClusterJobList)
        return ClusterJobList(jobs, last.ended_omitted)

    def _follow(self, path: str, query: str, page: Optional[int], first, reply: type):
        """The jobs of listing page ``first`` and of the pages that follow it (from ``path``), and
        the last page."""
        jobs, last = list(first.jobs), first
        while last.next:
            last = self._call("GET", path + _page(query, page, last.next), reply)
            jobs += last.jobs
        return jobs, last

    def cluster_job(self, job: str) -> ClusterJobInfo:
        return self._call("GET", f"/v1/cluster/jobs/{job}", ClusterJobInfo)

    def cancel(self, job: str) -> ClusterJobInfo:
        return self._call("POST", f"/v1/cluster/jobs/{job}/cancel", ClusterJobInfo)

    def submit_array(self, req: JobSubmit) -> ClusterJobList:
        """Queue a job array (``req.array``): one job per task index."""
        return self._call("POST", "/v1/cluster/arrays", ClusterJobList, req)

    def hold_job(self, job: str) -> ClusterJobInfo:
        """Keep a waiting scheduled job from running until :meth:`release_job` (``scontrol hold``)."""
        return self._call("POST", f"/v1/cluster/jobs/{job}/hold", ClusterJobInfo)

    def release_job(self, job: str) -> ClusterJobInfo:
        return self._call("POST", f"/v1/cluster/jobs/{job}/release", ClusterJobInfo)

    def cluster_forecast(self) -> ClusterForecast:
        """When each job is expected to start and end (``squeue --start``)."""
        return self._call("GET", "/v1/cluster/forecast", ClusterForecast)

    def requeue_job(self, job: str, hold: bool = False) -> ClusterJobInfo:
        """Stop a running job and queue it again (``scontrol requeue``; ``hold``: requeuehold)."""
        return self._call("POST", f"/v1/cluster/jobs/{job}/requeue", ClusterJobInfo, JobRequeue(hold))

    def update_job(self, job: str, req: JobUpdate) -> ClusterJobInfo:
        """Change a scheduled job's priority or time limit (``scontrol update``)."""
        return self._call("POST", f"/v1/cluster/jobs/{job}/update", ClusterJobInfo, req)

    def member_result(self, job: str, result: MemberResult) -> ClusterJobInfo:
        """A grouped job's own outcome (its group goes on)."""
        return self._call("POST", f"/v1/cluster/jobs/{job}/result", ClusterJobInfo, result)

    def job_logs(self, job: str, after: int = 0) -> LogList:
        return self._call("GET", f"/v1/cluster/jobs/{job}/logs?after={int(after)}", LogList)

    def events(self, after: int = 0, job: Optional[str] = None) -> EventList:
        q = f"?after={int(after)}" + (f"&job={job}" if job else "")
        return self._call("GET", f"/v1/cluster/events{q}", EventList)

    def gpu_time(self, since: Optional[float] = None, until: Optional[float] = None) -> GpuTimeList:
        """Each job's GPU-seconds that fell within ``[since, until)`` (epoch seconds; None: from the
        start, to now)."""
        q = "&".join(f"{k}={v!r}" for k, v in (("since", since), ("until", until)) if v is not None)
        return self._call("GET", "/v1/cluster/usage" + (f"?{q}" if q else ""), GpuTimeList)

    def set_user(self, user: str, tickets: float) -> UserList:
        return self._call("POST", f"/v1/cluster/users/{user}", UserList, UserTickets(tickets))

    def set_quota(self, user: str, gpus: Optional[int] = None, jobs: Optional[int] = None,
                  default: bool = False, max_priority: Optional[int] = None) -> UserList:
        """(admin) ``user``'s own quota: the most GPUs and jobs its admitted jobs may hold (None: no
        limit); ``default``: drop it (the coordinator's default quota applies again). ``max_priority``
        alone: only the highest priority it may submit at (the limits stay)."""
        return self._call("POST", f"/v1/cluster/users/{user}/quota", UserList,
                          UserQuota(gpus, jobs, default, max_priority))

    def projects(self) -> ProjectList:
        return self._call("GET", "/v1/cluster/projects", ProjectList)

    def set_project(self, name: str, gpus: Optional[int] = None, jobs: Optional[int] = None,
                    users: Optional[list[str]] = None, tickets: Optional[float] = None,
                    parent: Optional[str] = None, shares: Optional[dict[str, float]] = None) -> ProjectList:
        """(admin) Create or change project ``name``: its quota (None: no limit), members, fair-share
        tickets and parent project (None: kept; tickets 0: none; parent "": none), and with ``users``,
        members' own shares in it."""
        return self._call("POST", f"/v1/cluster/projects/{name}", ProjectList,
                          ProjectSet(gpus, jobs, users, tickets, parent=parent, shares=shares))

    def remove_project(self, name: str) -> ProjectList:
        return self._call("POST", f"/v1/cluster/projects/{name}", ProjectList, ProjectSet(remove=True))

    def users(self, window: float = 600.0) -> UserList:
        return self._call("GET", f"/v1/cluster/users?window={float(window)!r}", UserList)

    def whoami(self) -> WhoAmI:
        return self._call("GET", "/v1/whoami", WhoAmI)

    def add_user(self, user: str, unix_user: str = "", allow_root: bool = False) -> Credential:
        return self._call("POST", f"/v1/admin/users/{user}", Credential, AccountCreate(unix_user, allow_root))

    def add_node(self, node: str) -> Credential:
        return self._call("POST", f"/v1/admin/nodes/{node}", Credential)

    def revoke(self, role: str, name: str) -> Credential:
        return self._call("POST", f"/v1/admin/{role}s/{name}/revoke", Credential)

    def accounts(self) -> AccountList:
        return self._call("GET", "/v1/admin/accounts", AccountList)

    def node_register(self, name: str, req: NodeRegister) -> NodeInfo:
        return self._call("POST", f"/v1/cluster/nodes/{name}/register", NodeInfo, req)

    def node_poll(self, name: str, req: NodePoll) -> NodeTasks:
        return self._call("POST", f"/v1/cluster/nodes/{name}/poll", NodeTasks, req, timeout=req.wait + self.timeout)

    def node_leave(self, name: str, req: NodeLeave) -> NodeInfo:
        return self._call("POST", f"/v1/cluster/nodes/{name}/leave", NodeInfo, req)

    def cordon(self, name: str, seconds: float, reason: str = "", drain: bool = False,
               at: Optional[float] = None) -> NodeInfo:
        """(admin) Place nothing new on node ``name`` for ``seconds`` (0: lift its cordon and any
        maintenance planned); ``drain``: also requeue the jobs running there (they resume elsewhere
        from their checkpoints); ``at``: from that UNIX time instead of now (a maintenance window)."""
        return self._call("POST", f"/v1/cluster/nodes/{name}/cordon", NodeInfo,
                          NodeCordon(seconds, reason, drain, at))


_MATCH = ("user", "state", "project", "name")


def _page(query: str, page: Optional[int], after: str) -> str:
    """``query`` (:func:`_listing`'s) asking for the page of ``page`` jobs after job ``after``."""
    if page is None:
        return query
    more = f"limit={int(page)}" + (f"&after={urllib.parse.quote(after, safe='')}" if after else "")
    return f"{query}&{more}" if query else f"?{more}"


def _listing(ended, array: str, since: Optional[float], until: Optional[float], match: dict) -> str:
    """The query string of a job listing (:meth:`CoordinatorClient.cluster_status`).

    Raises:
        TypeError: a filter other than ``user``, ``state``, ``project``, ``name``."""
    q = [f"ended={ended if ended == 'all' else int(ended)}"] if ended is not None else []
    q += [f"array={urllib.parse.quote(array, safe='')}"] if array else []
    q += [f"{k}={v!r}" for k, v in (("since", since), ("until", until)) if v is not None]
    for key, v in match.items():
        if key not in _MATCH:
            raise TypeError(f"unknown job filter {key!r}: the filters are {', '.join(_MATCH)}")
        if v:
            q.append(f"{key}={urllib.parse.quote(v if isinstance(v, str) else ','.join(v), safe=',')}")
    return f"?{'&'.join(q)}" if q else ""
