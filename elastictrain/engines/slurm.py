"""Slurm as an engine: a run is one Slurm job, pinned to the nodes the policy chose (of one
partition, or several: ``--slurm-partition a100,v100``).

The batch script (``script()``; ``elastictrain submit --dry-run --backend slurm`` prints it) asks
for exactly the decided nodes (``--nodelist``) and GPUs per node (``--gres=gpu:N``; unequal GPUs
per node become a heterogeneous job, one component per node), or, on a partition without GPUs
(``cpus_per_worker``), N workers' CPUs per node (``--cpus-per-task``), and ``exec srun``s one ``etrun``
agent per node that joins this coordinator with the job's id and run, so generations, shards and
checkpoints are those of every other engine. ``exec`` matters: a batch script that outlives its
step and swallows its exit code ends COMPLETED and the job's result is lost.

Stopping: ``scancel --signal=TERM`` reaches the step (etrun): its workers checkpoint and exit 75;
a hard ``scancel`` follows after the grace period. (``--full`` would also signal the batch
shell, which is srun itself here, and srun answers SIGTERM by killing the step at once: the
checkpoint would be lost.) Jobs are submitted ``--requeue``, so that an admin's ``scontrol
requeue`` and Slurm's own preemption work as Slurm users expect; when Slurm requeues a run by
itself (those, ``RequeueExit=75``, a failed node), the bridge cancels Slurm's copy and the scheduler
resumes the job from its checkpoint as a new run, on the nodes it chooses.

States come from ``squeue --json`` (kept ``MinJobAge`` seconds after the end) and, for jobs gone
from it, the job completion log (``JobCompType=jobcomp/filetxt``) or ``sacct`` where accounting
exists. Every command runs with a timeout; ``SLURM_CONF`` and the usual Slurm environment apply.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import re
import shlex
import sys
from typing import Optional

from ..errors import ConfigError, ElasticTrainError
from ..launcher.run_as import RunAsError, chown_for, resolve
from ..runtime.client import write_token_file
from ..launcher.task_command import etrun_command, task_env
from .api import ACTIVE, ENDED, REQUEUED, EngineNode, RunLaunch, RunState, check_cpus_per_worker
from .api import parse_run_name as parse_job_name
from .api import run_name as job_name

__all__ = ["SlurmAdapter", "SlurmError", "parse_gres_gpus", "parse_gres_type", "job_name", "parse_job_name"]

log = logging.getLogger(__name__)

_UP = {"idle", "mixed", "allocated", "completing", "planned"}
_DRAIN = {"draining", "drained", "drain"}
_ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "REQUEUE_HOLD",
           "REQUEUE_FED", "REQUEUED", "SIGNALING", "STAGE_OUT", "STOPPED"}
_LOST = {"NODE_FAIL", "BOOT_FAIL"}
_TIMEOUT = 30.0


class SlurmError(ElasticTrainError):
    """A Slurm command failed; the message has its output."""

    http_status = 502
    code = "slurm"


def parse_gres_gpus(gres: str) -> int:
    """GPUs in a node's GRES (``gpu:2``, ``gpu:a100:4(S:0-1)``, ``gpu:2,shard:8``); 0 without."""
    return sum(int(fields[-1]) for fields in _gpu_parts(gres) if fields[-1].isdigit())


def parse_gres_type(gres: str) -> str:
    """The GPU type a node's GRES names (``gpu:a100:4(S:0-1)``: a100); "" where it names none, or
    several (a run asks for ``gpu:N`` on a node, which could then mix them)."""
    kinds = {fields[1] if len(fields) >= 3 else "" for fields in _gpu_parts(gres)}
    return kinds.pop() if len(kinds) == 1 else ""


def _gpu_parts(gres: str):
    """The ``gpu`` entries of a GRES string, each as its fields (``gpu:a100:4(S:0-1)``: gpu, a100, 4)."""
    for part in (gres or "").split(","):
        fields = part.split("(")[0].split(":")
        if fields[0] == "gpu" and len(fields) >= 2:
            yield fields


class SlurmAdapter:
    """Slurm's ``sinfo``/``sbatch``/``squeue``/``scancel`` behind :class:`~elastictrain.engines.api.EngineAdapter`.

    Args:
        partition: the partition (its nodes are the coordinator's cluster), or several, comma-separated
            (``a100,v100``: their nodes, each once; a run goes to the first of them that holds all its
            nodes, else one component per node, each in a partition of its node).
        coordinator: the URL the compute nodes reach the coordinator at.
        state_dir: where batch scripts and outputs go (on a filesystem the nodes share).
        token_file: the token file the runs' etrun reads (shared too).
        python: the interpreter the nodes run etrun with (default: this one).
        reservation: also pin runs to this reservation.
        tag: this coordinator's id, in every job's ``--comment``: jobs of another coordinator on the
            same Slurm are never adopted, even under the same job name.
        cpus_per_worker: schedule the partition's CPUs, not its GPUs: a node offers
            ``CPUs // cpus_per_worker`` worker slots, and a run asks for that many CPUs per worker
            (``--cpus-per-task``, no GRES). 0 (the default): GPUs, from each node's ``gpu`` GRES.
        accounts: a run of a job with a project (``submit -A``) is charged to the Slurm account
            of that name (``--account``; Slurm's accounting must know it where it enforces
            associations). False: Slurm's default account of the job's user.
    """

    name = "slurm"

    def __init__(self, partition: str, coordinator: str, state_dir: str, *, token_file: Optional[str] = None,
                 python: str = sys.executable, reservation: Optional[str] = None, tag: str = "",
                 cpus_per_worker: int = 0, accounts: bool = False) -> None:
        names = (partition or "").split(",")
        if not all(re.match(r"^[A-Za-z0-9._-]{1,128}$", p) for p in names) or len(names) > 64:
            raise ConfigError(f"--slurm-partition {partition!r}: give the name of a Slurm partition, or several "
                              "comma-separated (sinfo lists them)")
        self.partitions = list(dict.fromkeys(names))
        self._part_of: dict[str, list[str]] = {}  # node -> the partitions (of ours) it is in, in our order
        self.cpus_per_worker = check_cpus_per_worker(cpus_per_worker)  # 0: the nodes' GPUs
        self.gpus_from = f"partition {partition!r} (no node has gpu GRES in sinfo -o %G)"
        self.partition, self.coordinator, self.token_file = partition, coordinator, token_file
        self.state_dir, self.python, self.reservation = os.path.abspath(state_dir), python, reservation
        self.comment = f"elastictrain:{tag}" if tag else "elastictrain"  # whose jobs these are
        self.accounts = accounts
        self._outputs: dict[str, str] = {}
        self._jobcomp: Optional[str] = None

    # ------------------------------------------------------------------ commands
    async def _cmd(self, *args: str, check: bool = True) -> str:
        try:
            proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            raise SlurmError(f"cannot run {args[0]}: {exc.strerror}; install Slurm's client commands "
                             "(Debian: apt-get install slurm-client) and set SLURM_CONF") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), _TIMEOUT)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise SlurmError(f"{' '.join(args[:3])} did not answer in {_TIMEOUT:.0f} s (is slurmctld up?)") from None
        if check and proc.returncode != 0:
            raise SlurmError(f"{' '.join(args)} exited {proc.returncode}: {err.decode(errors='replace').strip()[:500]}")
        return out.decode(errors="replace")

    # ------------------------------------------------------------------ capacity
    async def nodes(self) -> list[EngineNode]:
        out = await self._cmd("sinfo", "-h", "-N", "-p", self.partition, "-o", "%N|%G|%T|%c|%P")
        seen: dict[str, EngineNode] = {}
        per = self.cpus_per_worker
        part_of: dict[str, set] = {}
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 5:
                continue
            part_of.setdefault(parts[0], set()).add(parts[4].rstrip("*"))  # (the default partition has a *)
            if parts[0] in seen:
                continue
            name, gres, state, cpus, _ = parts
            state = state.lower()
            base = state.rstrip("*~#!%$@^-")
            drained = base in _DRAIN  # an admin's drain: its jobs go on, Slurm starts no new one there
            up = (base in _UP or drained) and not state.endswith("*")  # a trailing * (not responding) etc.
            if per:
                slots = int(cpus) // per if cpus.isdigit() else 0
                seen[name] = EngineNode(name, slots, up, state, "slot", drained)
            else:
                seen[name] = EngineNode(name, parse_gres_gpus(gres), up, state, cordoned=drained,
                                        gpu_type=parse_gres_type(gres))
        if not seen:
            raise SlurmError(f"partition {self.partition!r} has no nodes (sinfo -p {self.partition}); check the name")
        self._part_of = {n: [p for p in self.partitions if p in ps] or self.partitions[:1] for n, ps in part_of.items()}
        return [seen[n] for n in sorted(seen)]

    # ------------------------------------------------------------------ runs
    def script(self, run: RunLaunch) -> str:
        """The batch script of ``run``."""
        d = self._run_dir(run.job, run.run)
        head = ["#!/bin/bash", f"# elastictrain: job {run.job}, run {run.run} (written by the coordinator)"]
        where = [self._part_of.get(n, self.partitions[:1]) for n in run.nodes]  # each node's partitions
        shared = [p for p in self.partitions if all(p in ps for ps in where)]  # a partition holding every node
        slots = [t.slots for t in run.tasks]
        one = len(set(slots)) == 1 and bool(shared)  # one component (else one per node)
        common = [f"--job-name={job_name(run.job, run.run)}", "--requeue",
                  f"--output={d}/slurm-%j.out", "--open-mode=append", f"--chdir={run.tasks[0].workdir}",
                  f"--comment={self.comment}"]
        if self.reservation:
            common.append(f"--reservation={self.reservation}")
        if self.accounts and run.project:  # (a project's name is a checked name: no quoting needed)
            common.append(f"--account={run.project}")
        if run.tasks[0].run_as:  # the user's own account (sbatch takes --uid and --gid from root only)
            common.append(f"--uid={run.tasks[0].run_as}")
            try:  # --uid alone keeps the submitter's group (root's, for a root coordinator): the account's own
                common.append(f"--gid={pwd.getpwnam(run.tasks[0].run_as).pw_gid}")
            except KeyError:
                pass  # no such account here: launch() refuses the run before sbatch
        env = task_env(run.tasks[0], "slurm")
        for k in ("ET_TOKEN", "ET_NODE_NAME", "ET_LOG_DIR"):  # per node, below
            env.pop(k, None)
        lines = list(head)
        if one:
            lines.append(f"#SBATCH --partition={shared[0]}")
        for flag in common:
            lines.append(f"#SBATCH {flag}")
        per = self.cpus_per_worker
        if one:  # one component: the same GPUs on every node, of one partition
            lines += [f"#SBATCH --nodes={len(run.nodes)}", f"#SBATCH --nodelist={','.join(run.nodes)}",
                      "#SBATCH --ntasks-per-node=1",
                      f"#SBATCH --cpus-per-task={slots[0] * per}" if per else f"#SBATCH --gres=gpu:{slots[0]}"]
        else:  # unequal GPUs per node, or nodes of no one partition: a heterogeneous job, a component a node
            for i, (node, n) in enumerate(zip(run.nodes, slots)):
                if i:
                    lines.append("#SBATCH hetjob")
                # (each component names its partition: one left out would be Slurm's default partition)
                lines += [f"#SBATCH --partition={shared[0] if shared else where[i][0]}", "#SBATCH --nodes=1",
                          f"#SBATCH --nodelist={node}", "#SBATCH --ntasks-per-node=1",
                          f"#SBATCH --cpus-per-task={n * per}" if per else f"#SBATCH --gres=gpu:{n}"]
        for k in sorted(env):
            lines.append(f"export {k}={shlex.quote(env[k])}")
        lines.append("unset ET_TOKEN")
        # each node's etrun gets its own log and state directory and its node's name; bash execs it,
        # so srun's signals reach etrun itself
        wrap = ["/bin/bash", "-c", 'export ET_LOG_DIR="$0" ET_NODE_NAME="${SLURMD_NODENAME:-slurm}"; exec "$@"']
        # the run's own worker credential (written beside the script at launch); an old-style run
        # without one reads the coordinator's token file
        token_file = os.path.join(d, "token") if run.tasks[0].token else self.token_file
        if one:
            cmd = etrun_command(run.tasks[0], self.coordinator, log_dir=None, token_file=token_file,
                                python=self.python)
            lines.append("exec srun --kill-on-bad-exit=0 " + shlex.join(wrap[:2]) + " "
                         + shlex.quote(wrap[2].replace('"$0"', '"$0/node${SLURM_NODEID:-0}"')) + " "
                         + shlex.join([d, *cmd]))
        else:
            parts = []
            for i, t in enumerate(run.tasks):
                cmd = etrun_command(t, self.coordinator, log_dir=None, token_file=token_file, python=self.python)
                parts.append(f"--het-group={i} " + shlex.join([*wrap, f"{d}/node{i}", *cmd]))
            lines.append("exec srun --kill-on-bad-exit=0 " + " : ".join(parts))
        return "\n".join(lines) + "\n"

    def _run_dir(self, job: str, run: int) -> str:
        return os.path.join(self.state_dir, "slurm", job, f"run{run}")

    async def launch(self, run: RunLaunch) -> str:
        d = self._run_dir(run.job, run.run)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "job.sh")
        t = run.tasks[0]
        try:  # the node daemons' rules, checked here (Slurm needs the same accounts on every host)
            acct, refused = resolve(t.run_as, t.allow_root, "the coordinator's host"), None
        except RunAsError as exc:
            acct, refused = None, str(exc)
        with open(path, "w") as f:
            f.write(self.script(run) if refused is None else
                    f"#!/bin/bash\n#SBATCH --partition={self.partitions[0]}\n#SBATCH --output={d}/slurm-%j.out\n"
                    f"#SBATCH --comment={self.comment}\n#SBATCH --job-name={job_name(run.job, run.run)}\n"
                    f"echo {shlex.quote('refused: ' + refused)}\nexit 126\n")
        if t.token:
            write_token_file(os.path.join(d, "token"), t.token)
        if acct is not None:  # the run's account writes its output here and reads its credential
            for p in (d, os.path.join(d, "token")):
                if os.path.exists(p):
                    chown_for(p, acct)
        out = await self._cmd("sbatch", "--parsable", path)
        handle = out.strip().split(";")[0]
        if not handle.isdigit():
            raise SlurmError(f"sbatch answered {out.strip()[:200]!r}, not a job id")
        self._outputs[handle] = os.path.join(d, f"slurm-{handle}.out")
        return handle

    async def withdraw(self, handle: str) -> None:
        # the step only (etrun gets SIGTERM; with --full srun, the batch shell, would kill the step at once)
        await self._cmd("scancel", "--signal=TERM", handle, check=False)

    async def kill(self, handle: str) -> None:
        await self._cmd("scancel", handle, check=False)

    def output(self, handle: str) -> Optional[str]:
        return self._outputs.get(handle)

    async def runs(self, handles: dict[str, tuple[str, int]]) -> list[RunState]:
        out = await self._cmd("squeue", "--json")
        try:
            jobs = json.loads(out).get("jobs", [])
        except ValueError as exc:
            raise SlurmError(f"squeue --json printed no JSON ({exc}); Slurm 21.08 or newer is needed") from None
        states: dict[str, RunState] = {}
        for j in jobs:
            key = parse_job_name(j.get("name", ""))
            handle = str(j.get("job_id", ""))
            if key is None or (handle not in handles and j.get("comment") != self.comment):
                continue
            if handle not in handles and j.get("het_job_offset", 0):
                continue  # a heterogeneous job's later component: its leader speaks for it
            state = str(j.get("job_state", "")).upper()
            raw = int(j.get("exit_code") or 0)
            code = (raw >> 8) & 0xFF if raw & 0x7F == 0 else 128 + (raw & 0x7F)
            d = self._run_dir(*key)
            self._outputs.setdefault(handle, os.path.join(d, f"slurm-{handle}.out"))
            nodes = _expand(j.get("nodes", ""))
            if int(j.get("restart_cnt") or 0) > 0 and state in _ACTIVE:
                last = await self._jobcomp_code(handle)
                states[handle] = RunState(handle, *key, REQUEUED, detail=f"restart {j.get('restart_cnt')}, "
                                          f"last exit {last}, reason {j.get('state_reason')}", nodes=nodes)
            elif state in _ACTIVE:
                states[handle] = RunState(handle, *key, ACTIVE, nodes=nodes)
            else:
                lost = state in _LOST or state == "PREEMPTED"
                said = _output_tail(self._outputs[handle]) if code and state == "FAILED" else ""
                states[handle] = RunState(handle, *key, ENDED, code=code if state != "CANCELLED" or raw else None,
                                          detail=f"Slurm job {handle} {state.lower()} (exit {code}, "
                                          f"{j.get('state_reason')})" + (f"; its output ends: {said}" if said else ""),
                                          cancelled=state == "CANCELLED", lost=lost, nodes=nodes)
        for handle, key in handles.items():
            if handle not in states:  # gone from squeue (older than MinJobAge): the completion log says
                code = await self._jobcomp_code(handle)
                states[handle] = RunState(handle, *key, ENDED, code=code,
                                          detail=f"Slurm job {handle} ended (exit {code}, from the completion log)")
        return list(states.values())

    async def _jobcomp_code(self, handle: str) -> Optional[int]:
        """The exit code of the job's last end in the completion log (or sacct), None if unknown."""
        if self._jobcomp is None:
            try:
                conf = await self._cmd("scontrol", "show", "config")
                m = re.search(r"^JobCompLoc\s*=\s*(\S+)", conf, re.M)
                self._jobcomp = m.group(1) if m else ""
            except SlurmError:
                self._jobcomp = ""
        if self._jobcomp and os.path.isfile(self._jobcomp):
            code = None
            try:
                with open(self._jobcomp, errors="replace") as f:
                    for line in f:
                        if line.startswith(f"JobId={handle} "):
                            m = re.search(r"\bExitCode=(\d+):(\d+)", line)
                            if m:
                                code = int(m.group(1)) if m.group(2) == "0" else 128 + int(m.group(2))
            except OSError:
                pass
            if code is not None:
                return code
        try:
            out = await self._cmd("sacct", "-n", "-X", "-P", "-j", handle, "-o", "ExitCode", check=False)
            m = re.match(r"\s*(\d+):(\d+)", out)
            if m:
                return int(m.group(1)) if m.group(2) == "0" else 128 + int(m.group(2))
        except SlurmError:
            pass
        return None


def _output_tail(path: str, limit: int = 2048) -> str:
    """The last lines of a run's output file (at most ``limit`` bytes): why a batch script failed
    before etrun could say (the node daemons report their tasks' output tail the same way)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            data = f.read(limit)
    except OSError:
        return ""
    return "\n".join(line for line in data.decode(errors="replace").splitlines()[-6:] if line.strip())


def _expand(nodes: str) -> list[str]:
    """``n[1-3],m1`` into names (the simple forms Slurm prints)."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", nodes or ""):
        base, ranges = m.group(1), m.group(2)
        if not ranges:
            out.append(base)
            continue
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if hi:
                width = len(lo)
                out += [f"{base}{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
            else:
                out.append(base + lo)
    return out
