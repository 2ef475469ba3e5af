"""Job notifications: Slurm's ``--mail-type``/``--mail-user``, as webhooks.

``elastictrain submit --notify URL --notify-on end,fail`` asks for an HTTP POST to ``URL`` when
the job begins (``begin``: its first start), ends (``end``: finished, failed, cancelled or timed
out), fails (``fail``: failed or timed out) or is requeued (``requeue``: preempted, drained, its
node lost); ``all`` is every one of them. The body is JSON with a ``text`` line, so a Slack or
Mattermost incoming webhook shows it as it is::

    {"text": "elastictrain job 12 (train) of alice: finished", "job": "12", "name": "train",
     "user": "alice", "event": "end", "kind": "finish", "status": "finished", "time": ..., ...}

The coordinator posts only to URLs its administrator allowed (``coordinator --notify-allow
'https://hooks.slack.com/*'``, shell patterns): a notification is a request the coordinator's
host makes, and without the list any user could make it reach services inside the cluster.
Redirects are not followed, for the same reason. Each post has a timeout and reads at most a
small reply; a failed one is tried again later (after 5 s, 30 s, 2 min, 10 min), then given up
with a ``notify_failed`` event.

Notifications are read from the durable event log after a cursor kept in the store: a
coordinator restart (or the standby taking over) sends what was not sent yet, so each is sent at
least once.

A user's notifications are paced: :data:`BURST` at once, then one every :data:`EVERY_USER`
seconds (a 1,000-task array with ``--notify-on all`` does not flood a Slack channel, nor hold up
the other users' posts, which have buckets of their own); the rest wait their turn, in order. At
most :data:`MAX_PENDING` notifications wait in memory: beyond, the event log keeps them (the
cursor stops) until some are sent.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from ..errors import ConfigError

__all__ = ["TYPES", "MAX_URL", "check_url", "check_patterns", "check_types", "Notifier", "post"]

log = logging.getLogger("elastictrain.notify")

TYPES = ("begin", "end", "fail", "requeue", "all")
_KINDS = {"begin": ("start",), "end": ("finish", "fail", "cancel", "timeout"), "fail": ("fail", "timeout"),
          "requeue": ("preempted", "requeue")}
_STATUS = {"start": "running", "finish": "finished", "fail": "failed", "cancel": "cancelled", "timeout": "failed",
           "preempted": "preempted", "requeue": "requeued"}
MAX_URL = 2048
CURSOR_META = "notify_cursor"
TIMEOUT = 5.0  # seconds a post may take
MAX_REPLY = 64 << 10  # bytes of a reply read (and dropped)
BACKOFF = (5.0, 30.0, 120.0, 600.0)  # seconds before each retry; then given up
EVERY = 1.0  # seconds between looks at the event log
AT_ONCE = 8  # posts in flight at once
BURST = 20  # a user's posts sent at once before pacing ...
EVERY_USER = 2.0  # ... then one every this many seconds, per user
MAX_PENDING = 10_000  # notifications waiting in memory; beyond, they wait in the event log


def check_url(url: str, allow: Sequence[str]) -> str:
    """``url`` if the coordinator may post to it: http or https, a host, within ``MAX_URL``
    characters and matching one of ``allow`` (shell patterns).

    Raises:
        ConfigError: naming the fix."""
    if len(url) > MAX_URL:
        raise ConfigError(f"--notify: a URL of at most {MAX_URL} characters")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--notify {url[:200]!r}: give an http:// or https:// URL with a host, e.g. "
                          "https://hooks.slack.com/services/...")
    if parts.username or parts.password:
        raise ConfigError("--notify: a URL with a user or password in it is refused (it would be kept and shown); "
                          "put the secret in the path, as Slack's webhooks do")
    if not allow:
        raise ConfigError("--notify: this coordinator posts to no URL; its administrator allows some with "
                          "`elastictrain coordinator --notify-allow 'https://hooks.example.com/*'`")
    if not any(fnmatch.fnmatchcase(url, p) for p in allow):
        raise ConfigError(f"--notify {url[:200]!r}: not among the URLs this coordinator posts to "
                          f"({', '.join(allow)}; `coordinator --notify-allow`)")
    return url


def check_patterns(given: Sequence[str]) -> tuple:
    """``coordinator --notify-allow``'s patterns, checked: each an http(s) URL pattern of at most
    ``MAX_URL`` characters (what :func:`check_url` matches URLs against).

    Raises:
        ConfigError: naming the fix."""
    for p in given:
        if not p.startswith(("http://", "https://")) or len(p) > MAX_URL or any(c.isspace() for c in p):
            raise ConfigError(f"--notify-allow {p[:200]!r}: give an http:// or https:// URL pattern, e.g. "
                              "'https://hooks.slack.com/*'")
    return tuple(given)


def check_types(types: Sequence[str]) -> list[str]:
    """``--notify-on``'s types, checked (default ``end``)."""
    out = []
    for t in types or ("end",):
        if t not in TYPES:
            raise ConfigError(f"--notify-on {t!r}: the types are {', '.join(TYPES)}")
        if t not in out:
            out.append(t)
    return out


def kinds_of(types: Sequence[str]) -> frozenset:
    """The event kinds that ``types`` notify of."""
    return _kinds(tuple(types))


@functools.lru_cache(maxsize=64)  # (a handful of distinct --notify-on lists; scan asks once per event)
def _kinds(types: tuple) -> frozenset:
    if "all" in types:
        return frozenset(k for ks in _KINDS.values() for k in ks)
    return frozenset(k for t in types for k in _KINDS.get(t, ()))


def _event_type(kind: str, types: Sequence[str]) -> str:
    """The type a notification of event ``kind`` is sent as (the first of ``types`` that covers it)."""
    for t in ("fail", "end", "begin", "requeue"):
        if ("all" in types or t in types) and kind in _KINDS[t]:
            return t
    return ""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D401 (urllib's signature)
        raise urllib.error.HTTPError(req.full_url, code, f"a redirect to {newurl[:200]} (not followed)", headers, fp)


_OPENER = urllib.request.build_opener(_NoRedirect)


def post(url: str, body: dict, timeout: float = TIMEOUT) -> None:
    """POST ``body`` as JSON to ``url``.

    Raises:
        OSError: no answer, a timeout, or a reply that is not 2xx (``urllib.error.HTTPError``)."""
    data = json.dumps(body, sort_keys=True).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "elastictrain-notify"})
    with _OPENER.open(req, timeout=timeout) as resp:
        resp.read(MAX_REPLY)


@dataclass
class _Item:
    seq: int
    url: str
    body: dict
    tries: int = 0
    due: float = 0.0


class Notifier:
    """Sends the notifications the event log's new events call for (see the module docstring).

    ``records``: job id -> its record (``notify_url``, ``notify_on``, ``name``, ``user``,
    ``exit_code``, ``reason``); ``emit``: writes an event (``notify_failed``); ``send``: the post
    (a test may give its own)."""

    def __init__(self, store, records: Mapping, emit: Callable[..., None], meta: Mapping,
                 send: Callable[[str, dict], None] = post) -> None:
        self.store, self.records, self.emit, self.send = store, records, emit, send
        self.cursor = int(meta.get(CURSOR_META, "0") or 0)  # events up to here were looked at
        self.pending: list[_Item] = []
        self.sent = self.failed = 0
        self._saved = self.cursor
        self._bucket: dict[str, tuple[float, float]] = {}  # user -> (tokens, when counted): the pacing

    def scan(self, limit: int = 500) -> int:
        """Queue the notifications of the events after the cursor; returns how many were queued."""
        if len(self.pending) >= MAX_PENDING:  # (the event log keeps the rest: the cursor waits)
            return 0
        rows = self.store.read_events(self.cursor, min(limit, MAX_PENDING - len(self.pending)))
        queued = 0
        for r in rows:
            self.cursor = r.seq
            rec = self.records.get(r.job) if r.job else None
            url = getattr(rec, "notify_url", "") if rec is not None else ""
            if not url or r.kind not in kinds_of(rec.notify_on):
                continue
            kind = r.kind
            detail = json.loads(r.detail) if r.detail else {}
            status = _STATUS.get(kind, kind)
            what = "timed out (its --time)" if kind == "timeout" else status
            body = {"text": f"elastictrain job {rec.id} ({rec.name}) of {rec.user}: {what}"
                            + (f": {rec.reason[:300]}" if kind in ("fail", "timeout") and rec.reason else ""),
                    "job": rec.id, "name": rec.name, "user": rec.user, "event": _event_type(kind, rec.notify_on),
                    "kind": kind, "status": status, "time": r.time, "run": detail.get("run")}
            if kind in ("finish", "fail", "timeout", "cancel"):
                body["exit_code"] = rec.exit_code
                body["reason"] = rec.reason[:1000]
            self.pending.append(_Item(r.seq, url, body))
            queued += 1
        return queued

    def due(self, now: float) -> list[_Item]:
        """The notifications to post now: due, and within their user's pace (the others of that user
        are put off until a post of its is allowed, in order). A job's own notifications go out in
        the order of its events: one waits while an older one of the same job does (being tried
        again, or put off), so "finished" never arrives before "started"."""
        out, bucket, later, held = [], self._bucket, {}, set()
        for i in self.pending:  # (in event order: items are appended so, and a retry keeps its place)
            job = i.body["job"]
            if job in held:
                continue
            if i.due > now:
                held.add(job)
                continue
            user = i.body["user"]
            if user in later:  # (this user's pace is spent: after the ones before it)
                later[user] += EVERY_USER
                i.due = later[user]
                held.add(job)
                continue
            tokens, at = bucket.get(user, (float(BURST), now))
            tokens = min(float(BURST), tokens + max(0.0, now - at) / EVERY_USER)
            if tokens >= 1.0:
                bucket[user] = (tokens - 1.0, now)
                out.append(i)
            else:
                bucket[user] = (tokens, now)
                later[user] = i.due = now + (1.0 - tokens) * EVERY_USER
                held.add(job)
        if len(bucket) > 4 * MAX_PENDING:  # (users with a full bucket again need no entry)
            self._bucket = {u: b for u, b in bucket.items() if b[0] + (now - b[1]) / EVERY_USER < BURST}
        return out

    def done(self, item: _Item, error: Optional[str], now: float) -> None:
        """``item`` was sent (``error`` None) or failed with ``error``: retried later, or given up."""
        if error is None:
            self.pending.remove(item)
            self.sent += 1
            return
        if item.tries < len(BACKOFF):
            item.due = now + BACKOFF[item.tries]
            item.tries += 1
            log.warning("notification of job %s to %s failed (%s); trying again in %.0f s", item.body["job"],
                        item.url[:100], error, BACKOFF[item.tries - 1])
            return
        self.pending.remove(item)
        self.failed += 1
        self.emit("notify_failed", item.body["job"], "", kind=item.body["kind"], tries=item.tries + 1,
                  error=error[:300])

    def needs_from(self) -> int:
        """The oldest event this notifier may still read (--retain keeps it and every later one): the
        one after its durable cursor, which :meth:`save` keeps below every notification not sent
        (a restart reads from there)."""
        return self._saved + 1

    def save(self) -> None:
        """Keep the cursor: below every notification not sent yet (a restart sends those again)."""
        keep = min([i.seq - 1 for i in self.pending] + [self.cursor])
        if keep != self._saved:
            with self.store.transaction() as tx:
                tx.put_meta(CURSOR_META, str(keep))
            self._saved = keep

    async def _send(self, item: _Item) -> Optional[str]:
        """Post ``item``; None, or why it failed."""
        try:
            await asyncio.to_thread(self.send, item.url, item.body)
            return None
        except (OSError, ValueError) as exc:  # (urllib's errors are OSErrors; a bad reply a ValueError)
            return f"{type(exc).__name__}: {exc}"

    async def run(self, clock: Callable[[], float] = time.time, flush: Callable[[], None] = lambda: None) -> None:
        """Look at the event log every second and send what is due, up to ``AT_ONCE`` posts at a time
        (an endpoint that hangs until its timeout holds up only its own)."""
        while True:
            try:
                self.scan()
                due = self.due(clock())
                for i in range(0, len(due), AT_ONCE):
                    batch = due[i:i + AT_ONCE]
                    for item, error in zip(batch, await asyncio.gather(*(self._send(it) for it in batch))):
                        self.done(item, error, clock())
                self.save()
                flush()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 (a store hiccup: the next look tries again)
                log.exception("notifications: a look at the event log failed")
            await asyncio.sleep(EVERY)
