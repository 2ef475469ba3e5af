"""A Decision, checked, becomes actions: the one place every scheduling invariant is enforced.

:func:`plan` refuses (with :class:`~elastictrain.errors.PolicyError`, naming the policy, the job
and the rule) a decision that places a job that is not runnable, gives an elastic job a worker
count outside its range, splits a gang (a placement whose GPUs do not add up to the job's
workers), puts more GPUs on a node or in the cluster than the snapshot offers, or forms an
invalid interleaving group (members must be 2+ placed jobs of one size on one placement, each
in one group), or places a job that needs a GPU type on a node of another. It resolves "any
node" placements (``(-1, gpus)``) to real nodes (within a job's GPU type), keeping a
running job where it is, and returns the actions in a fixed order: preemptions first (in
start order), then the placed jobs in the decision's order.
"""

from __future__ import annotations

from ..errors import PolicyError
from ..policies.api import ClusterSnapshot, Decision
from ..policies.placement import any_node, holds, one_type, type_mask
from .api import MIGRATE, PREEMPT, REGROUP, RESIZE, START, Action
from .table import JobTable

__all__ = ["plan"]


def plan(table: JobTable, snap: ClusterSnapshot, decision: Decision, policy: str = "policy",
         fast: bool = True) -> list[Action]:
    """Check ``decision`` against ``snap`` and turn it into actions. (``fast=False``: never the
    one-pass path for plain decisions; the tests hold the two to the same results.)

    Raises:
        PolicyError: the decision breaks an invariant (see the module docstring).
    """
    run = decision.run
    caps = snap.gpus_per_node
    nodes = len(caps)
    workers = decision.workers
    get = snap.by_key.get

    group_of: dict = {}
    for grp in decision.groups:
        grp = tuple(grp)
        where = run.get(grp[0]) if grp else None
        if (len(grp) < 2 or where is None or any(run.get(m) != where for m in grp)
                or len({_size(get(m), workers) for m in grp}) != 1 or any(m in group_of for m in grp)):
            raise PolicyError(f"policy {policy}: group {grp} must be 2+ placed jobs of one GPU count on one "
                              "placement, each in one group")
        for m in grp:
            group_of[m] = grp
    for key, f in decision.slowdown.items():
        if key not in run or not f > 0:
            raise PolicyError(f"policy {policy}: slowdown {f!r} for job {key!r}, which is not placed or not > 0")
    if fast and not workers and not group_of:
        actions = _plan_plain(table, snap, decision, policy)
        if actions is not None:
            return actions

    # ---- check every placement; count the GPUs each node gives out
    used = [0] * nodes
    total = 0
    anywhere = []  # group leaders (or lone jobs) placed "on any node", resolved below
    running = table.running
    plain = not workers and not group_of
    for key, where in run.items():
        if plain:
            e = running.get(key)
            if e is not None and (where is e.placement or where == e.placement):  # kept where it runs
                total += e.num_gpu
                for node, g in where:
                    used[node] += g
                continue
        view = get(key) or _not_runnable(policy, key)
        size = view.num_gpu
        if workers and key in workers:
            size = workers[key]
            lo, hi = view.min_gpu or view.num_gpu, view.max_gpu or view.num_gpu
            if not (isinstance(size, int) and lo <= size <= hi):
                raise PolicyError(f"policy {policy}: job {key!r} given {size!r} workers, outside its range "
                                  f"{lo}..{hi}")
        _check_placement(policy, key, where, size, nodes)
        if view.gpu_type:
            _check_type(policy, view, where, snap.node_types)
        if group_of and key in group_of and group_of[key][0] != key:
            continue  # a group's followers share its leader's GPUs
        total += size
        for node, g in where:
            if node < 0:
                anywhere.append(key)
            else:
                used[node] += g
    _check_capacity(policy, total, used, caps)

    resolved = _resolve(anywhere, run, get, used, caps, table.held_per_node(nodes) if table.stopping else None,
                        snap.node_types) if anywhere else None

    # ---- actions: preemptions, then the placed jobs in decision order
    actions = [Action(PREEMPT, key, (), e.placement, e.num_gpu) for key, e in running.items()
               if key not in run]
    slow = decision.slowdown
    for key, where in run.items():
        grp = group_of.get(key) if group_of else None
        if resolved is not None:
            where = resolved.get(grp[0] if grp else key, where)
        e = running.get(key)
        if plain and e is not None and not e.group and (where is e.placement or where == e.placement):
            continue  # keeps running as it is (a job left of its group is regrouped below: runs alone)
        size = workers.get(key, e.num_gpu if e is not None else get(key).num_gpu) if workers else \
            (e.num_gpu if e is not None else get(key).num_gpu)
        group = grp or ()
        if e is None:
            actions.append(Action(START, key, where, (), size, group, slow.get(key)))
            continue
        if e.placement == where and e.group == group and size == e.num_gpu:
            continue  # keeps running as it is
        if e.placement == where and size == e.num_gpu and e.group != group and sorted(e.group) == sorted(group):
            e.group = group  # the same group, its members listed in another order: nothing restarts
            table.touch(key)
            continue
        moved = e.placement != where and sorted(e.placement) != sorted(where)
        if size != e.num_gpu:
            kind = RESIZE
        elif e.group != group:
            kind = REGROUP
        elif moved:
            kind = MIGRATE
        else:
            e.placement = where  # the same GPUs listed in another order
            table.touch(key)
            continue
        actions.append(Action(kind, key, where, e.placement, size, group, slow.get(key), moved))
    return actions


def _plan_plain(table: JobTable, snap: ClusterSnapshot, decision: Decision, policy: str):
    """:func:`plan` for the common decision (no groups, no worker counts), in one pass: the
    same checks, the same actions in the same order. None where a placement is on "any node"
    (the general path resolves those)."""
    run, slow = decision.run, decision.slowdown
    caps = snap.gpus_per_node
    nodes = len(caps)
    used = [0] * nodes
    total = 0
    running = table.running
    get = snap.by_key.get
    placed = []
    reorder = []  # running jobs whose GPUs are listed in another order: nothing restarts
    for key, where in run.items():
        e = running.get(key)
        if e is not None:
            old = e.placement
            if where is old or where == old:  # kept where it runs
                total += e.num_gpu
                for node, g in where:
                    used[node] += g
                if e.group:  # a job left of its group: it runs alone now (its group restarts)
                    placed.append(Action(REGROUP, key, where, old, e.num_gpu, (), slow.get(key), False))
                continue
        view = get(key) or _not_runnable(policy, key)
        size = view.num_gpu
        if view.gpu_type:  # the general path checks its GPU type (and resolves "any node" within it)
            return None
        if len(where) == 1:  # one node: _check_placement's test, inline (most placements)
            node, g = where[0]
            if not (type(g) is int and g == size and type(node) is int and 0 <= node < nodes):
                _check_placement(policy, key, where, size, nodes)  # raises, or passes "any node"
                return None
            used[node] += g
        else:
            _check_placement(policy, key, where, size, nodes)
            for node, g in where:
                used[node] += g
        total += size
        if e is None:
            placed.append(Action(START, key, where, (), size, (), slow.get(key)))
            continue
        moved = len(where) == 1 or len(old) != len(where) or sorted(old) != sorted(where)
        if e.group:
            kind = REGROUP
        elif moved:
            kind = MIGRATE
        else:
            reorder.append((e, where))
            continue
        placed.append(Action(kind, key, where, old, e.num_gpu, (), slow.get(key), moved))
    _check_capacity(policy, total, used, caps)
    for e, where in reorder:
        e.placement = where
        table.touch(e.key)
    actions = [Action(PREEMPT, key, (), e.placement, e.num_gpu) for key, e in running.items()
               if key not in run]
    actions += placed
    return actions


def _not_runnable(policy: str, key):
    raise PolicyError(f"policy {policy}: placed job {key!r}, which is not runnable (unknown, ended, or still "
                      "stopping)")


def _check_placement(policy: str, key, where: tuple, size: int, nodes: int) -> None:
    """``where`` is (node, gpus) pairs on real nodes, or one (-1, gpus) for any node, adding up to
    the job's ``size``."""
    if len(where) == 1:
        node, got = where[0]
        ok = type(got) is int and got > 0 and type(node) is int and -1 <= node < nodes
    else:
        got, ok = 0, len(where) > 1
        for node, g in where:
            ok = ok and type(g) is int and g > 0 and type(node) is int and 0 <= node < nodes
            got += g if type(g) is int else 0
    if not ok:
        raise PolicyError(f"policy {policy}: job {key!r} has a bad placement {where!r} (need (node, gpus) "
                          f"pairs with node in 0..{nodes - 1} and gpus >= 1, or one (-1, gpus) for any node)")
    if got != size:
        raise PolicyError(f"policy {policy}: job {key!r} placed on {got} GPUs but runs with {size} (a gang "
                          "is all or nothing)")


def _check_type(policy: str, view, where: tuple, node_types: tuple) -> None:
    """A job that needs a GPU type is placed only on nodes of that type ("any node" is resolved
    within it)."""
    mask = type_mask(view.gpu_type, node_types)
    for node, _ in where:
        if node >= 0 and not (node < len(mask) and mask[node]):
            have = node_types[node] if node < len(node_types) else "unnamed"
            raise PolicyError(f"policy {policy}: job {view.job_id!r} needs GPU type {view.gpu_type!r} but was placed "
                              f"on node {node}, whose GPUs are {have!r}")
    if one_type(view.gpu_type) and len({mask[node] for node, _ in where if node >= 0}) > 1:
        raise PolicyError(f"policy {policy}: job {view.job_id!r} needs all its GPUs of one type of {view.gpu_type!r} "
                          f"but was placed on {sorted({node_types[n] for n, _ in where if n >= 0})}")


def _check_capacity(policy: str, total: int, used: list, caps: tuple) -> None:
    if total > sum(caps):
        raise PolicyError(f"policy {policy} placed {total} GPUs on a cluster offering {sum(caps)}")
    for node in range(len(caps)):
        if used[node] > caps[node]:
            raise PolicyError(f"policy {policy} placed {used[node]} GPUs on node {node}, which offers {caps[node]}")


def _size(view, workers: dict) -> int:
    return -1 if view is None else workers.get(view.job_id, view.num_gpu)


def _resolve(keys: list, run: dict, get, used: list[int], caps: tuple, held=None, node_types: tuple = ()) -> dict:
    """Real nodes for "any node" placements: a running job keeps its GPUs when they are free and
    its size is unchanged; the others take the best-fitting node, else the emptiest nodes,
    preferring GPUs that no stopping job still ``held`` (a start there would wait); a job that
    needs a GPU type, among the nodes of that type (those first: they have fewer choices)."""
    free = [c - u for c, u in zip(caps, used)]
    out, todo = {}, []
    for key in keys:
        view = get(key)
        size = run[key][0][1]
        old = view.placement
        if view.running and holds(old, free, size):
            for n, g in old:
                free[n] -= g
            out[key] = old
            continue
        todo.append((key, size, type_mask(view.gpu_type, node_types) if view.gpu_type else None))
    todo.sort(key=lambda t: t[2] is None)  # (stable: otherwise in decision order)
    for key, size, mask in todo:
        where = any_node(size, free, held, mask)
        if where is None:  # cannot happen after the total check above; refuse rather than over-place
            raise PolicyError(f"job {key!r}: {size} GPUs do not fit in the free GPUs {free}")
        for n, g in where:
            free[n] -= g
        out[key] = where
    return out
