"""``elastictrain projects``: quotas shared by a team (Slurm's accounts: ``sacctmgr add account``
with ``GrpTRES``; coordinator/projects.py). ``submit --project P`` (or ``-A``/``--account``)
charges a job to one."""

from __future__ import annotations

import argparse
from typing import Callable

import msgspec

from ._text import table
from .errors import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(sub, connection: Callable[[argparse.ArgumentParser], None]) -> None:
    pr = sub.add_parser("projects", help="projects: GPU and job quotas shared by their members (Slurm's accounts)")
    connection(pr)
    psub = pr.add_subparsers(dest="projects_command", required=True)
    ls = psub.add_parser("list", help="every project: its quota, members, what its admitted jobs count, what waits, "
                         "and the GPU-hours its jobs received (sshare)")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    st = psub.add_parser("set", help="(admin) create or change a project (sacctmgr add account ... GrpTRES=gres/gpu=N)")
    st.add_argument("name")
    st.add_argument("--gpus", type=int, default=None,
                    help="GPUs its members' admitted jobs may count together, each at its --gpus (left out: no limit)")
    st.add_argument("--jobs", type=int, default=None, help="jobs admitted at once (left out: no limit)")
    st.add_argument("--users", default=None, metavar="U1,U2=W",
                    help="its members, who may charge it (submit --project); a user's default project is the first "
                    "that lists it (left out: they stay). U=W gives a member a fair-share weight of its own here, in "
                    "place of its user's tickets (Slurm's per-association fairshare)")
    st.add_argument("--tickets", type=float, default=None,
                    help="fair-share tickets (gandiva-fair, multifactor): the project is one share beside the users "
                    "(or, under a parent with tickets, a share of the parent's), split among its members with jobs by "
                    "their own tickets (Slurm's fair-share tree); 0: none (left out: they "
                    "stay; given alone, the quota stays too)")
    st.add_argument("--parent", default=None, metavar="PROJECT",
                    help="make it a sub-project of PROJECT (Slurm's sub-account): its jobs count against PROJECT's "
                    "quota too; '' makes it a top-level project again (left out: as it was; given alone, the quota "
                    "stays)")
    rm = psub.add_parser("remove", help="(admin) drop a project (its jobs go on, charged to nothing)")
    rm.add_argument("name")


def _members(raw):
    """``--users alice=3,bob``: (the members, their own shares), or (None, None) when not given."""
    if raw is None:
        return None, None
    users, shares = [], {}
    for part in (x.strip() for x in raw.split(",")):
        if not part:
            continue
        name, sep, w = part.partition("=")
        users.append(name)
        if sep:
            try:
                shares[name] = float(w)
            except ValueError:
                raise ConfigError(f"--users {part!r}: a member's share is a number, as alice=3") from None
    return users, shares or None


def run(args, client) -> int:
    if args.projects_command == "set":  # the coordinator checks the names and the numbers (a 400 with the reason)
        users, shares = _members(args.users)
        pl = client.set_project(args.name, args.gpus, args.jobs, users, args.tickets, args.parent, shares)
        print(f"project {args.name} set")
    elif args.projects_command == "remove":
        pl = client.remove_project(args.name)
        print(f"project {args.name} removed")
    else:
        pl = client.projects()
        if args.json:
            print(msgspec.json.encode(pl).decode())
            return 0
    if not pl.projects:
        print("no projects (an admin creates one: elastictrain projects set NAME --gpus N --users U1,U2)")
        return 0
    rows = [("project", "parent", "GPUs", "jobs", "admitted GPUs", "admitted jobs", "waiting", "GPU-hours", "tickets",
             "entitled", "members")]
    for p in pl.projects:
        rows.append((p.name, p.parent or "-", "-" if p.gpus is None else str(p.gpus),
                     "-" if p.jobs is None else str(p.jobs),
                     str(p.used_gpus), str(p.used_jobs), str(p.queued), f"{p.gpu_hours:.3f}",
                     f"{p.tickets:g}" if p.tickets else "-", f"{p.entitled:.1%}" if p.tickets else "-",
                     ",".join(f"{u}={p.shares[u]:g}" if u in p.shares else u for u in p.users) or "-"))
    print(table(rows, right_align=False))
    return 0
