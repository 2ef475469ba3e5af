"""Maximum-weight matching of typed nodes, for Muri's grouping rounds.

Muri matches jobs in a graph whose edge weights are interleaving efficiencies. Jobs that
train the same model share a stage profile, so a weight depends only on the two nodes'
*types* (their multisets of profiles), and a matching is fully described by how many pairs of
each type pair it takes. That turns a matching over n nodes (Blossom, O(n^3)) into a
b-matching over T types, T being a few dozen however many jobs are queued:

    maximize   sum w(A,B) x(A,B)
    subject to sum_B x(A,B) + 2 x(A,A) <= n(A)  for every type A,   x >= 0 integer.

It is solved by greedy (heaviest type pair first, as many copies as fit) followed by local
search with moves applied in as many copies as stay feasible (moves are linear in x):

* *add*: pair two free nodes;
* *replace*: in a pair (A,B), swap B for a free node C;
* *augment*: a pair (A,B) splits and each member takes a free partner: (A,C), (B,D);
* *exchange*: two pairs (A,B), (C,D) become (A,C), (B,D) or (A,D), (B,C).

The result is a local optimum of the 2-exchange neighbourhood; ``benchmarks/grouping.py``
measures it against the exact Blossom matching. :func:`assign` then maps the type counts back
to concrete nodes, pairing nodes in their priority order.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Hashable, Optional, Sequence

__all__ = ["match_types", "assign"]

_EPS = 1e-12


def _key(a, b):
    return (a, b) if a <= b else (b, a)


def match_types(counts: dict, weight: Callable[[Hashable, Hashable], Optional[float]],
                max_rounds: int = 200) -> dict:
    """Type-pair counts ``{(A, B): x}`` (A <= B) of a heavy matching.

    ``counts``: nodes per type (types must be orderable); ``weight(A, B)``: the weight of
    pairing an A with a B, or None (or <= 0) where they may not pair.
    """
    types = sorted(t for t, c in counts.items() if c > 0)
    w: dict = {}
    for i, a in enumerate(types):
        for b in types[i:]:
            if a == b and counts[a] < 2:
                continue
            v = weight(a, b)
            if v is not None and v > _EPS:
                w[(a, b)] = v
    free = {t: counts[t] for t in types}
    x: dict = {}

    def room(a, b):
        return free[a] // 2 if a == b else min(free[a], free[b])

    for (a, b), _ in sorted(w.items(), key=lambda kv: (-kv[1], kv[0])):
        c = room(a, b)
        if c > 0:
            x[(a, b)] = x.get((a, b), 0) + c
            free[a] -= c
            free[b] -= c

    def gain_of(removed, added):
        g = 0.0
        for p in added:
            if p not in w:
                return None
            g += w[p]
        return g - sum(w[p] for p in removed)

    def apply(removed, added, copies):
        for p in removed:
            x[p] -= copies
            if not x[p]:
                del x[p]
            free[p[0]] += copies
            free[p[1]] += copies
        for p in added:
            x[p] = x.get(p, 0) + copies
            free[p[0]] -= copies
            free[p[1]] -= copies

    def feasible_copies(removed, added):
        need: dict = {}
        for p in added:
            need[p[0]] = need.get(p[0], 0) + 1
            need[p[1]] = need.get(p[1], 0) + 1
        have: dict = {}
        for p in removed:
            have[p] = have.get(p, 0) + 1
        copies = min(x[p] // n for p, n in have.items()) if have else 10 ** 12
        for p in removed:  # nodes the removed pairs hand back
            need[p[0]] = need.get(p[0], 0) - 1
            need[p[1]] = need.get(p[1], 0) - 1
        for t, n in need.items():
            if n > 0:
                copies = min(copies, free[t] // n)
        return copies

    for _ in range(max_rounds):
        best = [0.0, None, None, 0]  # gain per copy, removed, added, copies

        def consider(removed, added):
            g = gain_of(removed, added)
            if g is not None and g > max(best[0], _EPS):
                copies = feasible_copies(removed, added)
                if copies > 0:
                    best[:] = [g, removed, added, copies]

        frees = [t for t in types if free[t] > 0]
        for i, a in enumerate(frees):  # add
            for b in frees[i:]:
                consider((), ((a, b),))
        pairs = list(x)
        for p in pairs:
            for keep, drop in ((p[0], p[1]), (p[1], p[0])):  # replace one member with a free node
                for c in frees:
                    if c != drop:
                        consider((p,), (_key(keep, c),))
            for c in frees:  # augment: split the pair, each member takes a free partner
                for d in frees:
                    consider((p,), (_key(p[0], c), _key(p[1], d)))
        for i, p in enumerate(pairs):  # exchange partners between two pairs
            for r in pairs[i:]:
                if r == p and x[p] < 2:
                    continue
                (a, b), (c, d) = p, r
                consider((p, r), (_key(a, c), _key(b, d)))
                consider((p, r), (_key(a, d), _key(b, c)))
        if best[1] is None:
            break
        apply(best[1], best[2], best[3])
    return x


def assign(order: Sequence[Hashable], plan: dict) -> list[tuple[int, int]]:
    """Concrete pairs ``(i, j)`` (indices into ``order``, i < j) realizing the type counts ``plan``.

    ``order[i]`` is node i's type, nodes in priority order: each unpaired node, in order, is
    paired with the earliest remaining node of a type it still has pairs with.
    """
    left = dict(plan)
    queue: dict = {}
    for i, t in enumerate(order):
        queue.setdefault(t, deque()).append(i)
    partners: dict = {}
    for (a, b) in plan:
        partners.setdefault(a, set()).add(b)
        partners.setdefault(b, set()).add(a)
    taken = [False] * len(order)
    out = []
    for i, t in enumerate(order):
        if taken[i] or t not in partners:
            continue
        taken[i] = True
        q = queue[t]
        while q and taken[q[0]]:
            q.popleft()
        best_j, best_t = None, None
        for u in partners[t]:
            if left.get(_key(t, u), 0) <= 0:
                continue
            qu = queue[u]
            while qu and taken[qu[0]]:
                qu.popleft()
            if qu and (best_j is None or qu[0] < best_j):
                best_j, best_t = qu[0], u
        if best_j is None:
            taken[i] = False  # no partner left for this one: it stays single
            continue
        taken[best_j] = True
        k = _key(t, best_t)
        left[k] -= 1
        out.append((i, best_j))
    return out
