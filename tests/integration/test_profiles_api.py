"""Workers' profile reports: stored per job and worker by the real coordinator process, kept
across a kill -9, and bad reports refused with a 400 that names the field."""

import json

import msgspec
import pytest

from elastictrain.errors import BadRequestError, NotFoundError
from elastictrain.runtime.profiler import report_when_ready
from elastictrain.runtime.stages import Recorder, stage, use_recorder
from elastictrain.wire import CommProfile, ProfileReport, StageProfile

from .test_coordinator_bad_input import raw


def stage_profile(worker, compute=0.004):
    return StageProfile(worker=worker, iterations=20, warmup=5, iteration_seconds=0.001 + compute,
                        stages={"load": 0.001, "preprocess": 0.0, "compute": compute, "sync": 0.0})


def comm_profile(worker):
    return CommProfile(worker=worker, iterations=25, collectives_per_iteration=1.0, bytes_per_iteration=4096.0,
                       seconds_per_collective=0.0002, seconds_per_iteration=0.0002, tensor_count=2,
                       total_bytes=4096, largest_bytes=3072, skew=0.75, size_histogram={"<4KiB": 2})


def test_reports_are_kept_per_worker_latest_wins_and_survive_kill_9(coordinator, client):
    client.create_job("p", 1, 4)
    client.report_profile("p", ProfileReport(stage=stage_profile(1)))
    client.report_profile("p", ProfileReport(stage=stage_profile(0), comm=comm_profile(0)))
    got = client.report_profile("p", ProfileReport(stage=stage_profile(1, compute=0.009)))
    assert [r.stage.worker for r in got.reports] == [0, 1]
    assert got.reports[1].stage.stages["compute"] == 0.009  # the second report of worker 1 replaced the first
    assert got.reports[0].comm.skew == 0.75

    coordinator.kill()
    coordinator.start()
    after = client.profiles("p")
    assert after == got  # written to the database before the reply

    status, body = raw(coordinator, "GET", "/v1/jobs/p/profiles", headers={"Accept": "application/json"})
    assert status == 200 and body["reports"][0]["stage"]["stages"]["compute"] == 0.004


@pytest.mark.parametrize("report, words", [
    ({}, "needs a 'stage' or a 'comm' profile"),
    ({"stage": msgspec.to_builtins(stage_profile(0)), "comm": msgspec.to_builtins(comm_profile(1))},
     "send one report per worker"),
    ({"stage": dict(msgspec.to_builtins(stage_profile(0)), stages={"gpu": 0.1})}, "unknown stage type(s) ['gpu']"),
    ({"stage": dict(msgspec.to_builtins(stage_profile(0)), iteration_seconds=-1.0)}, "$.stage.iteration_seconds"),
    ({"stage": dict(msgspec.to_builtins(stage_profile(0)), iterations=0)}, "$.stage.iterations"),
    ({"comm": dict(msgspec.to_builtins(comm_profile(0)), skew=1.5)}, "<= 1.0 - at `$.comm.skew`"),
    ({"comm": dict(msgspec.to_builtins(comm_profile(0)), largest_bytes=10**9)}, "exceeds total_bytes"),
    ({"stage": dict(msgspec.to_builtins(stage_profile(0)), worker=-2)}, ">= 0 - at `$.stage.worker`"),
    ({"stage": dict(msgspec.to_builtins(stage_profile(0)), stages={"load": "slow"})}, "Expected `float`"),
])
def test_bad_reports_get_400_with_the_reason(coordinator, client, report, words):
    client.create_job("p", 1, 4)
    status, err = raw(coordinator, "POST", "/v1/jobs/p/profiles", json.dumps(report).encode(),
                      headers={"Content-Type": "application/json"})
    assert status == 400 and words in err["reason"], err
    assert client.profiles("p").reports == []  # nothing half-stored


def test_unknown_job_is_404_and_the_client_raises_the_servers_error(client):
    with pytest.raises(NotFoundError, match="create it with POST /v1/jobs first"):
        client.profiles("nope")
    client.create_job("p", 1, 1)
    with pytest.raises(BadRequestError, match="needs a 'stage' or a 'comm'"):
        client.report_profile("p", ProfileReport())


def test_a_training_loop_reports_its_profile_once_in_the_background(coordinator, client):
    client.create_job("loop", 1, 1)
    rec = Recorder()
    use_recorder(rec)
    try:
        sent = report_when_ready(client, "loop", rec, warmup=2, iterations=4, worker=0)
        for _ in range(10):  # the loop goes on past the window; one report is sent
            with stage("load"):
                pass
            with stage("compute"):
                sum(range(2000))
        assert sent.wait(10)
    finally:
        use_recorder(None)
    (report,) = client.profiles("loop").reports
    assert report.stage.iterations == 4 and report.stage.warmup == 2
    assert report.stage.stages["compute"] > 0
