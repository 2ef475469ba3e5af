"""Fair-share accounts: whom a job's GPU time counts against, and each account's tickets.

Shares are one level of projects deep, as Slurm's fair-share tree of accounts over users: a
project with tickets (``elastictrain projects set P --tickets N``) is one entry beside the users,
and its tickets are split among its members that have jobs, in proportion to their own tickets
(``users set U --tickets N``; the default for users not set). A job charged to such a project
counts against the account ``"P/U"`` (its project, its user); any other job against its user.

So with project ``vision`` at 2 tickets (alice at 1, bob at 3, both with jobs) and carol alone at
1: vision is entitled to 2/3 of the GPUs (alice 1/6, bob 1/2) and carol to 1/3, however many users
or jobs vision has. (Names cannot hold ``/``: ``model.check_name``; an account is unambiguous.)
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

__all__ = ["account", "account_tickets", "split_account", "shares", "decayed"]

_LN2 = math.log(2.0)


def account(user: str, project: str, projects: Mapping[str, float]) -> str:
    """The account a job of ``user`` charged to ``project`` counts against: ``"project/user"``
    where ``projects`` (project -> tickets) gives that project tickets, else ``user``."""
    return f"{project}/{user}" if project and project in projects else user


def split_account(name: str) -> tuple[str, str]:
    """(user, project) of an :func:`account` name (project "" for a user's own account)."""
    project, _, user = name.rpartition("/")
    return user, project


def account_tickets(accounts: Iterable[str], users: Mapping[str, float], default: float,
                    projects: Mapping[str, float]) -> dict[str, float]:
    """Each of ``accounts``' tickets (the accounts with jobs): a user's own (``users``, else
    ``default``); a project's split among its accounts here by their users' own tickets."""
    out: dict[str, float] = {}
    members: dict[str, list[str]] = {}
    for a in accounts:
        user, project = split_account(a)
        out[a] = users.get(user, default)
        if project in projects:  # (an account of a project whose tickets were since removed: the user's own)
            members.setdefault(project, []).append(a)
    for project, names in members.items():
        total = sum(out[a] for a in names)
        for a in names:
            out[a] = projects[project] * out[a] / total
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
