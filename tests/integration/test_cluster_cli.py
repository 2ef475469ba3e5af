"""What a user types against a live cluster: submit, status, logs, cancel; a failing job's root
cause; and the token on every route, reads included."""

import http.client
import json
import os
import pwd
import re
import subprocess
import sys
import textwrap
import time

import pytest

from elastictrain.launcher.local_cluster import LocalCluster as Cluster

WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                      "torch_cluster_job.py")


def _nap(c) -> None:
    """``nap.py SECONDS`` in the cluster's directory: a job that sleeps that long."""
    with open(os.path.join(c.tmp, "nap.py"), "w") as f:
        f.write("import sys, time\ntime.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0)\n")


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, "fifo", nodes=1, slots=2).start()
    yield c
    c.stop()


def test_submit_status_forecast_logs_cancel_and_a_failure_with_its_root_cause(cluster):
    c = cluster
    bad = os.path.join(c.tmp, "bad.py")
    with open(bad, "w") as f:
        f.write(textwrap.dedent("""
            import elastictrain as et
            job = et.init()
            raise ValueError("the learning rate is negative, fix --lr")
        """))
    ok = c.cli("submit", "--gpus", "2", "--name", "ok", "--steps", "30", "--", WORKER, "--ckpt-dir", "ck-ok",
            "--out", "ok.json").stdout.strip()
    assert ok.isdigit()
    failing = c.cli("submit", "--max-restarts", "1", "--", "bad.py").stdout.strip()
    long = c.cli("submit", "--gpus", "1", "--name", "long", "--", WORKER, "--ckpt-dir", "ck-long", "--out",
              "long.json", "--epochs", "50", "--step-sleep", "0.2").stdout.strip()
    c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(long) == "running"
           and {j.id: j.status for j in st.jobs}.get(ok) == "finished", 120, "ok to finish and long to run")
    table = c.cli("status").stdout
    assert "running:" in table and "long" in table and "n1" in table and "finished" in table
    one = c.cli("status", "--job", ok).stdout
    assert "finished" in one and "dataset" in one and "step 30/30" in one, one
    data = json.loads(c.cli("status", "--json").stdout)
    assert {j["id"]: j["status"] for j in data["jobs"]}[ok] == "finished" and data["nodes"][0]["slots"] == 2
    # squeue --start: the coordinator simulates its policy from now on
    fc = c.cli("status", "--start").stdout
    assert fc.startswith("forecast: policy fifo simulated from now"), fc
    row = next(line.split() for line in fc.splitlines() if line.startswith(f"{long} "))
    assert row[1:6] == ["long", "default", "running", "1", "running"] and row[6].startswith("in"), fc
    data = json.loads(c.cli("status", "--start", "--json", long).stdout)
    assert [j["id"] for j in data["jobs"]] == [long] and data["jobs"][0]["end"] > data["now"], data
    assert "  expected: runs now, ends in " in c.cli("status", long).stdout  # scontrol show job's StartTime
    logs = c.cli("logs", ok).stdout
    assert "[default0]:[train] done: 30 steps" in logs, logs[-2000:]
    assert c.cli("cancel", long).stdout.strip() == f"job {long} cancelled"
    events = c.cli("events", "--job", ok).stdout
    assert " start " in events and " finish " in events and f"  {ok}  " in events, events
    kinds = [json.loads(line)["kind"] for line in c.cli("events", "--kind", "submit", "--json").stdout.splitlines()]
    assert kinds == ["submit"] * 3, kinds
    bad_job = c.cli("events", "--job", "../x", check=False)
    assert bad_job.returncode == 2 and "--job" in bad_job.stderr
    c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(failing) == "failed"
           and all(n.used == 0 for n in st.nodes), 120, "the failing job to fail and the slots to be free")
    info = c.client.cluster_job(failing)
    assert "the learning rate is negative" in info.reason and info.restarts == 1, info.reason
    assert c.client.cluster_job(long).status == "cancelled"
    again = c.cli("cancel", long, check=False)
    assert again.returncode == 2 and "already cancelled" in again.stderr
    missing = c.cli("status", "--job", "999", check=False)
    assert missing.returncode == 2 and "no job '999'" in missing.stderr
    nothing = c.cli("submit", "--", "nope.py", check=False)
    assert nothing.returncode == 2 and "not in the work directory" in nothing.stderr
    # sacct's habit: one accounting row per job (issue 32.6: there was no history)
    rows = {r["id"]: r for r in map(json.loads, c.cli("history", "--format", "json").stdout.splitlines())}
    assert [rows[j]["state"] for j in (ok, failing, long)] == ["finished", "failed", "cancelled"]
    assert (rows[ok]["exit_code"], rows[long]["exit_code"]) == (0, None) and rows[failing]["exit_code"] not in (0, None)
    assert rows[failing]["restarts"] == {"worker_failure": 1} and rows[ok]["restarts"] == {}
    assert rows[ok]["elapsed"] > 0 and rows[ok]["gpu_hours"] > 0 and rows[ok]["end"] >= rows[ok]["start"]
    text = c.cli("history", "--state", "finished,failed", "--since", "1h").stdout
    assert text.splitlines()[0].split()[:5] == ["id", "name", "user", "gpus", "state"]
    assert f"\n{ok} " in text and f"\n{failing} " in text and "cancelled" not in text and "worker_failure:1" in text
    assert c.cli("history", "--user", "nobody-else").stdout.strip() == "no jobs match"
    csv = c.cli("history", "--format", "csv").stdout.splitlines()
    assert csv[0].startswith("id,name,user,gpus,state,submit") and len(csv) == 4
    bad = c.cli("history", "--since", "yesterday", check=False)
    assert bad.returncode == 2 and "--since 'yesterday'" in bad.stderr


def test_every_route_needs_the_token_but_health(cluster):
    host, port = cluster.coordinator.url.split("//")[1].rsplit(":", 1)

    def get(path, token=None):
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", path, headers={"Authorization": f"bearer {token}"} if token else {})
        r = conn.getresponse()
        body = r.read()
        conn.close()
        return r.status, body

    for path in ("/v1/cluster", "/v1/cluster/jobs", "/v1/cluster/events", "/v1/jobs/x", "/v1/jobs/x/profiles"):
        status, body = get(path)
        assert status == 401 and b"bearer token" in body, (path, status, body)
    assert get("/v1/health")[0] == 200
    status, body = get("/v1/cluster", cluster.coordinator.token)  # the scheme is case-insensitive
    assert status == 200 and json.loads(body)["policy"] == "fifo"  # a plain GET answers JSON
    r = subprocess.run([sys.executable, "-m", "elastictrain", "status", "--coordinator", cluster.coordinator.url],
                       env={k: v for k, v in cluster.env().items() if k not in ("ET_TOKEN_FILE", "ET_TOKEN")},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "missing bearer token" in r.stderr


def test_a_users_quota_admits_its_jobs_one_at_a_time(tmp_path):
    """Slurm's MaxTRESPerUser / Kueue's quota habit: `users quota` caps what a user's jobs hold;
    the next job waits (saying why) and is admitted when the first ends."""
    c = Cluster(tmp_path, "fifo", "--quota-jobs", "5", nodes=1, slots=2).start()
    try:
        out = c.cli("users", "quota", "alice", "--gpus", "1").stdout
        assert "user alice: quota 1 GPU, 5 jobs" not in out and "user alice: quota 1 GPU" in out, out
        with open(os.path.join(c.tmp, "nap.py"), "w") as f:
            f.write("import time\ntime.sleep(1.5)\n")
        run = ("--user", "alice", "--gpus", "1", "--", "nap.py")
        a = c.cli("submit", "--name", "first", *run).stdout.strip()
        b = c.cli("submit", "--name", "second", *run).stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(a) == "running", 60, "the first job to run")
        waiting = c.client.cluster_job(b)
        assert waiting.status == "queued" and "waiting for user alice's quota (1 GPU, its own)" in waiting.reason
        assert "alice's quota" in c.cli("status", "--job", b).stdout  # one free slot, and still it waits
        users = c.cli("users", "list").stdout
        assert "quota" in users.splitlines()[1] and "1 GPU" in users, users
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(b) == "finished", 120, "the second job to finish")
        events = [e for e in c.client.events(0).events if e.job == b]
        kinds = [e.kind for e in events]
        assert kinds.index("quota_wait") < kinds.index("admitted") < kinds.index("start"), kinds
        first = c.client.cluster_job(a)
        assert first.status == "finished" and first.end_time <= c.client.cluster_job(b).start_time
        bad = c.cli("users", "quota", "alice", "--gpus", "0", check=False)
        assert bad.returncode == 2 and "gpus" in bad.stderr, bad.stderr
        vague = c.cli("users", "quota", "alice", check=False)  # which one is meant: said, not guessed
        assert vague.returncode == 2 and "or --unlimited, and/or --max-priority N; or --default alone" in vague.stderr
        out = c.cli("users", "quota", "alice", "--max-priority", "3").stdout  # the limits stay
        assert "user alice: quota 1 GPU; priority up to 3" in out, out
        both = c.cli("users", "quota", "alice", "--default", "--max-priority", "3", check=False)
        assert both.returncode == 2, both.stderr
        high = c.cli("users", "quota", "alice", "--max-priority", "1001", check=False)
        assert high.returncode == 2 and "max_priority" in high.stderr, high.stderr
        big = c.cli("submit", "--user", "alice", "--gpus", "2", "--", "nap.py", check=False)
        assert big.returncode == 2 and "lower --gpus to 1 or less" in big.stderr, big.stderr
    finally:
        c.stop()


def test_a_pipeline_with_after_hold_release_and_an_array(tmp_path):
    """Slurm's --dependency, --hold, --array and --time habits: `submit --after JOB`, `submit
    --hold`, `submit --begin`, `release`, `submit --array 0-2%1` (each task sees its index), `hold`, `release` and
    `cancel` of a whole array, a job stopped at its `--time` limit, `update` (scontrol update) of a
    running job's time limit and of an array's priority and begin time."""
    c = Cluster(tmp_path, "fifo", nodes=1, slots=2).start()
    try:
        with open(os.path.join(c.tmp, "nap.py"), "w") as f:
            f.write("import time\ntime.sleep(1.0)\n")
        prep = c.cli("submit", "--name", "prep", "--hold", "--", "nap.py").stdout.strip()
        train = c.cli("submit", "--name", "train", "--after", prep, "--", "nap.py").stdout.strip()
        assert "on hold" in c.cli("status", "--job", prep).stdout
        assert f"waiting for job {prep} to finish" in c.cli("status", "--job", train).stdout
        t0 = time.time()  # (the CLI reads its clock after this: its begin is at least t0 + 3)
        soon = c.cli("submit", "--begin", "now+3s", "--", "nap.py").stdout.strip()  # Slurm's --begin
        assert "waiting for its begin time (--begin)" in c.cli("status", "--job", soon).stdout
        assert c.cli("release", prep).stdout.startswith(f"job {prep} released")
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(train) == "finished", 60, "the pipeline to finish")
        assert c.client.cluster_job(prep).end_time <= c.client.cluster_job(train).start_time
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(soon) == "finished", 60, "the --begin job to run")
        began = c.client.cluster_job(soon)
        assert began.start_time >= t0 + 3.0 - 0.01, (t0, began.submit_time, began.start_time)
        waited = c.cli("submit", "--wait", "--", "nap.py")  # sbatch --wait: back once it ended, with its status
        job = waited.stdout.strip()
        assert waited.returncode == 0 and c.client.cluster_job(job).status == "finished", waited
        with open(os.path.join(c.tmp, "bad.py"), "w") as f:
            f.write("raise SystemExit(3)\n")
        waited = c.cli("submit", "-W", "--max-restarts", "0", "--", "bad.py", check=False)
        code = c.client.cluster_job(waited.stdout.strip()).exit_code  # etrun's, as torchrun's: 1 on a worker failure
        assert waited.returncode == code == 1 and "exited with code 3" in waited.stderr, (waited, code)
        late = c.cli("hold", train, check=False)
        assert late.returncode == 2 and "already finished" in late.stderr, late.stderr
        bad = c.cli("submit", "--after", "nope", "--", "nap.py", check=False)
        assert bad.returncode == 2 and "no scheduled job 'nope'" in bad.stderr, bad.stderr
        with open(os.path.join(c.tmp, "task.py"), "w") as f:
            f.write("import os\nopen('task-%s.txt' % os.environ['ET_ARRAY_TASK_ID'], 'w').write("
                    "os.environ['ET_ARRAY_JOB_ID'] + ' ' + os.environ['ET_ARRAY_TASK_COUNT'])\n")
        tasks = c.cli("submit", "--name", "sweep", "--array", "0-2%1", "--", "task.py").stdout.split()
        base = tasks[0].split("_")[0]
        assert tasks == [f"{base}_{i}" for i in range(3)], tasks
        c.wait(lambda st: all(j.status == "finished" for j in st.jobs if j.id in tasks), 60, "the array to finish")
        for i in range(3):
            with open(os.path.join(c.tmp, f"task-{i}.txt")) as f:
                assert f.read() == f"{base} 3"
        starts = sorted((c.client.cluster_job(t).start_time, c.client.cluster_job(t).end_time) for t in tasks)
        assert all(a[1] <= b[0] for a, b in zip(starts, starts[1:]))  # %1: one task at a time
        with open(os.path.join(c.tmp, "long.py"), "w") as f:
            f.write("import time\ntime.sleep(120)\n")
        slow = c.cli("submit", "--time", "0:02", "--", "long.py").stdout.strip()  # Slurm's MM:SS: 2 s
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(slow) == "failed" and all(n.used == 0 for n in
                                                                                      st.nodes), 60, "the timeout")
        assert re.match(r"TIMEOUT: it held its GPUs [23] s, its --time limit is 2 s", c.client.cluster_job(slow).reason)
        assert c.cli("submit", "--time", "soon", "--", "long.py", check=False).returncode == 2
        # scontrol update: a running job's time limit lowered below what it has held stops it now
        upd = c.cli("submit", "--time", "10:00", "--", "long.py").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(upd) == "running", 60, "the job to run")
        out = c.cli("update", upd, "--time", "0:01", "--priority", "3").stdout
        assert out.startswith(f"job {upd} updated: priority 3, time limit 1 s ("), out
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(upd) == "failed" and all(n.used == 0 for n in
                                                                                     st.nodes), 60, "the timeout")
        assert "its --time limit is 1 s" in c.client.cluster_job(upd).reason
        empty = c.cli("update", upd, check=False)
        assert empty.returncode == 2 and "nothing to change; give --priority N, --time LIMIT, --begin" in empty.stderr
        big = c.cli("update", upd, "--priority", "5000", check=False)
        assert big.returncode == 2 and "priority" in big.stderr and "1000" in big.stderr, big.stderr
        keep = c.cli("submit", "--", "long.py").stdout.strip()  # scontrol requeuehold: its slot freed until release
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(keep) == "running", 60, "the job to run")
        out = c.cli("requeue", keep, "--hold").stdout
        assert out.startswith(f"job {keep} requeued on hold"), out
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(keep) == "preempted" and all(n.used == 0 for n in
                                                                                         st.nodes), 60, "the stop")
        assert "on hold" in c.cli("status", "--job", keep).stdout
        c.cli("cancel", keep)
        gate = c.cli("submit", "--hold", "--", "nap.py").stdout.strip()
        waiting = c.cli("submit", "--after", gate, "--array", "0-1", "--", "task.py").stdout.split()
        base = waiting[0].split("_")[0]
        out = c.cli("hold", base).stdout  # scontrol hold ARRAY: every waiting task
        assert [line.split(":")[0] for line in out.splitlines()] == [f"job {t} held" for t in waiting], out
        assert all("on hold" in c.client.cluster_job(t).reason for t in waiting)
        out = c.cli("release", base).stdout
        assert [line.split(":")[0] for line in out.splitlines()] == [f"job {t} released" for t in waiting], out
        out = c.cli("update", base, "--priority", "-2").stdout  # an array's every task not ended
        assert out.splitlines() == [f"job {t} updated: priority -2, time limit none (queued)" for t in waiting], out
        out = c.cli("update", base, "--begin", "now+1h").stdout  # scontrol update StartTime=
        assert [re.sub(r"begin \S+ \S+", "begin T", line) for line in out.splitlines()] == [
            f"job {t} updated: priority -2, time limit none, begin T (queued)" for t in waiting], out
        assert "waiting for its begin time (--begin)" in c.cli("status", "--job", waiting[0]).stdout
        out = c.cli("update", base, "--begin", "now").stdout
        assert out.splitlines() == [f"job {t} updated: priority -2, time limit none (queued)" for t in waiting], out
        out = c.cli("update", base, "--gpus", "1:2").stdout  # scontrol update NumNodes=: elastic now
        assert out.splitlines() == [f"job {t} updated: priority -2, time limit none, gpus 1:2 (queued)"
                                    for t in waiting], out
        bad = c.cli("update", base, "--gpus", "two", check=False)
        assert bad.returncode == 2 and "give N, or MIN:MAX" in bad.stderr, bad.stderr
        again = c.cli("release", base, check=False)
        assert again.returncode != 0 and f"job array {base}: no task of its 2 is on hold" in again.stderr
        out = c.cli("cancel", base).stdout
        assert out.splitlines() == [f"job {t} cancelled" for t in waiting], out
        again = c.cli("cancel", base, check=False)  # every task ended: a 409 that says so, not a silent 0
        assert again.returncode != 0 and f"job array {base}: each of its 2 tasks has ended" in again.stderr, again
        c.cli("cancel", gate)
    finally:
        c.stop()


def test_a_projects_quota_is_shared_by_its_members(tmp_path):
    """Slurm's accounts (sacctmgr ... GrpTRES, sbatch -A): `projects set`, `submit -A`, a user's
    default project, `status` saying a job waits for its project, `projects list`."""
    c = Cluster(tmp_path, "fifo", nodes=1, slots=2).start()
    try:
        with open(os.path.join(c.tmp, "nap.py"), "w") as f:  # (long enough for the checks while alice's job runs,
            f.write("import time\ntime.sleep(10.0)\n")  # a dozen commands, under make test's parallel load)
        out = c.cli("projects", "set", "vision", "--gpus", "1", "--users", "alice,bob").stdout
        assert out.startswith("project vision set") and "alice,bob" in out, out
        a = c.cli("submit", "--user", "alice", "--", "nap.py").stdout.strip()  # her default project
        b = c.cli("submit", "--user", "bob", "-A", "vision", "--", "nap.py").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(a) == "running", 60, "alice's job to run")
        shown = c.cli("status", "--job", b).stdout
        assert "project vision" in shown and "waiting for project vision's quota (1 GPU)" in shown, shown
        listed = c.cli("projects", "list").stdout.splitlines()
        assert listed[1].split()[:7] == ["vision", "-", "1", "-", "1", "1", "1"], listed
        listed = c.cli("projects", "set", "vision", "--tickets", "2").stdout.splitlines()  # fair share by project
        row = listed[2].split()
        assert row[:7] == ["vision", "-", "1", "-", "1", "1", "1"] and row[8:] == ["2", "100.0%", "alice,bob"], \
            listed  # (the quota stays; only vision has jobs)
        bad = c.cli("projects", "set", "vision", "--tickets", "-1", check=False)
        assert bad.returncode == 2 and "tickets" in bad.stderr and ">= 0.0" in bad.stderr, bad.stderr
        # a member's own share in the project (Slurm's per-association fairshare)
        row = c.cli("projects", "set", "vision", "--users", "alice=3,bob", "--tickets", "2").stdout.splitlines()[2]
        assert row.split()[:7] == ["vision", "-", "1", "-", "1", "1", "1"] and row.split()[-1] == "alice=3,bob", row
        bad = c.cli("projects", "set", "vision", "--users", "alice=lots", check=False)
        assert bad.returncode == 2 and "a member's share is a number, as alice=3" in bad.stderr, bad.stderr
        other = c.cli("submit", "--user", "carol", "--hold", "--", "nap.py").stdout.strip()  # in no project
        ids = [line.split()[0] for line in c.cli("status", "-u", "bob", "-t", "PD").stdout.splitlines() if line]
        assert b in ids and a not in ids and other not in ids, ids  # squeue -u bob -t PD
        ids = [line.split()[0] for line in c.cli("status", "-A", "vision").stdout.splitlines() if line]
        assert a in ids and b in ids and other not in ids, ids
        assert [j["id"] for j in json.loads(c.cli("status", "--json", "--state", "running").stdout)["jobs"]] == [a]
        bad = c.cli("status", "--state", "sleeping", check=False)
        assert bad.returncode == 2 and "is not one of queued, running" in bad.stderr, bad.stderr
        c.cli("cancel", other)
        bad = c.cli("submit", "--user", "carol", "--account", "nope", "--", "nap.py", check=False)
        assert bad.returncode == 2 and "no project 'nope'" in bad.stderr, bad.stderr
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(b) == "finished", 60, "bob's job to run after")
        rows = [json.loads(r) for r in c.cli("history", "-A", "vision", "--format", "json").stdout.splitlines()]
        assert sorted((r["id"], r["project"]) for r in rows) == sorted([(a, "vision"), (b, "vision")]), rows
        rows = [json.loads(r) for r in c.cli("history", "-j", b, "--format", "json").stdout.splitlines()]
        assert [r["id"] for r in rows] == [b], rows  # sacct -j
        sums = {r["user"]: r for r in map(json.loads, c.cli("history", "--by", "user", "-A", "vision", "--format",
                                                              "json").stdout.splitlines())}  # sreport by account
        assert {u: (s["jobs"], s["finished"]) for u, s in sums.items()} == {"alice": (1, 1), "bob": (1, 1)}, sums
        assert sums["bob"]["wait_median"] > sums["alice"]["wait_median"]  # (bob waited for alice's job)
        heads = [line.split() for line in c.cli("status").stdout.splitlines() if line.startswith("id ")]
        assert heads and all(h[:4] == ["id", "name", "user", "project"] for h in heads), heads  # a column now
        assert c.client.cluster_job(a).end_time <= c.client.cluster_job(b).start_time
        c.cli("projects", "set", "research", "--gpus", "8")
        listed = c.cli("projects", "set", "vision", "--parent", "research").stdout.splitlines()  # a sub-project
        rows = {r.split()[0]: r.split() for r in listed[2:]}
        assert rows["vision"][1:3] == ["research", "1"] and rows["research"][1:3] == ["-", "8"], listed
        assert rows["research"][7] == rows["vision"][7], listed  # (its GPU-hours hold vision's)
        bad = c.cli("projects", "remove", "research", check=False)
        assert bad.returncode == 2 and "has sub-projects (vision)" in bad.stderr, bad.stderr
        assert "research" in c.cli("projects", "remove", "vision").stdout  # (its parent stays)
        assert c.cli("projects", "remove", "research").stdout.startswith("project research removed\nno projects")
    finally:
        c.stop()


def test_cancel_hold_and_release_act_on_every_job_their_filters_match(tmp_path):
    """scancel -u USER -t PD -n NAME, scancel ID ID: several jobs at once, by id or by filter; a job a
    filter matches in a state the verb does not apply to is left alone; an id that is not there is
    said and the rest go on."""
    c = Cluster(tmp_path, "fifo", nodes=1, slots=1).start()
    try:
        with open(os.path.join(c.tmp, "nap.py"), "w") as f:
            f.write("import time\ntime.sleep(60)\n")
        run = c.cli("submit", "--user", "alice", "--", "nap.py").stdout.strip()
        held = c.cli("submit", "--user", "alice", "--hold", "--", "nap.py").stdout.strip()
        b1 = c.cli("submit", "--user", "bob", "--hold", "--", "nap.py").stdout.strip()
        b2 = c.cli("submit", "--user", "bob", "--hold", "--name", "other", "--", "nap.py").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(run) == "running", 60, "alice's first job to run")
        out = c.cli("release", "-u", "alice").stdout  # her held job; the running one is no hold's business
        lines = out.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"job {held} released"), out
        out = c.cli("cancel", "-u", "bob", "-n", "other").stdout
        assert out.strip() == f"job {b2} cancelled", out
        me = pwd.getpwuid(os.geteuid()).pw_name  # (bob's login: a user's filters select its own jobs)
        c.cli("users", "add", "bob", "--unix-user", me, "--token-out", "bob.token",
              *(["--allow-root"] if os.geteuid() == 0 else []))
        out = subprocess.run([sys.executable, "-m", "elastictrain", "cancel", "-t", "PD"], capture_output=True,
                             text=True, timeout=60, cwd=c.tmp, env=dict(c.env(), ET_TOKEN_FILE="bob.token"))
        assert out.returncode == 0 and out.stdout.strip() == f"job {b1} cancelled", out
        out = c.cli("cancel", "-t", "PD").stdout  # the admin's: every waiting job, alice's released one
        assert out.strip() == f"job {held} cancelled", out
        assert c.cli("cancel", "--me", "-u", "nobody", "-t", "PD").stdout.strip() == "no job to cancel matches"
        bad = c.cli("cancel", run, "404", check=False)
        assert bad.returncode == 1 and f"job {run} cancelled" in bad.stdout and "job 404:" in bad.stderr, bad
        status = {j.id: j.status for j in c.client.cluster_status().jobs}
        assert [status[k] for k in (run, held, b1, b2)] == ["cancelled"] * 4, status
        bad = c.cli("cancel", check=False)
        assert bad.returncode == 2 and "give job ids, or filters (-u USER" in bad.stderr, bad.stderr
    finally:
        c.stop()


def test_quota_borrow_runs_a_job_over_its_quota_on_idle_slots(tmp_path):
    """Kueue's borrowing: with `--quota-borrow` a job over its user's quota runs on slots nobody
    within a quota wants, and `status` says it borrows."""
    c = Cluster(tmp_path, "fifo", "--quota-gpus", "1", "--quota-borrow", nodes=1, slots=2).start()
    try:
        with open(os.path.join(c.tmp, "nap.py"), "w") as f:
            f.write("import time\ntime.sleep(6.0)\n")  # (long enough for status to see both run)
        a = c.cli("submit", "--user", "alice", "--", "nap.py").stdout.strip()
        b = c.cli("submit", "--user", "alice", "--", "nap.py").stdout.strip()
        c.wait(lambda st: all({j.id: j.status for j in st.jobs}.get(k) in ("running", "finished") for k in (a, b)),
               60, "both of alice's jobs to run")
        assert "borrowing" in c.cli("status", "--job", b).stdout
        c.wait(lambda st: all({j.id: j.status for j in st.jobs}.get(k) == "finished" for k in (a, b)), 60, "the end")
        kinds = [e.kind for e in c.client.events(0).events if e.job == b]
        assert "borrow" in kinds and "quota_wait" not in kinds, kinds
    finally:
        c.stop()


def test_a_forecast_start_comes_true(tmp_path):
    """`status --start` on real jobs: the queued job starts about when the forecast said (its wait
    is the running job's steps left at its measured step time)."""
    c = Cluster(tmp_path, "fifo", nodes=1, slots=2).start()
    try:
        a = c.cli("submit", "--gpus", "2", "--steps", "60", "--", WORKER, "--epochs", "2", "--step-sleep", "0.15",
                  "--ckpt-dir", "ck-a", "--out", "a.json").stdout.strip()
        c.wait(lambda st: {j.id: j.step for j in st.jobs}.get(a, 0) >= 20, 120, "a to train 20 steps")
        b = c.cli("submit", "--gpus", "2", "--steps", "10", "--", WORKER, "--ckpt-dir", "ck-b",
                  "--out", "b.json").stdout.strip()
        f = json.loads(c.cli("status", "--start", "--json", b).stdout)
        predicted, asked = f["jobs"][0]["start"], f["now"]
        assert predicted is not None and predicted > asked, f
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(b) in ("running", "finished"), 120, "b to start")
        actual = c.client.cluster_job(b).start_time
        print(f"forecast: asked at {asked:.2f}, start predicted in {predicted - asked:.2f} s, came in {actual - asked:.2f} s")
        assert abs(actual - predicted) <= max(3.0, 0.3 * (predicted - asked)), (asked, predicted, actual)
    finally:
        c.stop()


def test_a_job_runs_only_on_nodes_of_the_gpu_type_it_asks_for(tmp_path):
    """Slurm's --gres=gpu:a100:2 (and --gpu-type): a job goes only to nodes of its type, waits for
    them while other nodes idle (status says so), and a type no node has is refused with the fix."""
    c = Cluster(tmp_path, "srtf", nodes=2, slots=2, node_types=("NVIDIA-A100-SXM4", "Tesla-V100")).start()
    try:
        _nap(c)
        nodes = c.cli("nodes", "list").stdout.splitlines()  # sinfo -N
        assert nodes[0].split()[:4] == ["node", "state", "kind", "type"], nodes
        assert {r.split()[0]: r.split()[3] for r in nodes[1:]} == {"n1": "NVIDIA-A100-SXM4", "n2": "Tesla-V100"}, nodes
        v1 = c.cli("submit", "--gres", "gpu:v100:2", "--", "nap.py", "15").stdout.strip()  # (long: status sees v2 wait)
        v2 = c.cli("submit", "--gpu-type", "V100", "--", "nap.py").stdout.strip()  # (a word of it, any case)
        a = c.cli("submit", "--gres", "gpu:a100:1", "--", "nap.py").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(v1) == "running", 60, "the V100 job to run")
        shown = c.cli("status", "--job", v2).stdout
        assert "GPU type V100" in shown and "waiting for 1 V100 slots: 0 of 2 free" in shown, shown
        assert "1 (V100)" in c.cli("status").stdout
        w = c.cli("submit", "--gpu-type", "v100", "--", "nap.py").stdout.strip()  # waits too, then runs anywhere:
        out = c.cli("update", w, "--gpu-type", "any").stdout  # (scontrol update Gres=)
        assert re.search(rf"job {w} updated: .*, gpus 1 \((queued|running)\)", out), out  # (no type now)
        bad = c.cli("update", v1, "--gpu-type", "a100", check=False)
        assert bad.returncode == 2 and "a GPU type applies to a waiting job" in bad.stderr, bad.stderr
        c.wait(lambda st: all({j.id: j.status for j in st.jobs}.get(k) == "finished" for k in (v1, v2, a, w)), 90,
               "every job to finish")
        ran: dict = {}  # job -> the nodes its tasks were launched on
        for e in c.client.events(0).events:
            if e.kind == "launch":
                ran.setdefault(e.job, set()).add(e.node)
        assert ran.get(v1) == {"n2"} and ran.get(v2) == {"n2"} and ran.get(a) == {"n1"}, ran
        assert ran.get(w) == {"n1"}, ran
        assert c.client.cluster_job(v1).end_time <= c.client.cluster_job(v2).start_time  # it waited for n2
        bad = c.cli("submit", "--gpu-type", "h100", "--", "nap.py", check=False)
        assert bad.returncode == 2 and "no node has GPU type 'h100' (the nodes' types: NVIDIA-A100-SXM4, " \
            "Tesla-V100)" in bad.stderr, bad.stderr
        bad = c.cli("submit", "--gres", "gpu:a100:3", "--", "nap.py", check=False)
        assert bad.returncode == 2 and "needs 3 GPUs of type a100 but the nodes have 2" in bad.stderr, bad.stderr
        bad = c.cli("submit", "--gres", "gpu:a100:3", "--gpus", "2", "--", "nap.py", check=False)
        assert bad.returncode == 2 and "--gres asks for 3 GPU(s) and --gpus for 2" in bad.stderr, bad.stderr
        bad = c.cli("submit", "--gres", "tpu:4", "--", "nap.py", check=False)
        assert bad.returncode == 2 and "use gpu:N or gpu:TYPE:N" in bad.stderr, bad.stderr
        # alternatives (Slurm's --constraint "a100|h100"): any of the types, a gang may span them
        either = c.cli("submit", "--gpu-type", "h100|v100", "--gpus", "2", "--", "nap.py", "0.5").stdout.strip()
        mixed = c.cli("submit", "--gpu-type", "a100|v100", "--gpus", "3", "--", "nap.py", "0.5").stdout.strip()
        c.wait(lambda st: all({j.id: j.status for j in st.jobs}.get(k) == "finished" for k in (either, mixed)), 90,
               "the jobs of either type to finish")
        ran = {}
        for e in c.client.events(0).events:
            if e.kind == "launch":
                ran.setdefault(e.job, set()).add(e.node)
        assert ran.get(either) == {"n2"} and ran.get(mixed) == {"n1", "n2"}, ran
        bad = c.cli("submit", "--gpu-type", "a100||v100", "--", "nap.py", check=False)
        assert bad.returncode == 2 and "or up to 8 such names joined by | for any of them" in bad.stderr, bad.stderr
        # in brackets (Slurm's -C "[a100|v100]"): all of it on one type, so 3 fit on neither
        bad = c.cli("submit", "-C", "[a100|v100]", "--gpus", "3", "--", "nap.py", check=False)
        assert bad.returncode == 2 and "needs 3 GPUs of type [a100|v100] but the nodes have 2" in bad.stderr, \
            bad.stderr
        one = c.cli("submit", "-C", "[h100|v100]", "--gpus", "2", "--", "nap.py", "0.5").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(one) == "finished", 90, "the one-type job")
        assert {e.node for e in c.client.events(0).events if e.kind == "launch" and e.job == one} == {"n2"}
    finally:
        c.stop()


def test_backfill_lets_a_short_job_pass_a_blocked_one_and_says_why_a_long_one_waits(tmp_path):
    """Slurm's sched/backfill: with `--policy backfill` a job that does not fit gets a reservation
    from the running jobs' --time; a short job behind it starts now, a long one waits, and status
    says which reservation each stands behind."""
    c = Cluster(tmp_path, "backfill", nodes=1, slots=3).start()
    try:
        _nap(c)
        a = c.cli("submit", "--gpus", "2", "--time", "1:00", "--", "nap.py", "60").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(a) == "running", 60, "the first job to run")
        big = c.cli("submit", "--gpus", "3", "--time", "0:30", "--", "nap.py", "1").stdout.strip()
        long = c.cli("submit", "--gpus", "1", "--time", "10:00", "--", "nap.py", "60").stdout.strip()
        short = c.cli("submit", "--gpus", "1", "--time", "0:20", "--", "nap.py", "1").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(short) in ("running", "finished"), 60,
               "the short job to start ahead of the blocked one")
        st = {j.id: j for j in c.client.cluster_status().jobs}
        assert st[big].status == "queued" and st[long].status == "queued", {k: v.status for k, v in st.items()}
        assert st[big].reason.startswith("reserved (backfill): it starts in about "), st[big].reason
        assert st[long].reason.startswith(f"behind job {big}'s reservation (backfill"), st[long].reason
        assert "policy: reservation 3 GPUs (backfill)" in c.cli("status", "--job", big).stdout
        kinds = [(e.kind, e.job) for e in c.client.events(0).events if e.kind == "plan"]
        assert ("plan", short) in kinds, kinds  # the backfilled start is in the event log
        c.cli("cancel", a, big, long)
    finally:
        c.stop()


def test_backfill_grows_a_running_elastic_job_onto_gpus_freed_and_loses_no_sample(tmp_path):
    """An elastic job (--gpus 1:3) starts on the one GPU free beside a rigid job; when that job
    ends, backfill --grow grows it to 3 workers (nothing waits: no reservation to keep): a
    checkpointed restart at the new size, in the event log with why, and every sample is trained
    exactly once."""
    c = Cluster(tmp_path, "backfill", "--grow", nodes=1, slots=3).start()
    try:
        _nap(c)
        a = c.cli("submit", "--gpus", "2", "--time", "0:30", "--", "nap.py", "6").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(a) == "running", 60, "the rigid job to run")
        b = c.cli("submit", "--gpus", "1:3", "--steps", "300", "--", WORKER, "--ckpt-dir", "ck-grow", "--out",
                  "grow.json", "--samples", "6000", "--step-sleep", "0.1").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(b) == "finished", 240, "the elastic job to finish")
        events = c.client.events(0).events
        grow = [e.detail for e in events if e.job == b and e.kind == "plan" and e.detail.get("decision") == "grow"]
        resizes = [e.detail.get("workers") for e in events if e.job == b and e.kind == "resize"]
        assert grow and "grown from 1 to 3 workers" in grow[0]["why"], [(e.kind, e.detail) for e in events
                                                                          if e.job == b]
        assert resizes == [3], resizes
        with open(os.path.join(c.tmp, "grow.json")) as f:
            out = json.load(f)
        assert out["min"] == 1 and out["max"] == 1, out  # every sample exactly once across the resize
    finally:
        c.stop()


def test_history_by_user_over_a_period_counts_the_gpu_time_that_fell_within_it(tmp_path):
    """sreport's usage by account over a period: bob's job was submitted before the period but
    trained into it, so its GPU-hours within it count (jobs: 0, submitted before); alice's job ended
    before it, so she is not in it; without a period each job counts whole."""
    c = Cluster(tmp_path, "fifo", nodes=1, slots=2).start()
    try:
        with open(os.path.join(c.tmp, "steps.py"), "w") as f:
            f.write("import sys, time\nimport elastictrain as et\njob = et.init()\nt0 = time.time()\n"
                    "step = 0\nwhile time.time() - t0 < float(sys.argv[1]):\n"
                    "    step += 1\n    job.report_step(step)\n    time.sleep(0.1)\n")
        a = c.cli("submit", "--user", "alice", "--", "steps.py", "2").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(a) == "finished", 60, "alice's job")
        b = c.cli("submit", "--user", "bob", "--gpus", "2", "--", "steps.py", "6").stdout.strip()
        c.wait(lambda st: {j.id: j for j in st.jobs}[b].attained_gpu > 0, 60, "bob's job to train")
        time.sleep(1.0)
        since = int(time.time()) + 1  # (a whole second: the period's start as a date says it)
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(b) == "finished", 60, "bob's job")
        whole = {r["user"]: r for r in map(json.loads, c.cli("history", "--by", "user", "--format",
                                                              "json").stdout.splitlines())}
        assert whole["alice"]["gpu_hours"] > 0 and whole["bob"]["jobs"] == 1, whole
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
        part = {r["user"]: r for r in map(json.loads, c.cli("history", "--by", "user", "-S", start, "--format",
                                                             "json").stdout.splitlines())}
        assert set(part) == {"bob"} and part["bob"]["jobs"] == 0 and part["bob"]["share"] == 1.0, part
        end = c.client.cluster_job(b).end_time
        assert part["bob"]["gpu_hours"] == pytest.approx((end - since) * 2 / 3600, abs=0.6 * 2 / 3600), (part, end)
        assert part["bob"]["gpu_hours"] < whole["bob"]["gpu_hours"]
        bad = c.cli("history", "--by", "user", "-S", start, "-E", "1d", check=False)
        assert bad.returncode == 2 and "is not after --since" in bad.stderr, bad.stderr
        out = c.cli("history", "--by", "user", "-E", start).stdout  # (jobs submitted before: both; use before)
        assert "alice" in out and "bob" in out, out
    finally:
        c.stop()


def test_multifactor_shows_each_waiting_jobs_priority_and_takes_users_tickets(tmp_path):
    """Slurm's sprio: under `--policy multifactor` a waiting job's status shows its priority and the
    weighted factors; `users set --tickets` gives the fair-share factor its shares."""
    c = Cluster(tmp_path, "multifactor", nodes=1, slots=1).start()
    try:
        _nap(c)
        a = c.cli("submit", "--user", "alice", "--time", "1:00", "--", "nap.py", "60").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(a) == "running", 60, "alice's job to run")
        c.cli("users", "set", "bob", "--tickets", "3")
        b = c.cli("submit", "--user", "bob", "--priority", "-1000", "--time", "0:10", "--", "nap.py",
                  "1").stdout.strip()
        c.wait(lambda st: "priority" in {j.id: j.info for j in st.jobs}.get(b, {}), 60, "bob's job to be ranked")
        out = c.cli("status", "--job", b).stdout
        m = re.search(r"policy: priority (\d+) \(age (\d+), fairshare (\d+), size (\d+), qos (\d+)\)", out)
        assert m, out
        # bob used nothing: fair share 10000; 1 slot of 1: size 1000; priority -1000: qos 0
        assert [int(x) for x in m.groups()[2:]] == [10000, 1000, 0], out
        assert "reservation 1 GPUs (backfill)" in out, out
        # sshare: alice used all the GPU time, bob none; bob holds 3 of the 4 tickets
        rows = {r.split()[0]: r.split() for r in c.cli("users", "list").stdout.splitlines()[2:]}
        assert rows["alice"][-2:] == ["100.0%", "0.062"] and rows["bob"][-2:] == ["0.0%", "1.000"], rows
        c.cli("cancel", a, b)
    finally:
        c.stop()


def test_a_planned_maintenance_keeps_long_jobs_off_the_node_and_cordons_it_when_it_begins(tmp_path):
    """Slurm's flags=maint reservation: `nodes drain NAME --at TIME --for S` plans a window; until it
    begins backfill starts nothing there that would still run then (a short job may), and at its
    start the node is cordoned for its length (and drained)."""
    c = Cluster(tmp_path, "backfill", nodes=2, slots=1).start()
    try:
        _nap(c)
        out = c.cli("nodes", "drain", "n1", "--at", "now+14", "--for", "60", "--reason", "BIOS update").stdout
        assert out.startswith("node n1: maintenance planned from ") and "its jobs are requeued then" in out, out
        assert "node n1: maintenance planned from" in c.cli("nodes", "list").stdout
        long = c.cli("submit", "--time", "10:00", "--", "nap.py", "60").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(long) == "running", 60, "the long job to run")
        assert {n.name for n in c.client.cluster_status().nodes if long in n.jobs} == {"n2"}  # (n1 comes first)
        # (its --time leaves room for etrun's start on a loaded machine, and still ends before the window)
        short = c.cli("submit", "--time", "0:07", "--", "nap.py", "1").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(short) == "finished", 60, "the short job on n1")
        c.wait(lambda st: next(n for n in st.nodes if n.name == "n1").cordoned_until > 0, 30, "the window to begin")
        n1 = next(n for n in c.client.cluster_status().nodes if n.name == "n1")
        assert n1.cordon_why == "maintenance: BIOS update" and not n1.maint_start, n1
        kinds = [(e.kind, e.node) for e in c.client.events(0).events if e.kind.startswith("node_")]
        assert ("node_maintenance_planned", "n1") in kinds and kinds[-1] == ("node_cordoned", "n1"), kinds
        bad = c.cli("nodes", "drain", "n2", "--at", "someday", check=False)
        assert bad.returncode != 0 and "--at 'someday': give now+SPAN" in bad.stderr, bad.stderr
        c.cli("cancel", long)
    finally:
        c.stop()


def test_a_job_posts_its_notifications_to_a_webhook(tmp_path):
    """Slurm's --mail-type=ALL as a webhook: the coordinator posts the job's start and end to a real
    HTTP server, as Slack's incoming webhooks take them; a URL it does not allow is refused."""
    import http.server
    import threading

    got = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/services/T0/B0/secret"
    c = Cluster(tmp_path, "fifo", "--notify-allow", "http://127.0.0.1:*", nodes=1, slots=1).start()
    try:
        _nap(c)
        a = c.cli("submit", "--name", "nap", "--notify", url, "--notify-on", "all", "--", "nap.py", "1").stdout.strip()
        c.wait(lambda st: {j.id: j.status for j in st.jobs}.get(a) == "finished", 60, "the job to finish")
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [(g["job"], g["event"], g["status"]) for g in got] == [(a, "begin", "running"), (a, "end", "finished")]
        assert got[1]["text"] == f"elastictrain job {a} (nap) of default: finished" and got[1]["exit_code"] == 0
        bad = c.cli("submit", "--notify", "http://169.254.169.254/latest", "--", "nap.py", check=False)
        assert bad.returncode != 0 and "not among the URLs this coordinator posts to" in bad.stderr, bad.stderr
    finally:
        c.stop()
        srv.shutdown()
        srv.server_close()
