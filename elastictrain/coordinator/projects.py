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

A project may have a parent (``projects set vision --parent research``: Slurm's sub-account, whose
parent's ``GrpTRES`` also holds): a job charged to ``vision`` counts against ``vision``'s quota and
against ``research``'s, and is admitted only where every one of them has room, so a department caps
its labs together. A parent's figures (admitted GPUs and jobs, waiting jobs, GPU-hours) include its
sub-projects'. At most :data:`MAX_DEPTH` levels; no cycles; a project with sub-projects cannot be
removed before them. Membership is per project (a member of ``research`` is not one of ``vision``).
Fair-share tickets follow the tree (policies/shares.py): a sub-project's tickets are its share of
its parent's, as in Slurm's fair-share tree. A member may have a share of its own in a project
(``--users alice=3,bob``: Slurm's per-association ``fairshare``), which splits that project's
tickets in place of its user's tickets.

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

__all__ = ["Project", "ProjectBook", "META_KEY", "MAX_PROJECTS", "MAX_MEMBERS", "MAX_MEMBERSHIPS", "MAX_DEPTH"]

META_KEY = "projects"
MAX_PROJECTS = 10_000
MAX_MEMBERS = 10_000  # in one project
MAX_MEMBERSHIPS = 100_000  # in all projects together (what `projects list` returns stays bounded)
MAX_DEPTH = 8  # levels of sub-projects, the top one included


@dataclass(frozen=True)
class Project:
    quota: Quota
    users: tuple[str, ...] = ()
    tickets: float = 0.0  # fair-share tickets (0: none; policies/shares.py)
    parent: str = ""  # the project it is a sub-project of ("": none)
    shares: tuple[tuple[str, float], ...] = ()  # (member, its share here) where it differs from its user's tickets


class ProjectBook:
    """Every project (kept under :data:`META_KEY`, in creation order)."""

    def __init__(self, meta: dict) -> None:
        self.projects: dict[str, Project] = {}
        try:
            for name, p in json.loads(meta.get(META_KEY) or "{}").items():
                self.projects[str(name)] = Project(Quota(p.get("gpus"), p.get("jobs")),
                                                   tuple(str(u) for u in p.get("users", ())),
                                                   max(0.0, float(p.get("tickets") or 0.0)), str(p.get("parent") or ""),
                                                   tuple((str(u), float(w)) for u, w in (p.get("shares") or {}).items()
                                                         if float(w) > 0))
        except (ValueError, TypeError, AttributeError, ConfigError):
            self.projects = {}  # unreadable (it was written by us): no project limits

    @property
    def limited(self) -> bool:
        return any(p.quota.limited for p in self.projects.values())

    def tickets(self) -> dict[str, float]:
        """The projects that have fair-share tickets, and theirs."""
        return {n: p.tickets for n, p in self.projects.items() if p.tickets > 0}

    def parents(self) -> dict[str, str]:
        """Each sub-project's parent (the fair-share tree: policies/shares.py)."""
        return {n: p.parent for n, p in self.projects.items() if p.parent}

    def member_shares(self) -> dict[str, float]:
        """``"project/user"`` -> a member's own share in a project with tickets (policies/shares.py)."""
        return {f"{n}/{u}": w for n, p in self.projects.items() if p.tickets > 0 for u, w in p.shares}

    def chain(self, name: str) -> list[str]:
        """``name`` and its parents, up to the top (each once: a damaged store's cycle ends it)."""
        out = []
        while name and name not in out and len(out) < MAX_DEPTH:
            out.append(name)
            p = self.projects.get(name)
            name = p.parent if p is not None else ""
        return out

    def set(self, name: str, quota: Quota, users: Optional[list[str]], tickets: Optional[float] = None,
            parent: Optional[str] = None, shares: Optional[dict[str, float]] = None) -> str:
        """Create or change project ``name`` (``users``, ``tickets``, ``parent`` None: as they were;
        ``parent`` "": none; ``shares``: members' own shares here, with ``users``: those not given
        have none); returns the JSON to store.

        Raises:
            ConfigError: a bad name, or too many projects or members, or a parent that does not exist,
            would make a cycle or too deep a tree.
        """
        check_name("project", name)
        old = self.projects.get(name)
        if parent is None:
            parent = old.parent if old is not None else ""
        elif parent:
            check_name("project", parent)
            if parent not in self.projects:
                raise ConfigError(f"no project {parent!r} to be the parent of {name!r}; create it first "
                                  f"(`elastictrain projects set {parent}`)")
            above = self.chain(parent)
            if name in above:
                raise ConfigError(f"project {parent!r} is {name!r} or one of its sub-projects: a project cannot be "
                                  "its own parent")
            below = self._depth_below(name)
            if len(above) + 1 + below > MAX_DEPTH:
                raise ConfigError(f"projects nest at most {MAX_DEPTH} levels deep, and under {parent!r} project "
                                  f"{name!r} would make {len(above) + 1 + below}")
        if users is None:
            if shares:
                raise ConfigError("a member's share is set with its membership: --users alice=3,bob")
            members = old.users if old is not None else ()
            own = old.shares if old is not None else ()
        else:
            for u in users:
                check_name("user", u)
            members = tuple(dict.fromkeys(users))
            for u, w in (shares or {}).items():
                if u not in members:
                    raise ConfigError(f"a share for {u!r}, who is not among the members given")
                if not (0 < w <= 1_000_000 and math.isfinite(w)):
                    raise ConfigError(f"{u}'s share must be in (0, 1000000], got {w!r}")
            own = tuple((u, float(shares[u])) for u in members if shares and u in shares)
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
        self.projects[name] = Project(quota, members, float(tickets), parent, own)
        return self._json()

    def _children(self, name: str) -> list[str]:
        """The projects directly under ``name``."""
        return [n for n, p in self.projects.items() if p.parent == name]

    def _depth_below(self, name: str) -> int:
        """Levels of sub-projects under ``name`` (0: none)."""
        kids = self._children(name)
        return 1 + max(self._depth_below(k) for k in kids) if kids else 0

    def remove(self, name: str) -> str:
        """Raises: KeyError: no such project. ConfigError: it has sub-projects."""
        kids = self._children(name)
        if name in self.projects and kids:
            raise ConfigError(f"project {name} has sub-projects ({', '.join(kids[:5])}): remove them, or give them "
                              f"another parent (`elastictrain projects set {kids[0]} --parent ''`), first")
        del self.projects[name]
        return self._json()

    def _json(self) -> str:
        return json.dumps({n: {"gpus": p.quota.gpus, "jobs": p.quota.jobs, "users": list(p.users),
                               **({"tickets": p.tickets} if p.tickets else {}),
                               **({"parent": p.parent} if p.parent else {}),
                               **({"shares": dict(p.shares)} if p.shares else {})} for n, p in self.projects.items()})

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
        """Whether one more job of ``gpus`` charged to ``project`` fits its quota and its parents'
        (``used``: each project's admitted [GPUs, jobs], its sub-projects' included)."""
        for name in self.chain(project):
            p = self.projects.get(name)
            if p is not None:
                u = used.get(name, (0, 0))
                if not p.quota.fits(u[0], u[1], gpus):
                    return False
        return True

    def rollup(self, per_project: dict[str, float]) -> dict[str, float]:
        """``per_project``'s figures with each project's added to every parent's too."""
        out: dict[str, float] = {}
        for project, v in per_project.items():
            for name in self.chain(project):
                out[name] = out.get(name, 0) + v
        return out

    def count(self, used: dict[str, list[int]], project: str, gpus: int, jobs: int = 1) -> None:
        """Count a job of ``gpus`` (``jobs`` -1: take one away) in ``used``, for its project and each parent."""
        for name in self.chain(project):
            u = used.setdefault(name, [0, 0])
            u[0] += gpus
            u[1] += jobs

    def why(self, rec, used: dict[str, list[int]]) -> str:
        """Why ``rec`` waits for its project's quota, or a parent's ("" if it does not)."""
        for name in self.chain(rec.project):
            p = self.projects.get(name)
            full = p.quota.full(*used.get(name, (0, 0)), rec.gpus) if p is not None else []
            if full:
                what = f"project {name}'s quota" if name == rec.project else \
                    f"the quota of project {name}, which project {rec.project} is under"
                return (f"waiting for {what} ({p.quota.text()}): {' and '.join(full)}. It is admitted when they "
                        f"end, or when an admin raises it (`elastictrain projects set {name} --gpus N`)")
        return ""
