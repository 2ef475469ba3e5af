"""The allow/deny rules, credentials kept as digests, and what a job may carry."""

import os

import pytest

from elastictrain.coordinator.access import (
    ACCESS, ADMIN, ROLES, Access, Credentials, Identity, check_job_command, check_job_env, digest,
)
from elastictrain.coordinator.store import SQLiteStore
from elastictrain.errors import ConfigError, ForbiddenError, NotFoundError
from elastictrain.launcher.run_as import RunAsError, resolve, task_base_env


@pytest.fixture
def store(tmp_path):
    s = SQLiteStore(str(tmp_path / "c.db"))
    yield s
    s.close()


def test_every_route_has_a_rule_for_every_role():
    for route, rules in ACCESS.items():
        assert set(rules) == set(ROLES), route
        assert set(rules.values()) <= {"allow", "deny", "own", "view"}, route
        assert rules["admin"] == "allow", route


def test_credentials_are_digests_and_survive_a_restart(store):
    c = Credentials(store, store.load().meta)
    c.set_admin("the-admin-token")
    alice = c.add_user("alice", "alice", False)
    node = c.add_node("n1")
    worker = c.worker_token("7", 3, ["7", "8"])
    assert c.worker_token("7", 3, ["7", "8"]) == worker  # one per run
    meta = store.load().meta
    assert all(t not in "".join(meta) + "".join(meta.values()) for t in (alice, node, worker))
    assert f"cred:{digest(alice)}" in meta
    again = Credentials(store, meta)
    again.set_admin("the-admin-token")
    assert again.identify(alice.encode()) == Identity("user", "alice")
    assert again.identify(node.encode()) == Identity("node", "n1")
    assert again.identify(worker.encode()) == Identity("worker", "7", 3, frozenset({"7", "8"}))
    assert again.identify(b"the-admin-token") is ADMIN
    assert again.identify(b"the-admin-token ") is None and again.identify(b"\xff") is None
    assert again.accounts["alice"].unix_user == "alice"


def test_a_new_token_replaces_the_old_and_revoke_removes_both(store):
    c = Credentials(store, {})
    old = c.add_user("bob", "bob", False)
    new = c.add_user("bob", "bob", False)
    assert c.identify(old.encode()) is None and c.identify(new.encode()).name == "bob"
    assert c.revoke("user", "bob") == 1
    assert c.identify(new.encode()) is None and "bob" not in c.accounts
    with pytest.raises(NotFoundError):
        c.revoke("user", "bob")
    with pytest.raises(ConfigError, match="reserved"):
        c.add_user("default", "x", False)


def test_worker_credentials_of_ended_runs_are_pruned(store):
    c = Credentials(store, {})
    w1, w2 = c.worker_token("1", 1, ["1"]), c.worker_token("2", 1, ["2"])
    assert c.prune_workers(lambda job, run: job == "2") == 1
    assert c.identify(w1.encode()) is None and c.identify(w2.encode()) is not None
    assert len([k for k in store.load().meta if k.startswith("cred:")]) == 1


def test_the_rules():
    owners = {"a1": "alice", "b1": "bob", "sys": ""}
    claimed = {}
    alive = {("a1", 2)}
    acc = Access(lambda j: owners.get(j, claimed.get(j)), lambda j, r: (j, r) in alive,
                 lambda j, u: claimed.__setitem__(j, u))
    alice, bob = Identity("user", "alice"), Identity("user", "bob")
    assert acc.check(alice, "POST /v1/cluster/jobs/{job}/cancel", ("a1",)) == "own"
    with pytest.raises(ForbiddenError, match="not bob's"):
        acc.check(bob, "POST /v1/cluster/jobs/{job}/cancel", ("a1",))
    with pytest.raises(ForbiddenError):
        acc.check(alice, "POST /v1/jobs/{job}/steps", ("sys",))  # the admin's job
    acc.check(alice, "POST /v1/jobs/{job}/agents/join", ("new",))  # a new etrun job: alice's now
    assert claimed == {"new": "alice"}
    with pytest.raises(ForbiddenError):
        acc.check(bob, "POST /v1/jobs/{job}/agents/join", ("new",))
    w = Identity("worker", "a1", 2, frozenset({"a1"}))
    assert acc.check(w, "POST /v1/jobs/{job}/datasets/{ds}/lease", ("a1", "d")) == "own"
    with pytest.raises(ForbiddenError, match="cannot use job b1"):
        acc.check(w, "POST /v1/jobs/{job}/datasets/{ds}/lease", ("b1", "d"))
    stale = Identity("worker", "a1", 1, frozenset({"a1"}))
    with pytest.raises(ForbiddenError, match="has ended"):
        acc.check(stale, "POST /v1/jobs/{job}/steps", ("a1",))
    node = Identity("node", "n1")
    assert acc.check(node, "POST /v1/cluster/nodes/{node}/poll", ("n1",)) == "own"
    for route, args in (("POST /v1/cluster/nodes/{node}/poll", ("n2",)), ("POST /v1/cluster/jobs", ()),
                        ("POST /v1/admin/users/{user}", ("eve",))):
        with pytest.raises(ForbiddenError):
            acc.check(node, route, args)
    assert acc.check(alice, "GET /v1/cluster/jobs", ()) == "view"
    assert acc.may_see(alice, "alice") and not acc.may_see(alice, "bob") and acc.may_see(ADMIN, "bob")


def test_what_a_job_may_carry():
    check_job_env({"OMP_NUM_THREADS": "1", "NCCL_DEBUG": "INFO", "JOB_LR": "0.1", "ET_LOG_LEVEL": "debug"})
    for bad, why in (("LD_PRELOAD", "never passed"), ("LD_LIBRARY_PATH", "never"), ("PYTHONPATH", "never"),
                     ("PATH", "never"), ("CUDA_VISIBLE_DEVICES", "never"), ("ET_TOKEN_FILE", "never"),
                     ("ET_COORDINATOR", "never"), ("GLIBC_TUNABLES", "never"), ("SOMETHING", "allow list")):
        with pytest.raises(ConfigError, match=why):
            check_job_env({bad: "x"})
    check_job_env({"MYLAB_SEED": "1"}, ("MYLAB_*",))
    with pytest.raises(ConfigError):
        check_job_env({"LD_AUDIT": "x"}, ("*",))  # the never list wins over any allow pattern
    check_job_command(["train.py", "--lr", "0.1", "-v"], False)
    check_job_command(["pkg.train"], True)
    for cmd, module in ((["--no-python", "/bin/sh"], False), (["-m", "x"], False), (["a.py", ":", "b.py"], False),
                        (["os.system('id')"], True), ([""], False)):
        with pytest.raises(ConfigError):
            check_job_command(cmd, module)


def test_run_as_rules():
    import pwd

    me = pwd.getpwuid(os.geteuid())
    acct = resolve("", True, "n1")
    assert acct.uid == os.geteuid() and not acct.switch
    with pytest.raises(RunAsError, match="no UNIX account"):
        resolve("no-such-account-here", False, "n1")
    if os.geteuid() == 0:
        with pytest.raises(RunAsError, match="would run as root"):
            resolve("", False, "n1")
        with pytest.raises(RunAsError, match="would run as root"):
            resolve("root", False, "n1")
        nobody = resolve("nobody", False, "n1")
        assert nobody.switch and nobody.uid != 0
        env = task_base_env(nobody, {"LANG": "C.UTF-8", "ET_TOKEN_FILE": "/n.token", "LD_PRELOAD": "x", "SECRET": "s"})
        assert env["USER"] == "nobody" and env["LANG"] == "C.UTF-8"
        assert not {"ET_TOKEN_FILE", "LD_PRELOAD", "SECRET"} & set(env)
    else:
        with pytest.raises(RunAsError, match="not root"):
            resolve("root", True, "n1")
    own = task_base_env(resolve(me.pw_name, True, "n1"), {"A": "1", "ET_TOKEN": "t", "ET_TOKEN_FILE": "f"})
    assert own == {"A": "1"}
