"""Users in cluster mode: their tickets (``elastictrain users set NAME --tickets N``), kept in the
database and handed to a policy that shares GPU time by tickets (Gandiva-fair), and each user's
share of the GPU-seconds used over a window against what its tickets entitle it to
(``elastictrain status --users``).

The share over a window comes from samples of every user's cumulative GPU-seconds (attained
service of all its jobs, ended ones included), taken at most every ``every`` seconds and kept for
``keep`` seconds: the share is a user's increase over the window divided by everyone's.
"""

from __future__ import annotations

import json
import math
from collections import deque
from typing import Callable, Iterable, Optional

from ..errors import ConfigError
from ..model import check_name
from ..policies.shares import account_tickets, shares, split_account
from ..wire import UserInfo, UserList

__all__ = ["UserBook", "META_KEY", "MAX_WINDOW"]

META_KEY = "user_tickets"
MAX_WINDOW = 86_400.0  # seconds of samples kept, and the longest window one can ask for
MAX_USERS = 100_000


class UserBook:
    def __init__(self, meta: dict, policy, every: float = 5.0) -> None:
        self.policy, self.every = policy, every
        try:
            raw = json.loads(meta.get(META_KEY) or "{}")
            self.tickets: dict[str, float] = {str(k): float(v) for k, v in raw.items() if float(v) > 0}
        except (ValueError, TypeError, AttributeError):
            self.tickets = {}
        self.default = float(getattr(policy, "default", 1.0))
        self._samples: deque[tuple[float, dict[str, float]]] = deque()
        self._apply()

    @property
    def used(self) -> bool:
        """Whether the policy shares by tickets."""
        return hasattr(self.policy, "set_tickets")

    def _apply(self) -> None:
        if self.used:
            self.policy.set_tickets(self.tickets)

    def set(self, user: str, tickets: float) -> str:
        """Set ``user``'s tickets; returns the JSON to store under :data:`META_KEY`.

        Raises:
            ConfigError: a bad name, a number out of range, or too many users.
        """
        check_name("user", user)
        if not (0 < tickets <= 1_000_000 and math.isfinite(tickets)):
            raise ConfigError(f"tickets must be in (0, 1000000], got {tickets!r}")
        if user not in self.tickets and len(self.tickets) >= MAX_USERS:
            raise ConfigError(f"at most {MAX_USERS} users can have tickets set")
        self.tickets[user] = float(tickets)
        self._apply()
        return json.dumps(self.tickets, sort_keys=True)

    def sample(self, now: float, usage: Callable[[], Iterable[tuple[str, float]]], force: bool = False) -> None:
        """Record every user's cumulative GPU-seconds (``usage()``: (user, GPU-seconds) of every
        job), at most every ``every`` seconds."""
        if not force and self._samples and now - self._samples[-1][0] < self.every:
            return
        total: dict[str, float] = {}
        for user, gpu_s in usage():
            total[user] = total.get(user, 0.0) + gpu_s
        self._samples.append((now, total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= MAX_WINDOW:
            self._samples.popleft()

    def report(self, now: float, window: float, usage: Callable[[], Iterable[tuple[str, float]]],
               active: dict[str, int], running: dict[str, int],
               projects: Optional[dict[str, float]] = None, parents: Optional[dict[str, str]] = None,
               members: Optional[dict[str, float]] = None) -> UserList:
        """Each user's tickets, entitlement and share over the last ``window`` seconds.
        ``active``: each fair-share account's jobs not ended (a user, or a project with tickets and
        its member: policies/shares.py; ``projects`` gives those projects' tickets); ``running``:
        GPUs each user's running jobs hold now. A user's entitlement sums its accounts'."""
        if not (0 < window <= MAX_WINDOW and math.isfinite(window)):
            raise ConfigError(f"window must be in (0, {MAX_WINDOW:.0f}] seconds, got {window!r}")
        self.sample(now, usage, force=True)
        latest = self._samples[-1][1]
        start_t, start = self._samples[0]
        for t, snap in self._samples:  # the oldest sample inside the window
            if now - t <= window:
                start_t, start = t, snap
                break
        users = sorted(set(latest) | set(self.tickets))
        got = {u: max(0.0, latest.get(u, 0.0) - start.get(u, 0.0)) for u in users}
        total = sum(got.values())
        entitled = shares(account_tickets(active, self.tickets, self.default, projects or {}, parents, members))[0]
        jobs: dict[str, int] = {}
        for a, n in active.items():
            u = split_account(a)[0]
            jobs[u] = jobs.get(u, 0) + n
        out = []
        for u in users:
            out.append(UserInfo(u, self.tickets.get(u, self.default), u in self.tickets, entitled.get(u, 0.0),
                                got[u] / total if total > 0 else 0.0, got[u], running.get(u, 0), jobs.get(u, 0)))
        return UserList(out, now - start_t, self.used, self.default)


def window_arg(query: dict, default: float = 600.0) -> Optional[float]:
    """The ``window`` query parameter in seconds."""
    raw = query.get("window")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"window must be a number of seconds, got {raw!r}") from None
    return value
