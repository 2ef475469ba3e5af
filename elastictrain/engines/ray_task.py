"""What runs inside a Ray actor: one run's ``etrun`` on one node, as the node daemons start it.

The Ray engine (:mod:`.ray_engine`) places one actor of :class:`RunProcess` per node of a run, in
the run's placement group. The actor starts ``etrun`` as a child process in a session of its own
(the same command, environment and account rules as a node daemon's task: one place builds them,
:mod:`~elastictrain.launcher.task_command`), keeps its output in a file on its node, and answers
the coordinator's calls: ``poll`` (the exit status, or None while it runs, and new output from an
offset, so the coordinator needs no filesystem shared with the nodes) and ``signal`` (SIGTERM to
``etrun`` to stop it with a checkpoint, SIGKILL to its whole session).

The child has PR_SET_PDEATHSIG=SIGTERM: if the actor dies (its node's raylet is gone, or
``ray.kill``), ``etrun`` still gets its chance to checkpoint rather than living on unowned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from typing import Optional

__all__ = ["RunProcess"]

_MAX_READ = 256 * 1024


class RunProcess:
    """``etrun`` for ``task`` (a :class:`~elastictrain.wire.Task` as JSON bytes) on this node."""

    def __init__(self, task_json: bytes, coordinator: str, node: str) -> None:
        import msgspec

        from ..launcher.parent_death import set_pdeathsig
        from ..launcher.run_as import RunAsError, chown_for, resolve, task_base_env
        from ..launcher.task_command import etrun_command, task_env
        from ..runtime.client import write_token_file
        from ..wire import Task

        spec = msgspec.json.decode(task_json, type=Task)
        self.code: Optional[int] = None
        self.detail = ""
        self.proc: Optional[subprocess.Popen] = None
        base = os.path.join(tempfile.gettempdir(), "elastictrain-ray", spec.job)
        os.makedirs(base, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix=f"run{spec.run}-", dir=base)
        self.log = os.path.join(self.dir, "etrun.log")
        open(self.log, "ab").close()
        try:
            acct = resolve(spec.run_as, spec.allow_root, node)
        except RunAsError as exc:
            self._refused(126, f"refused: {exc}")
            return
        token_file = None
        if spec.token:  # the run's own credential, readable by its account alone
            token_file = os.path.join(self.dir, "token")
            write_token_file(token_file, spec.token)
        for path in (self.dir, *((token_file,) if token_file else ())):
            chown_for(path, acct)
        cmd = etrun_command(spec, coordinator, log_dir=self.dir, token_file=token_file, python=sys.executable)
        env = task_base_env(acct)
        env.update(task_env(spec, node))
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:  # the GPUs Ray gave this actor
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        switch = {"user": acct.uid, "group": acct.gid, "extra_groups": list(acct.groups)} if acct.switch else {}
        workdir = spec.workdir

        def as_task() -> None:  # in the child, after the switch to the task's account
            os.chdir(workdir)
            set_pdeathsig()

        out = open(self.log, "ab")
        try:
            self.proc = subprocess.Popen(cmd, cwd="/", env=env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=as_task,
                                         **switch)
        except (OSError, subprocess.SubprocessError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "it does not exist or the account may not enter it"
            self._refused(127, f"cannot start the job as {acct.name} in {workdir}: {why}")
        finally:
            out.close()

    def _refused(self, code: int, detail: str) -> None:
        self.code, self.detail = code, detail
        with open(self.log, "ab") as f:
            f.write((detail + "\n").encode())

    def poll(self, offset: int) -> tuple:
        """``(exit status or None while running, detail, output from offset, the node's Ray id)``;
        a status of 128+N is death by signal N."""
        if self.proc is not None and self.code is None:
            rc = self.proc.poll()
            if rc is not None:
                self.code = rc if rc >= 0 else 128 - rc
                self.detail = f"etrun exited {self.code}"
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, int(offset)))
                data = f.read(_MAX_READ)
        except OSError:
            data = b""
        import ray

        return self.code, self.detail, data, ray.get_runtime_context().get_node_id()

    def signal(self, sig: int, group: bool) -> None:
        """``sig`` to ``etrun`` (it forwards SIGTERM to its workers), or to its whole session."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """Before the actor is killed: nothing of the run may outlive it."""
        self.signal(signal.SIGKILL, True)
