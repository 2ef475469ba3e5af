"""benchmarks/epoch_end.py --quick prints every figure as a `name: value unit` line, and a job with
a slow rank ends its epochs sooner paced than with the previous release's prefetching."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # make test-slow (35 s; the default run keeps the pacing's unit and iterator tests)
def test_epoch_end_benchmark_prints_every_figure_and_pacing_helps_the_straggler():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "epoch_end.py"), "--quick"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    figures = dict(re.findall(r"^(\S+): (-?[0-9.]+) \S+", out.stdout, re.M))
    want = []
    for job in ("uniform", "straggler"):
        want.append(f"epoch_steps_{job}_ideal")
        for layout in ("before", "paced", "paced_taper8"):
            want += [f"{f}_{job}_{layout}" for f in ("epoch_end_extra_steps", "epoch_seconds",
                                                     "epoch_end_idle_rank_steps", "leases_deferred", "leases_per_epoch")]
        want += [f"epoch_seconds_{job}_paced_vs_before", f"epoch_seconds_{job}_paced_taper8_vs_before"]
    missing = [w for w in want if w not in figures]
    assert not missing, f"not printed: {missing}\n{out.stdout}"
    # the previous release leaves the slow rank's prefetched shards to the end (21 extra steps in
    # every run here); paced, it took 1-11
    assert float(figures["epoch_end_extra_steps_straggler_paced"]) < float(
        figures["epoch_end_extra_steps_straggler_before"]), out.stdout
    assert float(figures["leases_deferred_straggler_before"]) == 0, out.stdout
