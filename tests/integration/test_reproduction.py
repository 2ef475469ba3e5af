"""Reproduce the published average JCTs of SRTF, SRSF, Tiresias-L, Muri-S and Muri-L on the Muri traces.

Published values: Muri's draw_fig9-10.py (64 GPUs, 8 nodes x 8), as listed in
traces/README.md (the traces ship with the project, gzipped). Our engine runs with the ``muri`` preset (the reference
simulator's restart-cost and speed model). The target is 10%; SRTF, SRSF and Tiresias-L land
within 0.5%, Muri-S and Muri-L within 6% (see docs/simulator.md).
The Muri runs of all six traces take about a minute, so the default run checks trace3 and
trace3_pr and the ``slow`` run all six.
"""

import os
import statistics

import pytest

from elastictrain.sim.run import SimConfig, simulate

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "traces", "muri")
TRACES = ["trace1", "trace1_pr", "trace3", "trace3_pr", "trace4", "trace4_pr"]
PUBLISHED = {
    "srtf": [1370603, 2303544, 193082, 844395, 581983, 1430856],
    "srsf": [980141, 1801860, 185022, 798058, 487167, 1218502],
    "tiresias-l": [3330371, 6921683, 347213, 2213110, 1319383, 2674023],
}
MURI_PUBLISHED = {
    "muri-s": [867706, 1467192, 85503, 537777, 365468, 954225],
    "muri-l": [1072010, 2141937, 88687, 921095, 429175, 1488034],
}


@pytest.mark.parametrize("trace", TRACES)
def test_published_average_jct_within_10_percent(trace):
    path = os.path.join(ROOT, f"{trace}.csv.gz")
    cfg = SimConfig(path, os.path.join(ROOT, "n8g8.csv"), list(PUBLISHED), preset="muri")
    results = {r.policy: statistics.fmean(j.jct for j in r.jobs) for r in simulate(cfg, progress=False)}
    for policy, values in PUBLISHED.items():
        want = values[TRACES.index(trace)]
        assert abs(results[policy] / want - 1) < 0.10, f"{policy} on {trace}: {results[policy]:.0f} vs {want}"
    # the Tiresias paper's ordering, on the same runs
    assert results["srtf"] < results["tiresias-l"]


@pytest.mark.parametrize("trace", ["trace1", "trace3", "trace4"])
def test_tiresias_beats_yarn_cs_and_best_effort_fifo(trace):
    path = os.path.join(ROOT, f"{trace}.csv.gz")
    cfg = SimConfig(path, os.path.join(ROOT, "n8g8.csv"), ["tiresias-l", "yarn-cs", "fifo-be"], preset="muri")
    avg = {r.policy: statistics.fmean(j.jct for j in r.jobs) for r in simulate(cfg, progress=False)}
    assert avg["tiresias-l"] < avg["fifo-be"] < avg["yarn-cs"], avg


def _muri_traces():
    fast = ("trace3", "trace3_pr")
    return [t if t in fast else pytest.param(t, marks=pytest.mark.slow) for t in TRACES]


@pytest.mark.parametrize("trace", _muri_traces())
def test_muri_published_average_jct_within_10_percent_and_the_papers_orderings(trace):
    path = os.path.join(ROOT, f"{trace}.csv.gz")
    cfg = SimConfig(path, os.path.join(ROOT, "n8g8.csv"), list(MURI_PUBLISHED) + ["srtf", "srsf", "tiresias-l"],
                    preset="muri")
    avg = {r.policy: statistics.fmean(j.jct for j in r.jobs) for r in simulate(cfg, progress=False)}
    for policy, values in MURI_PUBLISHED.items():
        want = values[TRACES.index(trace)]
        assert abs(avg[policy] / want - 1) < 0.10, f"{policy} on {trace}: {avg[policy]:.0f} vs {want}"
    # Figures 9 and 10: Muri-S beats SRSF and SRTF; Muri-L beats Tiresias-L
    assert avg["muri-s"] < avg["srsf"] and avg["muri-s"] < avg["srtf"], avg
    assert avg["muri-l"] < avg["tiresias-l"], avg


@pytest.mark.parametrize("trace", ["trace3", pytest.param("trace1", marks=pytest.mark.slow)])
def test_muri_ablation_worst_ordering_and_no_blossom_are_worse(trace):
    """Figure 11: Muri-L against its worst slot ordering and against grouping in priority order."""
    path = os.path.join(ROOT, f"{trace}.csv.gz")
    cfg = SimConfig(path, os.path.join(ROOT, "n8g8.csv"), ["muri-l", "muri-l-worst", "muri-l-noblossom"],
                    preset="muri")
    avg = {r.policy: statistics.fmean(j.jct for j in r.jobs) for r in simulate(cfg, progress=False)}
    assert avg["muri-l"] < avg["muri-l-worst"], avg
    assert avg["muri-l"] < avg["muri-l-noblossom"], avg
