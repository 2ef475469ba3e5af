"""The Kubernetes objects the engine creates for a decision, against golden files (one node, two
nodes, unequal GPUs per node, a Muri group task), built from the client's typed models; the
deploy/kubernetes/ manifests validated by the same models; the Role allows what the engine does
and no more. Regenerate the golden files with ET_UPDATE_GOLDEN=1 after a deliberate change."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("kubernetes")
yaml = pytest.importorskip("yaml")

from kubernetes import client  # noqa: E402

from elastictrain.engines.api import RunLaunch, warn_if_no_gpus  # noqa: E402
from elastictrain.engines.k8s_manifests import manifests_yaml, pod_name, run_objects  # noqa: E402
from elastictrain.engines.kubernetes_engine import VERBS  # noqa: E402
from elastictrain.wire import GroupMember, Task  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GOLDEN = os.path.join(ROOT, "tests", "data", "k8s")
DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
URL = "http://elastictrain-coordinator.elastictrain.svc:7707"


def _task(job, slots, nnodes, **kw):
    base = dict(job=job, run=3, slots=slots, gpus=list(range(slots)), nnodes=nnodes, command=["train.py", "--lr", "0.1"],
                workdir="/code", env={"OMP_NUM_THREADS": "4"}, max_restarts=3, grace=30.0, module=False,
                token="tok-" + job)
    base.update(kw)
    return Task(**base)


def _cases():
    group = [GroupMember(job="a", run=2, command=["a.py"], workdir="/code", reason="start", env={}),
             GroupMember(job="b", run=5, command=["b.py", "--x", "1"], workdir="/code", reason="resume", env={})]
    return {
        "one_node": RunLaunch("resnet", 3, ("gpu-a",), (_task("resnet", 4, 1),)),
        "two_nodes": RunLaunch("bert", 3, ("gpu-a", "gpu-b"), (_task("bert", 2, 2), _task("bert", 2, 2)), "vision"),
        "unequal_gpus": RunLaunch("Big_Job.v2", 3, ("gpu-a", "gpu-b"),
                                  (_task("Big_Job.v2", 3, 2, grace=12.5), _task("Big_Job.v2", 1, 2, grace=12.5))),
        "group_task": RunLaunch("g-1", 3, ("gpu-c",), (_task("g-1", 2, 1, group=group, run_as="root",
                                                             allow_root=True, token=""),)),
    }


@pytest.fixture(autouse=True)
def _fixed_env(monkeypatch):
    monkeypatch.delenv("ET_LOG_LEVEL", raising=False)


@pytest.mark.parametrize("case", sorted(_cases()))
def test_manifests_match_the_golden_files(case):
    extra = {"kueue_queue": "team-a", "scheduler_name": "default-scheduler"} if case == "two_nodes" else {}
    secret, pods = run_objects(_cases()[case], image="registry.example.com/train:1.4", coordinator=URL,
                               namespace="ml", tag="c0ffee", **extra)
    text = manifests_yaml([secret, *pods])
    path = os.path.join(GOLDEN, f"{case}.yaml")
    if os.environ.get("ET_UPDATE_GOLDEN") == "1":
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert text == f.read(), f"{case}: the manifests changed; if on purpose, rerun with ET_UPDATE_GOLDEN=1"
    docs = list(yaml.safe_load_all(text))
    for d in docs:  # each document is a valid object of its kind, field by field
        getattr(client, f"V1{d['kind']}").model_validate(d)
    pod_docs = [d for d in docs if d["kind"] == "Pod"]
    run = _cases()[case]
    assert [p["spec"]["nodeSelector"]["kubernetes.io/hostname"] for p in pod_docs] == list(run.nodes)
    assert [p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for p in pod_docs] == \
        [str(t.slots) for t in run.tasks]
    for p in pod_docs:
        assert p["spec"]["restartPolicy"] == "Never"
        assert p["spec"]["terminationGracePeriodSeconds"] == int(-(-run.tasks[0].grace // 1)) + 15
        assert p["metadata"]["labels"]["elastictrain.io/run"] == "3"
        assert len(p["metadata"]["name"]) <= 63
        cmd = p["spec"]["containers"][0]["command"]
        assert cmd[:4] == ["python3", "-u", "-m", "elastictrain.launcher.cli"] and URL in cmd
    if extra:  # one Kueue pod group of all the run's pods
        for p in pod_docs:
            assert p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
            assert p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == str(len(run.nodes))
        assert len({p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] for p in pod_docs}) == 1
    assert [p["metadata"]["labels"].get("elastictrain.io/project") for p in pod_docs] == [run.project or None] * len(
        pod_docs)  # (the job's project, submit -A)
    assert (secret is None) == (not run.tasks[0].token)
    if secret is not None:  # the credential is in the Secret, never in the pod spec
        assert run.tasks[0].token not in yaml.safe_dump(pod_docs)


def test_a_misspelt_field_fails_when_built_not_on_a_cluster():
    with pytest.raises(Exception, match="restart_polcy|Extra inputs"):
        client.V1PodSpec(containers=[], restart_polcy="Never")


def test_pod_names_are_valid_and_distinct_for_any_job_id():
    names = {pod_name(j, 12, 3) for j in ("a", "A", "a_b", "a.b", "x" * 128, "Job-1")}
    assert len(names) == 6
    for n in names:
        assert len(n) <= 63 and n == n.lower() and n[0].isalnum() and n[-1].isalnum()


def _deploy_docs():
    out = []
    for name in sorted(os.listdir(DEPLOY)):
        if name.endswith(".yaml") and name != "kustomization.yaml":
            with open(os.path.join(DEPLOY, name)) as f:
                out += [(name, d) for d in yaml.safe_load_all(f) if d]
    return out


def test_deploy_manifests_are_valid_objects():
    kinds = []
    for name, d in _deploy_docs():
        group = d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else ""
        version = d["apiVersion"].split("/")[-1].capitalize()
        prefix = {"": "", "apps": "", "rbac.authorization.k8s.io": ""}[group]
        model = getattr(client, f"{prefix}{version}{d['kind']}")
        model.model_validate(d)
        kinds.append(d["kind"])
    assert sorted(set(kinds)) == ["ClusterRole", "ClusterRoleBinding", "Deployment", "Namespace",
                                  "PersistentVolumeClaim", "Role", "RoleBinding", "Service", "ServiceAccount"]
    with open(os.path.join(DEPLOY, "kustomization.yaml")) as f:
        listed = yaml.safe_load(f)["resources"]
    assert sorted(listed) == sorted({n for n, _ in _deploy_docs()})


def test_the_role_allows_exactly_what_the_engine_does():
    granted = {}
    for _, d in _deploy_docs():
        if d["kind"] in ("Role", "ClusterRole"):
            for rule in d["rules"]:
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        granted[(g, r)] = set(rule["verbs"]), d["kind"]
    assert {k: v for k, (v, _) in granted.items()} == VERBS
    assert granted[("", "nodes")][1] == "ClusterRole" and granted[("", "pods")][1] == "Role"


def test_the_deployment_runs_a_coordinator_command_that_parses():
    (dep,) = [d for _, d in _deploy_docs() if d["kind"] == "Deployment"]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    code = ("import sys; from elastictrain.cli import get_parser, _engine_config; a = get_parser().parse_args(sys.argv[1:]);"
            "e = _engine_config(a); print(e.kind, e.namespace, e.image, e.coordinator_url)")
    out = subprocess.run([sys.executable, "-c", code, *c["args"]], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, ET_K8S_NAMESPACE="elastictrain"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["kubernetes", "elastictrain", "registry.example.com/elastictrain:latest",
                                  "http://elastictrain-coordinator.elastictrain.svc:7707"]


def test_dry_run_prints_the_manifests(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    r = subprocess.run([sys.executable, "-m", "elastictrain", "submit", "--dry-run", "--backend", "kubernetes",
                        "--k8s-image", "reg/train:1", "--nodes", "n1:2,n2:1", "--name", "train", "--workdir",
                        str(tmp_path), "--", "train.py", "--epochs", "3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(r.stdout))
    assert [d["kind"] for d in docs] == ["Secret", "Pod", "Pod"]
    assert [d["spec"]["nodeSelector"]["kubernetes.io/hostname"] for d in docs[1:]] == ["n1", "n2"]
    for d in docs:
        getattr(client, f"V1{d['kind']}").model_validate(d)


def test_on_a_cluster_without_gpus_pods_ask_for_their_workers_cpus():
    run = _cases()["unequal_gpus"]  # 3 workers on gpu-a, 1 on gpu-b
    _, pods = run_objects(run, image="registry.example.com/train:1.4", coordinator=URL, namespace="ml",
                          cpus_per_worker=2)
    docs = list(yaml.safe_load_all(manifests_yaml(pods)))
    for d in docs:
        client.V1Pod.model_validate(d)
    res = [d["spec"]["containers"][0]["resources"] for d in docs]
    assert res == [{"limits": {"cpu": "6"}, "requests": {"cpu": "6"}}, {"limits": {"cpu": "2"}, "requests": {"cpu": "2"}}]


def test_nodes_offer_cpu_slots_and_a_cluster_without_gpus_names_the_option(caplog):
    """The adapter's reading of ``list_node`` (the API server's V1Node objects, built here: no API
    server runs in these tests, docs/kubernetes.md): allocatable CPUs // CPUs per worker."""
    from elastictrain.engines.k8s_manifests import cpu_millis
    from elastictrain.engines.kubernetes_engine import KubernetesAdapter

    assert [cpu_millis(q) for q in ("4", "3500m", "0.5", "x")] == [4000, 3500, 500, 0]
    nodes = [client.V1Node(metadata=client.V1ObjectMeta(name=n), spec=client.V1NodeSpec(unschedulable=cordon),
                           status=client.V1NodeStatus(allocatable={"cpu": cpu, "memory": "8Gi"},
                                                      conditions=[client.V1NodeCondition(type="Ready", status="True")]))
             for n, cpu, cordon in (("b", "3500m", False), ("a", "8", True))]

    class Listing:  # what CoreV1Api.list_node returns
        def list_node(self):
            return client.V1NodeList(items=nodes)

    def adapter(per):
        a = KubernetesAdapter("ml", "img:1", URL, cpus_per_worker=per)
        a._api = Listing()
        a._core = lambda: a._api
        return a

    got = adapter(2)._nodes()
    # a cordoned node is up (its pods go on) and cordoned (nothing new is placed there)
    assert [(n.name, n.gpus, n.up, n.kind, n.cordoned) for n in got] == [("a", 4, True, "slot", True),
                                                                         ("b", 1, True, "slot", False)]
    gpu_less = adapter(0)
    assert [n.gpus for n in gpu_less._nodes()] == [0, 0]
    assert warn_if_no_gpus(gpu_less._nodes(), gpu_less.cpus_per_worker, gpu_less.name, gpu_less.gpus_from, False)
    assert any("has no GPUs" in r.getMessage() and "--engine-cpus-per-worker N" in r.getMessage()
               for r in caplog.records)


def test_with_a_queue_per_project_a_projects_runs_go_through_its_own_localqueue():
    def queue(project, **kw):
        run = RunLaunch("bert", 3, ("gpu-a",), (_task("bert", 2, 1),), project)
        _, pods = run_objects(run, image="img:1", coordinator=URL, namespace="ml", **kw)
        return pods[0].metadata.labels.get("kueue.x-k8s.io/queue-name")

    assert queue("vision", kueue_queue="team-a", kueue_per_project=True) == "vision"
    assert queue("", kueue_queue="team-a", kueue_per_project=True) == "team-a"  # a job of no project
    assert queue("Vision_2", kueue_queue="team-a", kueue_per_project=True) == "team-a"  # not a valid queue name
    assert queue("vision", kueue_per_project=True) == "vision"
    assert queue("vision", kueue_queue="team-a") == "team-a"  # (not asked for)
    assert queue("", kueue_per_project=True) is None
