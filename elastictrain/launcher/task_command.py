"""The ``etrun`` command line and environment of one task (one run of a job on one node).

Every engine runs the same ``etrun`` joining the same coordinator (the node daemons start it as a
child process; Slurm runs it as the step of a batch job), so shards, generations and checkpoints
never change with the engine. This module is the one place that command is built.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

from ..wire import Task

__all__ = ["etrun_command", "task_env", "group_command"]


def group_command(spec: Task) -> list[str]:
    """``--group a.py ARGS : b.py ARGS`` for a group task; each script's path is made absolute
    from its own job's working directory (the group runs in the first member's)."""
    out = ["--group"]
    for i, m in enumerate(spec.group):
        if i:
            out.append(":")
        script = m.command[0] if os.path.isabs(m.command[0]) else os.path.join(m.workdir, m.command[0])
        out += [script, *m.command[1:]]
    return out


def etrun_command(spec: Task, coordinator: str, *, log_dir: Optional[str], slots: Optional[int] = None,
                  token_file: Optional[str] = None, warm_spares: int = -1, memory_enforce: Optional[str] = None,
                  python: str = sys.executable, zygote: Optional[str] = None) -> list[str]:
    """The ``etrun`` agent of ``spec`` on one node (``slots``: its local workers, default the task's;
    ``log_dir`` None: etrun takes ``ET_LOG_DIR``, which an engine sets per node)."""
    cmd = [python, "-u", "-m", "elastictrain.launcher.cli", "--nnodes", f"{spec.nnodes}:{spec.nnodes}",
           "--nproc-per-node", str(spec.slots if slots is None else slots), "--rdzv-id", spec.job,
           "--coordinator", coordinator, "--max-restarts", str(spec.max_restarts), "--shutdown-grace",
           str(spec.grace), *(("--log-dir", log_dir) if log_dir else ()), "--tee", "3", "--rdzv-conf",
           f"run={spec.run}"]
    if token_file:
        cmd += ["--token-file", os.path.abspath(token_file)]
    if warm_spares >= 0:
        cmd += ["--warm-spares", str(warm_spares)]
    if zygote:
        cmd += ["--zygote", zygote]
    if spec.memory_limit and memory_enforce:  # a resource plan's limit: etrun doubles it after an OOM
        cmd += ["--memory-limit", str(spec.memory_limit), "--memory-enforce", memory_enforce]
    if spec.group:  # an interleaving group: every member's script in one process per rank
        cmd += group_command(spec)
    else:
        if spec.module:
            cmd.append("--module")
        cmd += list(spec.command)
    return cmd


def task_env(spec: Task, node_name: str) -> dict[str, str]:
    """The variables a task adds to its engine's environment (the job's own, and ours)."""
    env = dict(spec.env)
    if spec.group:
        env["ET_GROUP_MEMBERS"] = json.dumps([{"job": m.job, "run": m.run, "reason": m.reason} for m in spec.group])
    env.update({"ET_NODE_NAME": node_name, "PYTHONUNBUFFERED": "1",
                "ET_LOG_LEVEL": spec.env.get("ET_LOG_LEVEL") or os.environ.get("ET_LOG_LEVEL", "info")})
    return env
