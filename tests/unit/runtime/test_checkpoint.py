"""Checkpointer: round trips, keep-K, corruption and truncation detection, busy saves, kill -9."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from elastictrain.errors import ConfigError
from elastictrain.runtime.checkpoint import CheckpointBusyError, Checkpointer


class Box:
    """Something with state_dict()/load_state_dict(), like a model."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.w = rng.standard_normal((64, 32)).astype(np.float32)
        self.meta = {"lr": 0.1, "ids": (1, 2, 3), 7: "int key", "inf": float("inf")}

    def state_dict(self):
        return {"w": self.w, "meta": self.meta}

    def load_state_dict(self, s):
        self.w, self.meta = s["w"].copy(), s["meta"]


def test_round_trip_and_structure(tmp_path):
    a = Box(1)
    ck = Checkpointer(str(tmp_path), {"box": a, "plain": {"step_arr": np.arange(5)}}, rank=0, world_size=1)
    ck.save(10, extra={"epoch": 2})
    ck.wait()
    b = Box(2)
    ck2 = Checkpointer(str(tmp_path), {"box": b, "plain": None}, rank=0, world_size=1)
    info = ck2.restore()
    assert info.step == 10 and info.extra == {"epoch": 2}
    assert np.array_equal(b.w, a.w) and b.meta == a.meta
    assert np.array_equal(ck2.state["plain"]["step_arr"], np.arange(5))


@pytest.mark.parametrize("url", ["dir", "memory"])
def test_a_state_without_arrays_restores_and_so_does_one_saved_by_an_older_version(tmp_path, url):
    """No array leaves: a 0-byte data file and no chunk checksums (it was once rejected as corrupt,
    so such a job started afresh). Older versions wrote one checksum of nothing: still readable."""
    if url == "memory":
        pytest.importorskip("fsspec")
    where = str(tmp_path / "a") if url == "dir" else f"memory://plain-{os.getpid()}"
    ck = Checkpointer(where, {"progress": {"step": 7, "name": "x"}}, rank=0, world_size=1)
    ck.save(7)
    ck.close()
    again = Checkpointer(where, {"progress": None}, rank=0, world_size=1)
    assert again.restore().step == 7 and again.state["progress"] == {"step": 7, "name": "x"}
    if url != "dir":
        return
    path = tmp_path / "a" / "step-000000007-g0" / "rank0.json"
    from elastictrain.runtime.checkpoint import _TRAILER, _manifest_bytes

    m = json.loads(path.read_bytes().rpartition(_TRAILER)[0])
    assert m["size"] == 0 and m["chunks"] == []
    m["chunks"] = [0]  # as earlier versions wrote it
    path.write_bytes(_manifest_bytes(m))
    again = Checkpointer(str(tmp_path / "a"), {"progress": None}, rank=0, world_size=1)
    assert again.restore().step == 7 and again.state["progress"]["step"] == 7


def test_keeps_the_last_k(tmp_path):
    box = Box()
    ck = Checkpointer(str(tmp_path), {"box": box}, rank=0, world_size=1, keep=2)
    for step in range(1, 6):
        box.w += 1
        ck.save(step)
    ck.close()
    assert sorted(os.listdir(tmp_path)) == ["step-000000004-g0", "step-000000005-g0"]


def test_a_second_save_at_one_step_is_a_no_op(tmp_path):
    """A loop that saves every N steps and at each epoch's end saves twice when the two meet:
    the step's checkpoint is written (and committed) once, with the first save's state."""
    box = Box()
    ck = Checkpointer(str(tmp_path), {"box": box}, rank=0, world_size=1, keep=5)
    first = ck.save(3, extra={"epoch": 0})
    box.w += 1
    assert ck.save(3, extra={"epoch": 1}) == first
    assert ck.stats.saves == 1
    ck.save(4)  # the next step saves again
    ck.close()
    assert ck.stats.saves == 2
    assert sorted(os.listdir(tmp_path)) == ["step-000000003-g0", "step-000000004-g0"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "no_manifest"])
def test_damaged_newest_is_skipped_with_a_warning(tmp_path, damage, caplog):
    box = Box()
    ck = Checkpointer(str(tmp_path), {"box": box}, rank=0, world_size=1, keep=5)
    ck.save(1)
    ck.wait()
    good = box.w.copy()
    box.w += 5
    ck.save(2)
    ck.wait()
    newest = tmp_path / "step-000000002-g0"
    data = newest / "rank0.bin"
    if damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        data.write_bytes(data.read_bytes()[:-100])
    else:
        (newest / "rank0.json").unlink()
    fresh = Box(9)
    info = Checkpointer(str(tmp_path), {"box": fresh}, rank=0, world_size=1).restore()
    assert info.step == 1 and np.array_equal(fresh.w, good)
    assert "step-000000002-g0" in caplog.text and ("checksum" in caplog.text or "truncated" in caplog.text
                                                   or "manifest" in caplog.text)


def test_no_valid_checkpoint_starts_fresh_and_says_so(tmp_path, caplog):
    assert Checkpointer(str(tmp_path), {"box": Box()}, rank=0, world_size=1).restore() is None
    assert "starting fresh" in caplog.text


def test_busy_save_waits_or_raises_and_is_counted(tmp_path):
    big = {"a": np.ones(64 << 20, dtype=np.uint8)}
    ck = Checkpointer(str(tmp_path), {"s": big}, rank=0, world_size=1, on_busy="wait", keep=5)
    ck.save(1)
    ck.save(2)  # the first is very likely still persisting
    ck.wait()
    assert ck.stats.saves == 2 and len(os.listdir(tmp_path)) == 2
    raiser = Checkpointer(str(tmp_path / "r"), {"s": big}, rank=0, world_size=1, on_busy="raise")
    raiser.save(1)
    with pytest.raises(CheckpointBusyError):
        for step in range(2, 50):  # at some point a save lands while one is persisting
            raiser.save(step)
            raiser.wait() if step % 7 == 0 else None


def test_sharded_needs_every_rank(tmp_path):
    for r in range(2):
        ck = Checkpointer(str(tmp_path), {"box": Box(r)}, rank=r, world_size=2, sharded=True)
        ck.save(3)
        ck.wait()
    os.remove(tmp_path / "step-000000003-g0" / "rank1.json")
    assert Checkpointer(str(tmp_path), {"box": Box()}, rank=0, world_size=2, sharded=True).restore() is None


def test_unsupported_values_are_named(tmp_path):
    from elastictrain.errors import ConfigError

    ck = Checkpointer(str(tmp_path), {"s": {"fn": object()}}, rank=0, world_size=1)
    with pytest.raises(ConfigError, match=r"\.s\.fn"):
        ck.save(1)


def test_kill_9_during_background_persist_leaves_the_previous_one(tmp_path):
    child = textwrap.dedent(f"""
        import sys, numpy as np
        from elastictrain.runtime.checkpoint import Checkpointer
        state = {{"a": np.full(256 << 20, 1, dtype=np.uint8)}}
        ck = Checkpointer({str(tmp_path)!r}, {{"s": state}}, rank=0, world_size=1)
        ck.save(1); ck.wait()
        state["a"][:] = 2
        ck.save(2)
        print("persisting", flush=True)
        import time; time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "persisting"
    p.send_signal(signal.SIGKILL)
    p.wait()
    out = {}
    info = Checkpointer(str(tmp_path), out, rank=0, world_size=1).restore()
    # the interrupted save is not complete, so the previous one is restored (or, had it finished
    # before the kill, the new one: either way an intact checkpoint)
    assert info is not None
    assert out["s"]["a"][0] == info.step and (out["s"]["a"] == info.step).all()


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_fsspec_urls(tmp_path, scheme):
    pytest.importorskip("fsspec")
    url = f"memory://ckpt-{os.getpid()}" if scheme == "memory" else f"file://{tmp_path}/remote"
    a = Box(1)
    ck = Checkpointer(url, {"box": a}, rank=0, world_size=1, keep=1)
    ck.save(1)
    ck.save(2)
    ck.close()
    b = Box(2)
    info = Checkpointer(url, {"box": b}, rank=0, world_size=1).restore()
    assert info.step == 2 and np.array_equal(a.w, b.w)
    assert [c[1] for c in Checkpointer(url, {}, rank=0, world_size=1)._list()] == ["step-000000002-g0"]


# ---------------------------------------------------------------- the manifest cannot lie (D5)
def _saved(tmp_path):
    """Two checkpoints (steps 2 and 3) of a small state; returns the states saved at each."""
    states = {}
    for step, lr in ((2, 0.05), (3, 0.04)):
        box = Box(step)
        box.meta = {"lr": lr, "step": step, "pair": [np.arange(3) + step, np.ones(2) * step]}
        ck = Checkpointer(str(tmp_path), {"box": box}, rank=0, world_size=1, keep=5)
        ck.save(step)
        ck.wait()
        states[step] = (box.w.copy(), box.meta["lr"], [x.copy() for x in box.meta["pair"]])
    return states


def _restored(tmp_path):
    box = Box(99)
    info = Checkpointer(str(tmp_path), {"box": box}, rank=0, world_size=1).restore()
    return info, (box.w, box.meta["lr"], box.meta["pair"])


def test_every_flipped_byte_of_the_manifest_is_caught_never_loaded_and_never_a_crash(tmp_path):
    states = _saved(tmp_path)
    path = tmp_path / "step-000000003-g0" / "rank0.json"
    good = path.read_bytes()
    outcomes = {"skipped": 0, "harmless": 0}
    for i in range(len(good)):
        for flip in (0x01, 0x80):
            bad = bytearray(good)
            bad[i] ^= flip
            path.write_bytes(bytes(bad))
            info, (w, lr, pair) = _restored(tmp_path)  # must not raise
            want = states[info.step]
            assert np.array_equal(w, want[0]) and lr == want[1] and all(
                np.array_equal(a, b) for a, b in zip(pair, want[2])), f"byte {i} ^ {flip:#x}: wrong state restored"
            outcomes["harmless" if info.step == 3 else "skipped"] += 1
    path.write_bytes(good)
    # the digest covers every byte of the JSON; only the line end after the digest can change
    # harmlessly (to other whitespace), and then the very same state is restored
    assert outcomes["skipped"] >= 2 * len(good) - 2 and outcomes["skipped"] + outcomes["harmless"] == 2 * len(good)


def test_a_manifest_that_fails_any_check_is_skipped_with_its_reason(tmp_path):
    _saved(tmp_path)
    path = tmp_path / "step-000000003-g0" / "rank0.json"
    body = json.loads(path.read_bytes().rpartition(b"\n#sha256:")[0])
    body["tensors"][0]["nbytes"] = 10 ** 9  # well formed, digest recomputed, but impossible
    import hashlib

    raw = json.dumps(body).encode()
    path.write_bytes(raw + b"\n#sha256:" + hashlib.sha256(raw).hexdigest().encode() + b"\n")
    ck = Checkpointer(str(tmp_path), {"box": Box()}, rank=0, world_size=1)
    assert ck.restore().step == 2
    assert any("outside the data file" in e.get("reason", "") for e in ck.stats.events)


# ---------------------------------------------------------------- pruning by commit status (D6)
class _Commits:
    def __init__(self, names):
        self.names = names

    def commits(self, job, ds):
        from types import SimpleNamespace

        return SimpleNamespace(commits=[SimpleNamespace(checkpoint=n) for n in self.names])


def test_pruning_keeps_the_newest_committed_checkpoints_whatever_is_newer(tmp_path):
    from types import SimpleNamespace

    committed = []
    job = SimpleNamespace(job_id="j", client=_Commits(committed), restore=lambda *a: None)
    shards = SimpleNamespace(spec=SimpleNamespace(name="d"), cursor=lambda step: None, commit=lambda *a: None)
    box = Box()
    for gen, steps, commit in ((1, (10, 20), True), (2, (30, 40, 50, 60), False)):
        ck = Checkpointer(str(tmp_path), {"box": box}, rank=0, world_size=1, generation=gen, keep=1, job=job,
                          shards=shards)
        for step in steps:
            ck.save(step)
            ck.close()
            if commit:
                committed.append(f"step-{step:09d}-g{gen}")
    names = sorted(os.listdir(tmp_path))
    # generation 2 never committed anything (it failed): its four complete checkpoints are newer,
    # yet the only committed one, step 20, is kept; step 10 (older than it) goes
    assert "step-000000020-g1" in names and "step-000000010-g1" not in names, names
    restored = Checkpointer(str(tmp_path), {"box": Box()}, rank=0, world_size=1, job=job, shards=shards).restore()
    assert restored.name == "step-000000020-g1"

    class Down:
        def commits(self, job, ds):
            from elastictrain.errors import CoordinatorUnavailableError

            raise CoordinatorUnavailableError("down")

    job.client = Down()  # the coordinator cannot say what is committed: nothing is deleted
    before = sorted(os.listdir(tmp_path))
    ck = Checkpointer(str(tmp_path), {"box": box}, rank=0, world_size=1, generation=3, keep=1, job=job, shards=shards)
    ck._prune()
    assert sorted(os.listdir(tmp_path)) == before


# ---------------------------------------------------------------- errors name the save that hit them
def test_an_unwritable_directory_is_reported_at_the_save_that_hit_it(tmp_path, monkeypatch):
    from elastictrain.runtime.checkpoint import CheckpointWriteError

    ck = Checkpointer(str(tmp_path), {"box": Box()}, rank=0, world_size=1)
    monkeypatch.setattr(ck.store, "writable", lambda: f"the checkpoint directory {tmp_path} is not writable")
    with pytest.raises(CheckpointWriteError, match=r"cannot save step 7: the checkpoint directory .* not writable"):
        ck.save(7)
    monkeypatch.undo()

    def broken(path, data, fsync):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(ck.store, "write", broken)  # a failure only the background write can see
    ck.save(8)
    with pytest.raises(CheckpointWriteError, match=r"step 8 was not saved: .*Permission denied"):
        ck.wait()


def test_another_jobs_checkpoint_is_never_restored(tmp_path, monkeypatch, caplog):
    """Two jobs saving into one directory (the README's default ``checkpoints``, submitted twice
    from one directory): each manifest names its job; the other job's is skipped, and naming
    it explicitly is an error that says what to do."""
    from elastictrain.runtime.checkpoint import CheckpointOwnerError

    monkeypatch.setenv("ET_JOB_ID", "job-a")
    a = Checkpointer(str(tmp_path), {"box": Box(1)}, rank=0, world_size=1, shards=None, job=None)
    a.job_id = "job-a"
    a.save(550)
    a.close()
    b = Checkpointer(str(tmp_path), {"box": Box(2)}, rank=0, world_size=1)
    b.job_id = "job-b"
    assert b.latest() is None
    assert "belongs to job 'job-a'" in caplog.text
    info = a.latest()
    assert info is not None and info.step == 550  # its own job finds it
    with pytest.raises(CheckpointOwnerError, match="own checkpoint directory"):
        b.restore(info)


def test_under_the_scheduler_a_relative_directory_is_the_jobs_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ET_NODE_NAME", "n1")
    monkeypatch.setenv("ET_JOB_ID", "train-7")
    ck = Checkpointer("checkpoints", {"box": Box()}, rank=0, world_size=1)
    assert ck.dir == os.path.join("checkpoints", "train-7")
    assert Checkpointer(str(tmp_path / "abs"), {"box": Box()}, rank=0, world_size=1).dir == str(tmp_path / "abs")


def test_a_checkpoint_directory_that_cannot_be_made_fails_at_construction_saying_so(tmp_path):
    # it was a raw FileNotFoundError (issue 32.8)
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"the checkpoint directory .*afile/ck cannot be created .*pass a directory"):
        Checkpointer(str(blocker / "ck"), {"x": 1})


def test_a_script_that_raises_just_after_a_save_keeps_that_save(tmp_path):
    # the persist thread is a daemon; the store here is slow (a second per save), so without the
    # exit hook the exception ends the process with the save half done and nothing to restore
    script = textwrap.dedent(f"""
        import time, numpy as np
        from elastictrain.runtime.checkpoint import Checkpointer
        slow = Checkpointer._persist
        def persist(self, *a, **k):
            time.sleep(1.0)
            return slow(self, *a, **k)
        Checkpointer._persist = persist
        ck = Checkpointer({str(tmp_path)!r}, {{"w": np.arange(1000.0)}}, rank=0, world_size=1)
        ck.save(7)
        raise RuntimeError("CUDA out of memory (a crash right after the save)")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "CUDA out of memory" in r.stderr, r.stderr
    assert "exiting while a checkpoint persists" in r.stderr, r.stderr
    ck = Checkpointer(str(tmp_path), {"w": None}, rank=0, world_size=1)
    info = ck.restore()
    assert info is not None and info.step == 7
    assert np.array_equal(ck.state["w"], np.arange(1000.0))
