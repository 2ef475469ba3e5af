"""A coordinator on PostgreSQL: a standby until it leads, then the coordinator.

Every coordinator started with the same ``--db postgresql://...`` listens at once. While another
one leads, it answers every request with ``503`` naming the leader (the ``X-ET-Leader`` header and
the reason); clients given several addresses (``ET_COORDINATOR=http://a:7707,http://b:7707``) go
there. Every ``lease / 4`` seconds it tries for the lease; when it gets it, it loads the whole
state from the database (as a coordinator restarted after ``kill -9`` does), starts the scheduler
and serves. A leader that loses its lease exits at once (code 3): its memory may be behind the
database, and every write it would make is refused by the fence anyway. Run it under a supervisor
that restarts it (systemd ``Restart=always``): it comes back as a standby.

What lived only in the old leader's memory and how the new one gets it back:

* long polls (node daemons, etrun agents): the clients' polls fail, they go to the new leader
  and poll again; rendezvous rounds are durable, so a round in progress goes on;
* each worker's resource samples and the straggler windows: rebuilt from the next samples the
  workers send (a few seconds; a straggler needs its N windows again before it is flagged);
* GPU utilization and step-rate history (the status page's charts): start again empty;
* anything else (jobs, runs, tasks, nodes, shards, leases, commits, events, logs, users,
  credentials, the policy's state): in the database, loaded at takeover.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Optional

from ..wire import Error
from .app import Coordinator, CoordinatorApp
from .leader import Leadership

__all__ = ["serve_replicated", "LOST_LEADERSHIP_EXIT"]

log = logging.getLogger(__name__)

LOST_LEADERSHIP_EXIT = 3


def _die(why: str) -> None:
    log.critical("leadership lost: %s; exiting (a standby leads now; restarted, this one becomes a standby)", why)
    logging.shutdown()
    os._exit(LOST_LEADERSHIP_EXIT)


class _Switch:
    """The ASGI app: a standby's answers until this coordinator leads, then the coordinator's."""

    def __init__(self) -> None:
        self.inner: Optional[CoordinatorApp] = None
        self.leader_url = ""
        self.leader_term = 0
        self.on_startup = None
        self.on_shutdown = None
        import msgspec

        self._json = msgspec.json.Encoder()
        self._msgpack = msgspec.msgpack.Encoder()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await self.on_startup()
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await self.on_shutdown()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        inner = self.inner
        if inner is not None:
            await inner(scope, receive, send)
        elif scope["type"] == "http":
            await self._standby(scope, send)

    async def _standby(self, scope, send) -> None:
        where = f"the leader is {self.leader_url} (term {self.leader_term})" if self.leader_url else \
            "no coordinator leads right now (one takes over within the lease)"
        err = Error("not_leader", f"this coordinator is a standby; {where}; retry there (clients given several "
                                  "addresses in ET_COORDINATOR do)")
        headers = dict(scope.get("headers") or [])
        as_json = b"msgpack" not in headers.get(b"accept", b"") and b"msgpack" not in headers.get(b"content-type", b"")
        body = self._json.encode(err) if as_json else self._msgpack.encode(err)
        head = [(b"content-type", b"application/json" if as_json else b"application/msgpack"),
                (b"content-length", str(len(body)).encode()), (b"retry-after", b"1"), (b"connection", b"close")]
        if self.leader_url:
            head.append((b"x-et-leader", self.leader_url.encode()))
        await send({"type": "http.response.start", "status": 503, "headers": head})
        await send({"type": "http.response.body", "body": body})


def serve_replicated(cfg, token: str, watch) -> None:
    """Serve as one of the coordinators on ``cfg.db`` (PostgreSQL) until SIGTERM or SIGINT."""
    from .pg_store import PostgresStore
    from .server import _bind, _engine, _url_of, _uvicorn, run_server

    # opened now: a database that does not answer is a clear error at start, not a standby that waits
    store = PostgresStore(cfg.db, sync=cfg.sync, on_fatal=lambda exc: _die(f"a commit failed: {exc}"))
    sock = _bind(cfg.host, cfg.port)
    url = cfg.advertise_url or _url_of(sock)
    leadership = Leadership(cfg.db, url, lease=cfg.lease)
    switch = _Switch()
    server = _uvicorn(cfg, switch)
    state: dict = {}

    async def lead(loop) -> None:
        t0 = time.monotonic()
        store.term = leadership.term  # every commit from now on is fenced by it
        coordinator = Coordinator(store, cluster=cfg.cluster, stragglers=watch)
        app = CoordinatorApp(coordinator, token, max_body=cfg.max_body, public_read=cfg.public_read)
        if cfg.engine is not None:
            coordinator.engine = _engine(cfg, coordinator, url, token)
        leadership.keep(_die)
        app.start_background(loop)
        state.update(coordinator=coordinator, app=app)
        switch.inner = app
        log.info("leading as term %d at %s: state loaded from the database in %.2f s", leadership.term, url,
                 time.monotonic() - t0)
        if coordinator.cluster is not None:
            coordinator.cluster.note("leader", "", term=leadership.term, url=url)

    async def campaign() -> None:
        loop = asyncio.get_running_loop()
        while True:
            term = await loop.run_in_executor(None, leadership.try_acquire)
            if term is not None:
                try:
                    await lead(loop)
                except Exception as exc:  # noqa: BLE001 - a leader that cannot start must let another lead
                    log.exception("could not start leading")
                    leadership.resign()
                    _die(f"start-up as leader failed: {exc}")
                state["settled"] = True
                return
            info = await loop.run_in_executor(None, leadership.current)
            if info is not None:
                switch.leader_url, switch.leader_term = info.url, info.term
            state["settled"] = True  # a standby that knows it is one (and, where one leads, whom)
            await asyncio.sleep(min(0.5, cfg.lease / 4))

    async def startup() -> None:
        state["campaign"] = asyncio.get_running_loop().create_task(campaign())

    async def shutdown() -> None:
        state["campaign"].cancel()
        app = state.get("app")
        if app is not None:
            app.stop_background()

    switch.on_startup, switch.on_shutdown = startup, shutdown

    try:
        run_server(server, sock, url, cfg, f"db {cfg.db}, standby until it leads",
                   settled=lambda: state.get("settled", False), settle_for=max(5.0, 2 * cfg.lease))
    finally:
        coordinator = state.get("coordinator")
        if coordinator is not None:
            coordinator.close()  # (closes the store)
            leadership.resign()  # a clean stop: a standby takes over at once
        else:
            store.close()
        leadership.close()
