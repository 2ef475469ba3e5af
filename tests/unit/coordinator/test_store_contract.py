"""One contract, every store: SQLite and PostgreSQL hold the same state after the same
transactions, read it back the same way, and leave nothing of a transaction that raised."""

import asyncio

import pytest

from elastictrain.coordinator.store import (
    CommitRow, DatasetRow, EventRow, JobRow, LiveRow, LogRow, PartRow, ProfileRow, SQLiteStore,
)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = SQLiteStore(str(tmp_path / "c.db"))
    else:
        from elastictrain.coordinator.pg_store import PostgresStore
        from tests.conftest import new_database

        s = PostgresStore(new_database(request.getfixturevalue("postgres")))
    yield s
    s.close()


def _fill(s) -> None:
    with s.transaction() as tx:
        tx.put_job(JobRow("j", 2, 4, 1, 8, "start"))
        tx.put_dataset(DatasetRow("j", "train", b"\x01spec", 1, 7, None, None, 0))
        for i in range(3):
            tx.put_live(LiveRow("j", "train", i, "DOING", 5 * i, 10 + i, i, 2, f"r{i}"))
        tx.put_part(PartRow("j", "train", "ck1", 0, 10, 2, 4, b"\x00\xffparts"))
        tx.put_commit(CommitRow("j", "train", "ck0", 1, 5, 2, 3, b"partial-0", 1.5))
        tx.put_commit(CommitRow("j", "train", "ck1", 2, 10, 2, 4, b"partial-1", 2.5))
        tx.put_profile(ProfileRow("j", 0, b"prof", 3.0))
        tx.put_cluster_job("1", 1, "running", b"rec1")
        tx.put_node("n1", 0, b"node")
        tx.put_rdzv("j", b"round")
        tx.put_meta("k", "v")
        for seq in (1, 2, 3):
            tx.add_event(EventRow(seq, float(seq), "start", "j" if seq != 2 else "other", "n1", "{}"))
            tx.add_log(LogRow("j", seq, "n1", 1, b"x" * 100))
    with s.transaction() as tx:  # replace, delete, prune
        tx.put_job(JobRow("j", 3, 2, 1, 8, "resize"))
        tx.put_live(LiveRow("j", "train", 0, "DONE", 10, 10, 0, 2, "r0"))
        tx.delete_part("j", "train", "ck1", 0)
        tx.put_meta("k", "w")
        tx.put_meta("gone", "x")
        tx.delete_meta("gone")
        tx.prune_log("j", 2)
        tx.fold_event(3, '{"count": 2}')


def test_the_same_state_on_every_store(store):
    _fill(store)
    st = store.load()
    assert st.jobs == [JobRow("j", 3, 2, 1, 8, "resize")]
    assert st.datasets == [DatasetRow("j", "train", b"\x01spec", 1, 7, None, None, 0)]
    assert sorted((r.shard_id, r.state, r.offset) for r in st.live) == [(0, "DONE", 10), (1, "DOING", 5),
                                                                       (2, "DOING", 10)]
    assert st.parts == []
    assert [(c.checkpoint, c.seq, c.partial) for c in st.commits] == [("ck0", 1, b""), ("ck1", 2, b"")]
    assert st.profiles == [ProfileRow("j", 0, b"prof", 3.0)]
    assert list(st.cluster_jobs) == [("1", b"rec1")] and st.nodes == [("n1", b"node")] and st.rdzv == [("j", b"round")]
    assert st.meta["k"] == "w" and "gone" not in st.meta and "schema" in st.meta
    assert st.last_event == 3 and st.log_bytes == {"j": (200, 3)}
    assert store.load_commit("j", "train", "ck1") == CommitRow("j", "train", "ck1", 2, 10, 2, 4, b"partial-1", 2.5)
    assert store.load_commit("j", "train", "nope") is None
    assert [(e.seq, e.detail) for e in store.read_events(0, 10)] == [(1, "{}"), (2, "{}"), (3, '{"count": 2}')]
    assert [e.seq for e in store.read_events(1, 10, "j")] == [3]
    assert [r.seq for r in store.read_logs("j", 0, 150)] == [2]
    assert [r.seq for r in store.read_logs("j", 0, 10_000)] == [2, 3]
    assert store.log_seq_at("j", 150) == 3


def test_the_scheduled_jobs_are_read_in_pages_each_once(store):
    """A start reads the job records a page at a time (a long history is not held at once): every
    record once, replaced ones as they are now, on the page boundaries too."""
    with store.transaction() as tx:
        for i in range(7):
            tx.put_cluster_job(f"job-{i}", i, "finished", b"old%d" % i)
    with store.transaction() as tx:
        tx.put_cluster_job("job-2", 2, "running", b"new2")  # (a replace: SQLite gives it a new rowid)
    got = list(store._cluster_jobs(page=3))
    assert sorted(got) == sorted([(f"job-{i}", b"old%d" % i) for i in range(7) if i != 2] + [("job-2", b"new2")])
    assert len(got) == 7
    assert sorted(store.load().cluster_jobs) == sorted(got)
    for page in (1, 7, 8):
        assert sorted(store._cluster_jobs(page=page)) == sorted(got)


def test_a_transaction_that_raises_leaves_nothing(store):
    with pytest.raises(RuntimeError):
        with store.transaction() as tx:
            tx.put_meta("half", "done")
            raise RuntimeError("boom")
    assert "half" not in store.load().meta


def test_postgres_commits_in_groups_and_answers_only_durable_state(request):
    """Group commit: transactions queued while a commit is in flight go together; a barrier
    returns only once everything queued before it is committed."""
    from elastictrain.coordinator.pg_store import PostgresStore
    from tests.conftest import new_database

    url = new_database(request.getfixturevalue("postgres"))
    s = PostgresStore(url)
    commits = []
    real = s._commit
    s._commit = lambda batch: (commits.append(len(batch)), real(batch))[1]

    async def main():
        s.start(asyncio.get_running_loop())
        for i in range(200):
            with s.transaction() as tx:
                tx.put_meta(f"k{i}", str(i))
            if i % 20 == 0:
                await asyncio.sleep(0)  # let the flusher run: what comes meanwhile waits for the next commit
        await s.barrier()

    asyncio.run(main())
    other = PostgresStore(url)  # another connection sees every queued transaction
    assert all(other.load().meta[f"k{i}"] == str(i) for i in range(200))
    assert sum(commits) == 200 and len(commits) < 200, commits
    s._task = None
    s.close()
    other.close()


def test_a_fenced_commit_writes_nothing_and_is_fatal(request):
    from elastictrain.coordinator.leader import Leadership
    from elastictrain.coordinator.pg_store import FencedError, PostgresStore
    from tests.conftest import new_database

    url = new_database(request.getfixturevalue("postgres"))
    s = PostgresStore(url)
    a, b = Leadership(url, "http://a", lease=1.0), Leadership(url, "http://b", lease=1.0)
    assert a.try_acquire() == 1 and b.try_acquire() is None
    s.term = a.term
    with s.transaction() as tx:
        tx.put_meta("by-a", "1")
    import time

    time.sleep(1.2)  # a's lease runs out (a was "paused")
    assert b.try_acquire() == 2 and not a.renew()
    with pytest.raises(FencedError, match="term 1 is over"):
        with s.transaction() as tx:
            tx.put_meta("late-a", "1")
    meta = PostgresStore(url).load().meta
    assert "by-a" in meta and "late-a" not in meta
    for x in (a, b):
        x.close()
    s.close()
