"""Every worker samples its resource use and the coordinator shows it: 2 workers under etrun
against a real coordinator, one of them burning CPU and holding 200 MB; `elastictrain status
--job` lists both with their CPU, memory and step time, and says why there are no GPU figures."""

import os
import subprocess
import sys

import pytest

from .test_etrun import etrun, finish, write


def test_status_shows_each_workers_resource_use(tmp_path, coordinator, client):
    script = write(tmp_path, "t.py", """
        import os, time
        import elastictrain as et
        job = et.init()
        hold = bytearray(200 * 2**20) if job.rank == 1 else b""
        for i in range(1, 1000):
            t = time.time()
            while time.time() - t < 0.01:  # busy: about one core
                pass
            job.report_step(i)
            if i == 150:
                break
        job.monitor.flush()
    """)
    env = dict(os.environ, ET_MONITOR_PERIOD="0.2", ET_MONITOR_BATCH="2")
    code, out, err = finish(etrun(["--coordinator", coordinator.url, "--token-file", coordinator.token_file,
                                   "--nproc-per-node", "2", "--rdzv-id", "mon", "--warm-spares", "0", script],
                                  cwd=str(tmp_path), env=env), 120)
    assert code == 0, err
    workers = {w.worker: w for w in client.resources("mon").workers}
    assert set(workers) == {0, 1}
    assert workers[1].latest.rss_bytes > workers[0].latest.rss_bytes + 150 * 2**20
    for w in workers.values():
        s = w.latest
        assert s.cpu_percent > 30 and s.step is not None and 0.005 < (s.step_time or 0) < 0.5, s
        assert w.history >= 3
        if s.gpu_util is None:
            assert s.gpu_absent  # says why
    r = subprocess.run([sys.executable, "-m", "elastictrain", "status", "--job", "mon"], capture_output=True, text=True,
                       env=dict(os.environ, ET_COORDINATOR=coordinator.url, ET_TOKEN_FILE=coordinator.token_file),
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "cpu %" in r.stdout and "step time" in r.stdout, r.stdout
    assert "no GPU figures" in r.stdout or "torch peak" in r.stdout or "%" in r.stdout


def test_resource_reports_are_checked(client):
    from elastictrain.errors import BadRequestError, NotFoundError
    from elastictrain.wire import ResourceReport, ResourceSample

    with pytest.raises(NotFoundError):
        client.report_resources("nobody", ResourceReport(0, [ResourceSample(1.0, 1.0, 1.0)]))
    client.create_job("j", 1, 1)
    with pytest.raises(BadRequestError, match="cpu_percent"):
        client.report_resources("j", ResourceReport(0, [ResourceSample(1.0, -5.0, 1.0)]))
    assert client.resources("j").workers == []
    reply = client.report_resources("j", ResourceReport(3, [ResourceSample(2.0, 50.0, 1e6), ResourceSample(1.0, 40.0, 1e6)]))
    assert [(w.worker, w.latest.t, w.history) for w in reply.workers] == [(3, 2.0, 2)]  # kept in time order
    # a worker's monitor may send a batch while its last flush sends the next one: the later batch
    # can arrive first, and the latest sample is still the latest in time
    newer = [ResourceSample(12.0, 1.0, 300.0), ResourceSample(13.0, 1.0, 300.0)]
    client.report_resources("j", ResourceReport(5, newer))
    older = [ResourceSample(10.0, 1.0, 100.0), ResourceSample(11.0, 1.0, 100.0)]
    client.report_resources("j", ResourceReport(5, older))
    (w,) = [w for w in client.resources("j").workers if w.worker == 5]
    assert (w.latest.t, w.latest.rss_bytes, w.history) == (13.0, 300.0, 4)
