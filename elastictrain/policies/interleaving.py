"""Muri's interleaving model: how long one interleaved iteration of a group takes (eq. 3), how
efficient it is (eq. 2 and 4), and which ordering of the group is best (or worst).

A group runs in *slots*: the executor has ``k`` slots per interleaved iteration, one per
resource type, separated by barriers, and in each slot every job runs one stage on a
different resource (Muri section 4). A job's stage times are ``t[0..s-1]`` in the order the
job uses them (load, preprocess, compute, sync, ...). A job placed at slot offset ``o`` runs
its stage ``j`` in slot ``(o + j) mod k``; a slot lasts as long as its longest stage. With
``s == k`` this is eq. 3::

    T = sum over slots j of  max over jobs i of  t_i[(j - o_i) mod k]

(the paper writes it for offsets 0..p-1). Two generalisations, both needed by real profiles:

* the offsets need not be consecutive: two jobs among four slots may sit one, two or three
  slots apart, and the best ordering is searched over all of them (rotations of the group are
  equivalent, so job 0 stays at offset 0);
* a profile may have fewer stages than the executor has slots (Muri's traces measure three:
  data loading, GPU compute, network sync; the executor has four resource types, storage IO
  and CPU among them). Its first stage then spans the extra slots, so data loading can
  overlap two slots, and the iteration time is the cycle time of the max-plus recurrence over
  slot barriers ``f[b + span] >= f[b] + t`` (with one slot per stage it reduces to eq. 3).

Efficiency (eq. 4, eq. 2 for k = 2): the fraction of resource-time that is busy,
``gamma = sum_i sum_j t_i[j] / (k * T)``; 1 means no resource is ever idle.
"""

from __future__ import annotations

import itertools
from typing import Sequence

from ..errors import ConfigError

__all__ = ["cycle_time", "best_ordering", "worst_ordering", "efficiency", "spans"]

_PERIODS = 8  # periods simulated for the max-plus cycle time (averaged over the last half)


def spans(n_stages: int, k: int) -> tuple[int, ...]:
    """Slots each stage occupies: one each, the first stage taking any slots left over."""
    if n_stages < 1:
        raise ConfigError("a stage profile needs at least one stage time")
    if n_stages > k:
        raise ConfigError(f"a profile of {n_stages} stages does not fit {k} resource slots; "
                          f"raise the number of resource types to at least {n_stages}")
    return (k - n_stages + 1,) + (1,) * (n_stages - 1)


def cycle_time(profiles: Sequence[Sequence[float]], offsets: Sequence[int], k: int) -> float:
    """Seconds per interleaved iteration of jobs with stage times ``profiles`` at slot ``offsets``."""
    if len(profiles) != len(offsets) or len(set(o % k for o in offsets)) != len(offsets):
        raise ConfigError(f"offsets {tuple(offsets)} must be distinct slots, one per job")
    if all(len(p) == k for p in profiles):  # eq. 3
        slot = [0.0] * k
        for p, o in zip(profiles, offsets):
            for j, t in enumerate(p):
                s = (o + j) % k
                if t > slot[s]:
                    slot[s] = t
        return sum(slot)
    edges: list[tuple[int, int, float]] = []  # (start slot, span, seconds)
    for p, o in zip(profiles, offsets):
        pos = o
        for t, m in zip(p, spans(len(p), k)):
            edges.append((pos % k, m, float(t)))
            pos += m
    n = _PERIODS * k
    f = [0.0] * (n + k + 1)
    by_end: dict[int, list[tuple[int, float]]] = {}
    for r in range(_PERIODS):
        for c, m, t in edges:
            by_end.setdefault(r * k + c + m, []).append((r * k + c, t))
    for b in range(1, n + 1):
        v = f[b - 1]  # barriers are in order
        for start, t in by_end.get(b, ()):
            if f[start] + t > v:
                v = f[start] + t
        f[b] = v
    half = _PERIODS // 2
    return (f[n] - f[half * k]) / (_PERIODS - half)


def _orderings(p: int, k: int):
    if p > k:
        raise ConfigError(f"a group of {p} jobs does not fit {k} resource slots")
    for rest in itertools.permutations(range(1, k), p - 1):
        yield (0,) + rest


def best_ordering(profiles: Sequence[Sequence[float]], k: int) -> tuple[float, tuple[int, ...]]:
    """The shortest interleaved iteration over all slot orderings: ``(T, offsets)``."""
    if len(profiles) == 1:
        return float(sum(profiles[0])), (0,)
    return min((cycle_time(profiles, o, k), o) for o in _orderings(len(profiles), k))


def worst_ordering(profiles: Sequence[Sequence[float]], k: int) -> tuple[float, tuple[int, ...]]:
    """The longest interleaved iteration over all slot orderings (for the ablation)."""
    if len(profiles) == 1:
        return float(sum(profiles[0])), (0,)
    return max((cycle_time(profiles, o, k), o) for o in _orderings(len(profiles), k))


def efficiency(profiles: Sequence[Sequence[float]], T: float, k: int) -> float:
    """Eq. 4: the busy fraction of the group's resource-time over an iteration of ``T`` seconds."""
    if T <= 0:
        raise ConfigError(f"iteration time must be positive, got {T}")
    return sum(sum(p) for p in profiles) / (k * T)
