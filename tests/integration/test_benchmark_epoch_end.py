"""benchmarks/epoch_end.py --quick prints every figure as a `name: value unit` line, and a job with
a slow rank ends its epochs sooner paced than with the previous release's prefetching."""

import pytest

from .bench_kit import run_benchmark


@pytest.mark.slow  # make test-slow (35 s; the default run keeps the pacing's unit and iterator tests)
def test_epoch_end_benchmark_prints_every_figure_and_pacing_helps_the_straggler():
    stdout, figures = run_benchmark("epoch_end.py", "--quick", timeout=600)
    want = []
    for job in ("uniform", "straggler"):
        want.append(f"epoch_steps_{job}_ideal")
        for layout in ("before", "paced", "paced_taper8"):
            want += [f"{f}_{job}_{layout}" for f in ("epoch_end_extra_steps", "epoch_seconds",
                                                     "epoch_end_idle_rank_steps", "leases_deferred", "leases_per_epoch")]
        want += [f"epoch_seconds_{job}_paced_vs_before", f"epoch_seconds_{job}_paced_taper8_vs_before"]
    missing = [w for w in want if w not in figures]
    assert not missing, f"not printed: {missing}\n{stdout}"
    # the previous release leaves the slow rank's prefetched shards to the end (21 extra steps in
    # every run here); paced, it took 1-11
    assert float(figures["epoch_end_extra_steps_straggler_paced"]) < float(
        figures["epoch_end_extra_steps_straggler_before"]), stdout
    assert float(figures["leases_deferred_straggler_before"]) == 0, stdout
