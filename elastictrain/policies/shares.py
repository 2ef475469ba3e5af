"""Fair-share accounts: whom a job's GPU time counts against, and each account's tickets.

Shares are one level of projects deep, as Slurm's fair-share tree of accounts over users: a
project with tickets (``elastictrain projects set P --tickets N``) is one entry beside the users,
and its tickets are split among its members that have jobs, in proportion to their own tickets
(``users set U --tickets N``; the default for users not set). A job charged to such a project
counts against the account ``"P/U"`` (its project, its user); any other job against its user.

So with project ``vision`` at 2 tickets (alice at 1, bob at 3, both with jobs) and carol alone at
1: vision is entitled to 2/3 of the GPUs (alice 1/6, bob 1/2) and carol to 1/3, however many users
or jobs vision has. (Names cannot hold ``/``: ``model.check_name``; an account is unambiguous.)

A member's weight in one project may differ from its own tickets (Slurm's per-association
``fairshare``: ``projects set vision --users alice=3,bob``): :func:`account_tickets`'s ``weights``
map the account ``"vision/alice"`` to 3, and only vision's split uses it (alice's other accounts
keep her tickets).

Sub-projects (``parents``: project -> its parent, ``projects set --parent``) make it a tree, as
Slurm's: a job counts against the nearest project with tickets at or above its own, and a project
with tickets under another with tickets gets a share of that one's, not of the whole: the parent's
tickets are split among its members with jobs (by their own tickets) and its sub-projects with jobs
below them (by theirs). Without sub-projects with tickets under ticketed ones, this is the flat rule
above, to the bit.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Optional

__all__ = ["account", "account_tickets", "split_account", "shares", "decayed"]

_LN2 = math.log(2.0)


_DEPTH = 16  # (a bound on walking up the tree: ProjectBook allows 8 levels and no cycle)


def _ticketed(project: str, projects: Mapping[str, float], parents: Mapping[str, str]) -> str:
    """The nearest project with tickets at or above ``project`` ("" if none)."""
    for _ in range(_DEPTH):
        if not project or project in projects:
            return project
        project = parents.get(project, "")
    return ""


def account(user: str, project: str, projects: Mapping[str, float], parents: Optional[Mapping[str, str]] = None) -> str:
    """The account a job of ``user`` charged to ``project`` counts against: ``"project/user"``
    where ``projects`` (project -> tickets) gives that project tickets (with ``parents``: the nearest
    project with tickets at or above it), else ``user``."""
    if parents:
        project = _ticketed(project, projects, parents)
    return f"{project}/{user}" if project and project in projects else user


def split_account(name: str) -> tuple[str, str]:
    """(user, project) of an :func:`account` name (project "" for a user's own account)."""
    project, _, user = name.rpartition("/")
    return user, project


def account_tickets(accounts: Iterable[str], users: Mapping[str, float], default: float,
                    projects: Mapping[str, float], parents: Optional[Mapping[str, str]] = None,
                    weights: Optional[Mapping[str, float]] = None) -> dict[str, float]:
    """Each of ``accounts``' tickets (the accounts with jobs): a user's own (``users``, else
    ``default``); a project's split among its accounts here by their users' own tickets, or by
    ``weights`` (``"project/user"`` -> the member's share there) where given (with ``parents``, a
    sub-project's own tickets are first its share of its parent's: module docstring)."""
    out: dict[str, float] = {}
    members: dict[str, list[str]] = {}
    for a in accounts:
        user, project = split_account(a)
        out[a] = users.get(user, default)
        if project in projects:  # (an account of a project whose tickets were since removed: the user's own)
            members.setdefault(project, []).append(a)
            if weights and a in weights:
                out[a] = weights[a]
    up = {p: _ticketed(parents.get(p, ""), projects, parents) for p in members} if parents else {}
    if not any(up.values()):  # one level: each project's tickets split among its members
        for project, names in members.items():
            total = sum(out[a] for a in names)
            for a in names:
                out[a] = projects[project] * out[a] / total
        return out
    below: dict[str, set] = {}  # project with tickets -> its sub-projects with tickets and jobs below them
    tops = set()
    for p in members:
        for _ in range(_DEPTH):
            q = up[p] if p in up else _ticketed(parents.get(p, ""), projects, parents)
            if not q:
                tops.add(p)
                break
            if p in below.setdefault(q, set()):
                break
            below[q].add(p)
            p = q

    def spread(p: str, budget: float) -> None:
        direct, subs = members.get(p, ()), sorted(below.get(p, ()))
        total = sum(out[a] for a in direct) + sum(projects[s] for s in subs)
        for a in direct:
            out[a] = budget * out[a] / total
        for s in subs:
            spread(s, budget * projects[s] / total)

    for p in sorted(tops):
        spread(p, projects[p])
    return out


def shares(tickets: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """Accounts' tickets (:func:`account_tickets`) as fractions of their sum, summed per user and
    per project (a user's own accounts counted under project ""): (by user, by project)."""
    total = sum(tickets.values())
    users: dict[str, float] = {}
    projects: dict[str, float] = {}
    for a, w in tickets.items():
        user, project = split_account(a)
        f = w / total
        users[user] = users.get(user, 0.0) + f
        projects[project] = projects.get(project, 0.0) + f
    return users, projects


def decayed(dt: float, half_life: float) -> tuple[float, float]:
    """Usage decayed with ``half_life``, over ``dt`` seconds: (the factor earlier usage is multiplied
    by, the GPU-seconds one GPU held through those seconds adds, each second decayed by its age,
    integrated exactly: where decisions fall in between does not change the sum)."""
    decay = 0.5 ** (dt / half_life)
    return decay, (1.0 - decay) * half_life / _LN2
