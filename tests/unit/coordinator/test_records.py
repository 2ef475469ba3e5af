"""The scheduler's job records with the ended ones packed (coordinator/records.py): a packed record
unpacks to the record it was, field for field; reading one by id unpacks it and keeps a change;
listings read packed ones without unpacking them; a start packs what a long run had packed."""

import tracemalloc

import msgspec

from elastictrain.coordinator.live import JobRecord
from elastictrain.coordinator.records import Cold, JobRecords, _pack, _unpack


def _rec(i, status="queued", **kw):
    return JobRecord(f"{i}_{i % 3}", i, f"train{i}", f"u{i % 2}", 0, 2, 1, ["train.py", "--lr", "0.1"], "/tmp",
                     {"ET_X": str(i)}, False, 100, None, 3, 30.0, float(i), status=status, array=str(i), **kw)


def _ended(i, **kw):
    return _rec(i, status="finished", end_time=1000.0 + i, attained_gpu=2.5 * i, **kw)


def test_a_packed_record_unpacks_to_the_record_it_was():
    rec = _ended(7, placement=[(0, 2), (3, 2)], held=[(1, 1)], group=["a", "b"], group_t0=(12, 3.5),
                 runs_by_reason={"preempt": 2, "node_lost": 1}, stage_times=[0.1, 0.2, 0.3, 0.05], exit_code=0,
                 notify_on=["end"], after=["3:ok"], project="vision", gpu_type="a100", step_time=0.25,
                 iteration_time=None, given_stages=[1.0, 2.0, 3.0, 4.0], start_time=1.0, reason="done")
    cold = _pack(rec)
    assert (cold.id, cold.user, cold.project, cold.status, cold.array, cold.end_time, cold.attained_gpu) == \
        (rec.id, rec.user, "vision", "finished", "7", 1007.0, 17.5)
    back = _unpack(cold)
    assert back == rec and back is not rec
    assert back.placement == [(0, 2), (3, 2)] and type(back.placement[0]) is tuple and type(back.group_t0) is tuple
    assert msgspec.msgpack.encode(back) == msgspec.msgpack.encode(rec)  # (what is stored is the same too)
    # every field is in it: one changed anywhere comes back changed
    for f in msgspec.structs.fields(JobRecord):
        if f.type in (int, float, str):
            changed = msgspec.structs.replace(rec, **{f.name: getattr(rec, f.name) + f.type(1)})
            assert _unpack(_pack(changed)) == changed


def test_a_packed_record_is_a_fraction_of_a_record_and_untracked():
    recs = [_ended(i, placement=[(i % 8, 2)]) for i in range(2000)]
    tracemalloc.start()
    try:
        a = tracemalloc.take_snapshot()
        packed = [_pack(r) for r in recs]
        b = tracemalloc.take_snapshot()
        cold_bytes = sum(s.size_diff for s in b.compare_to(a, "filename")) / len(recs)
        full = [_unpack(c) for c in packed]
        c = tracemalloc.take_snapshot()
        full_bytes = sum(s.size_diff for s in c.compare_to(b, "filename")) / len(recs)
    finally:
        tracemalloc.stop()
    assert full == recs
    assert cold_bytes < full_bytes / 2, (cold_bytes, full_bytes)
    import gc

    assert not gc.is_tracked(packed[0])  # (the collector's full passes do not walk them)


def test_ended_records_beyond_the_last_ones_are_packed_and_a_read_keeps_its_change():
    records = JobRecords(keep=2)
    for i in range(6):
        records[f"{i}_{i % 3}"] = _rec(i)
    ids = list(records.keys())
    for j in ids[:4]:
        records[j].status, records[j].end_time = "cancelled", 5.0
    records.settle([records[j] for j in ids[:4]])  # written as they ended, in this order
    kept = list(records.peek())
    assert [type(r) for r in kept] == [Cold, Cold, JobRecord, JobRecord, JobRecord, JobRecord]
    assert records.packed() == 2 and [r.id for r in kept] == ids and len(records) == 6 and ids[0] in records
    copy = records.full(kept[0])
    assert copy.id == ids[0] and copy.status == "cancelled" and records.packed() == 2  # (read, not unpacked)
    assert records.kept(ids[0]) is kept[0]
    rec = records[ids[0]]  # by id: unpacked, and kept so
    assert type(rec) is JobRecord and records.packed() == 1 and records.get(ids[0]) is rec
    rec.reason = "rewritten"
    assert records.get(ids[0]) is rec and records.packed() == 1
    records.settle([])  # (after the write of the change)
    assert records.packed() == 2 and type(records.kept(ids[0])) is Cold
    assert records[ids[0]].reason == "rewritten"  # the change is in the packed record
    records[ids[0]].status = "queued"  # requeued after its end: not ended, so never packed
    records.settle([])
    assert type(records.kept(ids[0])) is JobRecord and records.packed() == 1
    records[ids[4]].status = "failed"
    records.settle([records[ids[4]]])  # a third ends: the first of the last two is packed
    assert [type(records.kept(j)).__name__ for j in ids] == ["JobRecord", "Cold", "Cold", "JobRecord",
                                                              "JobRecord", "JobRecord"]
    assert records.get("nope") is None and records.get("nope", 3) == 3


def test_a_start_packs_the_ended_ones_in_submission_order():
    recs = [_ended(i) if i % 2 else _rec(i) for i in range(10)]
    records = JobRecords(keep=1)
    records.load(reversed(recs))  # (as stored: not in submission order)
    assert [r.id for r in records.peek()] == [r.id for r in recs]
    assert records.packed() == 5 and all((type(r) is Cold) == (i % 2 == 1) for i, r in enumerate(records.peek()))
    records.thaw([recs[9].id])
    assert records.packed() == 4 and type(records.kept(recs[9].id)) is JobRecord
    assert [records.full(r) for r in records.peek()] == recs
    records[recs[7].id].reason = "read"  # unpacked by id ...
    records.settle([])
    assert records.packed() == 4 and records.full(records.kept(recs[7].id)).reason == "read"  # ... and packed
    records.settle([records[recs[1].id]])  # (one written again after its end: the last to end now)
    assert type(records.kept(recs[1].id)) is JobRecord and type(records.kept(recs[9].id)) is Cold
