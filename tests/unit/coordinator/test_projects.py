"""Projects (coordinator/projects.py): a quota shared by a team's users, Slurm's accounts with
GrpTRES, in process on a manual clock with the real SQLite store."""

import pytest

from elastictrain.coordinator.access import Identity
from elastictrain.errors import ConfigError, ForbiddenError, NotFoundError
from elastictrain.wire import JobSubmit, ProjectSet, UserQuota

from .test_quotas import QuotaWorld


def _submit(w, user, gpus=1, **kw):
    w.c.creds.add_user(user, user, False) if user not in w.c.creds.accounts else None
    return w.s.submit(JobSubmit(["train.py"], str(w.tmp), gpus=gpus, **kw), Identity("user", user)).id


def test_a_projects_members_share_its_quota_and_the_rest_wait_until_it_has_room(tmp_path):
    w = QuotaWorld(tmp_path, policy="fifo", nodes=2, slots=4)
    w.s.set_project("vision", ProjectSet(gpus=3, users=["alice", "bob"]))
    a = _submit(w, "alice", 2)
    b = _submit(w, "bob", 1)  # the project's 3 GPUs are taken by alice's 2 and bob's 1
    c = _submit(w, "bob", 2)  # bob has no quota of his own, but his project is full
    d = _submit(w, "carol", 2)  # in no project
    w.s.tick()
    assert w.placed() == {a, b, d}
    assert [w.s.job(j).project for j in (a, b, c, d)] == ["vision", "vision", "vision", ""]
    why = w.s.job(c).reason
    assert "waiting for project vision's quota (3 GPUs): its admitted jobs count 3 of its 3 GPUs and this one " \
           "needs 2" in why and "elastictrain projects set vision --gpus N" in why, why
    w.run_all()
    w.clock.advance(1800)
    listed = {p.name: p for p in w.s.project_list().projects}["vision"]
    assert (listed.gpus, listed.users, listed.used_gpus, listed.used_jobs, listed.queued) == \
        (3, ["alice", "bob"], 3, 2, 1)
    assert listed.gpu_hours == pytest.approx(1.5, rel=0.01)  # 3 GPUs for half an hour: sshare's usage
    w.exit(b, 0)  # one GPU back: not enough
    w.s.tick()
    assert c not in w.s.table
    w.exit(a, 0)
    w.s.tick()
    assert w.status(c) == "running"


def test_a_user_charges_only_its_own_projects_and_both_quotas_hold(tmp_path):
    w = QuotaWorld(tmp_path, policy="fifo", nodes=1, slots=4)
    w.s.set_project("nlp", ProjectSet(jobs=1, users=["alice"]))
    w.s.set_project("vision", ProjectSet(gpus=3, users=["bob", "alice"]))
    with pytest.raises(ForbiddenError,
                       match=r"user bob is not a member of project nlp; ask an admin .*projects set nlp"):
        _submit(w, "bob", project="nlp")
    with pytest.raises(ConfigError, match=r"no project 'nope'; `elastictrain projects list` shows them"):
        _submit(w, "alice", project="nope")
    assert w.s.submit(JobSubmit(["train.py"], str(tmp_path), user="bob", project="nlp")).project == "nlp"  # admin
    first = _submit(w, "alice")  # her default: nlp, the first project that lists her
    other = _submit(w, "alice", project="vision")
    assert w.s.job(first).project == "nlp" and w.s.job(other).project == "vision"
    w.s.tick()
    assert w.status(first) == "queued" and "project nlp's quota (1 job)" in w.s.job(first).reason  # the admin's has it
    assert w.status(other) == "running"
    w.s.set_quota("alice", UserQuota(gpus=1))  # her own quota too: both must have room
    late = _submit(w, "alice", project="vision")
    w.s.tick()
    assert w.status(late) == "queued" and "user alice's quota" in w.s.job(late).reason
    with pytest.raises(ConfigError,
                       match=r"asks for 4 GPUs .* project vision's quota is 3: it could never be admitted"):
        _submit(w, "bob", 4, project="vision")


def test_projects_survive_a_restart_and_removing_one_lifts_its_limit(tmp_path):
    w = QuotaWorld(tmp_path, policy="fifo", nodes=1, slots=4, node_timeout=1000.0)
    w.s.set_project("vision", ProjectSet(gpus=1, users=["alice"]))
    a, b = _submit(w, "alice"), _submit(w, "alice")
    w.s.tick()
    w.run_all()
    assert w.status(b) == "queued"
    w.s._flush(everything=True)
    w.restart()
    assert [(p.name, p.gpus, p.users) for p in w.s.project_list().projects] == [("vision", 1, ["alice"])]
    w.s.tick()
    assert b not in w.s.table and w.s.job(b).project == "vision"
    w.s.set_project("vision", ProjectSet(gpus=2))  # members left out: they stay
    assert w.s.project_list().projects[0].users == ["alice"]
    w.s.tick()
    assert b in w.s.table
    w.s.set_project("vision", ProjectSet(remove=True))
    assert w.s.project_list().projects == [] and w.s.job(a).project == "vision"
    kinds = [e.detail for e in w.s.events.list(0).events if e.kind == "project"]
    assert kinds[-1] == {"project": "vision", "removed": True}
    with pytest.raises(NotFoundError, match="no project 'vision'"):
        w.s.set_project("vision", ProjectSet(remove=True))
    with pytest.raises(ConfigError, match="give --remove alone"):
        w.s.set_project("vision", ProjectSet(gpus=1, remove=True))
    with pytest.raises(ConfigError):
        w.s.set_project("bad name", ProjectSet(gpus=1))


def test_with_borrowing_a_job_over_its_projects_quota_borrows_and_counts_once_there_is_room(tmp_path):
    w = QuotaWorld(tmp_path, policy="fifo", nodes=1, slots=4, borrow=True)
    w.s.set_project("vision", ProjectSet(gpus=1, users=["alice"]))
    a, b = _submit(w, "alice"), _submit(w, "alice")
    w.s.tick()
    w.run_all()
    assert w.status(a) == w.status(b) == "running" and w.s.records[b].borrowing and not w.s.records[a].borrowing
    w.exit(a, 0)
    w.s.tick()
    assert not w.s.records[b].borrowing
    assert ("within_quota", b) in [(e.kind, e.job) for e in w.s.events.list(0).events]


def test_a_sub_projects_jobs_count_against_its_parents_quota_too(tmp_path):
    # research caps its labs together at 3 GPUs; vision (2 GPUs of its own) and nlp are under it
    w = QuotaWorld(tmp_path, policy="fifo", nodes=2, slots=4, node_timeout=1000.0)
    w.s.set_project("research", ProjectSet(gpus=3, users=["carol"]))
    w.s.set_project("vision", ProjectSet(gpus=2, users=["alice"], parent="research"))
    w.s.set_project("nlp", ProjectSet(users=["bob"], parent="research"))
    a = _submit(w, "alice", 2)
    b = _submit(w, "bob", 1)  # research: 2 + 1 = 3, full
    c = _submit(w, "bob", 1)  # nlp has no limit of its own, but research is full
    d = _submit(w, "alice", 1)  # vision is full (and research)
    e = _submit(w, "dave", 4)  # in no project
    w.s.tick()
    assert w.placed() == {a, b, e}
    why = w.s.job(c).reason
    assert "the quota of project research, which project nlp is under (3 GPUs)" in why and \
        "elastictrain projects set research --gpus N" in why, why
    assert "waiting for project vision's quota (2 GPUs)" in w.s.job(d).reason
    listed = {p.name: p for p in w.s.project_list().projects}
    assert (listed["research"].used_gpus, listed["research"].used_jobs, listed["research"].queued) == (3, 2, 2)
    assert (listed["vision"].parent, listed["vision"].used_gpus, listed["nlp"].used_gpus) == ("research", 2, 1)
    w.run_all()
    w.exit(b, 0)  # research has a GPU again: nlp's c fits it (vision's d is still over vision's own)
    w.s.tick()
    assert c in w.s.table and d not in w.s.table
    w.s.set_project("vision", ProjectSet(parent=""))  # vision on its own: its quota stays, research's is lifted
    assert {p.name: (p.parent, p.gpus) for p in w.s.project_list().projects}["vision"] == ("", 2)
    w.s._flush(everything=True)
    w.restart()
    assert {p.name: p.parent for p in w.s.project_list().projects} == {"research": "", "vision": "", "nlp": "research"}
    with pytest.raises(ConfigError, match=r"project research has sub-projects \(nlp\): remove them"):
        w.s.set_project("research", ProjectSet(remove=True))
    with pytest.raises(ConfigError, match="no project 'physics' to be the parent of 'nlp'"):
        w.s.set_project("nlp", ProjectSet(parent="physics"))
    with pytest.raises(ConfigError, match="a project cannot be its own parent"):
        w.s.set_project("research", ProjectSet(parent="nlp"))
    with pytest.raises(ConfigError, match="a project cannot be its own parent"):
        w.s.set_project("nlp", ProjectSet(parent="nlp"))


def test_projects_nest_at_most_eight_levels():
    from elastictrain.coordinator.projects import MAX_DEPTH, ProjectBook
    from elastictrain.coordinator.quotas import Quota

    book = ProjectBook({})
    book.set("p0", Quota(), [])
    for i in range(1, MAX_DEPTH):
        book.set(f"p{i}", Quota(), [], parent=f"p{i - 1}")
    assert book.chain(f"p{MAX_DEPTH - 1}") == [f"p{i}" for i in reversed(range(MAX_DEPTH))]
    with pytest.raises(ConfigError, match="nest at most 8 levels"):
        book.set("deeper", Quota(), [], parent=f"p{MAX_DEPTH - 1}")
    book.set("top", Quota(), [])
    with pytest.raises(ConfigError, match="nest at most 8 levels"):  # (p0's tree under top: 9 levels)
        book.set("p0", Quota(), [], parent="top")


def test_the_project_book_is_bounded():
    from elastictrain.coordinator import projects as mod
    from elastictrain.coordinator.projects import ProjectBook
    from elastictrain.coordinator.quotas import Quota

    book = ProjectBook({})
    with pytest.raises(ConfigError, match="at most 10000 members"):
        book.set("big", Quota(), [f"u{i}" for i in range(mod.MAX_MEMBERS + 1)])
    for i in range(10):
        book.set(f"p{i}", Quota(), [f"u{j}" for j in range(mod.MAX_MEMBERS)])
    with pytest.raises(ConfigError, match="at most 100000 memberships in all projects together"):
        book.set("one-more", Quota(), ["x"])
    book.set("p0", Quota(), ["x"])  # (replacing a project's members counts them once)
    assert ProjectBook({mod.META_KEY: book._json()}).projects["p0"].users == ("x",)
    assert ProjectBook({mod.META_KEY: "not json"}).projects == {}


def test_a_project_with_tickets_is_one_fair_share_beside_the_users_and_survives_a_restart(tmp_path):
    from .test_users import _drive

    w = QuotaWorld(tmp_path, policy="gandiva-fair", nodes=1, slots=4, quantum=10.0, compensate=0.0,
                   node_timeout=1000.0)
    w.s.set_project("vision", ProjectSet(users=["alice", "bob"], tickets=1.0))
    assert w.s.policy.project_tickets == {"vision": 1.0}
    for user in ("alice", "alice", "bob", "bob", "carol", "carol"):
        w.submit(1, user=user)  # alice's and bob's are charged to vision, their default project
    _drive(w, 400)
    by = {u.user: u for u in w.s.user_list(300.0).users}
    assert (by["alice"].entitled, by["bob"].entitled, by["carol"].entitled) == pytest.approx((0.25, 0.25, 0.5))
    assert by["carol"].share == pytest.approx(0.5, abs=0.08) and by["alice"].share == pytest.approx(0.25, abs=0.08)
    assert by["alice"].jobs == 2
    from elastictrain.sim.fairness_live import live_fairness

    events = w.s.events.list(0).events  # fairness --from-coordinator: by the accounts, summed per user
    r = live_fairness(events, {}, 1.0, 200.0, w.clock.now(), {"vision": 1.0})
    assert all(r.ratio(u) == pytest.approx(1.0, abs=0.15) for u in ("alice", "bob", "carol")), r
    assert r.entitled["carol"] == pytest.approx(r.entitled["alice"] + r.entitled["bob"], rel=0.01)
    by_user = live_fairness(events, {}, 1.0, 200.0, w.clock.now())  # (users' tickets alone: carol gets more)
    assert by_user.ratio("carol") == pytest.approx(1.5, abs=0.2)
    (listed,) = w.s.project_list().projects
    assert (listed.tickets, listed.entitled) == (1.0, pytest.approx(0.5))
    assert [e.detail["tickets"] for e in w.s.events.list(0).events if e.kind == "project"] == [1.0]
    w.s._flush(everything=True)
    w.restart()
    assert w.s.policy.project_tickets == {"vision": 1.0}
    w.s.set_project("vision", ProjectSet(gpus=8))  # tickets left out: they stay
    assert w.s.project_list().projects[0].tickets == 1.0
    w.s.set_project("vision", ProjectSet(tickets=0))  # none: alice and bob count as themselves again
    assert w.s.policy.project_tickets == {}
    by = {u.user: u for u in w.s.user_list(300.0).users}
    assert by["carol"].entitled == pytest.approx(1 / 3) and w.s.project_list().projects[0].entitled == 0.0
    with pytest.raises(ConfigError, match="give --remove alone"):
        w.s.set_project("vision", ProjectSet(tickets=1.0, remove=True))
    with pytest.raises(ConfigError, match=r"tickets must be in \[0, 1000000\]"):
        w.s.set_project("vision", ProjectSet(tickets=float("nan")))


def test_a_members_own_share_in_a_project_reaches_the_policy_the_lists_and_survives_a_restart(tmp_path):
    """`projects set vision --users alice=3,bob` (Slurm's per-association fairshare): alice weighs 3
    in vision's split, whatever her own tickets; the policy, `users list` and `projects list` agree."""
    from .test_users import _drive

    w = QuotaWorld(tmp_path, policy="gandiva-fair", nodes=1, slots=4, quantum=10.0, compensate=0.0,
                   node_timeout=1000.0)
    w.s.set_project("vision", ProjectSet(users=["alice", "bob"], tickets=1.0, shares={"alice": 3.0}))
    assert w.s.policy.member_shares == {"vision/alice": 3.0}
    for user in ("alice", "alice", "bob", "bob", "carol", "carol"):
        w.submit(1, user=user)
    _drive(w, 400)
    by = {u.user: u for u in w.s.user_list(300.0).users}
    assert (by["alice"].entitled, by["bob"].entitled, by["carol"].entitled) == pytest.approx((0.375, 0.125, 0.5))
    assert by["alice"].share == pytest.approx(0.375, abs=0.08) and by["bob"].share == pytest.approx(0.125, abs=0.08)
    (listed,) = w.s.project_list().projects
    assert listed.shares == {"alice": 3.0} and listed.users == ["alice", "bob"]
    assert [e.detail.get("shares") for e in w.s.events.list(0).events if e.kind == "project"] == [{"alice": 3.0}]
    w.s._flush(everything=True)
    w.restart()
    assert w.s.policy.member_shares == {"vision/alice": 3.0}
    w.s.set_project("vision", ProjectSet(tickets=2.0))  # members left out: they and their shares stay
    assert w.s.project_list().projects[0].shares == {"alice": 3.0}
    w.s.set_project("vision", ProjectSet(users=["alice", "bob"], tickets=2.0))  # members given: no shares now
    assert w.s.policy.member_shares == {} and w.s.project_list().projects[0].shares == {}
    with pytest.raises(ConfigError, match="a share for 'carol', who is not among the members given"):
        w.s.set_project("vision", ProjectSet(users=["alice"], shares={"carol": 1.0}))
    with pytest.raises(ConfigError, match="set with its membership"):
        w.s.set_project("vision", ProjectSet(shares={"alice": 1.0}))


def test_sub_projects_with_tickets_share_their_parents_share(tmp_path):
    # research (1) over vision (1) and nlp (1); carol alone: research and carol half each, and
    # research's half split between vision's alice and nlp's erin; the policy gets the tree too
    w = QuotaWorld(tmp_path, policy="gandiva-fair", nodes=1, slots=4, node_timeout=1000.0)
    w.s.set_project("research", ProjectSet(tickets=1.0))
    w.s.set_project("vision", ProjectSet(users=["alice"], tickets=1.0, parent="research"))
    w.s.set_project("nlp", ProjectSet(users=["erin"], tickets=1.0, parent="research"))
    assert w.s.policy.project_parents == {"vision": "research", "nlp": "research"}
    for user in ("alice", "erin", "carol"):
        w.submit(1, user=user)
    w.s.tick()
    by = {u.user: u for u in w.s.user_list(300.0).users}
    assert (by["alice"].entitled, by["erin"].entitled, by["carol"].entitled) == pytest.approx((0.25, 0.25, 0.5))
    listed = {p.name: p.entitled for p in w.s.project_list().projects}
    assert listed == pytest.approx({"research": 0.5, "vision": 0.25, "nlp": 0.25})  # (research's holds its labs')
    w.s.set_project("nlp", ProjectSet(parent=""))  # nlp beside research: a third each
    assert w.s.policy.project_parents == {"vision": "research"}
    by = {u.user: u for u in w.s.user_list(300.0).users}
    assert (by["alice"].entitled, by["erin"].entitled, by["carol"].entitled) == pytest.approx((1 / 3,) * 3)
