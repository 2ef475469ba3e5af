"""Job listings (GET /v1/cluster, /v1/cluster/jobs; ClusterScheduler.listing): every job that has
not ended, and of the ended ones only the N that ended last unless all are asked for, in
submission order; an array's tasks; a period of submission; the same job details as one job's
own reply (the nodes' tasks are indexed once per listing); pages of a listing, which list each job
once while jobs end and arrive between them, in the same order after a restart."""

import pytest

from elastictrain.coordinator.listing import JobFilter, JobIndex
from elastictrain.coordinator.live import ENDED_NAMES, JobRecord
from elastictrain.coordinator import records as records_mod
from elastictrain.coordinator.records import Cold, JobRecords
from elastictrain.errors import ConfigError
from elastictrain.wire import JobSubmit

from .test_cluster_scheduler import World


def _ids(jobs):
    return [j.id for j in jobs]


@pytest.mark.parametrize("hot", [1000, 2])
def test_ended_jobs_are_the_last_n_to_end_and_the_rest_stay_listed(tmp_path, monkeypatch, hot):
    """(``hot``: the ended jobs kept unpacked, records.py; with 2 most ended records are packed,
    and every listing, reply and restart is the same.)"""
    monkeypatch.setattr(records_mod, "HOT_ENDED", hot)
    w = World(tmp_path, policy="fifo", nodes=1, slots=2)
    ids = [w.submit() for _ in range(12)]
    w.s.tick()
    w.run_all()
    assert [w.status(j) for j in ids[:3]] == ["running", "running", "queued"]
    for j in reversed(ids[4:12]):  # the last submitted ends first
        w.clock.advance(1.0)
        w.s.cancel(j)
    jobs, omitted, _ = w.s.listing(3)
    assert omitted == 5
    assert _ids(jobs) == ids[:4] + ids[4:7]  # the three that ended last, in submission order
    assert w.s.records.packed() == (0 if hot > 8 else 6)
    listed = w.s.listing(None)[0]
    assert w.s.records.packed() == (0 if hot > 8 else 6)  # (a listing reads them without unpacking)
    assert listed == [w.s.job(j) for j in ids]  # (a job's own reply unpacks it: the same)
    assert w.s.listing(None, JobFilter(users=frozenset({"alice"})))[0] == []
    assert w.s.listing(None, JobFilter(states=frozenset({"cancelled"})))[0] == listed[4:]
    jobs, omitted, _ = w.s.listing(None)
    assert (_ids(jobs), omitted) == (ids, 0)
    jobs, omitted, _ = w.s.listing(0)
    assert (_ids(jobs), omitted) == (ids[:4], 8)
    assert _ids(w.s.jobs(100).jobs) == ids and w.s.jobs(2).ended_omitted == 6
    st = w.s.status(1)
    assert _ids(st.jobs) == ids[:5] and st.ended_omitted == 7 and [n.name for n in st.nodes] == ["n1"]
    w.clock.advance(1.0)
    w.exit(ids[1], 0)  # a running job finishes: the last to end
    w.s.tick()
    assert w.status(ids[1]) == "finished"
    jobs, omitted, _ = w.s.listing(2)
    assert (_ids(jobs), omitted) == ([ids[0], ids[1], ids[2], ids[3], ids[4]], 7)
    before = w.s.listing(None)[0]
    w.restart()  # the same listing from the stored records (ordered by their end times)
    again, omitted, _ = w.s.listing(2)
    assert (_ids(again), omitted) == (_ids(jobs), 7) and _ids(w.s.listing(None)[0]) == ids
    assert w.s.records.packed() == (0 if hot > 9 else 7) and w.s.listing(None)[0] == before


def test_a_listed_job_says_what_its_own_reply_says(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=2, slots=2)
    ids = [w.submit(gpus=g) for g in (1, 2, 1, 1)]
    w.s.tick()
    w.run_all()
    w.clock.advance(5.0)
    listed = {j.id: j for j in w.s.listing(None)[0]}
    for j in ids:
        one = w.s.job(j)
        assert listed[j] == one
    running = [j for j in ids if listed[j].status == "running"]
    assert len(running) == 3 and all(listed[j].placement and all(p.gpus for p in listed[j].placement)
                                     for j in running)  # the GPUs come from the nodes' tasks
    assert all(listed[j].attained > 0 for j in running)  # service accrued to now


def test_an_arrays_tasks_and_a_period_of_submission(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=1, slots=1)
    lone = w.submit()
    w.clock.advance(10.0)
    tasks = _ids(w.s.submit_array(JobSubmit(["sweep.py"], str(tmp_path), array="0-11", hold=True)).jobs)
    base = tasks[0].split("_")[0]
    other = _ids(w.s.submit_array(JobSubmit(["sweep.py"], str(tmp_path), array="0-1", hold=True)).jobs)
    for t in tasks[:6]:
        w.s.cancel(t)
    assert _ids(w.s.listing(None, JobFilter(array=base))[0]) == tasks
    jobs, omitted, _ = w.s.listing(2, JobFilter(array=base))
    assert (_ids(jobs), omitted) == (tasks[4:], 4)
    assert w.s.listing(None, JobFilter(array=lone))[0] == [] and w.s.listing(None, JobFilter(array="nope"))[0] == []
    t0 = w.s.records[lone].submit_time
    assert _ids(w.s.listing(None, JobFilter(since=t0 + 5))[0]) == tasks + other
    assert _ids(w.s.listing(None, JobFilter(until=t0 + 5))[0]) == [lone]
    assert _ids(w.s.listing(None, JobFilter(since=t0, until=t0 + 0.001))[0]) == [lone]


def test_a_filtered_listing_counts_only_the_ended_jobs_it_matches(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=1, slots=1)
    alice = [w.submit(user="alice", name="prep") for _ in range(6)]
    bob = [w.submit(user="bob", name="eval") for _ in range(4)]
    w.s.tick()
    w.run_all()
    for j in alice[1:5] + bob[:2]:
        w.clock.advance(1.0)
        w.s.cancel(j)
    jobs, omitted, _ = w.s.listing(2, JobFilter(users=frozenset({"alice"})))
    assert (_ids(jobs), omitted) == ([alice[0], alice[3], alice[4], alice[5]], 2)  # her last two ended, not bob's
    assert _ids(w.s.listing(None, JobFilter(states=frozenset({"running"})))[0]) == [alice[0]]
    jobs, omitted, _ = w.s.listing(1, JobFilter(users=frozenset({"bob"}), states=frozenset({"cancelled", "queued"})))
    assert (_ids(jobs), omitted) == ([bob[1], bob[2], bob[3]], 1)
    assert _ids(w.s.listing(0, JobFilter(names=frozenset({"eval", "nope"})))[0]) == bob[2:]
    assert w.s.listing(None, JobFilter(users=frozenset({"carol"}))) == ([], 0, "")
    listed = {j.id: j for j in w.s.listing(None)[0]}
    assert w.s.listing(None, JobFilter(users=frozenset({"alice"})))[0] == [listed[j] for j in alice]


def _paged(s, limit, ended=None, match=JobFilter(), between=None):
    """Every page of a listing of at most ``limit`` jobs, joined (``between(i)`` runs before page i > 0)."""
    jobs, more, i = [], "", 0
    while True:
        if i and between is not None:
            between(i)
        page, omitted, more = s.listing(ended, match, more, limit)
        assert len(page) <= limit and (len(page) == limit or not more)
        jobs += page
        i += 1
        if not more:
            return _ids(jobs), omitted, i


def test_a_listing_in_pages_is_the_listing(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=1, slots=1)
    lone = w.submit(user="bob")
    tasks = _ids(w.s.submit_array(JobSubmit(["sweep.py"], str(tmp_path), array="0-16", hold=True)).jobs)
    for t in tasks[2:15]:
        w.clock.advance(1.0)
        w.s.cancel(t)
    bob, array = JobFilter(users=frozenset({"bob"})), JobFilter(array=tasks[0].split("_")[0])
    for ended, match in ((None, JobFilter()), (4, JobFilter()), (0, JobFilter()), (None, bob), (3, array)):
        whole, omitted, _ = w.s.listing(ended, match)
        for limit in (1, 3, 5, 18, 100):
            ids, last_omitted, pages = _paged(w.s, limit, ended, match)
            assert (ids, last_omitted) == (_ids(whole), omitted), (ended, match, limit)
            assert pages == max(1, -(-len(whole) // limit))
    jobs, _, more = w.s.listing(None, JobFilter(), tasks[-1], 5)  # after the last job: an empty last page
    assert (jobs, more) == ([], "")
    with pytest.raises(ConfigError, match="'after': no job 'nope' here"):
        w.s.listing(None, JobFilter(), "nope", 5)
    st = w.s.status(None, JobFilter(), "", 4)
    assert _ids(st.jobs) == [lone] + tasks[:3] and st.next == tasks[2] and w.s.jobs(None, after=tasks[2]).next == ""


def test_pages_list_each_job_once_while_jobs_end_and_arrive(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=1, slots=1)
    tasks = _ids(w.s.submit_array(JobSubmit(["sweep.py"], str(tmp_path), array="0-19", hold=True)).jobs)
    late = []

    def between(i):  # before each page: the first job still waiting ends, and a job arrives
        w.clock.advance(1.0)
        w.s.cancel(next(t for t in tasks if w.status(t) == "queued"))
        late.append(w.submit())

    ids, _, pages = _paged(w.s, 4, ended=2, between=between)
    assert len(ids) == len(set(ids))  # nobody twice
    # every job still waiting, and every late one, is listed (each page sees the listing as it is)
    assert {t for t in tasks if w.status(t) == "queued"} | set(late) <= set(ids) and pages >= 6


def test_an_arrays_tasks_keep_their_order_after_a_restart(tmp_path):
    w = World(tmp_path, policy="fifo", nodes=1, slots=1)
    tasks = _ids(w.s.submit_array(JobSubmit(["sweep.py"], str(tmp_path), array="0-11", hold=True)).jobs)
    for t in reversed(tasks[::2]):  # rows written again, last task first
        w.s.cancel(t)
    before = _ids(w.s.listing(None)[0])
    assert before == tasks
    w.restart()
    assert _ids(w.s.listing(None)[0]) == before
    assert _ids(w.s.listing(None, JobFilter(), tasks[4], 3)[0]) == tasks[5:8]


def _rec(i, user="u", project="", status="queued"):
    return JobRecord(f"j{i}", i, "train", user, 0, 1, 1, ["train.py"], "/tmp", {}, False, None, None, 3, 30.0,
                     float(i), status=status, project=project)


def _recount(index):
    """What the index's sums must be: the ended jobs' states and GPU-seconds, counted afresh."""
    states, users, projects = {}, {}, {}
    for rec in index.records.peek():
        if rec.id in index._ended:
            states[rec.status] = states.get(rec.status, 0) + 1
            users[rec.user] = users.get(rec.user, 0.0) + rec.attained_gpu
            if rec.project:
                projects[rec.project] = projects.get(rec.project, 0.0) + rec.attained_gpu
    return states, users, projects


def _sums(index):
    nonzero = {s: n for s, n in index.ended_states.items() if n}
    return nonzero, dict(index.ended_usage()), dict(index.ended_project_usage())


def test_the_index_sums_the_ended_jobs_as_they_end_and_come_back():
    """What the scrapes and the usage samples read instead of the whole history: the ended jobs'
    states and GPU-seconds by user and project, kept as records are written (a job that ends, one
    rewritten after its end, one requeued after it), equal to a recount at every step, and the
    same when built afresh from the records (a restart). All but the last three ended are packed as
    they are written, and unpacked again to change."""
    import random

    rng = random.Random(7)
    records = JobRecords(keep=3)
    index = JobIndex(records)
    for i in range(200):
        rec = _rec(i, user=f"u{i % 5}", project=("vision", "", "nlp")[i % 3])
        records[rec.id] = rec
        index.added(rec)
    for _ in range(600):
        rec = records[f"j{rng.randrange(200)}"]
        move = rng.random()
        if rec.status in ENDED_NAMES and move < 0.2:
            rec.status = "queued"  # requeued
        elif rec.status in ENDED_NAMES and move < 0.4:
            rec.attained_gpu += 3.0  # rewritten after its end
        elif rec.status not in ENDED_NAMES:
            rec.status = rng.choice(sorted(ENDED_NAMES))
            rec.attained_gpu = float(rng.randrange(1, 1000))
            rec.end_time = float(rng.randrange(50))  # (ties on purpose)
        records.settle(index.wrote([rec]))
        packed = {r.id for r in records.peek() if type(r) is Cold}
        assert packed == set(index._ended) - set(records._hot) and records.packed() == len(packed)
        assert len(records._hot) <= 3
        states, users, projects = _recount(index)
        got = _sums(index)
        assert got[0] == states
        assert {u: pytest.approx(v) for u, v in users.items()} == {u: v for u, v in got[1].items() if u in users}
        assert all(v == pytest.approx(0.0, abs=1e-6) for u, v in got[1].items() if u not in users)
        assert {p: pytest.approx(v) for p, v in projects.items()} == {p: v for p, v in got[2].items() if p in projects}
        assert [r.id for r in index.open()] == [r.id for r in records.peek() if r.id not in index._ended]
    fresh = JobIndex(records)
    assert fresh.ended_states == {s: n for s, n in _recount(fresh)[0].items()}
    assert sorted(fresh._ended) == sorted(index._ended)


def test_pick_and_a_filtered_listing_rank_jobs_that_ended_at_one_instant_alike():
    """The ended jobs a listing shows are the last written, filtered or not: two jobs that ended at
    the same instant, written in turn, show the same one whether or not a filter was given (a
    filter ranked them by submission order, the plain listing by when each was written)."""
    records = JobRecords()
    index = JobIndex(records)
    a, b = _rec(1), _rec(2)
    for rec in (a, b):
        records[rec.id] = rec
        index.added(rec)
    for rec in (b, a):  # b written first, a (submitted first) last
        rec.status, rec.end_time = "finished", 5.0
        index.wrote([rec])
    plain, omitted = index.pick(1)
    assert [r.id for r in plain] == ["j1"] and omitted == 1
    mine, omitted = index.pick(1, JobFilter(users=frozenset({"u"})))
    assert [r.id for r in mine] == ["j1"] and omitted == 1
    c = _rec(3)
    records[c.id] = c
    index.added(c)
    c.status, c.end_time = "finished", 6.0  # ended, not written yet: listed, not counted (both ways)
    assert [r.id for r in index.pick(0)[0]] == ["j3"] and index.pick(0)[1] == 2
    assert [r.id for r in index.pick(0, JobFilter(users=frozenset({"u"})))[0]] == ["j3"]
    assert index.pick(0, JobFilter(users=frozenset({"u"})))[1] == 2
