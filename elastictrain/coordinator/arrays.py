"""Job arrays in cluster mode (Slurm's ``--array``): one submission, many tasks.

``elastictrain submit --array 0-7%2 -- sweep.py`` queues jobs ``ID_0`` .. ``ID_7`` (names
``NAME_0`` ..), each with ``ET_ARRAY_JOB_ID``, ``ET_ARRAY_TASK_ID`` and ``ET_ARRAY_TASK_COUNT``
in its environment; ``%2`` admits at most two of them at once (the coordinator's admission gate,
as for quotas). ``cancel ID`` and ``--after ID`` take the whole array.
"""

from __future__ import annotations

from ..errors import ConfigError

__all__ = ["parse_array", "MAX_ARRAY"]


MAX_ARRAY = 1000  # tasks in one job array (Slurm's MaxArraySize is 1001 by default)


def parse_array(spec: str) -> tuple[list[int], int]:
    """A job array's task indices and its ``%N`` limit (0: none), from Slurm's ``--array`` syntax:
    ``0-7``, ``1,3,5``, ``0-15:2``, ``1-3,8%2``.

    Raises:
        ConfigError: a malformed spec, an index outside [0, 1000000], more than :data:`MAX_ARRAY`
        tasks, or a limit below 1.
    """
    body, _, limit = spec.partition("%")
    fix = "write --array as Slurm does: 0-7, 1,3,5, 0-15:2, and %N for at most N at once (e.g. 0-99%8)"
    out: list[int] = []
    try:
        most = int(limit) if limit else 0
        ranges = []
        for part in body.split(","):
            rng, _, step = part.partition(":")
            lo, _, hi = rng.partition("-")
            ranges.append((int(lo), int(hi) if hi else int(lo), int(step) if step else 1))
    except ValueError:
        raise ConfigError(f"--array {spec!r} is not understood: {fix}") from None
    if (limit and most < 1) or not all(0 <= a <= b <= 1_000_000 and s >= 1 for a, b, s in ranges):
        raise ConfigError(f"--array {spec!r} is not understood: {fix}")
    for a, b, s in ranges:
        if len(out) + (b - a) // s + 1 > MAX_ARRAY:
            raise ConfigError(f"--array {spec!r}: more than {MAX_ARRAY} tasks; split it into several arrays")
        out.extend(range(a, b + 1, s))
    return sorted(set(out)), most
