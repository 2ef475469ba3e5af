"""Projects in cluster mode: a quota shared by a team (Slurm's account with ``GrpTRES=gres/gpu=N``
and ``GrpJobs``, Kueue's ClusterQueue shared by several namespaces).

A project has members (users) and a limit on the GPUs (each admitted job counted at its
``--gpus``) and jobs that its members' admitted jobs may hold together. A job is charged to the
project its submission names (``submit --project P``, also ``-A``/``--account`` as Slurm users
type it), or else to its user's default project: the first project, in the order they were
created, that lists the user. A user may only charge a project that lists it; the admin may
charge any. A job is admitted when both its user's quota (``quotas.py``) and its project's have
room; with ``--quota-borrow`` one over either is admitted as a borrower. Projects are kept in the
database; removing one leaves its jobs running, charged to nothing.

("Project" and not "account": here an account is a user's login, ``/v1/admin/accounts``.)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Optional

from ..errors import ConfigError, ForbiddenError
from ..model import check_name
from .quotas import Quota

__all__ = ["Project", "ProjectBook", "META_KEY", "MAX_PROJECTS", "MAX_MEMBERS", "MAX_MEMBERSHIPS"]

META_KEY = "projects"
MAX_PROJECTS = 10_000
MAX_MEMBERS = 10_000  # in one project
MAX_MEMBERSHIPS = 100_000  # in all projects together (what `projects list` returns stays bounded)


@dataclass(frozen=True)
class Project:
    quota: Quota
    users: tuple[str, ...] = ()
    tickets: float = 0.0  # fair-share tickets (0: none; policies/shares.py)


class ProjectBook:
    """Every project (kept under :data:`META_KEY`, in creation order)."""

    def __init__(self, meta: dict) -> None:
        self.projects: dict[str, Project] = {}
        try:
            for name, p in json.loads(meta.get(META_KEY) or "{}").items():
                self.projects[str(name)] = Project(Quota(p.get("gpus"), p.get("jobs")),
                                                   tuple(str(u) for u in p.get("users", ())),
                                                   max(0.0, float(p.get("tickets") or 0.0)))
        except (ValueError, TypeError, AttributeError, ConfigError):
            self.projects = {}  # unreadable (it was written by us): no project limits

    @property
    def limited(self) -> bool:
        return any(p.quota.limited for p in self.projects.values())

    def tickets(self) -> dict[str, float]:
        """The projects that have fair-share tickets, and theirs."""
        return {n: p.tickets for n, p in self.projects.items() if p.tickets > 0}

    def set(self, name: str, quota: Quota, users: Optional[list[str]], tickets: Optional[float] = None) -> str:
        """Create or change project ``name`` (``users``, ``tickets`` None: as they were); returns the JSON
        to store.

        Raises:
            ConfigError: a bad name, or too many projects or members.
        """
        check_name("project", name)
        old = self.projects.get(name)
        if users is None:
            members = old.users if old is not None else ()
        else:
            for u in users:
                check_name("user", u)
            members = tuple(dict.fromkeys(users))
        if len(members) > MAX_MEMBERS:
            raise ConfigError(f"a project has at most {MAX_MEMBERS} members, not {len(members)}")
        if old is None and len(self.projects) >= MAX_PROJECTS:
            raise ConfigError(f"at most {MAX_PROJECTS} projects; remove one first (`elastictrain projects remove`)")
        total = sum(len(p.users) for n, p in self.projects.items() if n != name) + len(members)
        if total > MAX_MEMBERSHIPS:
            raise ConfigError(f"at most {MAX_MEMBERSHIPS} memberships in all projects together, and this makes "
                              f"{total}; remove members or projects first")
        if tickets is None:
            tickets = old.tickets if old is not None else 0.0
        elif not (0 <= tickets <= 1_000_000 and math.isfinite(tickets)):
            raise ConfigError(f"tickets must be in [0, 1000000] (0: none), got {tickets!r}")
        self.projects[name] = Project(quota, members, float(tickets))
        return self._json()

    def remove(self, name: str) -> str:
        """Raises: KeyError: no such project."""
        del self.projects[name]
        return self._json()

    def _json(self) -> str:
        return json.dumps({n: {"gpus": p.quota.gpus, "jobs": p.quota.jobs, "users": list(p.users),
                               **({"tickets": p.tickets} if p.tickets else {})} for n, p in self.projects.items()})

    def default_for(self, user: str) -> str:
        """The first project that lists ``user`` ("" if none)."""
        return next((n for n, p in self.projects.items() if user in p.users), "")

    def charge(self, user: str, project: Optional[str], admin: bool) -> str:
        """The project a job of ``user`` is charged to: ``project`` if given (the user must be a
        member, unless an admin submits), else the user's default ("" for none).

        Raises:
            ConfigError: no such project. ForbiddenError: the user is not a member.
        """
        if not project:
            return self.default_for(user)
        check_name("project", project)
        p = self.projects.get(project)
        if p is None:
            raise ConfigError(f"no project {project!r}; `elastictrain projects list` shows them, and an admin "
                              f"creates one with `elastictrain projects set {project} --users {user}`")
        if not admin and user not in p.users:
            raise ForbiddenError(f"user {user} is not a member of project {project}; ask an admin to add it "
                                 f"(`elastictrain projects set {project} --users ...`)")
        return project

    def fits(self, project: str, used: dict[str, list[int]], gpus: int) -> bool:
        p = self.projects.get(project) if project else None
        if p is None:
            return True
        u = used.get(project, (0, 0))
        return p.quota.fits(u[0], u[1], gpus)

    def why(self, rec, used: dict[str, list[int]]) -> str:
        """Why ``rec`` waits for its project's quota ("" if it does not)."""
        p = self.projects.get(rec.project) if rec.project else None
        full = p.quota.full(*used.get(rec.project, (0, 0)), rec.gpus) if p is not None else []
        if not full:
            return ""
        return (f"waiting for project {rec.project}'s quota ({p.quota.text()}): {' and '.join(full)}. It is admitted "
                f"when they end, or when an admin raises it (`elastictrain projects set {rec.project} --gpus N`)")
