"""``coordinator --retain``: old events and ended jobs' output are deleted, on SQLite and
PostgreSQL, never what a reader still needs (the newest event, the GPU-time spans' and the
notifications' cursors), and job records and GPU-time accounting stay (coordinator/retention.py)."""

import asyncio

import pytest

from elastictrain.cli import main
from elastictrain.coordinator import retention
from elastictrain.coordinator.app import Coordinator
from elastictrain.coordinator.metrics import render
from elastictrain.coordinator.retention import Retention
from elastictrain.coordinator.scheduler import ClusterConfig
from elastictrain.coordinator.store import EventRow, LogRow
from elastictrain.coordinator.store import open_store as open_db
from elastictrain.errors import ConfigError
from elastictrain.wire import LogChunk, NodePoll

from .test_cluster_scheduler import World
from .test_gpu_time import open_store  # noqa: F401 (the fixture: SQLite, then PostgreSQL)
from .test_metrics import parse

DAY = 86400.0


def _fill(store, times, jobs=("a", "b")):
    with store.transaction() as tx:
        for i, t in enumerate(times, start=1):
            tx.add_event(EventRow(i, float(t), "plan", jobs[i % len(jobs)], "", "{}"))
        for job in jobs:
            tx.add_log(LogRow(job, 1, "n1", 1, b"out of " + job.encode()))


def _seqs(store):
    return [r.seq for r in store.read_events(0, 10_000)]


def test_events_older_than_the_span_go_but_never_the_newest_nor_what_a_reader_needs(open_store):
    store = open_store()
    _fill(store, range(100))  # events 1..100 at times 0..99
    r = Retention(store, retain=50.0, now=0.0)
    none = lambda cutoff: ()  # noqa: E731
    r.run(100.0, keep_from=30, ended_logs=none, forget_logs=None)  # a reader needs 30 onwards
    assert _seqs(store) == list(range(30, 101))
    r.run(100.0, keep_from=10**9, ended_logs=none, forget_logs=None)  # cutoff 50: times < 50 are events 1..50
    assert _seqs(store) == list(range(51, 101))
    r.run(10**6, keep_from=10**9, ended_logs=none, forget_logs=None)  # all old: the newest stays
    assert _seqs(store) == [100]
    assert store.newest_event() == 100 and store.event_at(0) == (100, 99.0)
    store = open_store()  # a restart numbers on from it
    assert store.load().last_event == 100


def test_a_first_pass_over_a_long_history_goes_in_batches(open_store, monkeypatch):
    monkeypatch.setattr(retention, "BATCH", 7)
    store = open_store()
    _fill(store, range(30))
    r = Retention(store, retain=10.0, now=0.0)
    r.run(100.0, 10**9, lambda cutoff: (), None)
    assert _seqs(store)[0] == 8 and r.due == 101.0  # 7 deleted; the next batch at the next tick
    while r.due == 101.0:
        r.run(100.0, 10**9, lambda cutoff: (), None)
    assert _seqs(store) == [30] and r.due == 100.0 + retention.EVERY


def test_output_of_jobs_named_is_deleted(open_store):
    store = open_store()
    _fill(store, [1, 2])
    gone = []
    Retention(store, 60.0, 0.0).run(10.0, 0, lambda cutoff: ["a"], gone.append)
    assert gone == ["a"] and store.read_logs("a", 0, 1 << 20) == []
    assert [x.data for x in store.read_logs("b", 0, 1 << 20)] == [b"out of b"]


class RetainWorld(World):
    def open(self):
        self.c = Coordinator(open_db(str(self.tmp / "db")), self.clock,
                             ClusterConfig(self.policy, dict(self.options), interval=1.0,
                                           node_timeout=self.node_timeout, retain=7 * DAY))
        self.s = self.c.cluster


def _say(w, job, text):
    """``job``'s output arrives from node n1 (as `etrun --tee` lines through the node daemon)."""
    asyncio.run(w.s.node_poll("n1", NodePoll(w.inst["n1"], [], [LogChunk(job, w.s.job(job).run, text)], 0.0)))


def test_the_live_scheduler_deletes_what_the_span_made_old_and_keeps_accounting(tmp_path):
    w = RetainWorld(tmp_path, policy="fifo", nodes=1, slots=2)
    old = w.submit(1, name="old")
    new = w.submit(1, name="new")
    w.s.tick()
    w.run_all()
    _say(w, old, b"old output\n")
    _say(w, new, b"new output\n")
    w.clock.advance(100)
    w.exit(old, 0)
    w.s.tick()
    assert w.status(old) == "finished"
    usage = {u.job: u.gpu_seconds for u in w.s.gpu_time(None, None).jobs}
    assert usage[old] == pytest.approx(100.0)
    w.clock.advance(8 * DAY)  # `old` ended 8 days ago; `new` still runs
    _say(w, new, b"more\n")
    w.submit(1, name="today")
    w.s.tick()  # the first pass is due a minute after the start
    events = w.s.event_list(0, None).events
    cutoff = w.clock.now() - 7 * DAY
    assert events and all(e.time >= cutoff for e in events[:-1]), [(e.seq, e.kind, e.time) for e in events]
    assert not [e for e in events if e.job == old]
    assert w.s.job_logs(old, 0).chunks == [] and w.status(old) == "finished"  # the record stays
    assert b"".join(c.data for c in w.s.job_logs(new, 0).chunks) == b"new output\nmore\n"
    assert {u.job: u.gpu_seconds for u in w.s.gpu_time(None, None).jobs}[old] == usage[old]
    m = parse(render("1", "sqlite", w.s))  # GET /metrics
    assert m[("elastictrain_retention_deleted_total", (("what", "job_output"),))] == 1
    assert m[("elastictrain_retention_deleted_total", (("what", "events"),))] >= 8
    last = w.s.events.seq
    w.restart()
    w.submit(1, name="later")
    w.s.tick()
    assert w.s.event_list(last, None).events[0].seq == last + 1  # numbered on, never again from 1


def test_retain_is_checked_with_the_fix(tmp_path, capsys):
    for bad in (-1.0, 30.0, 200 * 365 * DAY):
        with pytest.raises(ConfigError, match="--retain must be 0"):
            ClusterConfig("fifo", retain=bad)
    assert ClusterConfig("fifo", retain=0).retain == 0
    assert main(["coordinator", "--db", str(tmp_path / "x.db"), "--policy", "fifo", "--retain", "90 days"]) == 2
    assert "give a span such as 90d" in capsys.readouterr().err
    assert main(["coordinator", "--db", str(tmp_path / "x.db"), "--retain", "90d"]) == 2
    assert "--retain needs --policy" in capsys.readouterr().err


def test_events_a_notification_not_sent_yet_needs_are_kept(tmp_path):
    class Both(World):
        def open(self):
            self.c = Coordinator(open_db(str(self.tmp / "db")), self.clock,
                                 ClusterConfig(self.policy, dict(self.options), interval=1.0, retain=7 * DAY,
                                               notify_allow=("http://127.0.0.1:*",)))
            self.s = self.c.cluster

    w = Both(tmp_path, policy="fifo", nodes=1, slots=2)
    first = w.submit(1)
    w.s.tick()
    w.run_all()
    w.exit(first, 0)
    job = w.submit(1, notify="http://127.0.0.1:9/hook")  # (never delivered here)
    w.s.tick()
    w.run_all()
    w.exit(job, 0)
    w.s.tick()
    w.s.notifier.scan()  # its end notification waits to be sent (the notifier's loop: scan, post, save)
    w.s.notifier.save()
    finish = [e.seq for e in w.s.event_list(0, job).events if e.kind == "finish"][0]
    assert w.s.notifier.needs_from() == finish
    w.clock.advance(8 * DAY)
    w.submit(1)
    w.s.tick()
    assert w.s.event_list(0, None).events[0].seq == finish  # everything before it went; it stays
