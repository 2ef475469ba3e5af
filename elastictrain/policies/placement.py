"""Placement: where a job's GPUs go, shared by every policy.

* ``count``: GPUs are a pool; only the total counts (Tiresias's and Muri's 2D-LAS runs).
* ``consolidated``: YARN-like first fit: a job of at most one node's GPUs takes the first node
  with enough free GPUs; a larger one takes whole free nodes plus one node for the remainder,
  all under one switch (all or nothing); a job larger than a switch takes whole idle nodes
  across switches (it could never run otherwise).
* ``spread``: fragmentation-minimizing best fit across nodes: fill the nodes with the fewest
  free GPUs first, spreading a job over several nodes if needed.
* ``skew``: Tiresias: consolidate a job whose model skew (largest tensor / total) exceeds
  ``packlimit``; spread the others.

A job that needs a GPU type (``JobView.gpu_type``: Slurm's ``--gres=gpu:a100:4``) goes only on
the nodes of that type (:func:`type_mask`) in every mode; counting GPUs, it is placed on real
nodes at once (a count of the whole cluster's GPUs says nothing about one type's).

``sticky`` (the live coordinator sets it; simulations leave it off, as the reference
simulators do): a running job keeps its GPUs when they are still free, and a waiting job first
tries the GPUs no running job holds, so a decision moves a running job (a restart on a real
cluster) only when it has to.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Optional

from ..errors import ConfigError

__all__ = ["Placer", "make_placer", "PLACEMENTS", "best_node", "any_node", "holds", "only", "type_matches",
           "type_mask", "one_type", "groups", "one_type_room"]

PLACEMENTS = ("count", "consolidated", "spread", "skew")


class Placer:
    """Free-GPU bookkeeping for one decision. ``place(job)`` returns a placement or None."""

    def __init__(self, gpus_per_node: tuple[int, ...], nodes_per_switch: int, mode: str = "consolidated",
                 packlimit: float = 0.5, sticky: bool = False, running: tuple = (), node_types: tuple = ()) -> None:
        if mode not in PLACEMENTS:
            raise ConfigError(f"placement {mode!r} is not one of {', '.join(PLACEMENTS)}")
        self.free = list(gpus_per_node)
        self.cap = gpus_per_node
        self.total_free = sum(gpus_per_node)
        self.per_switch = max(1, nodes_per_switch)
        self.mode, self.packlimit = mode, packlimit
        self.per_node = max(gpus_per_node) if gpus_per_node else 0
        self.max_free = self.per_node  # at least the most free GPUs on any node (fails a search in O(1))
        self.sticky = sticky
        self.types = node_types  # each node's GPU type (empty: none named)
        self.soft = [0] * len(self.free)  # GPUs running jobs hold and have not been placed again yet
        if sticky:
            for j in running:
                for node, g in j.placement:
                    if 0 <= node < len(self.soft):
                        self.soft[node] += g

    def reset(self, free: list, total: int, top: int) -> "Placer":
        """Place from these free GPUs per node on (``total``: their sum, ``top``: their maximum), as
        a fresh placer would with the nodes' capacities as they are: a backfill's window of time
        (policies/backfill.py). Returns itself."""
        self.free, self.total_free, self.max_free = list(free), total, top
        return self

    def take(self, placement: tuple) -> None:
        """Reserve the GPUs of a job that keeps running where it is."""
        for node, g in placement:
            if node >= 0:
                self.free[node] -= g
            self.total_free -= g
        self.max_free = max(self.free) if self.free else 0

    def fill(self, jobs, strict: bool = False) -> dict[int, tuple]:
        """Place ``jobs`` in the given order: job id -> placement. A job that does not fit is
        skipped (``strict``: it stops the filling, as strict FIFO does)."""
        run = {}
        if not self.sticky and self.mode == "consolidated":
            return self._fill_first_fit(jobs, strict, run)
        place = self.place
        for j in jobs:
            if self.total_free == 0:
                break
            where = place(j.num_gpu, j.skew, j.placement if j.running else (), j.gpu_type)
            if where is not None:
                run[j.job_id] = where
            elif strict:
                break
        return run

    def _fill_first_fit(self, jobs, strict: bool, run: dict) -> dict:
        """:meth:`fill` for consolidated, non-sticky placement (every simulation of SRTF, FIFO,
        time slicing...): a job of at most one node's GPUs takes the first node with room, the
        same as :meth:`_first_fit`, in this one loop (simulations place millions of gangs, and a
        call per job was a third of it); a larger one goes through :meth:`place`."""
        per_node, free = self.per_node, self.free
        nodes = len(free)
        total, top = self.total_free, self.max_free  # (local copies, written back around place())
        for j in jobs:
            if total == 0:
                break
            n = j.num_gpu
            if j.gpu_type:  # only the nodes of its type
                self.total_free, self.max_free = total, top
                where = self.place(n, j.skew, (), j.gpu_type)
                total, top = self.total_free, self.max_free
                if where is not None:
                    run[j.job_id] = where
                elif strict:
                    break
                continue
            if n <= top:  # some node may have room: the first one that has takes it
                i = 0
                while i < nodes and free[i] < n:
                    i += 1
                if i < nodes:
                    free[i] -= n
                    total -= n
                    run[j.job_id] = ((i, n),)
                    continue
                top = max(free)  # none had: the bound was stale, now it is exact
            if n > per_node:
                self.total_free, self.max_free = total, top
                where = self.place(n, j.skew)
                total, top = self.total_free, self.max_free
                if where is not None:
                    run[j.job_id] = where
                    continue
            if strict:
                break
        self.total_free, self.max_free = total, top
        return run

    def place(self, num_gpu: int, skew: float = 0.0, current: tuple = (), gpu_type: str = "") -> Optional[tuple]:
        """A placement for a gang of ``num_gpu``, or None. ``current``: where the job runs now
        (kept when the placer is sticky); ``gpu_type``: the GPU type it needs ("" any)."""
        if num_gpu > self.total_free:
            return None
        if gpu_type:
            return self._typed(num_gpu, skew, current, gpu_type)
        if not self.sticky:  # the common path, kept short: simulations place millions of gangs
            mode = self.mode
            if mode == "count":
                self.total_free -= num_gpu
                return ((-1, num_gpu),)
            if mode == "consolidated" and num_gpu <= self.per_node:
                return self._first_fit(num_gpu)
            out = self._place(num_gpu, skew)
            return None if out is None else self._take(out, num_gpu, soft=False)
        if current:  # sticky: a running job keeps its GPUs if they are still free
            if current[0][0] >= 0 and sum(g for _, g in current) == num_gpu and \
                    all(self.free[n] >= g for n, g in current):
                return self._take(tuple(current), num_gpu, soft=True)
            for n, g in current:
                if n >= 0:
                    self.soft[n] = max(0, self.soft[n] - g)
        elif any(self.soft):  # sticky: a newcomer first tries the GPUs no running job holds
            free = self.free
            self.free = [f - s for f, s in zip(free, self.soft)]
            saved = self.total_free, self.max_free
            self.total_free, self.max_free = sum(self.free), max(self.free)
            try:
                out = self._place(num_gpu, skew) if num_gpu <= self.total_free else None
            finally:
                self.free = free
                self.total_free, self.max_free = saved
            if out is not None:
                return self._take(out, num_gpu, soft=False)
        out = self._place(num_gpu, skew)
        return None if out is None else self._take(out, num_gpu, soft=True)

    def _typed(self, num_gpu: int, skew: float, current: tuple, gpu_type: str) -> Optional[tuple]:
        """:meth:`place` on the nodes of ``gpu_type`` alone: the others look full while it places."""
        masks = groups(type_mask(gpu_type, self.types))
        if len(masks) > 1:  # one type of several ([a100|h100]): the first whose nodes hold it whole
            if current and current[0][0] >= 0:  # (where it runs first: a sticky placer keeps it there)
                masks = sorted(masks, key=lambda m: not (current[0][0] < len(m) and m[current[0][0]]))
            for m in masks:
                where = self._typed_on(num_gpu, skew, current, m)
                if where is not None:
                    return where
            return None
        return self._typed_on(num_gpu, skew, current, masks[0])

    def _typed_on(self, num_gpu: int, skew: float, current: tuple, mask: tuple) -> Optional[tuple]:
        """:meth:`_typed` on the nodes ``mask`` allows."""
        free = self.free
        mine = only(free, mask)
        if sum(mine) < num_gpu:
            return None
        if self.mode == "count":  # on real nodes: the count is the whole cluster's
            where = tuple(current) if holds(current, mine, num_gpu) else any_node(num_gpu, mine)
        else:
            total, top = self.total_free, self.max_free
            self.free, self.total_free, self.max_free = mine, sum(mine), max(mine)
            try:
                where = self.place(num_gpu, skew, current)
            finally:
                self.free, self.total_free, self.max_free = free, total, top
        if where is None:
            return None
        for node, g in where:
            free[node] -= g
        self.total_free -= num_gpu
        self.max_free = max(free)
        return where

    def _first_fit(self, num_gpu: int) -> Optional[tuple]:
        """Consolidated placement of a job of at most one node's GPUs, not sticky: the first node
        with room (:meth:`_fill_first_fit` does the same for a whole queue)."""
        if num_gpu > self.max_free:
            return None
        free = self.free
        for i, f in enumerate(free):
            if f >= num_gpu:
                free[i] = f - num_gpu
                self.total_free -= num_gpu
                return ((i, num_gpu),)
        self.max_free = max(free)  # none had room: the bound was stale, now it is exact
        return None

    def _take(self, out: tuple, num_gpu: int, soft: bool) -> tuple:
        if out[0][0] >= 0:
            for node, g in out:
                self.free[node] -= g
                if soft:
                    self.soft[node] = max(0, self.soft[node] - g)
            self.max_free = max(self.free)
        self.total_free -= num_gpu
        return out

    def _place(self, num_gpu: int, skew: float) -> Optional[tuple]:
        """Where a gang goes under the placer's mode, without taking the GPUs."""
        mode = self.mode
        if mode == "count":
            return ((-1, num_gpu),)
        if mode == "skew":
            mode = "consolidated" if skew > self.packlimit else "spread"
        if mode == "consolidated" and num_gpu <= self.per_node and num_gpu > self.max_free:
            return None  # no node has room, and a job this size stays on one node
        return self._consolidated(num_gpu) if mode == "consolidated" else self._spread(num_gpu)

    def _consolidated(self, need: int) -> Optional[tuple]:
        free, n = self.free, len(self.free)
        per_node = self.per_node
        if need <= per_node:
            for i in range(n):
                if free[i] >= need:
                    return ((i, need),)
            return None
        for s in range(0, n, self.per_switch):  # whole idle nodes + one for the rest, in one switch
            nodes = range(s, min(n, s + self.per_switch))
            full, rest = divmod(need, per_node)
            idle = [i for i in nodes if free[i] == self.cap[i] == per_node][:full]
            if len(idle) < full:
                continue
            if rest == 0:
                return tuple((i, per_node) for i in idle)
            last = next((i for i in nodes if i not in idle and free[i] >= rest), None)
            if last is not None:
                return tuple((i, per_node) for i in idle) + ((last, rest),)
        if need > self.per_switch * per_node:  # bigger than a switch: whole idle nodes anywhere
            idle = [i for i in range(n) if free[i] == self.cap[i] == per_node]
            full, rest = divmod(need, per_node)
            if len(idle) >= full:
                last = next((i for i in range(n) if i not in idle[:full] and free[i] >= rest), None) if rest else None
                if not rest or last is not None:
                    return tuple((i, per_node) for i in idle[:full]) + (((last, rest),) if rest else ())
        return None

    def _spread(self, need: int) -> Optional[tuple]:
        order = sorted((i for i in range(len(self.free)) if self.free[i] > 0), key=lambda i: (self.free[i], i))
        fit = next((i for i in order if self.free[i] >= need), None)
        if fit is not None:  # best fit on one node if any node can take it
            return ((fit, need),)
        out, left = [], need
        for i in reversed(order):  # else the emptiest nodes first, fewest nodes
            take = min(left, self.free[i])
            out.append((i, take))
            left -= take
            if left == 0:
                return tuple(out)
        return None


def make_placer(snapshot, mode: str, packlimit: float = 0.5, sticky: bool = False) -> Placer:
    return Placer(snapshot.gpus_per_node, snapshot.nodes_per_switch, mode, packlimit, sticky,
                  snapshot.running if sticky else (), snapshot.node_types)


# ---------------------------------------------------------------------------- GPU types
_WORDS = re.compile(r"[^a-z0-9]+")


def type_matches(want: str, have: str) -> bool:
    """Whether a node of GPU type ``have`` serves a job that needs ``want``: ``want``'s words are
    words of ``have``, in a row, ignoring case (``a100`` and ``A100-SXM4-80GB`` are served by
    ``NVIDIA A100-SXM4-80GB``; ``a10`` and ``80gb-a100`` are not). ``want`` may list alternatives
    joined by ``|`` (``a100|h100``): a node of any of them serves it (in brackets, ``[a100|h100]``,
    too; :func:`type_mask` then keeps a gang on one of them)."""
    return _alternative(want, have) >= 0


def one_type(want: str) -> bool:
    """Whether ``want`` keeps a gang on one of its alternatives (Slurm's ``[a100|h100]``)."""
    return want.startswith("[")


def _alternative(want: str, have: str) -> int:
    """The index of the first of ``want``'s alternatives that a node of type ``have`` serves; -1: none."""
    theirs = _WORDS.split(have.lower())
    for i, one in enumerate(want.strip("[]").lower().split("|")):
        mine = [w for w in _WORDS.split(one) if w]
        n = len(mine)
        if n > 0 and any(theirs[k:k + n] == mine for k in range(len(theirs) - n + 1)):
            return i
    return -1


@lru_cache(maxsize=256)
def type_mask(want: str, node_types: tuple) -> tuple:
    """For each node (``node_types``: each one's GPU type), whether a job needing ``want`` may
    run there. No node does where the nodes name no type (``node_types`` empty). For the one-type
    form (``[a100|h100]``) each entry is instead the node's alternative, numbered from 1 (0: none
    serves it): true where it may run, and :func:`any_node`, the placer and the mechanism's check
    keep a gang on nodes of one number."""
    if one_type(want):
        return tuple(_alternative(want, t) + 1 for t in node_types)
    return tuple(type_matches(want, t) for t in node_types)


def groups(mask: Optional[tuple]) -> tuple:
    """The one-type form's masks, one per alternative that some node serves, in ``want``'s order
    (:func:`type_mask`); ``(mask,)`` for any other."""
    if not mask or not any(type(m) is int for m in mask):  # (bools: any of the types, mixed)
        return (mask,)
    return tuple(tuple(m == g for m in mask) for g in sorted({m for m in mask if m}))


def one_type_room(want: str, node_types: tuple, caps: tuple) -> Optional[int]:
    """For the one-type form (``[a100|h100]``), the most GPUs a gang may get: the GPUs (``caps``,
    per node) of its largest alternative. None for any other ``want``."""
    if not one_type(want):
        return None
    return max((sum(c for c, ok in zip(caps, m) if ok) for m in groups(type_mask(want, node_types))), default=0)


# ---------------------------------------------------------------------------- "any node" resolution
def best_node(size: int, free: list, avoid: Optional[list] = None, gtype=None, types: tuple = ()) -> int:
    """The node with ``size`` free GPUs (not counting those ``avoid`` lists per node) that has the
    fewest, then the lowest node; of GPU type ``gtype`` where given (``types``: each node's). -1:
    none has."""
    best, room = -1, 0
    for n, a in enumerate(free):
        f = a - avoid[n] if avoid is not None else a
        if f >= size and (gtype is None or types[n] == gtype) and (best < 0 or f < room):
            best, room = n, f
    return best


def any_node(size: int, free: list, avoid: Optional[list] = None, mask: Optional[tuple] = None) -> Optional[tuple]:
    """Where a gang placed "on any node" goes: the best-fitting node without ``avoid``'s GPUs (GPUs
    a start there would wait for, or take from someone), else the best-fitting node, else spread
    over the nodes with the most free GPUs first; None if the free GPUs do not add up. ``mask``:
    the nodes it may use (a job's GPU type, :func:`type_mask`). (``free`` is not changed.) Shared
    by the mechanism core's plan and the priority tiers."""
    if mask is not None:
        masks = groups(mask)
        if len(masks) > 1:  # one type of several: the first that holds it whole
            for m in masks:
                where = any_node(size, free, avoid, m)
                if where is not None:
                    return where
            return None
        free = only(free, masks[0])
    n = best_node(size, free, avoid) if avoid is not None else -1
    if n < 0:
        n = best_node(size, free)
    if n >= 0:
        return ((n, size),)
    if sum(free) < size:
        return None
    take, left = [], size
    for n in sorted((m for m in range(len(free)) if free[m] > 0), key=lambda m: (-free[m], m)):
        g = min(left, free[n])
        take.append((n, g))
        left -= g
        if not left:
            break
    return tuple(take)


def only(free: list, mask: tuple) -> list:
    """``free`` (GPUs per node) on the nodes ``mask`` allows (a job's GPU type, :func:`type_mask`);
    0 on the others."""
    return [f if ok else 0 for f, ok in zip(free, mask)] + [0] * (len(free) - len(mask))


def holds(where: tuple, free: list, size: int) -> bool:
    """Whether a gang of ``size`` may stay ``where`` it runs: real nodes whose GPUs add up to its
    size, all of them within ``free``."""
    return bool(where) and where[0][0] >= 0 and sum(g for _, g in where) == size and \
        all(0 <= n < len(free) and free[n] >= g for n, g in where)
