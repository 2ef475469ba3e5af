"""The coordinator's HTTP API (``/v1/...``) as a plain ASGI application.

Served by uvicorn (see :mod:`elastictrain.coordinator.server`). No web framework sits in
between: routing is a table lookup, bodies are decoded straight into the typed messages of
:mod:`elastictrain.wire` by msgspec, and the handlers are short synchronous calls into the
state machines, so a request costs a few tens of microseconds of Python.

Every failure becomes a 4xx with a reason (``{"error": code, "reason": text}``): bad
bodies, wrong types, unknown fields, unknown routes, oversized bodies, a missing or wrong
token. Only a bug in this package yields a 500.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

import msgspec

from .. import __version__
from ..clock import Clock, WallClock
from ..errors import AuthError, BadRequestError, ElasticTrainError, NotFoundError, PayloadTooLargeError
from ..model import DatasetSpec
from ..wire import (
    API_VERSION, AgentJoin, AgentPoll, AgentReport, CommitList, CommitRequest, Error, GenerationCreate, GenerationInfo, Health, JobCreate,
    JobInfo, LeaseRequest, ProfileReport, ProgressRequest, ReleaseRequest, RestoreRequest, Version,
)
from .membership import Membership
from .profiles import ProfileBook
from .rendezvous import Rendezvous
from .shards import ShardManager
from .store import Store

__all__ = ["Coordinator", "CoordinatorApp", "MAX_BODY"]

log = logging.getLogger(__name__)

#: largest request body accepted (a commit part of many shards is a few KiB)
MAX_BODY = 1 << 20
MSGPACK, JSON = b"application/msgpack", b"application/json"


class Coordinator:
    """The coordinator's state: a store, jobs and their generations, and datasets."""

    def __init__(self, store: Store, clock: Optional[Clock] = None) -> None:
        self.store = store
        self.clock = clock or WallClock()
        loaded = store.load()
        self.members = Membership(store, loaded.jobs)
        self.shards = ShardManager(store, self.members, self.clock)
        self.shards.load(loaded)
        self.rendezvous = Rendezvous(self.members, self.clock)
        self.profiles = ProfileBook(store, self.members, self.clock, loaded.profiles)

    def job_info(self, job: str) -> JobInfo:
        r = self.members.get(job)
        return JobInfo(r.job, r.generation, r.world_size, r.min_workers, r.max_workers,
                       self.shards.datasets(job))

    def close(self) -> None:
        self.store.close()


@dataclass(frozen=True)
class _Route:
    method: str
    body: Optional[type]
    handler: Callable[..., Any]
    mutating: bool


class _Codec:
    def __init__(self, types: list[type]) -> None:
        self.mp = {t: msgspec.msgpack.Decoder(t) for t in types}
        self.js = {t: msgspec.json.Decoder(t) for t in types}
        self.mp_enc = msgspec.msgpack.Encoder()
        self.js_enc = msgspec.json.Encoder()


class CoordinatorApp:
    """ASGI application for a :class:`Coordinator`.

    Args:
        token: the bearer token every mutating (POST) request must carry.
        max_body: bodies larger than this get 413.
        reap_interval: seconds between sweeps that return expired leases.
    """

    def __init__(self, coordinator: Coordinator, token: str, *, max_body: int = MAX_BODY,
                 reap_interval: float = 0.5) -> None:
        if not token:
            raise ValueError("the coordinator needs a non-empty token")
        self.c = coordinator
        self._token = b"Bearer " + token.encode()
        self._max_body = max_body
        self._reap_interval = reap_interval
        self._reaper: Optional[asyncio.Task] = None
        s = coordinator.shards
        self._fixed: dict[str, dict[str, _Route]] = {
            "/v1/health": {"GET": _Route("GET", None, lambda: Health("ok"), False)},
            "/v1/version": {"GET": _Route("GET", None, lambda: Version(API_VERSION, __version__,
                                                                       coordinator.store.kind), False)},
            "/v1/jobs": {"POST": _Route("POST", JobCreate, self._create_job, True)},
        }
        # /v1/jobs/{job}[/generations | /profiles | /datasets[/{ds}[/verb]]]
        self._job = {"GET": _Route("GET", None, coordinator.job_info, False)}
        self._job_sub = {
            "generations": {"POST": _Route("POST", GenerationCreate, self._open_generation, True)},
            "datasets": {"POST": _Route("POST", DatasetSpec, s.register, True)},
            "profiles": {"POST": _Route("POST", ProfileReport, coordinator.profiles.put, True),
                         "GET": _Route("GET", None, coordinator.profiles.list, False)},
        }
        r = coordinator.rendezvous
        self._agents = {
            "join": {"POST": _Route("POST", AgentJoin, r.join, True)},
            "poll": {"POST": _Route("POST", AgentPoll, r.poll, True)},
            "report": {"POST": _Route("POST", AgentReport, r.report, True)},
        }
        self._ds = {"GET": _Route("GET", None, s.info, False)}
        self._ds_verb = {
            "lease": {"POST": _Route("POST", LeaseRequest, s.lease, True)},
            "progress": {"POST": _Route("POST", ProgressRequest, s.progress, True)},
            "commit": {"POST": _Route("POST", CommitRequest, s.commit, True)},
            "restore": {"POST": _Route("POST", RestoreRequest, s.restore, True)},
            "release": {"POST": _Route("POST", ReleaseRequest, s.release, True)},
            "commits": {"GET": _Route("GET", None, lambda j, d: CommitList(s.commits(j, d)), False)},
        }
        self._codec = _Codec([JobCreate, GenerationCreate, DatasetSpec, LeaseRequest, ProgressRequest,
                              CommitRequest, RestoreRequest, ReleaseRequest, AgentJoin, AgentPoll,
                              AgentReport, ProfileReport])

    # ------------------------------------------------------------------ handlers with bodies
    def _create_job(self, body: JobCreate):
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
                self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                if self._reaper is not None:
                    self._reaper.cancel()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self._reap_interval)
            try:
                self.c.shards.reap_all()
            except Exception:  # a failing sweep must not stop later sweeps; it is logged in full
                log.exception("lease sweep failed")

    async def _http(self, scope, receive, send) -> None:
        headers = dict(scope["headers"])
        ctype = headers.get(b"content-type", MSGPACK).split(b";")[0].strip()
        as_json = ctype == JSON or (scope["method"] == "GET" and JSON in headers.get(b"accept", b""))
        try:
            result = await self._dispatch(scope, headers, ctype, receive)
            status = 200
        except ElasticTrainError as exc:
            status, result = exc.http_status, Error(exc.code, str(exc))
        except msgspec.ValidationError as exc:
            status, result = 400, Error("bad_request", f"request body does not match the schema: {exc}")
        except msgspec.DecodeError as exc:
            status, result = 400, Error("bad_request", f"request body is not valid "
                                        f"{'JSON' if ctype == JSON else 'msgpack'}: {exc}")
        except Exception:  # a bug: log it in full, answer 500 and keep serving
            log.exception("internal error on %s %s", scope["method"], scope["path"])
            status, result = 500, Error("internal", "internal error; see the coordinator log")
        codec = self._codec
        body = codec.js_enc.encode(result) if as_json else codec.mp_enc.encode(result)
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", JSON if as_json else MSGPACK), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _dispatch(self, scope, headers: dict, ctype: bytes, receive):
        routes, args = self._match(scope["path"])
        method = scope["method"]
        route = routes.get(method)
        if route is None:
            raise _MethodNotAllowed(f"{method} is not allowed on {scope['path']}; use "
                                    f"{' or '.join(routes)}")
        if route.mutating:
            got = headers.get(b"authorization", b"")
            if not got:
                raise AuthError("missing bearer token: send 'Authorization: Bearer <token>' (workers "
                                "read it from the file named by ET_TOKEN_FILE)")
            if not hmac.compare_digest(got, self._token):
                raise AuthError("wrong bearer token; use the coordinator's token file")
        if route.body is None:
            return route.handler(*args)
        if ctype not in (MSGPACK, JSON):
            raise _UnsupportedMedia(f"content-type {ctype.decode(errors='replace')!r} is not supported; "
                                    "send application/msgpack or application/json")
        raw = await self._read_body(headers, receive)
        if not raw:
            raise BadRequestError("empty request body; send a msgpack or JSON object")
        dec = (self._codec.js if ctype == JSON else self._codec.mp)[route.body]
        return route.handler(*args, dec.decode(raw))

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


class _MethodNotAllowed(ElasticTrainError):
    http_status = 405
    code = "method_not_allowed"


class _UnsupportedMedia(ElasticTrainError):
    http_status = 415
    code = "unsupported_media_type"
