"""The Kubernetes objects of one run: one Pod per node (and a Secret with the run's credential).

Built from the official client's typed models (``V1Pod``, ``V1Container``, ...), which refuse an
unknown or misspelt field when they are built, not when a cluster reads them. The engine
(:mod:`.kubernetes_engine`) creates them; ``elastictrain submit --dry-run --backend kubernetes``
prints them (:func:`manifests_yaml`).

A pod runs the run's ``etrun`` for its node (the same command every engine runs,
:mod:`~elastictrain.launcher.task_command`), pinned to its node (``nodeSelector:
kubernetes.io/hostname``), asking for its GPUs (``nvidia.com/gpu``; on a cluster without GPUs, its
workers' CPUs), ``restartPolicy: Never``
(the coordinator decides what runs next, never the kubelet), and a termination grace of the
job's grace plus the 15 s every engine allows ``etrun`` to finish after its workers' checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
from typing import Optional

from ..launcher.task_command import etrun_command, task_env
from ..wire import Task
from .api import RunLaunch

__all__ = ["run_objects", "cpu_millis", "manifests_yaml", "pod_name", "LABEL_JOB", "LABEL_RUN", "LABEL_COORDINATOR",
           "LABEL_PROJECT",
           "ANNOTATION_JOB", "TOKEN_DIR", "default_namespace", "KILL_MARGIN"]

LABEL_MANAGED = "app.kubernetes.io/managed-by"
LABEL_COORDINATOR = "elastictrain.io/coordinator"
LABEL_JOB = "elastictrain.io/job"
LABEL_RUN = "elastictrain.io/run"
LABEL_INDEX = "elastictrain.io/node-index"
LABEL_PROJECT = "elastictrain.io/project"  # the job's project (submit -A): what cost reports group pods by
ANNOTATION_JOB = "elastictrain.io/job-id"  # the job id itself (a label value is capped at 63 characters)
TOKEN_DIR = "/var/run/elastictrain"
LOG_DIR = "/tmp/elastictrain"
KILL_MARGIN = 15  # seconds past the job's grace (the bridge's KILL_AFTER: etrun exits after its workers)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a Kubernetes object's name (a LocalQueue's)
_LABEL_OK = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


def _digest(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _dns(job: str) -> str:
    """``job`` as a DNS-1123 label part: lower case, ``-`` for anything else, with a digest of
    the id where that changed it (jobs ``A`` and ``a`` must not share pods) or it was long."""
    s = re.sub(r"[^a-z0-9-]", "-", job.lower()).strip("-") or "job"
    if s != job or len(s) > 30:
        s = f"{s[:30].rstrip('-')}-{_digest(job)}"
    return s


def pod_name(job: str, run: int, index: int) -> str:
    """``et-<job>-r<run>-n<i>``: at most 63 characters, valid for any job id."""
    return f"et-{_dns(job)}-r{run}-n{index}"


def secret_name(job: str, run: int) -> str:
    return f"et-{_dns(job)}-r{run}-token"


def job_label(job: str) -> str:
    return job if _LABEL_OK.match(job) else f"h-{_digest(job, 16)}"


def labels(job: str, run: int, tag: str) -> dict[str, str]:
    return {LABEL_MANAGED: "elastictrain", LABEL_COORDINATOR: tag or "elastictrain", LABEL_JOB: job_label(job),
            LABEL_RUN: str(run)}


def default_namespace() -> str:
    """The coordinator's own pod's namespace where it runs in one, else ``default``."""
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def _security(task: Task):
    """Never root unless an admin allowed it; the user's UNIX uid where this host knows it."""
    from kubernetes import client

    uid = gid = None
    if task.run_as:
        try:
            pw = pwd.getpwnam(task.run_as)
            uid, gid = pw.pw_uid, pw.pw_gid
        except KeyError:
            pass
    return client.V1SecurityContext(allow_privilege_escalation=False, run_as_non_root=not task.allow_root or None,
                                    run_as_user=uid, run_as_group=gid)


def cpu_millis(quantity: str) -> int:
    """A Kubernetes CPU quantity (``4``, ``3500m``, ``0.5``) in thousandths of a CPU (0 if unreadable)."""
    q = str(quantity).strip()
    try:
        return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)
    except ValueError:
        return 0


def run_objects(run: RunLaunch, *, image: str, coordinator: str, namespace: str, tag: str = "",
                python: str = "python3", service_account: Optional[str] = None, kueue_queue: Optional[str] = None,
                scheduler_name: Optional[str] = None, cpus_per_worker: int = 0,
                kueue_per_project: bool = False) -> tuple[Optional[object], list]:
    """The Secret (None for a run without a credential) and the Pods of ``run``, in node order.

    ``kueue_queue``: admit the run's pods through that Kueue LocalQueue as one pod group (Kueue's
    plain-pod integration: all of them or none); ``kueue_per_project``: a run of a job charged to a
    project goes through the LocalQueue named as the project instead (a project whose name is not a
    valid object name, or a job of none, through ``kueue_queue``). ``scheduler_name``: the pods' scheduler.
    ``cpus_per_worker``: a cluster without GPUs: each pod asks for that many CPUs per worker, not
    ``nvidia.com/gpu``."""
    from kubernetes import client

    grace = int(-(-max(t.grace for t in run.tasks) // 1)) + KILL_MARGIN
    meta_labels = labels(run.job, run.run, tag)
    annotations = {ANNOTATION_JOB: run.job}
    pod_labels, pod_annotations = dict(meta_labels), dict(annotations)
    if run.project:
        pod_labels[LABEL_PROJECT] = job_label(run.project)
    if kueue_per_project and run.project and _DNS_LABEL.match(run.project):
        kueue_queue = run.project  # (the project's own LocalQueue: Kueue's quota and accounting by team)
    if kueue_queue:  # one workload of len(nodes) pods: Kueue admits the gang or nothing
        pod_labels.update({"kueue.x-k8s.io/queue-name": kueue_queue,
                           "kueue.x-k8s.io/pod-group-name": f"et-{_dns(run.job)}-r{run.run}"})
        pod_annotations["kueue.x-k8s.io/pod-group-total-count"] = str(len(run.nodes))
    token = run.tasks[0].token
    secret = None
    volumes = [client.V1Volume(name="dshm", empty_dir=client.V1EmptyDirVolumeSource(medium="Memory"))]
    mounts = [client.V1VolumeMount(name="dshm", mount_path="/dev/shm")]  # DataLoader workers share memory
    if token:
        secret = client.V1Secret(
            api_version="v1", kind="Secret", type="Opaque", string_data={"token": token},
            metadata=client.V1ObjectMeta(name=secret_name(run.job, run.run), namespace=namespace,
                                         labels=dict(meta_labels), annotations=dict(annotations)))
        volumes.append(client.V1Volume(name="credential", secret=client.V1SecretVolumeSource(
            secret_name=secret_name(run.job, run.run), default_mode=0o400)))
        mounts.append(client.V1VolumeMount(name="credential", mount_path=TOKEN_DIR, read_only=True))
    pods = []
    for i, (node, task) in enumerate(zip(run.nodes, run.tasks)):
        cmd = etrun_command(task, coordinator, log_dir=LOG_DIR, python=python,
                            token_file=os.path.join(TOKEN_DIR, "token") if token else None)
        env = task_env(task, node)
        gpus = {"cpu": str(task.slots * cpus_per_worker)} if cpus_per_worker else {"nvidia.com/gpu": str(task.slots)}
        container = client.V1Container(
            name="etrun", image=image, command=cmd, working_dir=task.workdir,
            env=[client.V1EnvVar(name=k, value=env[k]) for k in sorted(env)],
            resources=client.V1ResourceRequirements(limits=dict(gpus), requests=dict(gpus)),
            volume_mounts=list(mounts), security_context=_security(task))
        pods.append(client.V1Pod(
            api_version="v1", kind="Pod",
            metadata=client.V1ObjectMeta(name=pod_name(run.job, run.run, i), namespace=namespace,
                                         labels={**pod_labels, LABEL_INDEX: str(i)}, annotations=dict(pod_annotations)),
            spec=client.V1PodSpec(
                scheduler_name=scheduler_name, restart_policy="Never", node_selector={"kubernetes.io/hostname": node},
                termination_grace_period_seconds=grace, containers=[container], volumes=list(volumes),
                service_account_name=service_account, automount_service_account_token=False,
                enable_service_links=False)))
    return secret, pods


def manifests_yaml(objects: list) -> str:
    """``objects`` (typed models) as one YAML stream, as ``kubectl apply -f`` takes it."""
    import yaml
    from kubernetes import client

    api = client.ApiClient()
    docs = [api.sanitize_for_serialization(o) for o in objects if o is not None]
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
