"""A period's GPU time from the spans the coordinator keeps as its event log is written
(coordinator/gpu_time.py), on SQLite and PostgreSQL: the same figures as folding the whole log
(elastictrain/usage.py), across coordinator restarts, and for a log written before the spans were
kept (caught up once, at start)."""

import json
import random
from types import SimpleNamespace

import pytest

from elastictrain.coordinator.events import EventLog
from elastictrain.coordinator.gpu_time import CURSOR_META
from elastictrain.coordinator.store import EventRow, SQLiteStore
from elastictrain.usage import gpu_spans, within


@pytest.fixture(params=["sqlite", "postgresql"])
def open_store(request, tmp_path):
    """Opens the test's one database (again: a coordinator restarted on it); closes what it opened."""
    opened = []
    if request.param == "sqlite":
        path = str(tmp_path / "c.db")

        def make():
            if opened:
                opened[-1].close()  # (one coordinator per SQLite file)
            opened.append(SQLiteStore(path))
            return opened[-1]
    else:
        from elastictrain.coordinator.pg_store import PostgresStore
        from tests.conftest import new_database

        url = new_database(request.getfixturevalue("postgres"))

        def make():
            opened.append(PostgresStore(url))
            return opened[-1]
    yield make
    for s in opened:
        s.close()


def _log():
    """(time, kind, job, detail): as tests/unit/test_usage.py's, and a job still placed at the end."""
    return [(10, "start", "a", {"placement": [["n1", 2]], "run": 1}), (15, "first_step", "a", {"run": 1}),
            (20, "start", "b", {"placement": [["n1", 1]], "run": 1}), (21, "first_step", "b", {"run": 1}),
            (30, "start", "c", {"placement": [["n2", 1]], "run": 1}), (35, "cancel", "c", {}),
            (38, "preempt", "a", {"placement": [["n1", 2]], "run": 1}), (40, "preempted", "a", {"run": 1}),
            (45, "deferred", "e", {"why": "no room"}),
            (50, "resume", "a", {"placement": [["n2", 2]], "run": 2}), (52, "first_step", "a", {"run": 2}),
            (60, "resize", "a", {"placement": [["n2", 4]], "run": 2, "workers": 4}),
            (61, "first_step", "a", {"run": 3}), (100, "finish", "a", {"run": 3}),
            (110, "start", "d", {"placement": [["n1", 3]], "run": 1})]


def _write(log: EventLog, store, events) -> None:
    for t, kind, job, detail in events:
        log.emit(float(t), kind, job, "n1", **detail)
        with store.transaction() as tx:
            log.write(tx)


def _expected(events, since, until, now):
    records = [SimpleNamespace(time=float(t), kind=k, job=j, detail=d) for t, k, j, d in events]
    hi = now if until is None else min(until, now)
    lo = float("-inf") if since is None else since
    a, s = within(gpu_spans(records, now), lo, hi), within(gpu_spans(records, now, service=True), lo, hi)
    return {job: [a.get(job, 0.0), s.get(job, 0.0)] for job in {*a, *s}}


def _approx(got: dict, want: dict) -> None:
    assert set(got) == set(want), (got, want)
    for job in want:
        assert got[job] == pytest.approx(want[job], abs=1e-6), job


def test_a_period_reads_the_kept_spans_and_they_survive_a_restart(open_store):
    store = open_store()
    events = _log()
    log = EventLog(store, 0)
    _write(log, store, events[:7])  # (a restart with a and b running, c ended)
    store = open_store()
    st = store.load()
    log = EventLog(store, st.last_event, st.meta)
    _write(log, store, events[7:])
    now = 130.0
    for since, until in ((None, None), (30.0, 70.0), (100.0, 200.0), (0.0, 15.0), (55.0, 56.0), (105.0, None)):
        _approx(log.gpu_time.within(since, until, now), _expected(events, since, until, now))
    got = log.gpu_time.within(30.0, 70.0, now)
    assert got["a"][1] == 10 * 2 + 8 * 2 + 9 * 4 and got["b"] == [40.0, 40.0]
    assert "d" in log.gpu_time.within(None, None, now) and log.gpu_time.within(None, None, now)["d"][1] == 0.0
    assert log.gpu_time.within(50.0, 50.0, now) == {}


def test_a_log_written_before_the_spans_were_kept_is_caught_up_once(open_store):
    store = open_store()
    events = _log()
    with store.transaction() as tx:  # (events as an older coordinator wrote them: no spans, no cursor)
        for seq, (t, kind, job, detail) in enumerate(events, 1):
            tx.add_event(EventRow(seq, float(t), kind, job, "n1", json.dumps(detail)))
    store = open_store()
    st = store.load()
    assert CURSOR_META not in st.meta
    log = EventLog(store, st.last_event, st.meta)
    _approx(log.gpu_time.within(30.0, 120.0, 130.0), _expected(events, 30.0, 120.0, 130.0))
    store = open_store()  # caught up: the next start reads no event again
    assert store.load().meta[CURSOR_META] == str(len(events))
    store.read_events = None  # (it would fail if called)
    st = store.load()
    log = EventLog(store, st.last_event, st.meta)
    _approx(log.gpu_time.within(None, None, 130.0), _expected(events, None, None, 130.0))


def test_random_logs_and_periods_match_folding_the_whole_log(open_store):
    rng = random.Random(7)
    jobs = [f"j{i}" for i in range(6)]
    run = dict.fromkeys(jobs, 0)
    events, t = [], 0.0
    for _ in range(300):
        t += rng.choice((0.0, 0.5, 3.0, 10.0))
        job = rng.choice(jobs)
        kind = rng.choice(("start", "resume", "first_step", "first_step", "resize", "migrate", "preempted",
                           "finish", "fail", "requeue", "deferred"))
        if kind in ("start", "resume"):
            run[job] += 1
        detail = {"run": run[job] - rng.choice((0, 0, 1))}
        if kind in ("start", "resume", "resize", "migrate"):
            detail["placement"] = [["n1", rng.randint(1, 4)]] + ([["n2", 2]] if rng.random() < 0.3 else [])
        events.append((t, kind, job, detail))
    store = open_store()
    log = EventLog(store, 0)
    done = 0
    for cut in sorted(rng.sample(range(1, len(events)), 3)) + [len(events)]:  # restarts in between
        _write(log, store, events[done:cut])
        done = cut
        store = open_store()
        st = store.load()
        log = EventLog(store, st.last_event, st.meta)
    now = t + 5.0
    for _ in range(40):
        a, b = sorted(rng.uniform(-10.0, now + 10.0) for _ in range(2))
        since, until = rng.choice((a, None)), rng.choice((b, None))
        _approx(log.gpu_time.within(since, until, now), _expected(events, since, until, now))
