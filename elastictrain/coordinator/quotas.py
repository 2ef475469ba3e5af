"""Per-user quotas in cluster mode: the most GPUs and jobs a user's admitted jobs may hold
(Slurm's ``MaxTRESPerUser=gres/gpu=N`` and ``MaxJobsPerUser``, Kueue's quota admission).

A job is *admitted* when it enters the job table that the policy decides on; until then no policy
sees it, so quotas need nothing from the policies. An admitted job counts its largest size
(``--gpus``) against its user's quota from admission to its end, running or waiting (a job the
policy preempts keeps its admission): whatever the policy decides, a user's jobs never hold more
GPUs than its quota. Each user's waiting jobs are admitted by priority, then submission order,
every one that fits (a smaller job may pass a larger one that does not fit, as Kueue's
BestEffortFIFO). Lowering a quota takes nothing back: admitted jobs go on, and new ones wait until
the admitted total is under it.

``elastictrain users quota NAME --gpus N --jobs M`` sets a user's own quota (it replaces the
coordinator's default, ``--quota-gpus``/``--quota-jobs``, as a whole: a number left out is no
limit); ``--default`` drops it. Quotas are kept in the database.

``users quota NAME --max-priority N`` lets the user give its jobs priorities up to N on a
coordinator that preempts by priority (as a Slurm association's allowed QOS; without it a user
may go up to 0 only, and only the admin above). It is kept apart from the limits: setting one
leaves the other as it was; ``--default`` drops both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Optional

from ..errors import ConfigError
from ..model import MAX_PRIORITY, check_name

__all__ = ["Quota", "QuotaBook", "META_KEY", "CAPS_KEY", "MAX_QUOTA", "MAX_PRIORITY"]

META_KEY = "user_quotas"
CAPS_KEY = "user_max_priorities"
MAX_QUOTA = 1_000_000
MAX_USERS = 100_000


@dataclass(frozen=True)
class Quota:
    """``gpus``/``jobs``: the most GPUs / jobs a user's admitted jobs may count (None: no limit)."""

    gpus: Optional[int] = None
    jobs: Optional[int] = None

    def __post_init__(self) -> None:
        for what, n in (("gpus", self.gpus), ("jobs", self.jobs)):
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_QUOTA):
                raise ConfigError(f"a quota's {what} must be a whole number in [1, {MAX_QUOTA}] (or no limit), "
                                  f"got {n!r}")

    @property
    def limited(self) -> bool:
        return self.gpus is not None or self.jobs is not None

    def fits(self, used_gpus: int, used_jobs: int, gpus: int) -> bool:
        """Whether one more job of ``gpus`` fits beside admitted jobs holding ``used_*``."""
        return (self.gpus is None or used_gpus + gpus <= self.gpus) and (self.jobs is None or used_jobs < self.jobs)

    def full(self, used_gpus: int, used_jobs: int, gpus: int) -> list[str]:
        """What leaves no room for one more job of ``gpus`` beside admitted jobs holding ``used_*``,
        in words (empty: it fits)."""
        out = []
        if self.gpus is not None and used_gpus + gpus > self.gpus:
            out.append(f"its admitted jobs count {used_gpus} of its {self.gpus} GPUs and this one needs {gpus}")
        if self.jobs is not None and used_jobs >= self.jobs:
            out.append(f"its {used_jobs} admitted job{'s reach' if used_jobs != 1 else ' reaches'} its limit of "
                       f"{self.jobs}")
        return out

    def text(self) -> str:
        parts = [f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}" if self.gpus is not None else "",
                 f"{self.jobs} job{'s' if self.jobs != 1 else ''}" if self.jobs is not None else ""]
        return ", ".join(p for p in parts if p) or "no limit"


class QuotaBook:
    """Every user's own quota (kept under :data:`META_KEY`) and the default for the others."""

    def __init__(self, meta: dict, default: Quota) -> None:
        self.default = default
        self.own: dict[str, Quota] = {}
        try:
            for user, q in json.loads(meta.get(META_KEY) or "{}").items():
                self.own[str(user)] = Quota(q.get("gpus"), q.get("jobs"))
        except (ValueError, TypeError, AttributeError, ConfigError):
            self.own = {}  # unreadable: every user has the default (logged by nobody: it was written by us)
        self.caps: dict[str, int] = {}  # user -> the highest priority it may give its jobs (above 0)
        try:
            for user, p in json.loads(meta.get(CAPS_KEY) or "{}").items():
                if type(p) is int and 0 < p <= MAX_PRIORITY:
                    self.caps[str(user)] = p
        except (ValueError, TypeError, AttributeError):
            self.caps = {}

    def max_priority(self, user: str) -> int:
        """The highest priority ``user`` may give a job under ``--priority-preemption``."""
        return self.caps.get(user, 0)

    def set_cap(self, user: str, priority: Optional[int]) -> str:
        """``user`` may give its jobs priorities up to ``priority`` (0 or None: up to 0, as everyone);
        returns the JSON to store.

        Raises:
            ConfigError: a bad name or number, or too many users.
        """
        check_name("user", user)
        if priority is not None and (type(priority) is not int or not 0 <= priority <= MAX_PRIORITY):
            raise ConfigError(f"--max-priority must be a whole number in [0, {MAX_PRIORITY}], got {priority!r}")
        if not priority:
            self.caps.pop(user, None)
        else:
            if user not in self.caps and len(self.caps) >= MAX_USERS:
                raise ConfigError(f"at most {MAX_USERS} users can have a highest priority of their own")
            self.caps[user] = priority
        return json.dumps(self.caps, sort_keys=True)

    def of(self, user: str) -> Quota:
        return self.own.get(user, self.default)

    def set(self, user: str, quota: Optional[Quota]) -> str:
        """Give ``user`` its own quota (None: back to the default); returns the JSON to store.

        Raises:
            ConfigError: a bad name, or too many users.
        """
        check_name("user", user)
        if quota is None:
            self.own.pop(user, None)
        else:
            if user not in self.own and len(self.own) >= MAX_USERS:
                raise ConfigError(f"at most {MAX_USERS} users can have a quota of their own")
            self.own[user] = quota
        return json.dumps({u: {"gpus": q.gpus, "jobs": q.jobs} for u, q in self.own.items()}, sort_keys=True)

    def admit(self, waiting: Iterable, used: dict[str, list[int]], projects=None,
              pused: Optional[dict[str, list[int]]] = None) -> list:
        """The waiting jobs (records with ``user``, ``gpus``, ``priority``, ``seq``, ``project``) to
        admit now, by priority then submission; ``used``: each user's admitted [GPUs, jobs], updated;
        with ``projects`` (a ProjectBook), each project's too (``pused``)."""
        return [rec for rec in sorted(waiting, key=lambda r: (-r.priority, r.seq))
                if self.fit(rec, used, projects, pused)]

    def fit(self, rec, used: dict[str, list[int]], projects=None, pused: Optional[dict[str, list[int]]] = None) -> bool:
        """Whether ``rec`` fits its user's quota (and its project's, with ``projects``); if so, it is
        counted in ``used`` (and ``pused``)."""
        u = used.setdefault(rec.user, [0, 0])
        if not self.of(rec.user).fits(u[0], u[1], rec.gpus):
            return False
        if projects is not None and rec.project:
            if not projects.fits(rec.project, pused, rec.gpus):
                return False
            projects.count(pused, rec.project, rec.gpus)  # (its parents' too)
        u[0] += rec.gpus
        u[1] += 1
        return True

    def why(self, rec, used: dict[str, list[int]]) -> str:
        """Why a job that is not admitted waits (squeue's QOSMaxGRESPerUser, said in full)."""
        q = self.of(rec.user)
        full = q.full(*used.get(rec.user, (0, 0)), rec.gpus)
        if not full:
            return f"admitted at the next decision (user {rec.user}'s quota: {q.text()})"
        what = "its own" if rec.user in self.own else "the coordinator's default"
        return (f"waiting for user {rec.user}'s quota ({q.text()}, {what}): {' and '.join(full)}. It is admitted "
                f"when they end, or when an admin raises the quota (`elastictrain users quota {rec.user} --gpus N "
                "--jobs M`)")

