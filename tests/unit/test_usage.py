"""GPU time from the event log (elastictrain/usage.py): runs' spans of GPUs, and their sum within a
period as sreport counts it (``history --by --since/--until``)."""

from types import SimpleNamespace

import pytest

from elastictrain.usage import gpu_spans, within


def _e(t, kind, job, **detail):
    return SimpleNamespace(time=float(t), kind=kind, job=job, detail=detail)


def _log():
    # job a: 2 GPUs from 10 (first step at 15) until preempted at 40; resumed on 2 at 50 (first step 52),
    # resized to 4 at 60 (first step of run 3 at 61), finished at 100. Job b: 1 GPU from 20 (first
    # step 21), still running at now=130. Job c: placed at 30, cancelled at 35 before its first step.
    return [_e(10, "start", "a", placement=[["n1", 2]], run=1), _e(15, "first_step", "a", run=1),
            _e(20, "start", "b", placement=[["n1", 1]], run=1), _e(21, "first_step", "b", run=1),
            _e(30, "start", "c", placement=[["n2", 1]], run=1), _e(35, "cancel", "c"),
            _e(38, "preempt", "a", placement=[["n1", 2]], run=1), _e(40, "preempted", "a", run=1),
            _e(50, "resume", "a", placement=[["n2", 2]], run=2), _e(52, "first_step", "a", run=2),
            _e(60, "resize", "a", placement=[["n2", 4]], run=2, workers=4), _e(61, "first_step", "a", run=3),
            _e(100, "finish", "a", run=3)]


def test_allocated_spans_run_from_each_start_and_service_from_each_first_step():
    allocated = gpu_spans(_log(), now=130.0)
    assert sorted(allocated) == [("a", 10.0, 40.0, 2), ("a", 50.0, 60.0, 2), ("a", 60.0, 100.0, 4),
                                 ("b", 20.0, 130.0, 1), ("c", 30.0, 35.0, 1)]
    service = gpu_spans(_log(), now=130.0, service=True)
    assert sorted(service) == [("a", 15.0, 40.0, 2), ("a", 52.0, 60.0, 2), ("a", 61.0, 100.0, 4),
                               ("b", 21.0, 130.0, 1)]  # (c never trained: no service)
    total = within(service, float("-inf"), 130.0)
    assert total == {"a": 25 * 2 + 8 * 2 + 39 * 4, "b": 109.0}


def test_a_period_counts_only_what_fell_within_it_whatever_the_submit_time():
    service = gpu_spans(_log(), now=130.0, service=True)
    assert within(service, 30.0, 70.0) == {"a": 10 * 2 + 8 * 2 + 9 * 4, "b": 40.0}
    assert within(service, 100.0, 200.0) == {"b": 30.0}  # (a ended at 100: nothing of it after)
    assert within(service, 0.0, 15.0) == {}
    # a first step of an older run (a worker still stopping) does not open the new run's span
    late = [_e(0, "start", "d", placement=[["n1", 1]], run=1), _e(5, "first_step", "d", run=1),
            _e(6, "migrate", "d", placement=[["n2", 1]], run=1), _e(7, "first_step", "d", run=1),
            _e(9, "first_step", "d", run=2), _e(10, "finish", "d", run=2)]
    assert sorted(gpu_spans(late, 20.0, service=True)) == [("d", 5.0, 6.0, 1), ("d", 9.0, 10.0, 1)]
    assert within(gpu_spans(late, 20.0), 0.0, 20.0) == {"d": pytest.approx(10.0)}
