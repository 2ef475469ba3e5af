"""Fair shares by project (policies/shares.py): a project with tickets is one share beside the
users, split among its members with jobs; Gandiva-fair (split and global stride) gives each
account its share of the GPU time, through the event engine."""

import pytest

from elastictrain.errors import ConfigError
from elastictrain.model import JobSpec
from elastictrain.policies import create
from elastictrain.policies.shares import account, account_tickets, split_account
from elastictrain.sim.cluster import ClusterSpec
from elastictrain.sim.engine import Simulator


def test_a_projects_tickets_are_split_among_its_members_with_jobs_by_their_own():
    projects = {"vision": 2.0}
    assert account("alice", "vision", projects) == "vision/alice"
    assert account("alice", "nlp", projects) == "alice"  # a project without tickets: the user's own
    assert account("alice", "", projects) == "alice"
    assert split_account("vision/alice") == ("alice", "vision") and split_account("carol") == ("carol", "")
    got = account_tickets(["vision/alice", "vision/bob", "carol"], {"bob": 3.0}, 1.0, projects)
    assert got == {"vision/alice": 0.5, "vision/bob": 1.5, "carol": 1.0}
    # a project whose tickets were removed: its accounts fall back to their users' own tickets
    assert account_tickets(["vision/alice"], {}, 1.0, {}) == {"vision/alice": 1.0}


JOBS = [("alice", "vision"), ("bob", "vision"), ("dave", "vision"), ("carol", ""), ("erin", "nlp")]


def test_a_members_own_share_in_a_project_splits_it_in_place_of_its_users_tickets():
    """Slurm's per-association fairshare: alice weighs 3 in vision (her own tickets stay 1 elsewhere)."""
    weights = {"vision/alice": 3.0}
    got = account_tickets(["vision/alice", "vision/bob", "alice", "carol"], {}, 1.0, {"vision": 2.0}, None, weights)
    assert got == {"vision/alice": 1.5, "vision/bob": 0.5, "alice": 1.0, "carol": 1.0}
    # a share in a project whose tickets were removed counts for nothing: the account is the user's own
    assert account_tickets(["vision/alice"], {}, 1.0, {}, None, weights) == {"vision/alice": 1.0}
    tree = account_tickets(["vision/alice", "vision/bob", "research/dan"], {}, 1.0, {"research": 2.0, "vision": 1.0},
                           {"vision": "research"}, {"vision/alice": 3.0, "research/dan": 1.0})
    # research: dan (1) and vision (1) a half each; vision's half split 3:1
    assert tree == pytest.approx({"research/dan": 1.0, "vision/alice": 0.75, "vision/bob": 0.25})


def test_gandiva_fair_gives_a_member_its_own_share_of_its_project():
    jobs = [JobSpec(i * 5 + k, 1 + k % 2, 0.0, 1e12, 1.0, user=u, project=p)
            for i, (u, p) in enumerate(JOBS) for k in range(5)]
    pol = create("gandiva-fair", project_tickets={"vision": 1.0, "nlp": 1.0})
    pol.set_tickets({}, None, None, {"vision/alice": 2.0})  # alice 2, bob 1, dave 1 within vision
    r = Simulator(jobs, ClusterSpec(1, 2, 4), pol, until=12 * 3600).run()
    got = r.extra["service_by_user"]
    share = {u: v / sum(got.values()) for u, v in got.items()}
    for user, want in (("alice", 1 / 6), ("bob", 1 / 12), ("dave", 1 / 12), ("carol", 1 / 3), ("erin", 1 / 3)):
        assert share[user] == pytest.approx(want, abs=0.012), share




def _shares(policy, project_tickets, nodes=2, gpus=4, hours=12, parents=None, **kw):
    """Each user's fraction of the GPU time: five users with five long jobs each (1 and 2 GPUs)."""
    jobs = [JobSpec(i * 5 + k, 1 + k % 2, 0.0, 1e12, 1.0, user=u, project=p)
            for i, (u, p) in enumerate(JOBS) for k in range(5)]
    pol = create(policy, project_tickets=project_tickets, **kw)
    if parents:
        pol.set_tickets({}, project_tickets, parents)
    r = Simulator(jobs, ClusterSpec(1, nodes, gpus), pol, until=hours * 3600).run()
    got = r.extra["service_by_user"]
    return {u: v / sum(got.values()) for u, v in got.items()}


@pytest.mark.parametrize("policy", ["gandiva-fair", "gandiva-fair-global"])
def test_gandiva_fair_gives_each_project_its_share_whatever_its_member_count(policy):
    alone = _shares(policy, {})
    assert all(v == pytest.approx(0.2, abs=0.01) for v in alone.values()), alone  # five users, equal
    shared = _shares(policy, {"vision": 1.0, "nlp": 1.0})
    # vision (three users), nlp (one) and carol (no project tickets) a third each
    for user, want in (("alice", 1 / 9), ("bob", 1 / 9), ("dave", 1 / 9), ("carol", 1 / 3), ("erin", 1 / 3)):
        assert shared[user] == pytest.approx(want, abs=0.01), shared
    weighted = _shares(policy, {"vision": 3.0, "nlp": 1.0})  # vision 3 of 5 shares
    assert weighted["alice"] + weighted["bob"] + weighted["dave"] == pytest.approx(0.6, abs=0.015), weighted


def test_sub_projects_tickets_split_their_parents_as_slurms_fair_share_tree():
    projects, parents = {"research": 2.0, "vision": 3.0, "nlp": 1.0}, {"vision": "research", "nlp": "research"}
    assert account("eve", "lab", projects, {"lab": "vision", **parents}) == "vision/eve"  # the nearest with tickets
    assert account("eve", "lab", projects, {"lab": "x"}) == "eve"
    # research's 2 tickets split among dan (its own member, 1), vision (3) and nlp (1); carol alone at 1
    got = account_tickets(["vision/alice", "nlp/bob", "carol", "research/dan"], {}, 1.0, projects, parents)
    assert got == pytest.approx({"vision/alice": 1.2, "nlp/bob": 0.4, "carol": 1.0, "research/dan": 0.4})
    assert account_tickets(["vision/alice", "carol"], {}, 1.0, projects, parents) == \
        pytest.approx({"vision/alice": 2.0, "carol": 1.0})  # (only vision has jobs under research: all of it)
    flat = ["vision/alice", "vision/bob", "carol"]  # no ticketed project above another: the flat rule, to the bit
    assert account_tickets(flat, {"bob": 3.0}, 1.0, {"vision": 2.0}, {"vision": "research"}) == \
        account_tickets(flat, {"bob": 3.0}, 1.0, {"vision": 2.0})


def test_gandiva_fair_shares_by_the_project_tree():
    # research (1 ticket) over vision (alice, bob, dave) and nlp (erin), 1 each; carol alone: carol and
    # research half each, vision and nlp a quarter each (flat, the three would have a third each)
    tree = _shares("gandiva-fair", {"research": 1.0, "vision": 1.0, "nlp": 1.0},
                   parents={"vision": "research", "nlp": "research"})
    for user, want in (("alice", 1 / 12), ("bob", 1 / 12), ("dave", 1 / 12), ("carol", 1 / 2), ("erin", 1 / 4)):
        assert tree[user] == pytest.approx(want, abs=0.01), tree


def test_tickets_given_to_a_project_mid_run_move_its_members_jobs_to_its_account():
    jobs = [JobSpec(i * 4 + k, 1, 0.0, 1e12, 1.0, user=u, project=p)
            for i, (u, p) in enumerate(JOBS[:4]) for k in range(4)]
    pol = create("gandiva-fair", compensate=0.0)
    orig = pol.decide

    def decide(s):  # the tickets arrive at 2 h, as `projects set vision --tickets 1` would
        if s.now >= 2 * 3600 and not pol.project_tickets:
            pol.set_tickets({}, {"vision": 1.0})
        return orig(s)

    pol.decide = decide
    r = Simulator(jobs, ClusterSpec(1, 1, 4), pol, until=4 * 3600, window=3600.0).run()
    first, last = (w["gpu_seconds"] for w in (r.extra["timeline"][0], r.extra["timeline"][-1]))
    share = {u: t["gpu"] / sum(x["gpu"] for x in first.values()) for u, t in first.items()}
    assert all(v == pytest.approx(0.25, abs=0.02) for v in share.values()), share  # four users, equal
    share = {u: t["gpu"] / sum(x["gpu"] for x in last.values()) for u, t in last.items()}
    assert share["carol"] == pytest.approx(0.5, abs=0.02), share  # vision's three users share the other half
    assert {sj.user for sj in pol._jobs.values()} == {"vision/alice", "vision/bob", "vision/dave", "carol"}
    assert pol.entitlement["vision/alice"]["gpu"] == pytest.approx(2 / 3)


def test_project_tickets_are_checked():
    with pytest.raises(ConfigError, match="tickets must be positive"):
        create("gandiva-fair", project_tickets={"vision": 0.0})
    pol = create("gandiva-fair")
    with pytest.raises(ConfigError, match="tickets must be positive"):
        pol.set_tickets({}, {"vision": -1.0})
    with pytest.raises(ConfigError, match="project name"):
        JobSpec(0, 1, 0.0, 1.0, 1.0, project="a/b")


def test_simulate_takes_tickets_and_a_traces_project_column(tmp_path):
    import csv
    import subprocess
    import sys

    trace = tmp_path / "t.csv"
    trace.write_text("job_id,num_gpu,submit_time,iterations,iteration_time,model,user,project\n" + "".join(
        f"{i},1,0,{3000 + i},1.0,m,{u},{p}\n" for i, (u, p) in enumerate([("a", "vision"), ("b", "vision"),
                                                                          ("c", ""), ("a", "vision"),
                                                                          ("b", "vision"), ("c", "")])))

    def simulate(*extra):
        return subprocess.run([sys.executable, "-m", "elastictrain", "simulate", "--trace", str(trace), "--cluster",
                               "n1g2", "--policy", "gandiva-fair", "--no-progress", "--out", str(tmp_path / "o"),
                               *extra], capture_output=True, text=True, timeout=120)

    def ends():
        with open(tmp_path / "o" / "jobs_gandiva-fair.csv") as f:
            rows = list(csv.DictReader(f))
        return {u: max(float(r["end_time"]) for r in rows if r["user"] == u) for u in "abc"}

    assert simulate().returncode == 0
    alone = ends()  # three users, a third each: c's two jobs end last (they are the longest)
    ok = simulate("--project-tickets", "vision=1", "--tickets", "a=1")
    assert ok.returncode == 0, ok.stderr
    shared = ends()  # vision's two users share half: c, with the other half, ends well before them
    assert shared["c"] < alone["c"] - 300 and shared["c"] < min(shared["a"], shared["b"]), (alone, shared)
    for flag, value, why in (("--project-tickets", "vision=0", "PROJECT=N with N in (0, 1000000]"),
                             ("--tickets", "a", "USER=N"), ("--project-tickets", "bad name=1", "project name")):
        bad = simulate(flag, value)
        assert bad.returncode != 0 and why in bad.stderr, bad.stderr
