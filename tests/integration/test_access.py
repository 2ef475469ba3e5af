"""Who may do what, on a real coordinator process: every route of the allow/deny table
(access.ACCESS) tried with every credential (admin, alice, bob, node n1, a worker of alice's
job), then the cases the table alone cannot show: bob cancelling alice's job, a worker of one
job leasing another's shards, a worker credential after its run ended, a node credential
submitting, a user submitting for another, what a user sees of another's jobs, revocation,
tokens stored only as digests, and an old database and token file working as before."""

import json
import os
import sqlite3

import msgspec
import pytest
import requests

from elastictrain import CoordinatorClient, DatasetSpec
from elastictrain.coordinator.access import ACCESS, ROLES, access_table_markdown
from elastictrain.coordinator.process import CoordinatorProcess
from elastictrain.errors import AuthError, ConfigError, ForbiddenError
from elastictrain.wire import JobSubmit, LogChunk, NodePoll, NodeRegister, TaskState

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def world(tmp_path):
    """A coordinator running FIFO; alice and bob (users), node n1's credential, one job of each
    user placed on n1 (played by this test over the node protocol), and the worker credential of
    alice's run."""
    proc = CoordinatorProcess(str(tmp_path / "coord.db"), str(tmp_path / "token"),
                              log_file=str(tmp_path / "coordinator.log"),
                              extra_args=("--policy", "fifo", "--interval", "0.2"))
    proc.start()
    admin = CoordinatorClient(proc.url, proc.token, timeout=5.0, retry_for=5.0)
    w = {"proc": proc, "url": proc.url, "tokens": {"admin": proc.token}}
    w["tokens"]["alice"] = admin.add_user("alice").token
    w["tokens"]["bob"] = admin.add_user("bob", "bob").token
    w["tokens"]["node"] = admin.add_node("n1").token
    c = {k: CoordinatorClient(proc.url, t, timeout=5.0, retry_for=2.0) for k, t in w["tokens"].items()}
    c["node"].node_register("n1", NodeRegister(4, "i1", "slot", "cpu", "h1"))
    a = c["alice"].submit(JobSubmit(["train.py", "--x"], str(tmp_path), name="a-job", gpus=1)).id
    b = c["bob"].submit(JobSubmit(["secret.py", "--key", "hunter2"], str(tmp_path), name="b-job", gpus=1)).id
    tasks = {}
    for _ in range(100):
        tasks = {t.job: t for t in c["node"].node_poll("n1", NodePoll("i1", [], [], 0.0)).tasks}
        if a in tasks and b in tasks:
            break
        __import__("time").sleep(0.1)
    assert a in tasks and b in tasks, tasks
    w["tokens"]["worker"] = tasks[a].token
    c["worker"] = CoordinatorClient(proc.url, tasks[a].token, timeout=5.0, retry_for=2.0)
    assert tasks[a].run_as == "alice" and tasks[b].run_as == "bob" and not tasks[a].allow_root
    w.update(a=a, b=b, clients=c, tasks=tasks, admin=admin)
    # each job's worker registers a dataset, as a training script does
    c["worker"].register_dataset(a, DatasetSpec("train", 100, 10))
    c["admin"].register_dataset(b, DatasetSpec("train", 100, 10))
    try:
        yield w
    finally:
        for x in c.values():
            x.close()
        admin.close()
        proc.stop()


def _args(route: str, w) -> dict:
    admin_route = route.split()[1].startswith("/v1/admin/")
    return {"job": w["a"], "ds": "train", "node": "n9" if admin_route else "n1", "user": "carol", "project": "p1"}


def _send(w, role: str, route: str, job: str = None):
    method, path = route.split(" ", 1)
    args = _args(route, w)
    if job is not None:
        args["job"] = job
    url = w["url"] + path.format(**args)
    token = w["tokens"]["alice" if role == "user" else role]
    headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
    if method == "GET":
        return requests.get(url, headers=headers, timeout=10)
    # an empty body: a route that lets the caller in answers 400 (the body is checked after the
    # credential), one that does not answers 403; nothing changes either way
    return requests.post(url, headers=headers, data=b"", timeout=10)


SIDE_EFFECTS = {"POST /v1/cluster/jobs/{job}/cancel", "POST /v1/admin/nodes/{node}", "POST /v1/admin/nodes/{node}/revoke",
                "POST /v1/admin/users/{user}/revoke"}


def test_every_route_with_every_credential_follows_the_table(world):
    checked = 0
    for route, rules in ACCESS.items():
        if route in SIDE_EFFECTS:
            continue
        for role in ROLES:
            rule = rules[role]
            r = _send(world, role, route)
            if rule == "deny":
                assert r.status_code == 403, (route, role, r.status_code, r.text)
                assert "may not use" in r.json()["reason"], r.text
            else:
                assert r.status_code not in (401, 403), (route, role, r.status_code, r.text)
            if rule == "own" and "{job}" in route:  # and bob's job is refused to alice and to alice's worker
                other = _send(world, role, route, job=world["b"])
                if role in ("user", "worker"):
                    assert other.status_code == 403, (route, role, other.text)
            checked += 1
    assert checked >= 4 * (len(ACCESS) - len(SIDE_EFFECTS))
    # the routes with side effects: refused to everyone but the admin
    for route in sorted(SIDE_EFFECTS - {"POST /v1/cluster/jobs/{job}/cancel"}):
        for role in ("user", "node", "worker"):
            assert _send(world, role, route).status_code == 403, (route, role)


def test_bob_cannot_cancel_alices_job_and_alice_can(world):
    c = world["clients"]
    with pytest.raises(ForbiddenError, match="not bob's"):
        c["bob"].cancel(world["a"])
    assert c["admin"].cluster_job(world["a"]).status == "running"
    with pytest.raises(ForbiddenError):
        c["node"].cancel(world["a"])
    with pytest.raises(ForbiddenError):
        c["worker"].cancel(world["a"])
    assert c["alice"].cancel(world["a"]).status in ("running", "cancelled")  # its tasks stop


def test_workers_nodes_and_users_stay_inside_their_scope(world):
    c, a, b = world["clients"], world["a"], world["b"]
    # a worker of job a: its own shards, never job b's
    lease = c["worker"].lease(a, "train", 0, 0, "r1")
    assert lease is not None
    with pytest.raises(ForbiddenError, match=f"cannot use job {b}"):
        c["worker"].lease(b, "train", 0, 0, "r2")
    with pytest.raises(ForbiddenError):
        c["worker"].submit(JobSubmit(["x.py"], "/tmp"))
    # a node credential: its own node only, and no job
    with pytest.raises(ForbiddenError, match="node n1's"):
        c["node"].node_register("n2", NodeRegister(4, "i2", "slot"))
    with pytest.raises(ForbiddenError):
        c["node"].submit(JobSubmit(["x.py"], "/tmp"))
    # its output is taken only for runs placed on it
    run_b = world["tasks"][b].run
    c["node"].node_poll("n1", NodePoll("i1", [], [LogChunk(b, run_b, b"real line\n"),
                                                  LogChunk(b, run_b + 7, b"forged line\n")], 0.0))
    logs = b"".join(k.data for k in c["admin"].job_logs(b).chunks)
    assert b"real line" in logs and b"forged" not in logs
    # a user: its own name only; no tickets
    with pytest.raises(ForbiddenError, match="only the admin may submit a job for another user"):
        c["alice"].submit(JobSubmit(["x.py"], "/tmp", user="bob"))
    with pytest.raises(ForbiddenError):
        c["alice"].set_user("alice", 100.0)
    # the admin acts for a user, and the event log says so
    jid = c["admin"].submit(JobSubmit(["x.py"], "/tmp", user="bob")).id
    ev = [e for e in c["admin"].events(0, jid).events if e.kind == "submit"][0]
    assert ev.detail["user"] == "bob" and ev.detail["by"] == "admin" and ev.detail["run_as"] == "bob"


def test_a_user_sees_the_queue_but_not_other_users_commands_or_logs(world):
    c, a, b = world["clients"], world["a"], world["b"]
    jobs = {j.id: j for j in c["alice"].cluster_jobs().jobs}
    assert jobs[a].command == ["train.py", "--x"]
    assert jobs[b].user == "bob" and jobs[b].command == [] and jobs[b].workdir == "" and jobs[b].status
    assert c["alice"].cluster_job(b).command == []
    assert all(j.command == [] for j in c["alice"].cluster_status().jobs if j.id == b)
    with pytest.raises(ForbiddenError):
        c["alice"].job_logs(b)
    ev = c["alice"].events(0).events
    assert any(e.job == b for e in ev)
    # of bob's events alice sees where and on how many workers his job ran (as the queue shows), not why
    assert all(set(e.detail) <= {"placement", "previous", "run", "workers", "previous_workers"} for e in ev
               if e.job == b)
    assert [e.detail["placement"] for e in ev if e.job == b and e.kind == "start"] == [[["n1", 1]]], ev
    assert "hunter2" not in msgspec.json.encode(c["alice"].events(0)).decode()
    assert "hunter2" not in msgspec.json.encode(c["alice"].cluster_status()).decode()
    assert "hunter2" in msgspec.json.encode(c["admin"].cluster_status()).decode()
    assert [j.job for j in c["alice"].jobs()] == [a]
    me = c["alice"].whoami()
    assert (me.role, me.name, me.unix_user) == ("user", "alice", "alice")


def test_a_worker_credential_dies_with_its_run(world):
    c, a = world["clients"], world["a"]
    c["worker"].dataset(a, "train")
    c["admin"].cancel(a)
    # the node reports the task gone: the run has ended
    for _ in range(50):
        reply = c["node"].node_poll("n1", NodePoll("i1", [TaskState(a, world["tasks"][a].run, "exited", 75, "")],
                                                   [], 0.0))
        if a not in {t.job for t in reply.tasks}:
            break
    c["node"].node_poll("n1", NodePoll("i1", [TaskState(a, world["tasks"][a].run, "exited", 75, "")], [], 0.0))
    __import__("time").sleep(1.2)  # a live run is remembered for a second
    with pytest.raises(ForbiddenError, match="which has ended"):
        c["worker"].dataset(a, "train")


def test_revoked_credentials_and_bad_input(world):
    c, admin = world["clients"], world["admin"]
    admin.revoke("user", "bob")
    with pytest.raises(AuthError, match="revoked"):
        c["bob"].cluster_jobs()
    with pytest.raises(ConfigError, match="reserved"):
        admin.add_user("admin")
    with pytest.raises(ConfigError, match="UNIX account name"):
        admin.add_user("carol", "Bad Name;rm")
    acc = admin.accounts()
    assert [u.user for u in acc.users] == ["alice"] and acc.nodes == ["n1"]
    # a new token for alice replaces the old one
    fresh = admin.add_user("alice").token
    with pytest.raises(AuthError):
        c["alice"].cluster_jobs()
    with CoordinatorClient(world["url"], fresh, timeout=5.0, retry_for=2.0) as again:
        assert again.whoami().name == "alice"


def test_bad_input_to_the_newer_cluster_routes_is_a_4xx_with_a_reason(world):
    """Projects, begin times, requeues and project names at submission: every bad value gets a 4xx
    that says why, never a 5xx, and the coordinator goes on serving."""
    a = world["a"]
    cases = [
        ("/v1/cluster/projects/p1", {"gpus": 0}), ("/v1/cluster/projects/p1", {"jobs": 10**12}),
        ("/v1/cluster/projects/p1", {"users": ["../x"]}), ("/v1/cluster/projects/p1", {"users": "alice"}),
        ("/v1/cluster/projects/a%2Fb", {"gpus": 1}), ("/v1/cluster/projects/" + "x" * 300, {"gpus": 1}),
        ("/v1/cluster/projects/nope", {"remove": True}), ("/v1/cluster/projects/p1", {"remove": True, "gpus": 1}),
        (f"/v1/cluster/jobs/{a}/update", {"begin": -1}), (f"/v1/cluster/jobs/{a}/update", {"begin": 1e12}),
        (f"/v1/cluster/jobs/{a}/update", {"begin": float("nan")}), (f"/v1/cluster/jobs/{a}/requeue", {"hold": "yes"}),
        ("/v1/cluster/jobs", {"command": ["x.py"], "workdir": "/tmp", "project": "../x"}),
        ("/v1/cluster/jobs", {"command": ["x.py"], "workdir": "/tmp", "project": "nope"}),
    ]
    headers = {"Authorization": "Bearer " + world["tokens"]["admin"], "Content-Type": "application/json"}
    for path, body in cases:
        r = requests.post(world["url"] + path, headers=headers, timeout=10,
                          data=json.dumps(body, allow_nan=True).encode())
        assert 400 <= r.status_code < 500 and r.json()["reason"], (path, body, r.status_code, r.text)
    assert world["admin"].projects().projects == []  # nothing was made of them
    assert world["admin"].cluster_job(a).status == "running"
    for query in ("since=abc", "since=nan", "until=inf", "since=-5", "until=1e309", "since=" + "1" * 50):
        r = requests.get(world["url"] + "/v1/cluster/usage?" + query, headers=headers, timeout=10)
        assert 400 <= r.status_code < 500 and r.json()["reason"], (query, r.status_code, r.text)
    usage = world["admin"].gpu_time(since=0.0)
    assert a in {u.job for u in usage.jobs} and usage.until == usage.now  # (a runs: its GPUs count to now)


def test_tokens_are_stored_only_as_digests(world, tmp_path):
    proc = world["proc"]
    proc.stop()
    raw = b""
    for name in os.listdir(tmp_path):
        if name.startswith("coord.db"):
            with open(tmp_path / name, "rb") as f:
                raw += f.read()
    for who, token in world["tokens"].items():
        assert token.encode() not in raw, who
    rows = sqlite3.connect(str(tmp_path / "coord.db")).execute("SELECT key FROM meta WHERE key LIKE 'cred:%'").fetchall()
    assert len(rows) >= 4  # alice, bob, n1, the worker
    proc.start()  # and they still work after a restart
    with CoordinatorClient(proc.url, world["tokens"]["alice"], timeout=5.0, retry_for=5.0) as again:
        assert again.whoami().name == "alice"


def test_an_old_database_and_token_file_keep_working(tmp_path):
    """A database and token file from before credentials existed: the token is the admin's."""
    from elastictrain.coordinator.store import SQLiteStore

    s = SQLiteStore(str(tmp_path / "coord.db"))
    from elastictrain.coordinator.membership import Membership

    Membership(s, []).create_job("old-job", 1, 2)
    s.close()
    with open(tmp_path / "token", "w") as f:
        f.write("an-old-token-from-last-year\n")
    os.chmod(tmp_path / "token", 0o600)
    proc = CoordinatorProcess(str(tmp_path / "coord.db"), str(tmp_path / "token"))
    proc.start()
    try:
        with CoordinatorClient(proc.url, "an-old-token-from-last-year", timeout=5.0, retry_for=5.0) as c:
            assert c.whoami().role == "admin" and [j.job for j in c.jobs()] == ["old-job"]
    finally:
        proc.stop()


def test_the_table_in_docs_is_the_table_in_the_code():
    with open(os.path.join(ROOT, "docs", "security.md")) as f:
        doc = f.read()
    assert access_table_markdown() in doc, "docs/security.md: paste access_table_markdown() over the old table"
