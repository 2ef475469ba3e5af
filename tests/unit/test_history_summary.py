"""``elastictrain history --by user|project`` (sreport's utilization by account): sacct's rows summed."""

import pytest

from elastictrain.cluster_cli import summarize_history


def _row(user, project, hours, state, start, waited, preemptions=0):
    return {"user": user, "project": project, "gpu_hours": hours, "state": state, "start": start, "waited": waited,
            "preemptions": preemptions}


def test_rows_are_summed_per_user_or_project_most_gpu_hours_first():
    rows = [_row("ana", None, 1.0, "finished", 10.0, 10.0, 1), _row("ana", "vision", 3.0, "failed", 20.0, 30.0),
            _row("ben", "vision", 0.0, "cancelled", None, 99.0), _row("ben", "vision", 4.0, "finished", 5.0, 50.0, 2),
            _row("ben", "nlp", 2.0, "running", 1.0, 70.0)]
    users = summarize_history(rows, "user")
    assert [u["user"] for u in users] == ["ben", "ana"]  # 6 GPU-hours, then 4
    ben = users[0]
    assert (ben["jobs"], ben["finished"], ben["failed"], ben["cancelled"], ben["preemptions"]) == (3, 1, 0, 1, 2)
    assert ben["gpu_hours"] == 6.0 and ben["share"] == pytest.approx(0.6)
    assert (ben["wait_median"], ben["wait_p95"]) == (60.0, 70.0)  # (the cancelled job never started: no wait)
    assert (users[1]["wait_median"], users[1]["wait_p95"]) == (20.0, 30.0)
    projects = {p["project"]: p for p in summarize_history(rows, "project")}
    assert set(projects) == {"vision", "nlp", "-"} and projects["vision"]["gpu_hours"] == 7.0
    assert projects["-"]["jobs"] == 1 and sum(p["share"] for p in projects.values()) == pytest.approx(1.0)
    none = summarize_history([_row("cy", None, 0.0, "queued", None, 5.0)], "user")
    assert none[0]["share"] == 0.0 and none[0]["wait_median"] is None


def test_over_a_period_the_gpu_hours_are_those_within_it_and_an_account_with_no_job_submitted_there_shows():
    rows = [_row("ana", None, 5.0, "finished", 10.0, 10.0), _row("ana", None, 1.0, "running", 20.0, 2.0)]
    users = {u["user"]: u for u in summarize_history(rows, "user", {"ana": 1.5, "ben": 0.5, "cy": 0.0})}
    assert set(users) == {"ana", "ben"}  # (cy: nothing in the period, and no job submitted there)
    assert (users["ana"]["jobs"], users["ana"]["gpu_hours"], users["ana"]["share"]) == (2, 1.5, 0.75)
    assert (users["ben"]["jobs"], users["ben"]["gpu_hours"], users["ben"]["wait_median"]) == (0, 0.5, None)
