"""GET /ui serves the status page without a token (it holds no data), and every API read the
page's script makes answers JSON to a browser-style request with the bearer token."""

import json
import re
import time
import urllib.request


def _get(url, token=None):
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return r.status, r.headers.get("content-type", ""), r.read()


def test_the_status_page_and_the_reads_it_makes(coordinator, client):
    status, ctype, body = _get(coordinator.url + "/ui")
    assert status == 200 and ctype.startswith("text/html")
    page = body.decode()
    assert '<script src="/ui/app.js"></script>' in page and "<script>" not in page  # no inline script
    status, ctype, body = _get(coordinator.url + "/ui/app.js")
    assert status == 200 and ctype.startswith("text/javascript")
    page = body.decode()
    assert "Authorization" in page
    client.create_job("web", 1, 2)
    client.register_dataset("web", __import__("elastictrain").DatasetSpec("train", 100, 10))
    paths = set(re.findall(r'get\("(/v1/[a-z]+(?:\?[^"]*)?)"\)', page))
    assert {"/v1/jobs?scheduled=0", "/v1/cluster?ended=30"} <= paths, paths
    for path in ("/v1/jobs", "/v1/jobs?scheduled=0"):
        status, ctype, body = _get(coordinator.url + path, coordinator.token)
        jobs = json.loads(body)["jobs"]
        assert ctype.startswith("application/json") and [j["job"] for j in jobs] == ["web"]
    for path in ("/v1/jobs/web", "/v1/jobs/web/datasets/train", "/v1/jobs/web/resources"):
        status, ctype, body = _get(coordinator.url + path, coordinator.token)
        assert status == 200 and ctype.startswith("application/json"), path
        json.loads(body)
    try:
        _get(coordinator.url + "/v1/jobs")  # the data still needs the token
        raise AssertionError("an unauthenticated read was answered")
    except urllib.error.HTTPError as exc:
        assert exc.code == 401


def test_the_page_script_renders_live_data(tmp_path, coordinator, client):
    """The page's own script, run by node against this coordinator with a minimal DOM."""
    import os
    import shutil
    import subprocess

    import pytest

    from elastictrain.coordinator.ui import APP_JS
    from elastictrain.wire import ResourceReport, ResourceSample

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the page's script is checked only by the test above")
    script = tmp_path / "page.js"
    script.write_text(APP_JS.decode())
    client.create_job("web", 1, 2)
    client.register_dataset("web", __import__("elastictrain").DatasetSpec("train", 100, 10))
    client.report_resources("web", ResourceReport(0, [ResourceSample(1.0, 97.0, 300 * 2**20, step=5, step_time=0.25,
                                                                     gpu_absent="no GPU on this machine")]))
    harness = os.path.join(os.path.dirname(__file__), "ui_harness.js")
    r = subprocess.run([node, harness, str(script), coordinator.url, coordinator.token, "web"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["err"] == "", out
    assert "<td>web</td>" in out["jobs"]
    assert "no scheduling policy" in out["cluster"]
    assert "<td>train</td>" in out["job"] and "<td>97</td>" in out["job"] and "300 MiB" in out["job"]
    assert "0.250 s" in out["job"] and "no GPU on this machine" in out["job"]


def test_the_page_shows_users_tickets_and_shares_in_cluster_mode(tmp_path):
    """With a ticket policy: the users' table (tickets set and default, entitlement) on the page."""
    import os
    import shutil
    import subprocess

    import pytest

    from elastictrain import CoordinatorClient
    from elastictrain.coordinator.process import CoordinatorProcess
    from elastictrain.coordinator.ui import APP_JS
    from elastictrain.wire import JobSubmit, NodeRegister

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the page's script is checked only by the test above")
    script = tmp_path / "page.js"
    script.write_text(APP_JS.decode())
    proc = CoordinatorProcess(str(tmp_path / "coord.db"), str(tmp_path / "token"),
                              log_file=str(tmp_path / "coordinator.log"), extra_args=("--policy", "gandiva-fair"))
    proc.start()
    try:
        c = CoordinatorClient(proc.url, proc.token, timeout=5.0, retry_for=10.0)
        c.set_user("alice", 3.0)
        ids = [c.submit(JobSubmit(["train.py"], str(tmp_path), user=user)).id for user in ("alice", "bob")]
        # no node yet: the queue's expected start is unknown ("-"), and the job page says why it waits
        harness = os.path.join(os.path.dirname(__file__), "ui_harness.js")
        r = subprocess.run([node, harness, str(script), proc.url, proc.token, ids[0]], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["err"] == "", out
        cluster = out["cluster"]
        assert "policy gandiva-fair" in cluster and "<td>alice</td><td>3</td><td>75.0%</td>" in cluster, cluster
        assert "<td>bob</td><td>1 (default)</td><td>25.0%</td>" in cluster, cluster
        # a job's page: why it waits, its restarts as `elastictrain history` counts them, the log tail
        # (which the page scrolls to its end) -- issue 32.6
        job = out["job"]
        assert "queued: no node is up to run it" in job and "restarts -" in job and '<pre id="logtail">' in job, job
        assert "<th>expected start</th>" in out["queue"] and out["queue"].count("<td>-</td>") >= 2, out["queue"]
        # a node of 1 slot: one job runs, and the other's expected start is the policy's (a quantum later)
        c.node_register("n1", NodeRegister(1, "i1", "slot"))
        for _ in range(50):
            if sum(j.status == "running" for j in c.cluster_status().jobs) == 1:
                break
            time.sleep(0.1)
        time.sleep(0.5)
        r = subprocess.run([node, harness, str(script), proc.url, proc.token, ids[0]], capture_output=True, text=True,
                           timeout=60)
        queue = json.loads(r.stdout)["queue"]
        assert re.search(r"<td>in (\d+s|1m)</td>", queue), queue  # gandiva-fair: its turn within a 60 s quantum
        c.close()
    finally:
        proc.stop()
