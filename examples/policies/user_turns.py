"""A complete scheduling policy in 40 lines, the one docs/policies.md walks through.

Users take turns: whenever GPUs are free, the next job to start is the oldest waiting job of the
user who holds the fewest GPUs right now. A job that runs keeps its GPUs until it ends (no
preemption), so the policy never costs a job a restart.

Run it in the simulator and on a live cluster by its path, ``user_turns:UserTurns`` (from this
directory, or with it on PYTHONPATH)::

    elastictrain simulate --trace t.csv --cluster n2g4 --policy user_turns:UserTurns
    elastictrain coordinator --policy user_turns:UserTurns ...
"""

from __future__ import annotations

from elastictrain.policies.api import ClusterSnapshot, Decision
from elastictrain.policies.placement import make_placer


class UserTurns:
    name = "user-turns"

    def __init__(self, placement: str = "consolidated") -> None:
        self.placement = placement  # (any keyword argument becomes an option of the policy)

    def decide(self, s: ClusterSnapshot) -> Decision:
        placer = make_placer(s, self.placement, sticky=True)  # sticky: a running job keeps its GPUs
        run, held = {}, {}
        for j in s.running:  # the jobs that run go on where they are
            run[j.job_id] = placer.place(j.num_gpu, j.skew, j.placement)
            held[j.user] = held.get(j.user, 0) + j.num_gpu
        waiting = [j for j in s.jobs if not j.running]  # (s.jobs is in arrival order)
        while waiting and placer.total_free > 0:
            j = min(waiting, key=lambda j: held.get(j.user, 0))  # the first waiting job of the user holding least
            waiting.remove(j)
            where = placer.place(j.num_gpu, j.skew)
            if where is not None:  # (a job that does not fit waits; a smaller one may go first)
                run[j.job_id] = where
                held[j.user] = held.get(j.user, 0) + j.num_gpu
        return Decision(run)
