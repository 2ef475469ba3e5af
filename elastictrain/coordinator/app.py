"""The coordinator's HTTP API (``/v1/...``) as a plain ASGI application.

Served by uvicorn (see :mod:`elastictrain.coordinator.server`). No web framework sits in
between: routing is a table lookup, bodies are decoded straight into the typed messages of
:mod:`elastictrain.wire` by msgspec, and the handlers are short synchronous calls into the
state machines, so a request costs a few tens of microseconds of Python.

Every route takes the bearer token, reads included (``public_read=True`` lets GETs through
without it); only ``/v1/health`` and ``/v1/version``, which say nothing about jobs, are open.
Every failure becomes a 4xx with a reason (``{"error": code, "reason": text}``): bad
bodies, wrong types, unknown fields, unknown routes, oversized bodies, a missing or wrong
token. Only a bug in this package yields a 500.

A handler may be a coroutine (the node daemons' long poll); the others are short synchronous
calls. Cluster mode (``/v1/cluster/...``) exists when the coordinator runs a policy.
"""

from __future__ import annotations

import asyncio
import bisect
import inspect
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional
from urllib.parse import parse_qs

import msgspec

from .. import __version__
from ..clock import Clock, WallClock
from ..errors import (
    AuthError, BadRequestError, ConfigError, ConflictError, ElasticTrainError, NotFoundError, PayloadTooLargeError,
)
from ..model import DatasetSpec, check_name, check_states
from ..wire import (
    API_VERSION, AccountCreate, AccountInfo, AccountList, AgentAction, AgentJoin, ClusterJobInfo,
    Credential,
    WhoAmI, AgentPoll, AgentReport, CommitList, CommitRequest, Error, GenerationCreate,
    GenerationInfo, Health, JobCreate, JobInfo, JobList, JobRequeue, JobSubmit, JobUpdate, LeaseRequest, MemberResult,
    NodeCordon,
    NodeLeave, NodePoll, NodeRegister, ProfileList, ProfileReport, ProgressRequest, ReleaseRequest, ResourceList,
    ResourceReport,
    RestoreRequest, ProjectSet, StepInfo, StepReport, StragglerInfo, UserQuota, UserTickets,
    Version,
)
from .access import ADMIN, ANONYMOUS, PUBLIC_ROUTES, Access, Credentials, Identity
from .gc_pacing import Freezer
from .listing import LIST_ENDED, MAX_PAGE, JobFilter, cut
from .membership import Membership
from .profiles import ProfileBook
from .resources import ResourceBook
from .rendezvous import Rendezvous
from .shards import ShardManager
from .stragglers import StragglerWatch
from .store import Store
from .users import window_arg

#: what a user is shown of the details of another user's job events: where and on how many workers
#: it ran (what the queue shows anyway), so that a report built from the log (fairness
#: --from-coordinator) counts every job's GPU time; the rest (reasons, commands, errors) stays the
#: job's owner's
_PUBLIC_DETAIL = frozenset({"placement", "previous", "run", "workers", "previous_workers"})

__all__ = ["Coordinator", "CoordinatorApp", "MAX_BODY"]

log = logging.getLogger(__name__)

#: largest request body accepted (a commit part of many shards is a few KiB)
MAX_BODY = 1 << 20
MSGPACK, JSON = b"application/msgpack", b"application/json"


class Coordinator:
    """The coordinator's state: a store, jobs and their generations, datasets, and (with a
    ``cluster`` config) the live scheduler."""

    def __init__(self, store: Store, clock: Optional[Clock] = None, cluster=None,
                 stragglers: Optional[StragglerWatch] = None) -> None:
        self.store = store
        self.clock = clock or WallClock()
        loaded = store.load()
        self.members = Membership(store, loaded.jobs)
        self.shards = ShardManager(store, self.members, self.clock)
        self.shards.load(loaded)
        self.rendezvous = Rendezvous(self.members, self.clock, store, loaded.rdzv)
        self.profiles = ProfileBook(store, self.members, self.clock, loaded.profiles)
        self.resources = ResourceBook(self.members)
        self.stragglers = stragglers or StragglerWatch()
        self.creds = Credentials(store, loaded.meta)
        self._alive: dict[tuple, float] = {}
        self.cluster = None
        self.engine = None  # an in-process engine bridge (--backend slurm), run beside the scheduler
        if cluster is not None:
            from .scheduler import ClusterScheduler

            self.cluster = ClusterScheduler(self, loaded, cluster)
        self.access = Access(self.owner, self.run_alive, self.creds.claim)

    def owner(self, job: str) -> Optional[str]:
        """The user a job belongs to: its submitter (a scheduled job), the user whose credential
        first used its name (an etrun job); "" for a job of the admin's or the scheduler's; None
        for a job the coordinator does not know."""
        if self.cluster is not None:
            rec = self.cluster.records.kept(job)  # (an old one packed: its user read, not unpacked)
            if rec is not None:
                return rec.user
        known = self.creds.owners.get(job)
        if known is not None:
            return known
        return "" if job in self.members.jobs else None

    def run_alive(self, job: str, run: int) -> bool:
        """Whether run ``run`` of ``job`` (a task's job id) still has a task placed, running or exiting
        (a yes is remembered for a second: a worker's requests do not each scan every node)."""
        if self.cluster is None:
            return False
        key, now = (job, run), self.clock.now()
        if self._alive.get(key, 0.0) > now:
            return True
        alive = self.cluster.nodes.run_alive(job, run)
        if alive:
            if len(self._alive) > 100_000:
                self._alive.clear()
            self._alive[key] = now + 1.0
        return alive

    def job_info(self, job: str) -> JobInfo:
        r = self.members.get(job)
        shape = self.rendezvous.shape(job) or ("", "", 0, 0, 0)
        return JobInfo(r.job, r.generation, r.world_size, r.min_workers, r.max_workers, self.shards.datasets(job),
                       *shape)

    def job_list(self, unscheduled: bool = False, after: str = "", limit: Optional[int] = None,
                 sees: Optional[Callable[[str], bool]] = None) -> JobList:
        """Every job etrun or the library created, by name (``unscheduled``: but those the scheduler
        placed, which its own listing shows; ``sees``: those it passes); a page of them: at most
        ``limit``, the names after ``after`` (``next``: the name the next page follows)."""
        names = self.members.jobs
        if unscheduled and self.cluster is not None:
            records = self.cluster.records
            names = [n for n in names if n not in records]
        if sees is not None:
            names = [n for n in names if sees(n)]
        names = sorted(names)
        if after:
            names = names[bisect.bisect_right(names, after):]
        names, more = cut(names, limit)
        return JobList([self.job_info(name) for name in names], more)

    def put_resources(self, job: str, req: ResourceReport) -> ResourceList:
        """A worker's resource samples; they may flag it a straggler. It is then given fewer
        samples per step where the job asks for its parts (:meth:`Job.local_batch`); else, or when
        it stays slow, its node is excluded for a cooldown where the job can run without it (a
        spare agent takes its place); a job the scheduler placed is requeued and its node cordoned."""
        self.resources.put(job, req)
        members = self.members.get(job)
        flag = self.stragglers.observe(job, members.generation, req.worker, req.samples)
        if flag is not None:
            flag.agent = self.rendezvous.agent_of(job, flag.worker)
            node = self.rendezvous.node_of(job, flag.agent)
            why = f"rank {flag.worker} does its work {flag.slowdown:.2f}x slower than its peers' median"
            cut = self.stragglers.share_out(job, flag, members.world_size)
            if flag.worker in self.stragglers.cut(job) and cut is None:
                why += ", even with fewer samples per step"
            if cut is not None:
                flag.action = cut
            elif not flag.agent:
                flag.action = "kept: no etrun agent runs it"
            elif self.stragglers.cooldown <= 0:
                flag.action = "flagged only (--straggler-cooldown 0)"
            else:  # a job the scheduler placed moves off the node (cordoned); any other leaves it
                moved = self.cluster.replace_node(job, node, self.stragglers.cooldown, why) \
                    if self.cluster is not None else None
                flag.action = moved or self.rendezvous.exclude(job, flag.agent, self.stragglers.cooldown, why)
            log.warning("job %s: straggler: %s; node %s %s", job, why, flag.agent or "-", flag.action)
            if self.cluster is not None:
                self.cluster.note("straggler", job, worker=flag.worker, slowdown=round(flag.slowdown, 3),
                                  agent=flag.agent, node=node, action=flag.action)
        return self.list_resources(job)

    def agent_report(self, job: str, req: AgentReport) -> AgentAction:
        """An etrun agent's report; an out-of-memory plan it chose (a doubled memory limit, more
        gradient accumulation) goes to the event log, and a doubled limit stays the job's floor."""
        action = self.rendezvous.report(job, req)
        if self.cluster is not None and req.event == "failed" and (req.accumulate or req.memory_limit):
            self.cluster.out_of_memory(job, req)
        return action

    def list_resources(self, job: str) -> ResourceList:
        out = self.resources.list(job)
        return ResourceList(out.job, out.workers, [StragglerInfo(f.worker, round(f.slowdown, 3), f.since, f.agent,
                                                                 f.action) for f in self.stragglers.current(job)],
                            self.stragglers.shares.get(job))

    def put_profile(self, job: str, req: ProfileReport) -> ProfileList:
        out = self.profiles.put(job, req)
        if self.cluster is not None:
            self.cluster.profile_arrived(job)
        return out

    def step(self, job: str, req: StepReport) -> StepInfo:
        self.members.get(job)
        if self.cluster is not None:
            return self.cluster.step(job, req)
        return StepInfo(job, req.step, None)

    def scheduler(self):
        """The live scheduler.

        Raises:
            ConflictError: this coordinator runs no policy.
        """
        if self.cluster is None:
            raise ConflictError("this coordinator runs no scheduling policy: start it with `elastictrain coordinator "
                                "--policy NAME` (e.g. tiresias-l) to submit jobs and add nodes (docs/cluster.md)")
        return self.cluster

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
        self.store.close()


@dataclass(frozen=True)
class _Route:
    method: str
    body: Optional[type]
    handler: Callable[..., Any]
    key: str = ""  # its row in access.ACCESS, e.g. "POST /v1/jobs/{job}/steps"
    query: bool = False  # the handler takes the query string as a dict
    who: bool = False  # the handler takes the caller's Identity (first)


def _all_routes(table) -> list["_Route"]:
    """Every :class:`_Route` in nested dicts of routes."""
    out = []
    for v in table.values():
        if isinstance(v, _Route):
            out.append(v)
        elif isinstance(v, dict):
            out.extend(_all_routes(v))
    return out


class _Codec:
    def __init__(self, types: list[type]) -> None:
        self.mp = {t: msgspec.msgpack.Decoder(t) for t in types}
        self.js = {t: msgspec.json.Decoder(t) for t in types}
        self.mp_enc = msgspec.msgpack.Encoder()
        self.js_enc = msgspec.json.Encoder()


def _routes(prefix: str, table: dict) -> dict:
    """``{verb: {method: _Route}}`` with each route's access key filled in from ``prefix``."""
    out = {}
    for verb, methods in table.items():
        path = prefix + ("/" + verb if verb else "")
        out[verb] = {m: _with_key(r, f"{m} {path}") for m, r in methods.items()}
    return out


def _with_key(r: _Route, key: str) -> _Route:
    from .access import ACCESS

    if key not in ACCESS:
        raise AssertionError(f"route {key} has no row in access.ACCESS")
    return _Route(r.method, r.body, r.handler, key, r.query, r.who)


class CoordinatorApp:
    """ASGI application for a :class:`Coordinator`.

    Args:
        token: the admin token (the token file's); users', nodes' and workers' credentials are
            the coordinator's :class:`~elastictrain.coordinator.access.Credentials`.
        public_read: let GET requests through without a token (everything but the credential
            routes, as the admin sees it).
        max_body: bodies larger than this get 413.
        reap_interval: seconds between sweeps that return expired leases.
        gc_freeze: keep the long-lived state out of the garbage collector's sight
            (:mod:`.gc_pacing`; off for a coordinator embedded in another program's process).
    """

    def __init__(self, coordinator: Coordinator, token: str, *, max_body: int = MAX_BODY,
                 reap_interval: float = 0.5, public_read: bool = False, gc_freeze: bool = True) -> None:
        if not token:
            raise ValueError("the coordinator needs a non-empty token")
        self.c = coordinator
        coordinator.creds.set_admin(token)
        self._max_body = max_body
        self._reap_interval = reap_interval
        self._public_read = public_read
        self._tasks: list[asyncio.Task] = []
        self.freezer = Freezer() if gc_freeze else None
        self._barrier = getattr(coordinator.store, "barrier", None)
        s = coordinator.shards
        sched = coordinator.scheduler
        R = _Route
        fixed = {
            "/v1/health": {"GET": R("GET", None, lambda: Health("ok"))},
            "/v1/version": {"GET": R("GET", None, lambda: Version(API_VERSION, __version__, coordinator.store.kind))},
            "/v1/whoami": {"GET": R("GET", None, self._whoami, who=True)},
            "/v1/jobs": {"POST": R("POST", JobCreate, self._create_job, who=True),
                         "GET": R("GET", None, self._job_list, query=True, who=True)},
            "/v1/cluster": {"GET": R("GET", None, lambda w, q: self._view(w, sched().status(*_listing_args(q))),
                                     query=True, who=True)},
            "/v1/cluster/jobs": {"GET": R("GET", None, lambda w, q: self._view(w, sched().jobs(*_listing_args(q))),
                                          query=True, who=True),
                                 "POST": R("POST", JobSubmit, lambda w, b: sched().submit(b, w), who=True)},
            "/v1/cluster/arrays": {"POST": R("POST", JobSubmit, lambda w, b: self._view(w, sched().submit_array(b, w)),
                                             who=True)},
            "/v1/cluster/events": {"GET": R("GET", None, self._events, query=True, who=True)},
            "/v1/cluster/usage": {"GET": R("GET", None, lambda q: sched().gpu_time(
                _time_arg(q, "since"), _time_arg(q, "until")), query=True)},
            "/v1/cluster/forecast": {"GET": R("GET", None, lambda: sched().forecast())},
            "/v1/cluster/utilization": {"GET": R("GET", None, lambda: sched().utilization())},
            "/metrics": {"GET": R("GET", None, self._metrics)},
            "/v1/cluster/users": {"GET": R("GET", None, self._users, query=True)},
            "/v1/cluster/projects": {"GET": R("GET", None, lambda: sched().project_list())},
            "/v1/admin/accounts": {"GET": R("GET", None, self._accounts)},
        }
        self._fixed = {path: {m: _with_key(r, f"{m} {path}") for m, r in methods.items()}
                       for path, methods in fixed.items()}
        # /v1/cluster/users/{name}: set its tickets
        users = _routes("/v1/cluster/users/{user}", {
            "": {"POST": R("POST", UserTickets, lambda u, b: sched().set_user(u, b))},
            "quota": {"POST": R("POST", UserQuota, lambda u, b: sched().set_quota(u, b))}})
        self._user, self._user_verb = users.pop(""), users
        self._project = _routes("/v1/cluster/projects/{project}", {
            "": {"POST": R("POST", ProjectSet, lambda p, b: sched().set_project(p, b))}})[""]
        # /v1/jobs/{job}[/generations | /profiles | /steps | /datasets[/{ds}[/verb]]]
        self._job = _routes("/v1/jobs/{job}", {"": {"GET": R("GET", None, coordinator.job_info)}})[""]
        self._job_sub = _routes("/v1/jobs/{job}", {
            "generations": {"POST": R("POST", GenerationCreate, self._open_generation)},
            "datasets": {"POST": R("POST", DatasetSpec, s.register)},
            "resources": {"POST": R("POST", ResourceReport, coordinator.put_resources),
                          "GET": R("GET", None, coordinator.list_resources)},
            "profiles": {"POST": R("POST", ProfileReport, coordinator.put_profile),
                         "GET": R("GET", None, coordinator.profiles.list)},
            "steps": {"POST": R("POST", StepReport, coordinator.step)},
        })
        r = coordinator.rendezvous
        self._agents = _routes("/v1/jobs/{job}/agents", {
            "join": {"POST": R("POST", AgentJoin, r.join)},
            "poll": {"POST": R("POST", AgentPoll, r.long_poll)},
            "report": {"POST": R("POST", AgentReport, coordinator.agent_report)},
        })
        self._ds = _routes("/v1/jobs/{job}/datasets/{ds}", {"": {"GET": R("GET", None, s.info)}})[""]
        self._ds_verb = _routes("/v1/jobs/{job}/datasets/{ds}", {
            "lease": {"POST": R("POST", LeaseRequest, s.lease)},
            "progress": {"POST": R("POST", ProgressRequest, s.progress)},
            "commit": {"POST": R("POST", CommitRequest, s.commit)},
            "restore": {"POST": R("POST", RestoreRequest, s.restore)},
            "release": {"POST": R("POST", ReleaseRequest, s.release)},
            "commits": {"GET": R("GET", None, lambda j, d: CommitList(s.commits(j, d)))},
        })
        # /v1/cluster/jobs/{id}[/cancel | /logs], /v1/cluster/nodes/{name}/{register | poll | leave}
        self._cjob = _routes("/v1/cluster/jobs/{job}", {
            "": {"GET": R("GET", None, lambda w, j: self._view(w, sched().job(j)), who=True)}})[""]
        self._cjob_verb = _routes("/v1/cluster/jobs/{job}", {
            "cancel": {"POST": R("POST", None, lambda w, j: sched().cancel(j, w), who=True)},
            "hold": {"POST": R("POST", None, lambda w, j: sched().hold(j, w), who=True)},
            "release": {"POST": R("POST", None, lambda w, j: sched().release(j, w), who=True)},
            "update": {"POST": R("POST", JobUpdate, lambda w, j, b: sched().update(j, b, w), who=True)},
            "requeue": {"POST": R("POST", JobRequeue, lambda w, j, b: sched().requeue(j, b, w), who=True)},
            "result": {"POST": R("POST", MemberResult, lambda j, b: sched().member_result(j, b))},
            "logs": {"GET": R("GET", None, self._logs, query=True)},
            "steps": {"GET": R("GET", None, lambda j: sched().step_history(j))},
        })
        self._node_verb = _routes("/v1/cluster/nodes/{node}", {
            "register": {"POST": R("POST", NodeRegister, lambda n, b: sched().node_register(n, b))},
            "poll": {"POST": R("POST", NodePoll, lambda n, b: sched().node_poll(n, b))},
            "leave": {"POST": R("POST", NodeLeave, lambda n, b: sched().node_leave(n, b))},
            "cordon": {"POST": R("POST", NodeCordon, lambda n, b: sched().cordon(n, b))},
        })
        self._admin_user = _routes("/v1/admin/users/{user}", {
            "": {"POST": R("POST", AccountCreate, self._add_user, who=True)},
            "revoke": {"POST": R("POST", None, lambda w, u: self._revoke(w, "user", u), who=True)},
        })
        self._admin_node = _routes("/v1/admin/nodes/{node}", {
            "": {"POST": R("POST", None, self._add_node, who=True)},
            "revoke": {"POST": R("POST", None, lambda w, n: self._revoke(w, "node", n), who=True)},
        })
        # one decoder per body type of every route, found from the routes themselves, so that a
        # new route cannot miss its decoder
        bodies = {r.body for r in _all_routes(vars(self)) if r.body is not None}
        self._codec = _Codec(sorted(bodies, key=lambda t: t.__name__))

    def _events(self, who: Identity, query: dict):
        job = query.get("job")
        out = self.c.scheduler().event_list(_int_arg(query, "after"), job)
        if who.role == "admin":
            return out
        return msgspec.structs.replace(out, events=[
            e if not e.job or self._sees(who, e.job) else
            msgspec.structs.replace(e, detail={k: v for k, v in e.detail.items() if k in _PUBLIC_DETAIL})
            for e in out.events])

    def _sees(self, who: Identity, job: str) -> bool:
        """Whether ``who`` sees ``job``'s command, working directory, details and logs."""
        return self.c.access.may_see(who, self.c.owner(job) or "", job)

    def _metrics(self) -> "_Text":
        """Prometheus' text format (coordinator/metrics.py)."""
        from .metrics import CONTENT_TYPE, render

        text = render(__version__, self.c.store.kind, self.c.cluster, freezer=self.freezer)
        return _Text(text.encode(), CONTENT_TYPE)

    def _users(self, query: dict):
        return self.c.scheduler().user_list(window_arg(query))

    def _logs(self, job: str, query: dict):
        return self.c.scheduler().job_logs(job, _int_arg(query, "after"))

    def _whoami(self, who: Identity) -> WhoAmI:
        if who.anonymous:
            raise AuthError("missing bearer token: send 'Authorization: Bearer <token>'")
        acct = self.c.creds.accounts.get(who.name) if who.role == "user" else None
        return WhoAmI(who.role, who.name, who.run, sorted(who.jobs), acct.unix_user if acct else "")

    def _job_list(self, who: Identity, query: dict) -> JobList:
        """``GET /v1/jobs[?scheduled=0&limit=N&after=JOB]`` (0: leave out the jobs the scheduler
        placed; a page: at most N, those named after JOB, the previous page's ``next``)."""
        scheduled = query.get("scheduled", "1")
        if scheduled not in ("0", "1"):
            raise BadRequestError(f"query parameter 'scheduled' must be 0 or 1, got {scheduled[:40]!r}")
        after, limit = _page_args(query)
        return self.c.job_list(scheduled == "0", after, limit,
                               None if who.role == "admin" else lambda job: self._sees(who, job))

    def _view(self, who: Identity, out):
        """``out`` (a job, a job list, the cluster's status) as ``who`` may see it: other users'
        commands, working directories and job details left out."""
        if who.role == "admin":
            return out

        def one(j: ClusterJobInfo) -> ClusterJobInfo:
            if self._sees(who, j.id):
                return j
            return msgspec.structs.replace(j, command=[], workdir="", info={})

        if isinstance(out, ClusterJobInfo):
            return one(out)
        return msgspec.structs.replace(out, jobs=[one(j) for j in out.jobs])  # a job list, the cluster's status

    # ------------------------------------------------------------------ credentials
    def _add_user(self, who: Identity, user: str, body: AccountCreate) -> Credential:
        token = self.c.creds.add_user(user, body.unix_user or user, body.allow_root)
        self._note("credential", user=user, role="user", unix_user=body.unix_user or user,
                   allow_root=body.allow_root, by=who.name)
        return Credential("user", user, token)

    def _add_node(self, who: Identity, node: str) -> Credential:
        token = self.c.creds.add_node(node)
        self._note("credential", node=node, role="node", by=who.name)
        return Credential("node", node, token)

    def _revoke(self, who: Identity, role: str, name: str) -> Credential:
        n = self.c.creds.revoke(role, name)
        self._note("revoke", role=role, name=name, credentials=n, by=who.name)
        return Credential(role, name, "")

    def _accounts(self) -> AccountList:
        creds = self.c.creds
        return AccountList([AccountInfo(a.user, a.unix_user, a.allow_root, a.created)
                            for a in sorted(creds.accounts.values(), key=lambda a: a.user)], creds.nodes())

    def _note(self, kind: str, **detail) -> None:
        log.info("%s: %s", kind, " ".join(f"{k}={v}" for k, v in detail.items()))
        if self.c.cluster is not None:
            self.c.cluster.note(kind, "", **detail)

    # ------------------------------------------------------------------ handlers with bodies
    def _create_job(self, who: Identity, body: JobCreate):
        self.c.access.check(who, "POST /v1/jobs", (body.job,))
        self.c.members.create_job(body.job, body.min_workers, body.max_workers)
        return self.c.job_info(body.job)

    def _open_generation(self, job: str, body: GenerationCreate):
        r = self.c.members.open_generation(job, body.expected, body.world_size, body.reason)
        return GenerationInfo(r.job, r.generation, r.world_size, r.reason)

    # ------------------------------------------------------------------ routing
    def _match(self, path: str) -> tuple[dict[str, _Route], tuple[str, ...]]:
        fixed = self._fixed.get(path)
        if fixed is not None:
            return fixed, ()
        p = path.split("/")
        # ['', 'v1', 'jobs', job, ...]
        if len(p) >= 4 and p[1] == "v1" and p[2] == "jobs" and p[3]:
            n = len(p)
            if n == 4:
                return self._job, (p[3],)
            if n == 5 and p[4] in self._job_sub:
                return self._job_sub[p[4]], (p[3],)
            if n == 6 and p[4] == "agents" and p[5] in self._agents:
                return self._agents[p[5]], (p[3],)
            if n == 6 and p[4] == "datasets" and p[5]:
                return self._ds, (p[3], p[5])
            if n == 7 and p[4] == "datasets" and p[5] and p[6] in self._ds_verb:
                return self._ds_verb[p[6]], (p[3], p[5])
        if len(p) >= 5 and p[1] == "v1" and p[2] == "cluster" and p[4]:
            n = len(p)
            if p[3] == "jobs":
                if n == 5:
                    return self._cjob, (p[4],)
                if n == 6 and p[5] in self._cjob_verb:
                    return self._cjob_verb[p[5]], (p[4],)
            if p[3] == "nodes" and n == 6 and p[5] in self._node_verb:
                return self._node_verb[p[5]], (p[4],)
            if p[3] == "users" and n == 5:
                return self._user, (p[4],)
            if p[3] == "projects" and n == 5:
                return self._project, (p[4],)
            if p[3] == "users" and n == 6 and p[5] in self._user_verb:
                return self._user_verb[p[5]], (p[4],)
        if len(p) >= 5 and p[1] == "v1" and p[2] == "admin" and p[3] in ("users", "nodes") and p[4]:
            table = self._admin_user if p[3] == "users" else self._admin_node
            verb = p[5] if len(p) == 6 else "" if len(p) == 5 else None
            if verb in table:
                return table[verb], (p[4],)
        raise NotFoundError(f"no route {path}; the API lives under /v1 (see docs/coordinator.md)")

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive, send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                self.start_background(asyncio.get_running_loop())
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                self.stop_background()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def start_background(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the lease sweeps, the scheduler and the engine (and a store's group commit), and
        move the loaded state out of the garbage collector's sight (coordinator/gc_pacing.py)."""
        start = getattr(self.c.store, "start", None)
        if start is not None:
            start(loop)
        if self.freezer is not None:
            self.freezer.freeze()
            self.freezer.install(loop)
            self._tasks.append(loop.create_task(self.freezer.run()))
        self._tasks.append(loop.create_task(self._reap_loop()))
        if self.c.cluster is not None:
            self._tasks.append(loop.create_task(self.c.cluster.run()))
        if self.c.engine is not None:
            self._tasks.append(loop.create_task(self.c.engine.run()))

    def stop_background(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.freezer is not None:
            self.freezer.uninstall()

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self._reap_interval)
            try:
                self.c.shards.reap_all()
            except Exception:  # a failing sweep must not stop later sweeps; it is logged in full
                log.exception("lease sweep failed")

    async def _http(self, scope, receive, send) -> None:
        if scope["path"].startswith("/ui") and scope["method"] == "GET":  # the status page: no data in it
            from .ui import CSP, FILES

            found = FILES.get(scope["path"])
            if found is not None:
                ctype, page = found
                await send({"type": "http.response.start", "status": 200, "headers": [
                    (b"content-type", ctype), (b"content-length", str(len(page)).encode()),
                    (b"content-security-policy", CSP), (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"), (b"cache-control", b"no-store"), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": page})
                return
        headers = dict(scope["headers"])
        who = self._identify(headers)
        authed = who is not None
        ctype = headers.get(b"content-type", MSGPACK).split(b";")[0].strip().lower()
        # JSON when the client sent JSON, or (a GET) did not ask for msgpack: a plain curl reads text
        as_json = ctype == JSON or (scope["method"] == "GET" and MSGPACK not in headers.get(b"accept", b"").lower())
        try:
            result = await self._dispatch(scope, headers, ctype, receive, who)
            status = 200
        except ElasticTrainError as exc:
            status, result = exc.http_status, Error(exc.code, str(exc))
        except msgspec.ValidationError as exc:
            status, result = 400, Error("bad_request", f"request body does not match the schema: {exc}")
        except msgspec.DecodeError as exc:
            status, result = 400, Error("bad_request", f"request body is not valid "
                                        f"{'JSON' if ctype == JSON else 'msgpack'}: {exc}")
        except UnicodeDecodeError as exc:
            status, result = 400, Error("bad_request", f"request body has a string that is not valid UTF-8: {exc}")
        except Exception:  # a bug: log it in full, answer 500 and keep serving
            log.exception("internal error on %s %s", scope["method"], scope["path"])
            status, result = 500, Error("internal", "internal error; see the coordinator log")
        barrier = self._barrier
        if barrier is not None:  # a store that commits in groups: answer only for durable state
            try:
                await barrier()
            except ElasticTrainError as exc:
                status, result = 503, Error("unavailable", f"{exc}; retry against another coordinator")
        codec = self._codec
        if isinstance(result, _Text):  # (GET /metrics)
            body, kind = result.body, result.ctype
        else:
            body, kind = (codec.js_enc.encode(result), JSON) if as_json else (codec.mp_enc.encode(result), MSGPACK)
        head = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
        if not authed:  # no keep-alive without the token: idle anonymous sockets cannot pile up
            head.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})

    def _identify(self, headers: dict) -> Optional[Identity]:
        got = headers.get(b"authorization", b"")
        scheme, _, value = got.partition(b" ")
        if not got or scheme.lower() != b"bearer":
            return None
        return self.c.creds.identify(value.strip())

    async def _dispatch(self, scope, headers: dict, ctype: bytes, receive, who: Optional[Identity]):
        routes, args = self._match(scope["path"])
        method = scope["method"]
        route = routes.get(method)
        if route is None:
            raise _MethodNotAllowed(f"{method} is not allowed on {scope['path']}; use "
                                    f"{' or '.join(routes)}")
        if route.key not in PUBLIC_ROUTES:
            if who is None and self._public_read and method == "GET" and not route.key.startswith("GET /v1/admin/"):
                who = ADMIN  # --public-read: reads are open, as the admin sees them
            if who is None:
                if not headers.get(b"authorization"):
                    raise AuthError("missing bearer token: send 'Authorization: Bearer <token>' (workers "
                                    "read it from the file named by ET_TOKEN_FILE; the CLI takes --token-file)")
                raise AuthError("wrong bearer token, or one that was revoked; use the coordinator's token file or "
                                "your own (`elastictrain users add` makes one)")
            self.c.access.check(who, route.key, args)
        if route.who:
            args = (who or ANONYMOUS, *args)
        if route.query:
            args = (*args, _query(scope))
        if route.body is None:
            result = route.handler(*args)
        else:
            if ctype not in (MSGPACK, JSON):
                raise _UnsupportedMedia(f"content-type {ctype.decode(errors='replace')!r} is not supported; "
                                        "send application/msgpack or application/json")
            raw = await self._read_body(headers, receive)
            if not raw:
                raise BadRequestError("empty request body; send a msgpack or JSON object")
            dec = (self._codec.js if ctype == JSON else self._codec.mp)[route.body]
            result = route.handler(*args, dec.decode(raw))
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _read_body(self, headers: dict, receive) -> bytes:
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                n = int(declared)
            except ValueError:
                raise BadRequestError("content-length is not a number") from None
            if n > self._max_body:
                raise PayloadTooLargeError(f"body of {n} bytes exceeds the limit of {self._max_body}")
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise BadRequestError("client disconnected before the body was complete")
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                raise PayloadTooLargeError(f"body exceeds the limit of {self._max_body} bytes")
            chunks.append(chunk)
            if not msg.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


@dataclass(frozen=True)
class _Text:
    """A reply that is text, not msgpack or JSON: its bytes and content type."""

    body: bytes
    ctype: bytes


def _query(scope) -> dict:
    try:
        raw = scope.get("query_string", b"").decode("ascii")
    except UnicodeDecodeError:
        raise BadRequestError("the query string must be ASCII") from None
    if len(raw) > 4096:
        raise BadRequestError("the query string is longer than 4096 characters")
    return {k: v[-1] for k, v in parse_qs(raw).items()}


def _int_arg(query: dict, name: str, default: int = 0) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or len(raw) > 18:
        raise BadRequestError(f"query parameter {name!r} must be a whole number >= 0, got {raw[:40]!r}")
    return int(raw)


MAX_TIME = 1e11  # the latest time a query may name (epoch seconds: about the year 5138)


def _listing_args(query: dict) -> tuple[Optional[int], JobFilter, str, Optional[int]]:
    """A job listing's query (``GET /v1/cluster``, ``/v1/cluster/jobs``): ``ended=N`` (the N jobs
    that ended last, default ``LIST_ENDED``) or ``ended=all``, and its filter: ``array=JOB`` (only
    its tasks); ``since``/``until`` (only jobs submitted in that period, epoch seconds); ``user``,
    ``state``, ``project``, ``name`` (comma-separated: any of them; states ours or Slurm's); and its
    page: ``limit=N`` (at most N jobs, 1 to ``MAX_PAGE``), ``after=JOB`` (those after it: the
    previous page's ``next``)."""
    ended: Optional[int] = LIST_ENDED
    if query.get("ended") == "all":
        ended = None
    elif "ended" in query:
        ended = _int_arg(query, "ended")

    def names(key: str, kind: str) -> frozenset:
        return _filter_arg(query, key, lambda v: frozenset(check_name(kind, x) for x in v.split(","))) or frozenset()

    array = _filter_arg(query, "array", lambda v: check_name("job", v)) or ""
    return (ended, JobFilter(array, _time_arg(query, "since"), _time_arg(query, "until"), names("user", "user"),
                             _filter_arg(query, "state", check_states) or frozenset(), names("project", "project"),
                             names("name", "job")), *_page_args(query))


def _page_args(query: dict) -> tuple[str, Optional[int]]:
    """A listing's page: ``after=JOB`` ("" where not given: from the start) and ``limit=N`` (1 to
    ``MAX_PAGE``; None where not given: every job)."""
    limit = _int_arg(query, "limit") if "limit" in query else None
    if limit is not None and not 1 <= limit <= MAX_PAGE:
        raise BadRequestError(f"query parameter 'limit' must be 1 to {MAX_PAGE} (jobs per page), got {limit}")
    return _filter_arg(query, "after", lambda v: check_name("job", v)) or "", limit


def _filter_arg(query: dict, name: str, parse):
    """``parse`` of query parameter ``name`` (None where it is not given, or empty)."""
    raw = query.get(name)
    if not raw:
        return None
    try:
        return parse(raw)
    except ConfigError as exc:
        raise BadRequestError(f"query parameter {name!r}: {exc}") from None


def _time_arg(query: dict, name: str) -> Optional[float]:
    """A time (epoch seconds, 0 to MAX_TIME) from the query, or None where it is not given."""
    raw = query.get(name)
    if raw is None:
        return None
    try:
        t = float(raw) if len(raw) <= 40 else math.nan
    except ValueError:
        t = math.nan
    if not 0.0 <= t <= MAX_TIME:
        raise BadRequestError(f"query parameter {name!r} must be a time in epoch seconds from 0 to {MAX_TIME:.0f}, "
                              f"got {raw[:40]!r}")
    return t


class _MethodNotAllowed(ElasticTrainError):
    http_status = 405
    code = "method_not_allowed"


class _UnsupportedMedia(ElasticTrainError):
    http_status = 415
    code = "unsupported_media_type"
