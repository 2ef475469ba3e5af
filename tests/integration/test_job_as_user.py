"""A job runs as its user's UNIX account, with only what that account may touch: a real node
daemon started as root runs alice's job as alice (a file only root may read stays unread; bob's
job cannot read alice's output), refuses root and a working directory the account may not
enter, and the coordinator refuses loader variables and etrun's own flags at submit.

Needs root and useradd (CI has both); skips with the reason otherwise."""

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from elastictrain import CoordinatorClient
from elastictrain.errors import ConfigError
from elastictrain.launcher.local_cluster import LocalCluster
from elastictrain.wire import JobSubmit

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                reason="needs root and useradd to make UNIX accounts for alice and bob")

PROBE = """
import json, os, sys
out = {"uid": os.getuid(), "gid": os.getgid(), "home": os.environ.get("HOME"),
       "env": sorted(os.environ), "token_file": os.environ.get("ET_TOKEN_FILE")}
for name, path in (("secret", sys.argv[1]), ("other", sys.argv[2])):
    try:
        with open(path) as f:
            out[name] = "read: " + f.read()[:20]
    except OSError as exc:
        out[name] = type(exc).__name__
with open("probe.json", "w") as f:
    json.dump(out, f)
print("probed as", os.getuid(), flush=True)
"""


def _python_for_others(base: str) -> str:
    """An interpreter other accounts may run, with this one's packages: this one where every
    directory above it is open to others, else Debian's python3.X beside a pyvenv.cfg whose
    site-packages point at this venv's (same minor version: the same compiled extensions)."""
    real = os.path.realpath(sys.executable)
    if _open_to_others(real):
        return sys.executable
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = f"/usr/bin/{ver}"
    if not os.path.exists(system):
        pytest.skip(f"{real} is not open to other accounts and there is no {system} to use instead")
    import site
    import sysconfig

    shim = os.path.join(base, "py")
    os.makedirs(os.path.join(shim, "bin"))
    os.symlink(system, os.path.join(shim, "bin", "python"))
    with open(os.path.join(shim, "pyvenv.cfg"), "w") as f:
        f.write(f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {sys.version.split()[0]}\n")
    sp = os.path.join(shim, "lib", ver, "site-packages")
    os.makedirs(sp)
    dirs = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    with open(os.path.join(sp, "et.pth"), "w") as f:  # addsitedir: their own .pth files (the editable install) too
        f.write("import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dict.fromkeys(dirs)) + "\n")
    return os.path.join(shim, "bin", "python")


def _open_to_others(path: str) -> bool:
    d = path
    while d != "/":
        d = os.path.dirname(d)
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(path).st_mode & stat.S_IXOTH)


@pytest.fixture
def accounts():
    tag = f"{os.getpid() % 100000}"
    names = {"alice": f"eta{tag}", "bob": f"etb{tag}"}
    base = tempfile.mkdtemp(prefix="et-asuser-")
    os.chmod(base, 0o755)
    made = []
    try:
        for who, name in names.items():
            home = os.path.join(base, f"home-{who}")
            r = subprocess.run(["useradd", "-m", "-d", home, "-s", "/bin/sh", name], capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"useradd {name} failed: {r.stderr.strip()}")
            made.append(name)
        yield base, names
    finally:
        for name in made:
            subprocess.run(["userdel", "-r", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _workdir(base: str, account: str) -> str:
    d = os.path.join(base, f"work-{account}")
    os.makedirs(d)
    pw = pwd.getpwnam(account)
    with open(os.path.join(d, "probe.py"), "w") as f:
        f.write(PROBE)
    for p in (d, os.path.join(d, "probe.py")):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    os.chmod(d, 0o700)  # alice's alone
    return d


def _secret(base: str) -> str:
    secret = os.path.join(base, "root-only")
    with open(secret, "w") as f:
        f.write("TOP-SECRET")
    os.chmod(secret, 0o600)
    os.makedirs(os.path.join(base, "cluster"))
    return secret


def _probes(c, base: str, names: dict, secret: str, root_workdir: bool) -> tuple:
    """alice's and bob's probe jobs and mallory's (mapped to root without leave; ``root_workdir``:
    also alice's in /root, which she may not enter), run to their ends on cluster ``c``, with the
    checks every engine shares. Returns the jobs by id, their ids, alice's probe, the users'
    clients and alice's working directory."""
    admin = c.client
    tok = {who: admin.add_user(who, name).token for who, name in names.items()}
    tok["mallory"] = admin.add_user("mallory", "root").token
    users = {who: CoordinatorClient(c.coordinator.url, t, timeout=10.0, retry_for=10.0) for who, t in tok.items()}
    wa, wb = _workdir(base, names["alice"]), _workdir(base, names["bob"])
    ids = {"alice": users["alice"].submit(JobSubmit(["probe.py", secret, "/dev/null"], wa, max_restarts=0)).id}
    c.wait(lambda st: next(j for j in st.jobs if j.id == ids["alice"]).status in ("finished", "failed"), 120,
           "alice's job")
    ids["bob"] = users["bob"].submit(JobSubmit(["probe.py", secret, os.path.join(wa, "probe.json")], wb,
                                               max_restarts=0)).id
    if root_workdir:  # refused when it starts
        ids["root_workdir"] = users["alice"].submit(JobSubmit(["probe.py", secret, secret], "/root",
                                                              max_restarts=0)).id
    ids["mallory"] = users["mallory"].submit(JobSubmit(["probe.py", secret, secret], wa, max_restarts=0)).id
    by = {j.id: j for j in c.wait_all(len(ids), 120).jobs}
    assert by[ids["alice"]].status == "finished" and by[ids["bob"]].status == "finished", (by, c.tail())
    with open(os.path.join(wa, "probe.json")) as f:
        a = json.load(f)
    with open(os.path.join(wb, "probe.json")) as f:
        b = json.load(f)
    alice, bob = pwd.getpwnam(names["alice"]), pwd.getpwnam(names["bob"])
    assert (a["uid"], a["gid"]) == (alice.pw_uid, alice.pw_gid) and (b["uid"], b["gid"]) == (bob.pw_uid, bob.pw_gid)
    assert a["secret"] == "PermissionError" and b["secret"] == "PermissionError"
    assert b["other"] == "PermissionError"  # bob cannot read alice's output
    token_file = a["token_file"]
    assert token_file.endswith("/token") and os.stat(token_file).st_uid == alice.pw_uid
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    mallory = by[ids["mallory"]]
    assert mallory.status == "failed" and "would run as root" in mallory.reason, mallory
    return by, ids, a, users, wa


def test_jobs_run_as_their_users_and_touch_only_what_those_may(accounts):
    base, names = accounts
    py = _python_for_others(base)
    secret = _secret(base)
    with LocalCluster(os.path.join(base, "cluster"), "fifo", nodes=1, slots=2, node_credentials=True,
                      python=py) as c:
        by, ids, a, users, wa = _probes(c, base, names, secret, root_workdir=True)
        assert a["home"] == pwd.getpwnam(names["alice"]).pw_dir
        assert "LD_PRELOAD" not in a["env"] and "PYTHONPATH" not in a["env"]
        jr = by[ids["root_workdir"]]
        assert jr.status == "failed" and "cannot start the job as" in jr.reason, jr
        # refused at submit, with the rule: loader variables, etrun's own flags, a lone ':'
        refusals = [
            (JobSubmit(["probe.py"], wa, env={"LD_PRELOAD": "/tmp/x.so"}), "LD_"),
            (JobSubmit(["probe.py"], wa, env={"PYTHONPATH": "/tmp"}), "PYTHONPATH"),
            (JobSubmit(["probe.py"], wa, env={"MY_SECRET_HOOK": "1"}), "allow list"),
            (JobSubmit(["--no-python", "/bin/sh", "-c", "id"], wa), "must start with the script"),
            (JobSubmit(["--log-dir", "/etc", "probe.py"], wa), "must start with the script"),
            (JobSubmit(["probe.py", ":", "/bin/sh"], wa), "lone ':'"),
        ]
        for req, why in refusals:
            with pytest.raises(ConfigError, match=why):
                users["alice"].submit(req)
        assert len(c.client.cluster_jobs().jobs) == 4  # nothing was queued
        for u in users.values():
            u.close()


def test_through_slurm_a_job_runs_as_its_user_via_sbatch_uid(accounts, slurm):
    """The same rules through a real Slurm (`--backend slurm`): alice's batch job is submitted with
    `sbatch --uid` and `--gid`, so slurmstepd runs her script as her account and group; bob's job
    cannot read her output; root without leave is refused before sbatch, with the reason."""
    base, names = accounts
    py = _python_for_others(base)
    secret = _secret(base)
    with LocalCluster(os.path.join(base, "cluster"), "fifo", slurm_conf=slurm.conf, python=py) as c:
        by, ids, a, users, wa = _probes(c, base, names, secret, root_workdir=False)
        with open(os.path.join(c.tmp, "slurm-runs", "coordinator-id")) as f:  # (job ids repeat across tests)
            ours = "elastictrain:" + f.read().strip()
        rows = [line.split("|") for line in slurm.run("squeue", "--states=all", "--noheader",
                                                      "--format=%j|%u|%k").splitlines()]
        ja = ids["alice"]
        assert [names["alice"]] == sorted({u for j, u, k in rows if j.startswith(f"et.{ja}.") and k == ours}), rows
        for u in users.values():
            u.close()
