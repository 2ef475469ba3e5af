"""The Kubernetes engine's reaction to pod-watch events (tests/data/k8s/pod_events.json): exit
0, 75 and 1, a kubelet eviction, a node lost (taint manager, then pod GC), one pod of two still
running, an image that cannot be pulled, a run the coordinator withdrew, a pod deleted by someone
else, and another coordinator's pod. The events are written in the API server's shape (pods as
``kubectl get -o json`` prints them; no cluster recorded them here: docs/kubernetes.md says so).
How the bridge turns the states into exits is the same for every engine (a lost run is requeued
from its checkpoint: code 75)."""

import json
import os

import pytest

from elastictrain.engines.api import parse_run_name
from elastictrain.engines.kubernetes_engine import PodWatch

EVENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "k8s",
                      "pod_events.json")
with open(EVENTS) as f:
    SCENARIOS = json.load(f)


def _replay(name):
    sc = SCENARIOS[name]
    w = PodWatch("c0ffee")
    handle = None
    for kind, pod in sc["events"]:
        job = pod["metadata"]["annotations"]["elastictrain.io/job-id"]
        handle = f"et.{job}.r{pod['metadata']['labels']['elastictrain.io/run']}"
        if sc.get("withdrawn") and kind != "ADDED":
            w.withdrawn.add(handle)
        w.on_event(kind, pod)
    return w, handle, sc["expect"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_pod_events_become_run_states(name):
    w, handle, expect = _replay(name)
    states = {s.handle: s for s in w.states({})}
    if expect is None:
        assert states == {}, "another coordinator's pods are never ours"
        return
    s = states[handle]
    assert (s.job, s.run) == parse_run_name(handle)
    assert s.state == expect["state"], (s.state, s.detail)
    if s.state == "ended":
        assert (s.code, s.lost) == (expect["code"], expect["lost"]), s
        assert s.detail
    assert s.nodes and all(n.startswith("gpu-") for n in s.nodes)


def test_an_unknown_run_is_active_only_while_fresh():
    w = PodWatch("c0ffee")
    assert w.states({"et.j.r1": ("j", 1)}, frozenset({"et.j.r1"}))[0].state == "active"
    s = w.states({"et.j.r1": ("j", 1)})[0]
    assert s.state == "ended" and not s.lost and "no pod" in s.detail


def test_a_reported_run_ignores_its_late_events():
    w, handle, _ = _replay("exit_0")
    w.forget(handle)
    for kind, pod in SCENARIOS["exit_0"]["events"]:
        w.on_event(kind, pod)
    assert w.states({}) == []


def test_the_eviction_and_node_loss_details_say_why():
    w, handle, _ = _replay("eviction")
    assert "low on resource" in w.states({})[0].detail
    w, handle, _ = _replay("node_lost")
    assert "node no longer exists" in w.states({})[0].detail
    w, handle, _ = _replay("image_pull")
    assert "ImagePullBackOff" in w.states({})[0].detail


def test_a_nodes_gpu_type_is_its_gpu_product_label_where_that_is_a_name():
    from elastictrain.engines.api import gpu_type_name as _gpu_type

    assert _gpu_type("NVIDIA-A100-SXM4-80GB") == "NVIDIA-A100-SXM4-80GB"  # (NVIDIA's GPU feature discovery)
    assert _gpu_type("") == "" and _gpu_type("a b/c") == ""
