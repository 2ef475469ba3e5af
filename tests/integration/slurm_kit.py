"""A real Slurm on this host for the tests: a private munged, slurmctld and three slurmd (nodes n1
and n2, 2 fake GPUs each, of GRES types a100 and v100, partitions ``low`` and ``high``; n3, 4 CPUs and no GPU, partition
``cpu``), started in about 2 s, stopped by PID.

Needs root and Debian's ``slurmctld slurmd slurm-client munge`` (``make test`` installs them
where it can). Settings that matter, learnt on these machines: ``cred_expire=10`` in AuthInfo (a
requeued job may start again 10 s later, not 120 s), ``RequeueExit=75`` (etrun's preempted code:
Slurm requeues such a run by itself, and the engine cancels that copy), fake GPUs as character
devices named in gres.conf, ``jobcomp/filetxt`` (no slurmdbd here), and
``ProctrackType=proctrack/linuxproc``: no cgroups here, and with ``proctrack/pgid`` the batch step's
slurmstepd polls for the script's process group to empty with a sleep of 1 s, then 2 s, so every
job ended 3 s after its script exited (seen in slurmd's log; srun itself exits within 15 ms of its
task). Real clusters use ``proctrack/cgroup``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

CONF = """ClusterName=et
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket,cred_expire=10
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/log/jobcomp.txt
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
MinJobAge=300
KillWait=10
SlurmdTimeout=10
InactiveLimit=0
MessageTimeout=10
NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={p1} CPUs=8 RealMemory=4000 Gres=gpu:a100:2 State=UNKNOWN
NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={p2} CPUs=8 RealMemory=4000 Gres=gpu:v100:2 State=UNKNOWN
NodeName=n3 NodeHostname={host} NodeAddr=127.0.0.1 Port={p3} CPUs=4 RealMemory=4000 State=UNKNOWN
PartitionName=low Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP PriorityTier=1 OverSubscribe=NO GraceTime=5
PartitionName=high Nodes=n[1-2] MaxTime=INFINITE State=UP PriorityTier=10 OverSubscribe=NO
PartitionName=one Nodes=n1 MaxTime=INFINITE State=UP PriorityTier=1 OverSubscribe=NO
PartitionName=two Nodes=n2 MaxTime=INFINITE State=UP PriorityTier=1 OverSubscribe=NO
PartitionName=cpu Nodes=n3 MaxTime=INFINITE State=UP PriorityTier=1 OverSubscribe=NO
RequeueExit=75
SlurmdParameters=config_overrides
SchedulerParameters=sched_interval=2,bf_interval=2
"""

NEEDED = ("slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel", "munged")
NODES = ("n1", "n2", "n3")


def missing() -> str:
    """Why a real Slurm cannot be started here ("" if it can)."""
    if os.geteuid() != 0:
        return "the Slurm tests need root (slurmd runs jobs as their users)"
    lacking = [c for c in NEEDED if shutil.which(c) is None and not os.path.exists(f"/usr/sbin/{c}")]
    if lacking:
        return (f"Slurm is not installed ({', '.join(lacking)} missing): "
                "apt-get install -y slurmctld slurmd slurm-client munge, or `make slurm`")
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_free_ports() -> tuple[int, int]:
    for _ in range(100):
        p = _free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p, p + 1
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


class SlurmKit:
    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.conf = os.path.join(self.root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def start(self, timeout: float = 30.0) -> "SlurmKit":
        r = self.root
        for d in ("munge", "state", "spool/n1", "spool/n2", "spool/n3", "run", "log", "fakegpu"):
            os.makedirs(os.path.join(r, d), exist_ok=True)
        for i in range(4):
            dev = os.path.join(r, "fakegpu", f"gpu{i}")
            if not os.path.exists(dev):
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # a character device, like /dev/null
        p1, p2 = _two_free_ports()
        with open(self.conf, "w") as f:
            f.write(CONF.format(root=r, ctld=_free_port(), p1=p1, p2=p2, p3=_free_port(), host=socket.gethostname()))
        with open(os.path.join(r, "gres.conf"), "w") as f:
            f.write(f"AutoDetect=off\nNodeName=n1 Name=gpu Type=a100 File={r}/fakegpu/gpu[0-1]\n"
                    f"NodeName=n2 Name=gpu Type=v100 File={r}/fakegpu/gpu[2-3]\n")
        munge = os.path.join(r, "munge")
        shutil.chown(munge, "munge", "munge")
        os.chmod(munge, 0o711)
        key = os.path.join(munge, "munge.key")
        if not os.path.exists(key):
            with open(key, "wb") as f:
                f.write(os.urandom(1024))
            shutil.chown(key, "munge", "munge")
            os.chmod(key, 0o400)
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged", f"--socket={munge}/munge.socket",
                        f"--key-file={key}", f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/munged.seed",
                        f"--log-file={munge}/munged.log"], check=True, timeout=30)
        deadline = time.monotonic() + timeout
        while not os.path.exists(os.path.join(munge, "munge.socket")):
            if time.monotonic() > deadline:
                raise RuntimeError("munged did not start")
            time.sleep(0.05)
        subprocess.run(["/usr/sbin/slurmctld", "-f", self.conf], check=True, env=self.env, timeout=30)
        for n in NODES:
            subprocess.run(["/usr/sbin/slurmd", "-f", self.conf, "-N", n], check=True, env=self.env, timeout=30)
        while True:
            st = self.node_states()
            if all(st.get(n) == "idle" for n in NODES):
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm did not come up: {st} (logs in {r}/log)")
            time.sleep(0.2)

    def run(self, *args: str, check: bool = True) -> str:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=30,
                              check=check).stdout

    def node_states(self) -> dict:
        try:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        except subprocess.TimeoutExpired:
            return {}
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def start_slurmd(self, node: str, timeout: float = 120.0) -> None:
        """Start ``node``'s slurmd again and wait until Slurm has it back (a job that was running
        there when its slurmd died is cleaned up first: the node stays 'completing' a while)."""
        subprocess.run(["/usr/sbin/slurmd", "-f", self.conf, "-N", node], check=True, env=self.env, timeout=30)
        deadline = time.monotonic() + timeout
        while self.node_states().get(node) not in ("idle", "mixed", "allocated"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurmd {node} did not come back: {self.node_states()}")
            if self.node_states().get(node, "").startswith("down"):
                self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
            time.sleep(0.5)

    def slurmd_pid(self, node: str) -> int:
        with open(os.path.join(self.root, "run", f"slurmd-{node}.pid")) as f:
            return int(f.read())

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "--signal=KILL", "-u", "root"], env=self.env, capture_output=True,
                       timeout=30, check=False)
        pids = []
        for name in (*(f"run/slurmd-{n}.pid" for n in NODES), "run/slurmctld.pid", "munge/munged.pid"):
            path = os.path.join(self.root, name)
            try:
                with open(path) as f:
                    pids.append(int(f.read()))
            except (OSError, ValueError):
                continue
        for pid in pids:  # all at once: each takes about 2 s to wind down
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5.0
        for pid in pids:
            try:
                while time.monotonic() < deadline:
                    os.kill(pid, 0)
                    time.sleep(0.05)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._sweep()

    def _sweep(self) -> None:
        """Kill what is left of this Slurm: step daemons (slurmstepd outlives a killed slurmd) and
        anything they started, known by the SLURM_CONF they inherited from our daemons."""
        mark = f"SLURM_CONF={self.conf}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        os.kill(int(entry), signal.SIGKILL)
            except (OSError, ValueError):
                pass
