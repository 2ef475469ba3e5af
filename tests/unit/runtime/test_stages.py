"""Stage annotations, the recorder and the profiles built from it."""

import threading
import time

import pytest

import elastictrain as et
from elastictrain.errors import ConfigError
from elastictrain.runtime.profiler import attribute_spans, attribute_usage, comm_profile, stage_profile, CommStats
from elastictrain.runtime.stages import Recorder, use_recorder


@pytest.fixture
def rec():
    r = Recorder()
    use_recorder(r)
    yield r
    use_recorder(None)


def test_context_manager_and_decorator_record_each_iteration(rec):
    @et.stage("compute")
    def compute(x):
        time.sleep(0.004)
        return x * 2

    for i in range(4):
        with et.stage("load"):
            time.sleep(0.002)
        assert compute(i) == 2 * i
    rec.next_iteration()
    assert rec.completed == 4
    for it in rec.iterations:
        assert set(it) == {"load", "compute"}
        assert 0.0015 < it["load"] < 0.05 and 0.0035 < it["compute"] < 0.05
    prof = stage_profile(rec, warmup=1)
    assert prof.iterations == 3 and prof.stages["preprocess"] == 0.0
    assert prof.iteration_seconds == pytest.approx(sum(prof.stages.values()))


def test_unknown_stage_and_short_profile_name_the_fix(rec):
    with pytest.raises(ConfigError, match="use one of load, preprocess, compute, sync"):
        et.stage("forward")
    with et.stage("load"):
        pass
    with pytest.raises(ConfigError, match="more than 5 iterations"):
        stage_profile(rec, warmup=5)


def test_overlapping_spans_are_attributed_not_double_counted(rec):
    # a loader thread's spans overlap the main thread's compute spans, into one recorder
    def loader():
        use_recorder(rec)
        with et.stage("load"):
            time.sleep(0.03)

    for _ in range(2):
        t = threading.Thread(target=loader)
        with et.stage("compute"):
            t.start()
            time.sleep(0.02)
        t.join()
    rec.next_iteration()
    for it in rec.iterations:
        assert sum(it.values()) < 0.045  # wall time, not 0.05 of summed spans
        assert it["compute"] == pytest.approx(0.02, abs=0.01)  # compute wins while both run


def test_attribute_spans_and_usage_follow_the_dominant_resource():
    spans = [("compute", 0.0, 1.0), ("load", 0.5, 2.0), ("sync", 2.5, 3.0)]
    got = attribute_spans(spans)
    assert got["compute"] == pytest.approx(1.0) and got["load"] == pytest.approx(1.0)
    assert got["sync"] == pytest.approx(0.5)
    # usage normalized to each resource's peak; below the threshold an instant counts for nobody
    usage = {"load": [100, 100, 0, 0, 1], "compute": [0.1, 0.5, 0.9, 1.0, 0.0]}
    got = attribute_usage(usage, dt=0.5, threshold=0.05)
    assert got == {"load": 0.5 + 0.5, "compute": 1.0}


def test_comm_profile_counts_bytes_and_skew():
    st = CommStats()
    for _ in range(3):
        st.record(1000, 0.001)
        st.record(3000, 0.003)
        st.step()
    p = comm_profile(st, [3000, 500, 500])
    assert p.collectives_per_iteration == 2 and p.bytes_per_iteration == 4000
    assert p.seconds_per_collective == pytest.approx(0.002)
    assert p.skew == pytest.approx(0.75) and p.size_histogram["<4KiB"] == 3
