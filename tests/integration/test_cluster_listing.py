"""Job listings on a real coordinator process: ``GET /v1/cluster`` and ``/v1/cluster/jobs`` list
every job that has not ended and the 1000 (or ``ended=N``) that ended last, say how many ended
jobs they left out, take an array and a period, refuse a bad query with a 400 and its reason;
``GET /v1/jobs?scheduled=0`` leaves out the scheduler's jobs (and comes in pages too); ``elastictrain status`` asks for
the last 10 ended jobs and says how many more there are; squeue's filters (-u, -t, -A, -n) are the
coordinator's, so a filtered status shows the last 10 ended jobs it matches; a listing comes in pages
(limit=N, after=JOB), which the client joins."""

import http.client
import os
import re
import subprocess
import sys

import pytest

from elastictrain import CoordinatorClient
from elastictrain.coordinator.process import CoordinatorProcess
from elastictrain.wire import JobSubmit

from .test_coordinator_bad_input import raw


@pytest.fixture
def cluster(tmp_path):
    proc = CoordinatorProcess(str(tmp_path / "c.db"), str(tmp_path / "token"), log_file=str(tmp_path / "c.log"),
                              extra_args=("--policy", "fifo"))
    proc.start()
    client = CoordinatorClient(proc.url, proc.token, timeout=10.0, retry_for=10.0)
    try:
        yield proc, client
    finally:
        client.close()
        proc.stop()


def test_listings_keep_the_last_ended_jobs_and_say_how_many_they_left_out(cluster, tmp_path):
    proc, c = cluster
    tasks = []
    for _ in range(2):  # 2,000 ended tasks, then 3 waiting jobs
        arr = c.submit_array(JobSubmit(["sweep.py"], str(tmp_path), array="0-999", hold=True)).jobs
        tasks += [j.id for j in arr]
        for j in arr:
            c.cancel(j.id)
    waiting = [c.submit(JobSubmit(["train.py"], str(tmp_path))).id for _ in range(3)]
    st = c.cluster_status()
    assert len(st.jobs) == 1003 and st.ended_omitted == 1000
    assert [j.id for j in st.jobs] == tasks[1000:] + waiting  # the last 1000 to end, in submission order
    st = c.cluster_status(ended=5)
    assert [j.id for j in st.jobs] == tasks[-5:] + waiting and st.ended_omitted == 1995
    assert len(c.cluster_jobs(ended="all").jobs) == 2003 and c.cluster_jobs(ended=0).ended_omitted == 2000
    base = tasks[0].split("_")[0]
    assert [j.id for j in c.cluster_jobs(ended="all", array=base).jobs] == tasks[:1000]
    t = c.cluster_job(waiting[0]).submit_time
    assert [j.id for j in c.cluster_jobs(ended="all", since=t).jobs] == waiting
    for query, word in (("ended=-1", "'ended' must be a whole number"), ("ended=lots", "'ended' must be a whole"),
                        ("array=..%2F", "'array': job name '../' is invalid"), ("since=yesterday", "'since' must")):
        for path in ("/v1/cluster", "/v1/cluster/jobs"):
            code, body = raw(proc, "GET", f"{path}?{query}")
            assert code == 400 and word in body["reason"], (path, query, body)
    code, body = raw(proc, "GET", "/v1/jobs?scheduled=maybe")
    assert code == 400 and "'scheduled' must be 0 or 1" in body["reason"]
    text = _metrics(proc)
    frozen = float(re.search(r"^elastictrain_gc_frozen_objects (\S+)$", text, re.M).group(1))
    assert frozen > 10_000  # the state loaded at start (and what the imports made) is out of the collector's sight

    env = dict(os.environ, ET_COORDINATOR=proc.url, ET_TOKEN_FILE=str(tmp_path / "token"))
    out = subprocess.run([sys.executable, "-m", "elastictrain", "status"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "1990 earlier ended job(s) not shown: `status --all`, or `history`" in out.stdout
    assert tasks[-1] in out.stdout and tasks[-11] not in out.stdout and waiting[0] in out.stdout
    out = subprocess.run([sys.executable, "-m", "elastictrain", "status", "--all"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert tasks[0] in out.stdout and "not shown" not in out.stdout


def test_the_job_list_without_the_schedulers_jobs_and_in_pages(cluster, tmp_path):
    proc, c = cluster
    c.create_job("lib-job", 1, 4)
    sched = c.submit(JobSubmit(["train.py"], str(tmp_path))).id
    c.create_job(sched, 1, 4)  # (as etrun does when the scheduler starts it)
    assert {j.job for j in c.jobs()} == {"lib-job", sched}
    code, body = raw(proc, "GET", "/v1/jobs?scheduled=0")
    assert code == 200 and [j["job"] for j in body["jobs"]] == ["lib-job"]
    names = sorted(f"lib-{i:02d}" for i in range(23)) + ["lib-job"]
    for name in names[:-1]:
        c.create_job(name, 1, 2)
    assert [j.job for j in c.jobs(page=5)] == sorted(names + [sched]) == [j.job for j in c.jobs(page=None)]
    code, body = raw(proc, "GET", "/v1/jobs?scheduled=0&limit=10")
    assert code == 200 and [j["job"] for j in body["jobs"]] == names[:10] and body["next"] == names[9]
    code, body = raw(proc, "GET", f"/v1/jobs?scheduled=0&limit=10&after={names[19]}")
    assert code == 200 and [j["job"] for j in body["jobs"]] == names[20:] and body.get("next", "") == ""
    for query, word in (("limit=0", "'limit' must be 1 to 100000"), ("after=a%2Fb", "'after': job name 'a/b'")):
        code, body = raw(proc, "GET", f"/v1/jobs?{query}")
        assert code == 400 and word in body["reason"], (query, body)


def test_a_filtered_listing_is_made_by_the_coordinator(cluster, tmp_path):
    proc, c = cluster
    alice = [c.submit(JobSubmit(["prep.py"], str(tmp_path), user="alice", hold=True)).id for _ in range(14)]
    bob = [c.submit(JobSubmit(["eval.py"], str(tmp_path), user="bob", hold=True)).id for _ in range(3)]
    for j in alice[:12] + bob[:1]:
        c.cancel(j)
    st = c.cluster_status(ended=3, user="alice")
    assert [j.id for j in st.jobs] == alice[9:] and st.ended_omitted == 9  # her last 3 ended (not bob's) and the rest
    assert [j.id for j in c.cluster_jobs(ended="all", user=["alice", "bob"], state="PD").jobs] == alice[12:] + bob[1:]
    assert [j.id for j in c.cluster_jobs(ended=0, name="eval").jobs] == bob[1:]
    assert c.cluster_jobs(ended="all", state="r").jobs == [] and c.cluster_jobs(project="none-yet").jobs == []
    for query, word in (("state=sleeping", "'state': state 'sleeping' is not one of queued"),
                        ("user=..%2F", "'user': user name '../' is invalid"), ("state=,", "at least one state"),
                        ("name=a,%20b", "'name': job name ' b' is invalid"), ("project=p%00", "'project'")):
        code, body = raw(proc, "GET", f"/v1/cluster/jobs?{query}")
        assert code == 400 and word in body["reason"], (query, body)

    env = dict(os.environ, ET_COORDINATOR=proc.url, ET_TOKEN_FILE=str(tmp_path / "token"))
    out = subprocess.run([sys.executable, "-m", "elastictrain", "status", "-u", "alice"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "2 earlier ended job(s) not shown" in out.stdout  # 12 of hers ended: the last 10 shown
    rows = [row.split() for row in out.stdout.splitlines()]
    ids = [r[0] for r in rows if r[1:3] in (["prep", "alice"], ["eval", "bob"])]
    assert alice[2] in ids and alice[1] not in ids and bob[2] not in ids, out.stdout


def test_a_listing_comes_in_pages_the_client_joins(cluster, tmp_path):
    proc, c = cluster
    tasks = [j.id for j in c.submit_array(JobSubmit(["sweep.py"], str(tmp_path), array="0-24", hold=True)).jobs]
    for j in tasks[:20]:
        c.cancel(j)
    whole = c.cluster_status(ended=12, page=None)
    assert whole.next == "" and len(whole.jobs) == 17 and whole.ended_omitted == 8
    for page in (1, 7, 17, 2000):
        st = c.cluster_status(ended=12, page=page)
        assert ([j.id for j in st.jobs], st.ended_omitted, st.next) == ([j.id for j in whole.jobs], 8, "")
        assert [j.id for j in c.cluster_jobs(ended="all", page=page).jobs] == tasks
    code, body = raw(proc, "GET", "/v1/cluster?ended=all&limit=10")
    assert code == 200 and [j["id"] for j in body["jobs"]] == tasks[:10] and body["next"] == tasks[9]
    code, body = raw(proc, "GET", f"/v1/cluster/jobs?ended=all&limit=10&after={tasks[19]}")
    assert code == 200 and [j["id"] for j in body["jobs"]] == tasks[20:] and body.get("next", "") == ""
    for query, word in (("limit=0", "'limit' must be 1 to 100000"), ("limit=100001", "'limit' must be 1 to 100000"),
                        ("limit=ten", "'limit' must be a whole number"), ("after=nope", "'after': no job 'nope' here"),
                        ("after=..%2F", "'after': job name '../' is invalid")):
        for path in ("/v1/cluster", "/v1/cluster/jobs"):
            code, body = raw(proc, "GET", f"{path}?{query}")
            assert code == 400 and word in body["reason"], (path, query, body)


def _metrics(proc) -> str:
    host, port = proc.url.split("//")[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {proc.token}"})
    text = conn.getresponse().read().decode()
    conn.close()
    return text
