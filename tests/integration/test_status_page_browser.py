"""The status page in a real browser: headless Chromium (Debian's `chromium`; `make test` installs
it where it can) loads /ui from a coordinator running muri-s with two node daemons and three jobs,
two of them interleaved in one group. The test reads the page as the browser rendered it (its
DOM after the script ran against the API) and writes a screenshot under the test's temp dir."""

import os
import re
import shutil
import subprocess
import time

import pytest

from elastictrain.launcher.local_cluster import LocalCluster as Cluster
from elastictrain.wire import JobSubmit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MURI_JOB = os.path.join(ROOT, "examples", "torch_muri_job.py")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def browse(url: str, *args: str) -> str:
    cmd = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--virtual-time-budget=6000", "--window-size=1280,2600", *args, url]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed: `apt-get install chromium` (make test does)")
def test_the_status_page_in_headless_chromium(tmp_path):
    with Cluster(tmp_path, "muri-s", nodes=2, slots=1) as c:
        ids = []
        # 1500 steps: none ends before the page is read (the users table counts 3 GPUs admitted)
        for name, stages in (("io", (60, 0, 8)), ("gpu", (4, 0, 60)), ("cpu", (4, 40, 8))):
            args = [MURI_JOB, "--steps", "1500", "--load-ms", str(stages[0]), "--cpu-ms", str(stages[1]),
                    "--compute-ms", str(stages[2]), "--ckpt-dir", os.path.join(c.tmp, f"ckpt-{name}"),
                    "--out", os.path.join(c.tmp, f"{name}.json")]
            given = {"load": stages[0] / 1000, "preprocess": stages[1] / 1000, "compute": stages[2] / 1000}
            ids.append(c.client.submit(JobSubmit(args, c.tmp, name=name, steps=1500, env={"OMP_NUM_THREADS": "1"},
                                                 stage_times=given, priority=int(name == "cpu"))).id)
            time.sleep(0.5)
        c.client.set_quota("default", gpus=8)  # the users table shows it, and what the jobs count
        c.wait(lambda st: any(j.info.get("group_iteration_time") for j in st.jobs) and
               all(j.step >= 20 for j in st.jobs), 120, "a group to train")
        time.sleep(3)  # a few more points on the charts
        job = next(j for j in c.client.cluster_status().jobs if j.info.get("group"))
        # without the token the page shows no data, only the reason
        dom = browse(c.coordinator.url + "/ui", "--dump-dom")
        assert "missing bearer token" in dom and "n1" not in dom.split("<h2>Cluster</h2>")[1]
        url = f"{c.coordinator.url}/ui#token={c.coordinator.token}&job={job.id}"
        dom = browse(url, "--dump-dom")
        cluster = dom.split("<h2>Cluster</h2>")[1].split("<h2>Scheduled jobs</h2>")[0]
        assert "policy muri-s" in cluster and "<td>n1</td>" in cluster and "<td>n2</td>" in cluster
        assert "GPUs in use" in cluster and "<polyline" in cluster  # the utilization chart
        assert "<th>quota</th>" in cluster and "<td>8 GPUs: 3 GPUs admitted</td>" in cluster
        groups = dom.split("<h2>Interleaving groups</h2>")[1].split("<h2>Other jobs (etrun)</h2>")[0]
        assert job.info["group"] in groups  # the group, measured against eq. 3
        queue = dom.split("<h2>Scheduled jobs</h2>")[1].split("<h2>Interleaving groups</h2>")[0]
        assert all(f"<td>{i}</td>" in queue for i in ids)
        assert queue.count("<td>default (priority 1)</td>") == 1  # (no preemption by it here: admission order)
        page = dom.split('id="jobtitle"')[1]
        assert f"Job {job.id}" in page and "Stage profile" in page and "<rect" in page  # the bar chart
        assert "Step rate" in page and page.count("<polyline") >= 1
        assert re.search(r"<td>(start|regroup|group)</td>", page), page[:3000]
        def log_tail(job_page):
            return job_page.split("Log tail")[1][:3000]

        tail = log_tail(page)
        for _ in range(5):  # node daemons ship output with their polls: on a busy machine it may lag
            if "[muri-job] generation" in tail:
                break
            time.sleep(2)
            tail = log_tail(browse(url, "--dump-dom").split('id="jobtitle"')[1])
        assert "[muri-job] generation" in tail, tail  # the log tail
        assert c.coordinator.token not in dom  # the token left the address bar and the page
        shot = tmp_path / "status-page.png"
        browse(url, f"--screenshot={shot}")
        assert shot.stat().st_size > 10_000
        if os.environ.get("ET_SCREENSHOT"):  # (how docs/status-page.png was made)
            shutil.copy(shot, os.environ["ET_SCREENSHOT"])
        # a cordoned node shows as such, its reason as text
        c.client.cordon("n2", 600, "<b>fan</b> failure")
        cluster = browse(url, "--dump-dom").split("<h2>Cluster</h2>")[1].split("<h2>Scheduled jobs</h2>")[0]
        assert "<td>cordoned: &lt;b&gt;fan&lt;/b&gt; failure</td>" in cluster, cluster[:3000]
        # a planned maintenance window too
        c.client.cordon("n1", 600, "firmware", True, time.time() + 3600)
        cluster = browse(url, "--dump-dom").split("<h2>Cluster</h2>")[1].split("<h2>Scheduled jobs</h2>")[0]
        assert "; maintenance planned " in cluster, cluster[:3000]


XSS = r"""
import sys
print("</pre><script>document.body.setAttribute('data-pwned', 'script')</script>")
print('<img src=x onerror="document.body.setAttribute(\'data-pwned\', \'img\')">')
print("<svg onload=\"document.body.setAttribute('data-pwned', 'svg')\"></svg>", flush=True)
raise RuntimeError('<img src=x onerror="document.body.setAttribute(\'data-pwned\', \'reason\')">')
"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed: `apt-get install chromium` (make test does)")
def test_the_page_shows_script_a_job_prints_as_text_and_runs_none_of_it(tmp_path):
    """A job whose output (its log tail, its failure reason, its events) carries script: the page
    shows the text; nothing runs (every value is escaped, and the CSP forbids inline script)."""
    import urllib.request

    with open(tmp_path / "xss.py", "w") as f:
        f.write(XSS)
    with Cluster(tmp_path, "fifo", nodes=1, slots=1) as c:
        jid = c.client.submit(JobSubmit(["xss.py", "<b>bold</b>"], c.tmp, name="x", max_restarts=0)).id
        c.wait_all(1, 90)
        job = c.client.cluster_job(jid)
        assert job.status == "failed" and "<img src=x" in job.reason, job
        for _ in range(10):  # its output reaches the coordinator with the node's polls
            if b"onerror" in b"".join(k.data for k in c.client.job_logs(jid).chunks):
                break
            time.sleep(1)
        with urllib.request.urlopen(c.coordinator.url + "/ui", timeout=10) as r:
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "<script>" not in r.read().decode()
        dom = browse(f"{c.coordinator.url}/ui#token={c.coordinator.token}&job={jid}", "--dump-dom")
        assert 'data-pwned="' not in dom  # no script set the attribute (the text of the payloads is there)
        assert "&lt;img src=x onerror=" in dom and "&lt;/pre&gt;&lt;script&gt;" in dom  # shown, as text
        assert '<img src="x"' not in dom and "<svg onload" not in dom
        assert dom.count("&lt;img src=x") >= 2  # the ended jobs' reason and the job's log tail
