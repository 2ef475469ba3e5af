"""Stragglers on real processes. Node replacement: an elastic etrun job of 3 one-worker nodes (--nnodes 2:3) and a
spare agent; from step 60 one node's worker computes 3x slower (synchronous DDP: every rank's
step slows). The coordinator flags the rank from its own work per step (non-sync et.stage spans)
within 3 monitor windows, excludes its node for a cooldown, the spare takes its place, and the
job's throughput comes back; every sample is trained exactly once. Fewer samples: a 4-node job
whose ranks ask for their part of the batch; the slow rank's share is cut instead, and the job
keeps all its nodes. (The scenarios are benchmarks/autoscale.py's, which prints the same figures.)"""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench():
    spec = importlib.util.spec_from_file_location("autoscale_bench", os.path.join(ROOT, "benchmarks", "autoscale.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # make test-slow (about 25 s; the flagging itself is in tests/unit)
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


@pytest.mark.slow  # make test-slow (the default run stays under 15 minutes)
def test_a_straggler_that_asks_for_its_part_gets_fewer_samples_and_the_job_keeps_its_nodes(tmp_path):
    # 4 nodes, --nnodes 3:4, no spare; --uneven: every rank takes its part of the 32-sample batch
    # from job.local_batch() and computes per sample; one node 3x slower from step 60
    r = _bench().straggler(str(tmp_path), quick=True, shares=True)
    logs = "".join(open(os.path.join(tmp_path, f)).read()[-2000:] for f in sorted(os.listdir(tmp_path))
                   if f.endswith(".log"))
    assert r["events"], logs
    ev = r["events"][0].detail
    assert ev["action"].startswith("fewer samples per step"), ev  # not "excluded": the node stays
    assert r["detect"] is not None and r["detect"] <= 3 * 1.0 + 2.0, r["detect"]
    cut = r["shares"]
    assert cut is not None and len(cut.weights) == 4, cut  # only the flagged rank's share was cut
    assert cut.weights[ev["worker"]] < 0.6 and sum(w < 1.0 for w in cut.weights) == 1, (cut, ev)
    assert r["slowed"] < 0.6 * r["before"], r
    # one rank at a third of its speed: at most (3 + 1/3) / 4 = 0.83 of the speed before (the
    # benchmark's straggler_shares_throughput_recovered holds the 0.8 target; here, with CI's noise,
    # the job must clearly come back from the slowdown)
    assert r["after"] >= 0.7 * r["before"] and r["after"] > 1.4 * r["slowed"], r
    res = r["result"]
    assert (res["min"], res["max"], res["world"]) == (1, 1, 4), res  # every sample once, no node lost
    assert not any(x.startswith("straggler@") for x in res["reasons"]), res  # no restart
    assert "batch shares" in r["status"], r["status"]
