"""The fair-share report of a live cluster, from the coordinator's event log
(``elastictrain fairness --from-coordinator URL --out DIR``): the same kind of report the
simulator's fairness experiments write (a total table, a per-window timeline, CSV and PNG).

GPU time per user comes from the runs in the event log: a run holds its placement's GPUs from
its ``start``/``resume`` to the event that ends it (:func:`elastictrain.usage.gpu_spans`: allocated
time). A user's entitlement in a window is its ticket share among the users with a job alive
in that window, times the GPU-seconds all jobs used there (the work-conserving fair share), so
``received / entitled`` is 1.0 when GPU time followed the tickets exactly. With projects' tickets,
shares are those of the fair-share accounts (policies/shares.py: a job charged to a project with
tickets counts against the project's share, split among its members with jobs), summed per user.
The tickets are today's (users' and projects'), applied to the whole log.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ..policies.shares import account, account_tickets, shares
from ..usage import gpu_spans
from .fairness import pyplot, save_png

__all__ = ["LiveFairness", "live_fairness", "write_live_report"]

_JOB_ENDS = ("finish", "fail", "cancel")


@dataclass(frozen=True)
class LiveFairness:
    users: list[str]
    tickets: dict[str, float]
    received: dict[str, float]  # GPU-seconds over the whole log
    entitled: dict[str, float]  # GPU-seconds its tickets entitle it to, summed over windows
    window: float
    start: float
    end: float
    #: per window: (start seconds from the log's start, {user: received / entitled in it})
    timeline: list = field(default_factory=list)

    def ratio(self, user: str) -> float:
        e = self.entitled.get(user, 0.0)
        return self.received.get(user, 0.0) / e if e > 0 else 0.0


def live_fairness(events: Iterable, tickets: dict[str, float], default: float, window: float,
                  now: float, projects: Optional[dict[str, float]] = None,
                  parents: Optional[dict[str, str]] = None, members: Optional[dict[str, float]] = None) -> LiveFairness:
    """Build the report from event records (``time``, ``kind``, ``job``, ``detail``); ``projects``:
    the projects' tickets (those with none left out); ``parents``: each sub-project's parent;
    ``members``: members' own shares in their projects (``"project/user"``: policies/shares.py)."""
    projects = projects or {}
    user_of: dict[str, str] = {}
    account_of: dict[str, str] = {}
    alive: dict[str, list] = {}  # job -> [submitted, ended or None]
    events = list(events)
    first = events[0].time if events else None
    for e in events:
        job = e.job
        if e.kind == "submit":
            user_of[job] = str(e.detail.get("user") or "default")
            account_of[job] = account(user_of[job], str(e.detail.get("project") or ""), projects, parents)
            alive[job] = [e.time, None]
        elif e.kind in _JOB_ENDS and job in alive:
            alive[job][1] = e.time
    spans = [(user_of.get(job, "default"), t0, t1, g) for job, t0, t1, g in gpu_spans(events, now)]
    start = first if first is not None else now
    users = sorted(set(user_of.values()))
    received = dict.fromkeys(users, 0.0)
    entitled = dict.fromkeys(users, 0.0)
    timeline = []
    t = start
    while t < now:
        hi = min(now, t + window)
        got = dict.fromkeys(users, 0.0)
        for u, a, b, g in spans:
            overlap = min(b, hi) - max(a, t)
            if overlap > 0:
                got[u] += overlap * g
        active = {account_of[j] for j, (s, end) in alive.items() if s < hi and (end is None or end > t)}
        used = sum(got.values())
        mine = shares(account_tickets(active, tickets, default, projects, parents, members))[0]
        ratios = {}
        for u in users:
            share = mine.get(u, 0.0)
            entitled[u] += share * used
            received[u] += got[u]
            ratios[u] = got[u] / (share * used) if share > 0 and used > 0 else 0.0
        timeline.append((t - start, ratios))
        t = hi
    return LiveFairness(users, {u: tickets.get(u, default) for u in users}, received, entitled, window, start, now,
                        timeline)


def write_live_report(r: LiveFairness, out: str) -> list[str]:
    """``fairness_total.csv``, ``fairness_timeline.csv`` and ``fairness.png`` (with matplotlib)."""
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, "fairness_total.csv"), os.path.join(out, "fairness_timeline.csv")]
    with open(paths[0], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["user", "tickets", "gpu_seconds", "entitled_gpu_seconds", "received_over_entitled"])
        for u in r.users:
            w.writerow([u, f"{r.tickets[u]:g}", f"{r.received[u]:.1f}", f"{r.entitled[u]:.1f}", f"{r.ratio(u):.4f}"])
    with open(paths[1], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["window_start_s"] + r.users)
        for start, ratios in r.timeline:
            w.writerow([f"{start:.0f}"] + [f"{ratios[u]:.4f}" for u in r.users])
    plt = pyplot()
    if plt is None:
        return paths
    fig, ax = plt.subplots(figsize=(7, 4))
    for u in r.users:
        ax.plot([s for s, _ in r.timeline], [x[u] for _, x in r.timeline], label=f"{u} ({r.tickets[u]:g} tickets)")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_xlabel("time since the first event (s)")
    ax.set_ylabel("GPU time received / entitled")
    ax.set_title("live cluster: each user's share against its tickets")
    return paths + [save_png(plt, fig, ax, out)]
