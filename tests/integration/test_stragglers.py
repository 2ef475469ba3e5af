"""Stragglers on real processes: an elastic etrun job of 3 one-worker nodes (--nnodes 2:3) and a
spare agent; from step 60 one node's worker computes 3x slower (synchronous DDP: every rank's
step slows). The coordinator flags the rank from its own work per step (non-sync et.stage spans)
within 3 monitor windows, excludes its node for a cooldown, the spare takes its place, and the
job's throughput comes back; every sample is trained exactly once. (The scenario is
benchmarks/autoscale.py's, which prints the same figures.)"""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench():
    spec = importlib.util.spec_from_file_location("autoscale_bench", os.path.join(ROOT, "benchmarks", "autoscale.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_straggler_is_flagged_and_its_node_replaced(tmp_path):
    r = _bench().straggler(str(tmp_path), quick=True)
    logs = "".join(open(os.path.join(tmp_path, f)).read()[-2000:] for f in sorted(os.listdir(tmp_path))
                   if f.endswith(".log"))
    assert r["events"], logs  # the flag is in the event log ...
    ev = r["events"][0].detail
    assert ev["action"].startswith("excluded for") and ev["slowdown"] > 1.5, ev
    assert r["flag"] is not None and r["flag"].slowdown > 1.5  # ... and in the job's resources (status)
    assert r["detect"] is not None and r["detect"] <= 3 * 1.0 + 2.0, r["detect"]  # 3 windows of 1 s, + slack
    assert r["slowed"] < 0.6 * r["before"], r  # the slowdown was real
    assert r["after"] >= 0.8 * r["before"], r
    res = r["result"]
    assert (res["min"], res["max"], res["world"]) == (1, 1, 3), res
    assert any(x.startswith("straggler@") for x in res["reasons"]), res
    assert "own work" in r["status"]
