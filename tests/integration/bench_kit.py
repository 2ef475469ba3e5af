"""Running a benchmark script as a user would, for the tests that check its figures."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIGURE = re.compile(r"^(\S+): (-?[0-9.]+) \S+", re.M)  # the `name: value unit` lines


def run_benchmark(script: str, *args: str, timeout: float = 300) -> tuple[str, dict[str, str]]:
    """Run ``benchmarks/<script>`` with ``args``; returns its output and its figures (name ->
    value). Fails the test if it exits non-zero."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args], capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout, dict(FIGURE.findall(out.stdout))
