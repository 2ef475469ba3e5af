"""`elastictrain status` and GET /v1/jobs tell the truth about jobs etrun ran: a failed job says
failed, nodes are called nodes, leases a job never committed are explained, and a plain curl
GET reads JSON."""

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from .test_etrun import etrun, finish, write

pytest.importorskip("torch")


def cli(args, coordinator):
    env = dict(os.environ, ET_COORDINATOR=coordinator.url, ET_TOKEN_FILE=coordinator.token_file)
    r = subprocess.run([sys.executable, "-m", "elastictrain", *args], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_failed_job_reads_failed_and_lists_as_json(tmp_path, coordinator, client):
    script = write(tmp_path, "t.py", """
        import os, sys
        import elastictrain as et
        job = et.init()
        it = job.shards(et.DatasetSpec("train", num_samples=64, shard_size=8, epochs=1))
        next(iter(it))  # leases a shard and never commits it
        if os.environ["RANK"] == "1":
            sys.exit(3)
        import time; time.sleep(30)
    """)
    code, out, err = finish(etrun(["--coordinator", coordinator.url, "--token-file", coordinator.token_file,
                                   "--nproc-per-node", "2", "--rdzv-id", "failing", "--warm-spares", "0", script],
                                  cwd=str(tmp_path)), 120)
    assert code == 1, err
    text = cli(["status", "failing"], coordinator)
    assert "job failing: failed: worker failure with no restarts left" in text
    assert "last generation 1 (world size 2); nodes 1 (--nnodes 1:1)" in text
    assert "never committed" in text and "generation 1, world size 2" not in text
    listing = cli(["status"], coordinator)  # no scheduler: the jobs etrun ran
    assert "failing" in listing and "failed" in listing and "1 of 1:1" in listing
    info = client.job("failing")
    assert (info.status, info.min_workers, info.max_workers, info.min_nodes) == ("failed", 2, 2, 1)
    req = urllib.request.Request(coordinator.url + "/v1/jobs", headers={"Authorization": f"Bearer {coordinator.token}"})
    with urllib.request.urlopen(req, timeout=10) as r:  # as curl: no Accept header asking for msgpack
        assert r.headers["content-type"].startswith("application/json")
        body = json.loads(r.read())
    assert [j["job"] for j in body["jobs"]] == ["failing"] and body["jobs"][0]["status"] == "failed"
