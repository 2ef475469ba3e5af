"""Muri: multi-resource interleaving groups (Muri-S, Muri-L and the ablation variants).

Each decision (Muri section 4.2 and Algorithm 1):

1. **Priority.** Muri-S: shortest remaining service first (remaining time x GPUs, durations
   known, SRSF). Muri-L: least attained service first (GPU-seconds received, 2D-LAS). Ties keep
   the previous decision's order, which lists larger jobs first.
2. **Candidates.** Jobs are visited in priority order with a trial placement; each job that
   fits claims itself and the next ``group_size - 1`` jobs of its *bucket* (jobs with the same
   GPU count: Muri never groups across GPU counts, so a group's workers share the same GPUs).
3. **Grouping rounds.** While the candidates need more GPUs than the cluster has, each bucket's
   nodes (jobs, then groups) are matched for maximum total interleaving efficiency and matched
   pairs are merged, most urgent first, until the demand fits (at most ``rounds`` rounds,
   groups of at most ``group_size`` jobs). The matching is over profile *types*
   (:mod:`.grouping`), so it costs the same for 10 or 10,000 queued jobs. With
   ``matching="priority"`` (the "without Blossom" ablation) a bucket's candidates are instead
   grouped in priority order, ``group_size`` at a time.
4. **Split.** A group whose interleaved iteration is slower than its members run one after
   the other is split again.
5. **Placement.** Groups (and single jobs) are admitted in priority order while they fit, then
   placed largest first; a group's jobs share one placement.

A grouped job runs at its group's interleaved iteration time (eq. 3 with the best, or for
``ordering="worst"`` the worst, slot ordering; see :mod:`.interleaving`) times
``overhead[size - 1] / overhead[0]``: the measured cost of interleaving ``size`` jobs relative
to a job alone (the Muri simulator's 1.015, 1.33, 1.5, 1.37). The Decision carries the groups
and each member's slowdown; the engine charges a group's restart as the sum of its members'.

Jobs without a stage profile never group (they run alone at their own iteration time).

**A finishing job is left alone** (``finish_hold``, 5% by default): a running job with at most
that fraction of its iterations left, and less time left than a restart of it costs
(``JobView.restart_cost``: the start-up the coordinator measured from its last start to its
first step; the simulator's restart cost), keeps its placement and its group (as the previous
decision formed it) until it ends, and the decision is made for the others around it.
Regrouping it would restart it (a checkpoint, a new process) for less work than the restart
itself. (Holding every job in its last 5%, whatever its restart cost, pinned jobs for hours
on the synthetic traces: +53% preemptions of the others and +3.5% mean JCT for Muri-S.)

**Groups change on arrivals, ends and new profiles** (as in the paper's simulator). A decision
with nothing arrived or ended, the cluster unchanged, no job's stage profile changed and exactly
the jobs it ran running (a run's first step, the coordinator's periodic round) keeps the
previous decision (:meth:`Muri._hold`).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

from ..errors import ConfigError, PolicyError
from .api import ClusterSnapshot, Decision, Restored, nothing_changed, register, restored_arrivals
from .grouping import assign, match_types
from .interleaving import best_ordering, efficiency, worst_ordering
from .placement import make_placer

__all__ = ["Muri"]

DEFAULT_OVERHEAD = (1.015, 1.33, 1.5, 1.37)


class _Last(NamedTuple):
    """A full decision (:meth:`Muri._hold` repeats it while nothing changed) and its inputs."""

    run: dict
    groups: tuple
    slowdown: dict
    gpus_per_node: tuple
    profiles: dict  # job key -> the stage times it was grouped on


class Muri:
    """Args:
        known_duration: True for Muri-S (SRSF priority), False for Muri-L (2D-LAS priority).
        group_size: the most jobs in one group (2 to 4, at most ``resources``).
        resources: resource types (slots per interleaved iteration); profiles with fewer
            stage times let their first stage span the extra slots.
        ordering: ``best`` or ``worst`` slot ordering of a group (the worst is an ablation).
        matching: ``blossom`` (maximum-weight matching of profile types) or ``priority``.
        rounds: grouping rounds at most (each can double a group's size).
        overhead: slowdown factor of a group of 1, 2, 3, 4 jobs.
        autosplit: split groups slower than their members alone.
        placement: see :mod:`.placement` (default ``consolidated``, YARN first fit).
    """

    #: a run's first step cannot change the decision (nothing arrived or ended: the groups are
    #: held, :meth:`_hold`), so the simulator need not decide again then (sim/engine.py)
    first_step_events = False

    def __init__(self, known_duration: bool = True, group_size: int = 4, resources: int = 4,
                 ordering: str = "best", matching: str = "blossom", rounds: Optional[int] = None,
                 overhead: Sequence[float] = DEFAULT_OVERHEAD, autosplit: bool = True,
                 placement: str = "consolidated", packlimit: float = 0.5, sticky: bool = False,
                 finish_hold: float = 0.05) -> None:
        if not 1 <= group_size <= 4 or group_size > resources:
            raise ConfigError(f"muri group_size must be 1 to 4 and at most resources ({resources}), "
                              f"got {group_size}")
        if ordering not in ("best", "worst"):
            raise ConfigError(f"muri ordering must be best or worst, got {ordering!r}")
        if matching not in ("blossom", "priority"):
            raise ConfigError(f"muri matching must be blossom or priority, got {matching!r}")
        if not 0.0 <= finish_hold < 1.0:
            raise ConfigError(f"muri finish_hold is a fraction of a job's iterations in [0, 1), got {finish_hold!r}")
        if len(overhead) < group_size or any(o <= 0 for o in overhead):
            raise ConfigError(f"muri overhead needs a positive factor for each group size up to {group_size}, "
                              f"got {tuple(overhead)}")
        self.known, self.k, self.resources = known_duration, group_size, resources
        self.ordering, self.matching = ordering, matching
        self.rounds = group_size if rounds is None else rounds
        self.overhead = tuple(float(o) for o in overhead)
        self.autosplit, self.placement, self.packlimit, self.sticky = autosplit, placement, packlimit, sticky
        self.needs = frozenset({"duration", "profile"}) if known_duration else frozenset({"profile"})
        self.name = "muri-s" if known_duration else "muri-l"
        if ordering == "worst":
            self.name += "-worst"
        if matching == "priority":
            self.name += "-noblossom"
        self._profiles: dict[tuple, int] = {}  # stage times -> profile id
        self._plist: list[tuple] = []
        self._time: dict[tuple, float] = {}  # sorted profile ids -> group iteration time (raw T)
        self._rank: dict = {}  # job key -> position in the previous decision's order
        self._next = 0
        self.finish_hold = finish_hold
        self._last: Optional[_Last] = None  # the last full decision, and what it was made on
        self._known: Optional[set] = None  # the jobs import_state restored, until the next decision

    # ---- the interleaving model, cached per multiset of profiles
    def _pid(self, j) -> int:
        p = j.stage_times
        if not p:
            return -1  # no profile: never groups
        pid = self._profiles.get(p)
        if pid is None:
            if len(p) > self.resources:
                raise PolicyError(f"job {j.job_id} has {len(p)} stage times; muri was set up for "
                                  f"resources={self.resources}")
            pid = self._profiles[p] = len(self._plist)
            self._plist.append(tuple(float(t) for t in p))
        return pid

    def group_time(self, members: tuple) -> float:
        """Interleaved iteration time of a group of profile ids, with its size's overhead."""
        t = self._time.get(members)
        if t is None:
            profs = [self._plist[m] for m in members]
            fn = best_ordering if self.ordering == "best" else worst_ordering
            t = fn(profs, self.resources)[0] * self.overhead[len(members) - 1] / self.overhead[0]
            self._time[members] = t
        return t

    def _weight(self, a: tuple, b: tuple) -> Optional[float]:
        m = tuple(sorted(a + b))
        if len(m) > self.k or m[0] < 0:
            return None
        return efficiency([self._plist[i] for i in m], self.group_time(m), self.resources)

    # ---- memory across restarts
    def export_state(self) -> dict:
        """The jobs' ranks (tie order) and the last full decision with what it was made on, so that
        a restarted coordinator holds the groups it runs until something changes, as it would have,
        instead of regrouping at once (which restarts the groups)."""
        last = self._last
        return {"rank": [[str(k), r] for k, r in self._rank.items()], "next": self._next,
                "last": None if last is None else {
                    "run": [[str(k), [list(p) for p in where]] for k, where in last.run.items()],
                    "groups": [[str(k) for k in g] for g in last.groups],
                    "slowdown": [[str(k), v] for k, v in last.slowdown.items()],
                    "gpus": list(last.gpus_per_node),
                    "profiles": [[str(k), list(p)] for k, p in last.profiles.items()]}}

    def import_state(self, state: dict, jobs, rename: Optional[dict] = None) -> None:
        """Restore :meth:`export_state` for the jobs in ``jobs`` (views; ``rename``: their ids here,
        by exported id).

        Raises:
            ValueError, TypeError, KeyError: a malformed state (the caller starts afresh).
        """
        now = Restored(jobs, rename)
        key = now.id
        rank = {key(k): int(r) for k, r in state["rank"] if key(k) is not None}
        last, data = None, state["last"]
        if data is not None:
            run = {key(k): tuple((int(n), int(g)) for n, g in where) for k, where in data["run"]}
            groups = tuple(tuple(key(k) for k in g) for g in data["groups"])
            if None not in run and all(None not in g for g in groups):  # (else: a job gone; decide afresh)
                last = _Last(run, groups, {key(k): float(v) for k, v in data["slowdown"] if key(k) is not None},
                             tuple(int(g) for g in data["gpus"]),
                             {key(k): tuple(float(t) for t in p) for k, p in data["profiles"] if key(k) is not None})
        self._rank, self._next, self._last = rank, int(state["next"]), last
        self._known = now.ids()

    # ---- one decision
    def decide(self, s: ClusterSnapshot) -> Decision:
        if self._known is not None:  # the first decision after import_state: the jobs it knew are no arrivals
            s, self._known = restored_arrivals(s, self._known), None
        rank = self._rank
        for jid in s.ended:
            rank.pop(jid, None)
        for j in s.arrived:
            if j.job_id not in rank:
                rank[j.job_id] = self._next
                self._next += 1
        if len(rank) != len(s.jobs):  # jobs this policy never saw arrive (e.g. rebuilt after a restart)
            for j in s.jobs:
                if j.job_id not in rank:
                    rank[j.job_id] = self._next
                    self._next += 1
        last = self._last
        if last is not None and nothing_changed(s, last.run, last.gpus_per_node) \
                and all(last.profiles.get(j.job_id) == j.stage_times for j in s.jobs):
            return self._hold(s, last)
        held = self._finishing(s)
        jobs = [j for j in s.jobs if j.job_id not in held] if held else s.jobs
        if self.known:
            order = sorted(jobs, key=lambda j: (j.remaining_iterations * j.iteration_time * j.num_gpu,
                                                  rank[j.job_id]))
        else:
            order = sorted(jobs, key=lambda j: (j.attained_gpu, rank[j.job_id]))
        pos = {j.job_id: i for i, j in enumerate(order)}

        # 2. candidates: each job that fits claims itself and the next group_size - 1 of its bucket
        buckets: dict[int, list] = {}
        for j in order:
            buckets.setdefault(j.num_gpu, []).append(j)
        index = {j.job_id: i for b in buckets.values() for i, j in enumerate(b)}
        chosen = dict.fromkeys(buckets, 0)
        trial = make_placer(s, self.placement, self.packlimit)
        units = list({id(u): u for u in held.values()}.values())
        for u in units:  # the finishing jobs' GPUs are theirs
            trial.take(u[0].placement)
        for j in order:
            g = j.num_gpu
            if index[j.job_id] < chosen[g]:
                continue
            if trial.total_free < g:
                if trial.total_free == 0:
                    break
                continue
            if trial.place(g, j.skew, (), j.gpu_type) is not None:
                chosen[g] = min(chosen[g] + self.k, len(buckets[g]))
        capacity = s.total_gpus - sum(u[0].num_gpu for u in units)
        demand = sum(g * n for g, n in chosen.items())
        nodes = {g: [[j] for j in buckets[g][:n]] for g, n in chosen.items() if n}

        # 3. grouping rounds
        if demand > capacity and self.k > 1:
            if self.matching == "priority":
                demand = self._group_in_order(nodes, demand, capacity)
            else:
                for _ in range(self.rounds):
                    if demand <= capacity:
                        break
                    for g in nodes:  # buckets in order of their most urgent job
                        if demand > capacity:
                            nodes[g], demand = self._match_round(nodes[g], g, demand, capacity)

        # 4. split groups that run slower than their members alone
        groups = []  # (priority position, skew, members)
        for g, bucket in nodes.items():
            for grp in bucket:
                parts = [grp]
                if len(grp) > 1 and (len({j.gpu_type for j in grp}) > 1 or self.autosplit and
                                     self.group_time(self._key(grp)) > sum(j.iteration_time for j in grp)):
                    parts = [[j] for j in grp]  # (members share GPUs: they need the same GPU type)
                groups += [(min(pos[j.job_id] for j in p), max(j.skew for j in p), p) for p in parts]
        groups.sort(key=lambda e: e[0])

        # 5. admit in priority order, place largest first (the finishing jobs first, where they are)
        trial = make_placer(s, self.placement, self.packlimit)
        for u in units:
            trial.take(u[0].placement)
        admitted = [e for e in groups if trial.place(e[2][0].num_gpu, e[1], (), e[2][0].gpu_type) is not None]
        admitted.sort(key=lambda e: (-e[2][0].num_gpu, e[0]))
        placer = make_placer(s, self.placement, self.packlimit, self.sticky)
        run: dict[int, tuple] = {}
        shared, slowdown = [], {}
        for u in units:
            placer.take(u[0].placement)
        for kept, grp in [(True, u) for u in units] + [(False, e[2]) for e in admitted]:
            if kept:
                where = grp[0].placement
            else:
                here = grp[0].placement if all(j.running and j.placement == grp[0].placement for j in grp) else ()
                where = placer.place(grp[0].num_gpu, max(j.skew for j in grp), here, grp[0].gpu_type)
            if where is None:
                continue
            for j in grp:
                run[j.job_id] = where
            if len(grp) > 1:
                shared.append(tuple(j.job_id for j in grp))
                t = self.group_time(self._key(grp))
                for j in grp:  # never faster than alone, whatever the profile says
                    slowdown[j.job_id] = max(1.0, t / j.iteration_time)

        # ties keep this order next time: priority order, larger jobs first
        for i, j in enumerate(sorted(order, key=lambda j: -j.num_gpu)):
            rank[j.job_id] = i
        self._last = _Last(run, tuple(shared), slowdown, s.gpus_per_node, {j.job_id: j.stage_times for j in s.jobs})
        return Decision(run, groups=tuple(shared), slowdown=slowdown)

    def _hold(self, s: ClusterSnapshot, last: "_Last") -> Decision:
        """Nothing changed since the last decision (a run's first step, a periodic round):
        nothing arrived or ended, the cluster and the profiles are the same, and exactly the
        jobs it ran run. The decision stands as it was. Muri regroups on arrivals and ends, as
        in the paper's simulator; regrouping at every decision point would restart groups whose
        members have just paid their start-up, because their priorities moved while they trained."""
        return Decision({j.job_id: j.placement for j in s.running}, groups=last.groups, slowdown=last.slowdown)

    def _finishing(self, s: ClusterSnapshot) -> dict:
        """Running jobs within ``finish_hold`` of their end, each with the running members of the
        group it ran in (a unit kept as it is): job key -> unit (a list of views, one placement)."""
        if not self.finish_hold:
            return {}
        out: dict = {}
        group_of = None  # job key -> the group the last decision ran it in (built if a job is finishing)
        for j in s.running:
            if j.job_id in out or j.remaining_iterations > self.finish_hold * j.iterations or \
                    j.remaining_iterations * j.iteration_time > j.restart_cost:
                continue
            if group_of is None:
                group_of = {k: grp for grp in (self._last.groups if self._last else ()) for k in grp}
            unit = [j]
            for k in group_of.get(j.job_id, ()):
                m = s.job(k)
                if k != j.job_id and m is not None and m.running and m.placement == j.placement:
                    unit.append(m)
            for m in unit:
                out[m.job_id] = unit
        return out

    def _key(self, grp: list) -> tuple:
        """A group's type: the sorted profile ids of its members."""
        return tuple(sorted(self._pid(j) for j in grp))

    def _match_round(self, bucket: list, g: int, demand: int, capacity: int):
        types = [self._key(grp) for grp in bucket]
        counts: dict = {}
        for t in types:
            if t[0] >= 0 and len(t) < self.k:
                counts[t] = counts.get(t, 0) + 1
        plan = match_types(counts, self._weight)
        pairs = assign([t if t in counts else None for t in types], plan) if plan else []
        partner = {}
        for a, b in pairs:
            partner[a], partner[b] = b, a
        out = []
        for u in range(len(bucket)):  # a pair is merged when its later member comes up
            v = partner.get(u)
            if v is None:
                out.append(bucket[u])
            elif v < u:
                if demand > capacity:
                    out.append(bucket[v] + bucket[u])
                    demand -= g
                else:
                    out.append(bucket[v])
                    out.append(bucket[u])
        return out, demand

    def _group_in_order(self, nodes: dict, demand: int, capacity: int) -> int:
        for g, bucket in nodes.items():
            out = []
            for i in range(0, len(bucket), self.k):
                chunk = bucket[i:i + self.k]
                grp = list(chunk[0])
                for other in chunk[1:]:
                    if demand > capacity and other[0].stage_times and grp[0].stage_times:
                        grp += other
                        demand -= g
                    else:
                        out.append(other)
                out.append(grp)
            nodes[g] = out
        return demand


_OPTS = ("group_size", "resources", "rounds", "overhead", "autosplit", "placement", "packlimit", "sticky",
         "finish_hold")
register("muri-s", lambda **kw: Muri(known_duration=True, **kw), _OPTS)
register("muri-l", lambda **kw: Muri(known_duration=False, **kw), _OPTS)
register("muri-l-worst", lambda **kw: Muri(known_duration=False, ordering="worst", **kw), _OPTS)
register("muri-l-noblossom", lambda **kw: Muri(known_duration=False, matching="priority", **kw), _OPTS)
