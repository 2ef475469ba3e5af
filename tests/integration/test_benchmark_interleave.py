"""benchmarks/interleave.py prints every figure the docs quote, as `name: value unit` lines."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # make test-slow: the default run stays under 15 minutes
def test_interleave_benchmark_prints_every_figure_of_a_mix():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "interleave.py"), "--quick",
                          "--mixes", "io_io", "--item-every", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    figures = dict(re.findall(r"^(\S+): ([0-9.]+) (?:x|ms/iteration)$", out.stdout, re.M))
    want = [f"interleave_io_io_item1_{m}_{f}" for m in ("free", "locks", "timeshare", "executor", "predicted")
            for f in ("sum", "min_member")]
    want += ["interleave_io_io_item1_executor_vs_best_baseline", "interleave_io_io_item1_executor_vs_predicted",
             "interleave_item1_alone_io"]
    missing = [w for w in want if w not in figures]
    assert not missing, f"not printed: {missing}\n{out.stdout}"
    assert all(float(figures[w]) > 0 for w in want), out.stdout
