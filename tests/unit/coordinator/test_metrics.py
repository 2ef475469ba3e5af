"""``GET /metrics`` (coordinator/metrics.py): Prometheus' text format, every line of it checked
against the format's grammar, and the figures against the scheduler's state they describe."""

import re

import pytest

from elastictrain.coordinator.metrics import render
from elastictrain.wire import NodeCordon, ProjectSet

from .test_quotas import QuotaWorld

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"'
                     r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*")*)\})? '
                     r'(-?[0-9.]+(?:e[+-]?[0-9]+)?|[+-]Inf|NaN)$')


def parse(text: str) -> dict:
    """{(name, labels): value}, checking the format: a HELP and a TYPE before each family's samples,
    counters named ..._total, every sample line well formed, each series once."""
    assert text.endswith("\n")
    out, family, kinds = {}, None, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            family = line.split()[2]
            assert family not in kinds, f"{family} twice"
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name == family and kind in ("gauge", "counter", "histogram"), line
            assert kind != "counter" or name.endswith("_total"), line
            kinds[name] = kind
            continue
        m = _SAMPLE.match(line)
        assert m and (m.group(1) == family or kinds[family] == "histogram" and m.group(1) in (
            f"{family}_bucket", f"{family}_sum", f"{family}_count")), line
        labels = tuple(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        key = (m.group(1), labels)
        assert key not in out, f"{line}: a series twice"
        out[key] = float(m.group(4))
    return out


def test_the_metrics_say_what_the_scheduler_holds(tmp_path):
    w = QuotaWorld(tmp_path, policy="fifo", nodes=2, slots=2, quota_gpus=2)
    w.s.set_project("vision", ProjectSet(gpus=3, users=["alice"]))
    a = w.submit(2)  # alice's 2 GPUs: her quota is full
    w.submit(1)  # waits for the quota
    b = w.submit(1, user="bob", hold=True)
    w.submit(1, user="bob", begin=w.clock.now() + 3600)
    w.s.tick()
    w.run_all()
    w.clock.advance(30)
    m = parse(render("1.2.3", "sqlite", w.s))
    assert m[("elastictrain_info", (("version", "1.2.3"), ("store", "sqlite"), ("policy", "fifo")))] == 1
    assert m[("elastictrain_jobs", (("state", "running"),))] == 1
    assert m[("elastictrain_jobs", (("state", "queued"),))] == 3
    waits = {k[1][0][1]: v for k, v in m.items() if k[0] == "elastictrain_jobs_waiting"}
    assert waits == {"policy": 0, "hold": 1, "begin": 1, "dependency": 0, "array": 0, "quota": 1}
    assert m[("elastictrain_queue_oldest_wait_seconds", ())] == pytest.approx(30.0)
    assert m[("elastictrain_nodes", (("state", "up"),))] == 2
    slots = {k[1][0][1]: v for k, v in m.items() if k[0] == "elastictrain_node_slots"}
    used = {k[1][0][1]: v for k, v in m.items() if k[0] == "elastictrain_node_slots_used"}
    assert slots == {"n1": 2, "n2": 2} and sum(used.values()) == 2
    assert m[("elastictrain_user_gpus_running", (("user", "alice"),))] == 2
    assert m[("elastictrain_user_jobs_waiting", (("user", "bob"),))] == 2
    assert m[("elastictrain_project_gpus_admitted", (("project", "vision"),))] == 2
    assert m[("elastictrain_project_gpus_quota", (("project", "vision"),))] == 3
    assert m[("elastictrain_scheduler_decisions_total", ())] >= 1
    assert m[("elastictrain_events_total", (("kind", "submit"),))] == 4
    assert m[("elastictrain_events_total", (("kind", "start"),))] == 1
    w.exit(a, 0)
    w.s.tick()
    m = parse(render("1.2.3", "sqlite", w.s))
    assert m[("elastictrain_jobs", (("state", "finished"),))] == 1
    assert m[("elastictrain_events_total", (("kind", "start"),))] == 2  # the quota's job started
    assert m[("elastictrain_job_records_packed", ())] == 0  # (one ended: among the last 1000, kept unpacked)
    w.s.records.keep = 0  # (so that the next to end is packed once written)
    w.s.cancel(b)
    w.s.tick()
    m = parse(render("1.2.3", "sqlite", w.s))
    assert m[("elastictrain_job_records_packed", ())] == 2 and m[("elastictrain_jobs", (("state", "cancelled"),))] == 1
    assert not [k for k in m if k[0] == "elastictrain_node_maintenance_start_seconds"]
    at = w.clock.now() + 600
    w.s.cordon("n2", NodeCordon(3600.0, "firmware", True, at))  # planned: only a gauge until it begins
    m = parse(render("1.2.3", "sqlite", w.s))
    assert m[("elastictrain_node_maintenance_start_seconds", (("node", "n2"),))] == at
    assert m[("elastictrain_node_cordoned", (("node", "n2"),))] == 0


def test_label_values_are_escaped_and_a_coordinator_without_a_policy_says_only_what_it_is():
    from elastictrain.coordinator.metrics import _label

    assert _label('NVIDIA "A100"\\x\n') == 'NVIDIA \\"A100\\"\\\\x\\n'
    m = parse(render("1.2.3", "postgres", None))
    assert list(m) == [("elastictrain_info", (("version", "1.2.3"), ("store", "postgres"), ("policy", "")))]


def histogram(m: dict, name: str, label: tuple = ()) -> tuple:
    """(bucket bound -> cumulative count, sum, count) of one series, checked: cumulative counts
    that never fall, and a +Inf bucket equal to the count."""
    buckets = {}
    for (n, labels), v in m.items():
        if n == f"{name}_bucket" and labels[:-1] == label:
            buckets[float(labels[-1][1])] = v
    bounds = sorted(buckets)
    assert bounds and bounds[-1] == float("inf")
    assert [buckets[b] for b in bounds] == sorted(buckets[b] for b in bounds)
    count = m[(f"{name}_count", label)]
    assert buckets[float("inf")] == count
    return buckets, m[(f"{name}_sum", label)], count


def test_histograms_time_each_wait_each_start_up_and_each_decision(tmp_path):
    from elastictrain.wire import JobRequeue, StepReport

    w = QuotaWorld(tmp_path, policy="fifo", nodes=1, slots=2, node_timeout=3600.0)
    a = w.submit(2)
    b = w.submit(2)
    w.clock.advance(40)
    w.s.tick()  # a waited 40 s for its first run
    w.run_all(train=False)
    w.clock.advance(3)
    w.c.step(a, StepReport(0, 1))  # its first step, 3 s after its launch
    w.clock.advance(100)
    w.s.requeue(a, JobRequeue(hold=True))  # an admin's requeue: a checkpoints and exits, b starts
    w.s.tick()
    w.exit(a, 75)
    w.clock.advance(7)
    w.s.tick()
    w.run_all(train=False)
    w.clock.advance(0.5)
    w.c.step(b, StepReport(0, 1))
    w.s.release(a)
    w.exit(b, 0)
    w.clock.advance(10)
    w.s.tick()  # a again, 17.5 s after its requeue
    w.run_all(train=False)
    w.clock.advance(2)
    w.c.step(a, StepReport(0, 2))
    m = parse(render("1", "sqlite", w.s))
    wait, total, n = histogram(m, "elastictrain_job_wait_seconds", (("kind", "start"),))
    assert n == 2 and total == pytest.approx(40.0 + 150.0) and wait[60.0] == 1 and wait[300.0] == 2, wait
    _, total, n = histogram(m, "elastictrain_job_wait_seconds", (("kind", "resume"),))
    assert n == 1 and total == pytest.approx(17.5)
    up, total, n = histogram(m, "elastictrain_run_startup_seconds", (("reason", "start"),))
    assert n == 2 and total == pytest.approx(3.5) and up[0.5] == 1 and up[5.0] == 2, up
    _, total, n = histogram(m, "elastictrain_run_startup_seconds", (("reason", "requeue"),))
    assert n == 1 and total == pytest.approx(2.0)
    _, total, n = histogram(m, "elastictrain_scheduler_decision_seconds")
    assert n == m[("elastictrain_scheduler_decisions_total", ())] >= 3 and 0 < total < 10
