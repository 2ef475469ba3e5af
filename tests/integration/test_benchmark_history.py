"""benchmarks/history_period.py prints every figure as a `name: value unit` line, and the kept spans
give every job of the last day the GPU-seconds that folding the whole event log gives (the script
checks it, and exits non-zero where they disagree)."""

from .bench_kit import run_benchmark


def test_history_period_benchmark_prints_every_figure_and_agrees_with_the_event_log():
    stdout, figures = run_benchmark("history_period.py", "--quick", "--jobs", "600", "--repeat", "1")
    want = ["history_period_events", "history_period_jobs_in_last_day", "history_period_catch_up",
            "history_period_events_path", "history_period_spans_path", "history_period_spans_path_whole_30_days",
            "history_period_spans_vs_events_path"]
    assert not [w for w in want if w not in figures], stdout
    assert int(figures["history_period_events"]) == 600 * 7 and int(figures["history_period_jobs_in_last_day"]) > 0
