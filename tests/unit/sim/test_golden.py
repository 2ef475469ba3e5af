"""Golden run: a fixed simulation of the shipped 60-job Tiresias trace on 8 GPUs (2 nodes x 4),
compared with the checked-in result. Regenerate deliberately with ``python -m tests.unit.sim.test_golden``."""

import json
import os

from elastictrain.sim.report import summarize
from elastictrain.sim.run import SimConfig, simulate

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data")
POLICIES = ["yarn-cs", "fifo-be", "srtf", "srsf", "tiresias-l", "gandiva-ts"]
KEYS = ("avg_jct", "median_jct", "p99_jct", "makespan", "preemptions", "avg_queueing_delay")


def current() -> dict:
    cfg = SimConfig(os.path.join(DATA, "60_job.csv"), "n2g4", POLICIES)
    return {s["policy"]: {k: round(s[k], 6) for k in KEYS} for s in map(summarize, simulate(cfg, progress=False))}


def test_golden_60_job():
    with open(os.path.join(DATA, "golden_60_job.json")) as f:
        golden = json.load(f)
    assert current() == golden


if __name__ == "__main__":
    with open(os.path.join(DATA, "golden_60_job.json"), "w") as f:
        json.dump(current(), f, indent=2, sort_keys=True)
