"""benchmarks/simulator.py prints its figures as `name: value unit` lines (a short selection:
the full run takes half an hour)."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_simulator_benchmark_prints_wall_time_and_scaling_per_policy():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "simulator.py"), "--quick",
                          "--traces", "trace3", "--policies", "srtf,gandiva-fair-stretch64"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    figures = dict(re.findall(r"^(\S+): ([0-9.]+) (?:s|events/s|events)$", out.stdout, re.M))
    want = ["sim_trace3_srtf_wall", "sim_trace3_srtf_events_per_s", "sim_trace3_srtf_avg_jct"]
    for label in ("srtf", "gandiva-fair-stretch64"):
        for n in (2, 10):
            want += [f"sim_synth{n}k_{label}_{f}" for f in ("wall", "events", "avg_jct")]
    missing = [w for w in want if w not in figures]
    assert not missing, f"not printed: {missing}\n{out.stdout}"
    assert all(float(figures[w]) > 0 for w in want), out.stdout
    exponents = dict(re.findall(r"^sim_scaling_(\S+)_exponent: ([0-9.]+)$", out.stdout, re.M))
    assert set(exponents) == {"srtf", "gandiva-fair-stretch64"}, out.stdout
    assert all(0.3 < float(e) < 2.0 for e in exponents.values()), exponents  # linear-ish, not a hang
