"""Kubernetes as an engine: a run is one Pod per node, created and watched through the API.

``elastictrain coordinator --policy P --backend kubernetes --k8s-image IMAGE`` talks to the API
server with the official ``kubernetes`` client (in a pod: its service account; elsewhere: the
kubeconfig). The objects of a run are built in :mod:`.k8s_manifests`. What the engine does:

* **capacity**: the nodes, their allocatable ``nvidia.com/gpu``; a node that is not Ready
  offers nothing (it leaves, its runs are requeued); a cordoned one (``spec.unschedulable``) is
  cordoned here too: its runs go on, nothing new is placed there;
* **launch**: the run's Secret (its worker credential, mounted read-only) and its pods;
* **withdraw**: deletes the pods with their grace period: the kubelet sends SIGTERM to ``etrun``,
  whose workers checkpoint and exit 75; **kill**: deletes them with a grace of 0;
* **states**: from a pod watch (:class:`PodWatch`, fed by a thread; a pure function of the
  events it was given, so recorded events replay in the tests): exit 0 finished, 75 preempted,
  another code a failure; a pod the cluster itself disrupted (kubelet eviction, the taint
  manager, a deleted node, the scheduler's preemption) is a *lost* run, requeued from its
  checkpoint; an image that cannot be pulled fails the run with the kubelet's message.

Pods are labelled with the coordinator's id, so a restarted coordinator adopts its runs from the
watch and never another coordinator's. Not run against a real cluster here (docs/kubernetes.md).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from ..errors import ConfigError, ElasticTrainError
from .api import (ACTIVE, ENDED, EngineNode, RunLaunch, RunState, check_cpus_per_worker, combine_codes,
                  gpu_type_name, parse_run_name, run_name)
from .k8s_manifests import (ANNOTATION_JOB, LABEL_COORDINATOR, LABEL_INDEX, LABEL_RUN, cpu_millis, pod_name, run_objects,
                            secret_name)

__all__ = ["KubernetesAdapter", "KubernetesEngineError", "PodWatch", "VERBS"]

log = logging.getLogger(__name__)

#: what the engine does through the API, and so all its Role may allow (deploy/kubernetes/rbac.yaml)
VERBS = {("", "pods"): {"create", "delete", "get", "list", "watch"},
         ("", "secrets"): {"create", "delete"},
         ("", "nodes"): {"get", "list", "watch"}}  # cluster-wide: a ClusterRole

#: DisruptionTarget reasons: the cluster ended the pod, not the job (a lost run: requeued)
_DISRUPTED = {"PreemptionByScheduler", "DeletionByTaintManager", "EvictionByEvictionAPI", "DeletionByPodGC",
              "TerminationByKubelet"}
#: waiting reasons that never resolve by themselves: the run fails with the kubelet's message
_STUCK = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
          "CreateContainerError"}


class KubernetesEngineError(ElasticTrainError):
    """The API server refused or could not be reached; the message has its answer."""

    http_status = 502
    code = "kubernetes"


def _pod_result(pod: dict, deleted: bool) -> tuple[str, Optional[int], str, bool]:
    """``(state, code, detail, lost)`` of one pod (a dict as the API sends it): state ``active``
    or ``ended``."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    name, phase, reason = meta.get("name", "?"), status.get("phase", ""), status.get("reason") or ""
    terminated, waiting = None, None
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") == "etrun":
            st = cs.get("state") or {}
            terminated, waiting = st.get("terminated"), st.get("waiting")
    disrupted = [c for c in status.get("conditions") or []
                 if c.get("type") == "DisruptionTarget" and c.get("status") == "True" and c.get("reason") in _DISRUPTED]
    if reason in ("Evicted", "NodeLost", "Shutdown", "Terminated", "NodeShutdown") or disrupted:
        why = (disrupted[0].get("message") or disrupted[0].get("reason")) if disrupted else \
            (status.get("message") or reason)
        if terminated is None and not deleted and phase not in ("Failed", "Succeeded"):
            return ACTIVE, None, "", False  # being disrupted: its end comes next
        return ENDED, None, f"pod {name}: {why}", True
    if terminated is not None and (phase in ("Failed", "Succeeded") or deleted):
        code = terminated.get("exitCode")
        if code is None and terminated.get("signal"):
            code = 128 + int(terminated["signal"])
        return ENDED, code, f"pod {name} exited {code} ({terminated.get('reason') or phase})", False
    if phase in ("Failed", "Succeeded"):
        return ENDED, 0 if phase == "Succeeded" else None, f"pod {name} {phase.lower()}: {status.get('message') or reason}", False
    if waiting is not None and waiting.get("reason") in _STUCK:
        return ENDED, 127, f"pod {name} cannot start: {waiting.get('reason')}: {waiting.get('message', '')}"[:2000], False
    if deleted:  # gone without a container status: it never ran, or was force-deleted
        return ENDED, None, f"pod {name} deleted before it reported an exit", True
    return ACTIVE, None, "", False


class PodWatch:
    """Runs' states from pod-watch events (``ADDED``/``MODIFIED``/``DELETED`` of pods as dicts).

    ``withdrawn``: handles the coordinator deleted on purpose: a pod of those that disappears is
    the stop it asked for, not a lost node."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.pods: dict[str, tuple[str, int, int, dict, bool]] = {}  # pod -> (job, run, index, pod, deleted)
        self.withdrawn: set[str] = set()
        self.done: dict[str, None] = {}  # runs reported and cleaned up: their late events are ignored

    def on_event(self, kind: str, pod: dict) -> None:
        meta = pod.get("metadata") or {}
        lab = meta.get("labels") or {}
        if lab.get(LABEL_COORDINATOR) != (self.tag or "elastictrain"):
            return
        job = (meta.get("annotations") or {}).get(ANNOTATION_JOB)
        try:
            run, index = int(lab.get(LABEL_RUN, "")), int(lab.get(LABEL_INDEX, ""))
        except ValueError:
            return
        if not job or not meta.get("name") or run_name(job, run) in self.done:
            return
        self.pods[meta["name"]] = (job, run, index, pod, kind == "DELETED")

    def size(self, handle: str) -> int:
        """The pods of the run seen so far (its node count, once all were)."""
        return max([i + 1 for job, run, i, _p, _d in self.pods.values() if run_name(job, run) == handle], default=0)

    def states(self, handles: dict[str, tuple[str, int]], fresh: frozenset = frozenset()) -> list[RunState]:
        """``fresh``: runs just created, whose pods the watch may not have shown yet (active)."""
        by_run: dict[str, list] = {}
        for job, run, index, pod, deleted in self.pods.values():
            by_run.setdefault(run_name(job, run), []).append((index, pod, deleted))
        out = []
        for handle, pods in by_run.items():
            pods.sort(key=lambda p: p[0])
            job, run = parse_run_name(handle) or ("?", 0)
            results = [_pod_result(p, d) for _, p, d in pods]
            nodes = [((p.get("spec") or {}).get("nodeSelector") or {}).get("kubernetes.io/hostname", "") for _, p, _ in pods]
            if handle in self.withdrawn:  # gone on purpose: its pods' exit (75) or nothing (None), never "lost"
                results = [(s, c, d, False) for s, c, d, _ in results]
            lost = [d for s, _, d, x in results if x]
            if lost:
                out.append(RunState(handle, job, run, ENDED, detail="; ".join(lost)[:4000], lost=True, nodes=nodes))
            elif all(s == ENDED for s, *_ in results):
                code = combine_codes([c for _, c, _, _ in results])
                details = [d for _, c, d, _ in results if c == code] or [results[0][2]]
                out.append(RunState(handle, job, run, ENDED, code=code, detail=details[0], nodes=nodes))
            else:
                out.append(RunState(handle, job, run, ACTIVE, nodes=nodes))
        known = {s.handle for s in out}
        for handle, key in handles.items():
            if handle not in known:
                out.append(RunState(handle, *key, ACTIVE) if handle in fresh else
                           RunState(handle, *key, ENDED, detail=f"no pod of run {handle} is left"))
        return out

    def forget(self, handle: str) -> None:
        """The run was reported and its pods deleted: its records go, and its late events are ignored."""
        for name in [n for n, (job, run, *_r) in self.pods.items() if run_name(job, run) == handle]:
            del self.pods[name]
        self.withdrawn.discard(handle)
        self.done[handle] = None
        while len(self.done) > 100_000:  # the oldest first (run numbers only grow)
            del self.done[next(iter(self.done))]


class KubernetesAdapter:
    """The Kubernetes API behind :class:`~elastictrain.engines.api.EngineAdapter`."""

    name = "kubernetes"

    def __init__(self, namespace: str, image: str, coordinator: str, *, tag: str = "", python: str = "python3",
                 service_account: Optional[str] = None, kueue_queue: Optional[str] = None,
                 scheduler_name: Optional[str] = None, cpus_per_worker: int = 0,
                 kueue_per_project: bool = False) -> None:
        self.cpus_per_worker = check_cpus_per_worker(cpus_per_worker)  # 0: the nodes' GPUs
        self.gpus_from = "the cluster (no node has nvidia.com/gpu allocatable)"
        if not namespace or len(namespace) > 63 or not namespace.replace("-", "a").isalnum() or namespace != namespace.lower():
            raise ConfigError(f"--k8s-namespace {namespace!r}: give a namespace name (lower case, digits and -)")
        if not image or any(c.isspace() for c in image):
            raise ConfigError(f"--k8s-image {image!r}: give an image reference, e.g. registry.example.com/train:1.0")
        self.namespace, self.image, self.coordinator = namespace, image, coordinator
        self.tag, self.python, self.service_account = tag, python, service_account
        self.kueue_queue, self.scheduler_name, self.kueue_per_project = kueue_queue, scheduler_name, kueue_per_project
        self.watch = PodWatch(tag)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="et-k8s")
        self._api = None
        self._watching = False
        self._grace: dict[str, int] = {}
        self._sizes: dict[str, int] = {}  # handle -> pods launched
        self._launched: dict[str, float] = {}  # handle -> when (its pods reach the watch a moment later)

    def _core(self):
        if self._api is None:
            try:
                from kubernetes import client, config
            except ImportError:
                raise ConfigError("--backend kubernetes needs the client: pip install 'elastictrain[kubernetes]'") from None
            try:
                config.load_incluster_config()
            except config.ConfigException:
                try:
                    config.load_kube_config()
                except (config.ConfigException, OSError) as exc:
                    raise KubernetesEngineError(f"no Kubernetes credentials: not in a pod, and no kubeconfig ({exc}); "
                                                "set KUBECONFIG or run the coordinator in the cluster") from None
            self._api = client.CoreV1Api()
        if not self._watching:
            self._watching = True
            threading.Thread(target=self._watch_loop, name="et-k8s-watch", daemon=True).start()
        return self._api

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _watch_loop(self) -> None:
        from kubernetes import watch

        selector = f"{LABEL_COORDINATOR}={self.tag or 'elastictrain'}"
        api = self._api
        while True:
            try:
                listing = api.list_namespaced_pod(self.namespace, label_selector=selector)
                with self._lock:
                    for p in listing.items:
                        self.watch.on_event("ADDED", api.api_client.sanitize_for_serialization(p))
                for ev in watch.Watch().stream(api.list_namespaced_pod, self.namespace, label_selector=selector,
                                               resource_version=listing.metadata.resource_version, timeout_seconds=300):
                    with self._lock:
                        self.watch.on_event(ev["type"], api.api_client.sanitize_for_serialization(ev["object"]))
            except Exception as exc:  # noqa: BLE001 - the watch expires or the API server restarts: list again
                log.warning("pod watch in %s broke (%s); listing again", self.namespace, exc)
                time.sleep(2.0)

    def _raise(self, what: str, exc: Exception):
        status = getattr(exc, "status", None)
        reason = getattr(exc, "reason", "") or str(exc)
        raise KubernetesEngineError(f"{what}: the API server answered {status} {reason}"[:1000]) from None

    # ------------------------------------------------------------------ capacity
    async def nodes(self) -> list[EngineNode]:
        return await self._call(self._nodes)

    def _nodes(self) -> list[EngineNode]:
        try:
            items = self._core().list_node().items
        except Exception as exc:  # noqa: BLE001 - ApiException, urllib3 errors: one message
            self._raise("listing nodes", exc)
        out = []
        for n in items:
            ready = any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
            cordoned = bool(n.spec and n.spec.unschedulable)
            alloc, per = n.status.allocatable or {}, self.cpus_per_worker
            state = "cordoned" if cordoned else ("ready" if ready else "not ready")
            if per:  # (a cordoned node's pods keep running: it is up, and takes nothing new)
                out.append(EngineNode(n.metadata.name, cpu_millis(alloc.get("cpu", "0")) // (1000 * per),
                                      ready, state, "slot", cordoned))
            else:
                labels = (n.metadata.labels or {}) if n.metadata else {}
                out.append(EngineNode(n.metadata.name, int(str(alloc.get("nvidia.com/gpu", "0")) or 0),
                                      ready, state, cordoned=cordoned,
                                      gpu_type=gpu_type_name(labels.get("nvidia.com/gpu.product", ""))))
        return sorted(out, key=lambda e: e.name)

    # ------------------------------------------------------------------ runs
    async def launch(self, run: RunLaunch) -> str:
        return await self._call(self._launch, run)

    def _launch(self, run: RunLaunch) -> str:
        api = self._core()
        secret, pods = run_objects(run, image=self.image, coordinator=self.coordinator, namespace=self.namespace,
                                   tag=self.tag, python=self.python, service_account=self.service_account,
                                   kueue_queue=self.kueue_queue, scheduler_name=self.scheduler_name,
                                   cpus_per_worker=self.cpus_per_worker, kueue_per_project=self.kueue_per_project)
        handle = run_name(run.job, run.run)
        try:
            if secret is not None:
                api.create_namespaced_secret(self.namespace, secret)
            for pod in pods:
                api.create_namespaced_pod(self.namespace, pod)
        except Exception as exc:  # noqa: BLE001
            self._delete(run.job, run.run, len(pods), 0)
            self._raise(f"creating the pods of {handle}", exc)
        self._grace[handle] = pods[0].spec.termination_grace_period_seconds
        self._sizes[handle] = len(pods)
        self._launched[handle] = time.monotonic()
        return handle

    def _delete(self, job: str, run: int, n: int, grace: Optional[int]) -> None:
        from kubernetes import client

        api = self._core()
        body = client.V1DeleteOptions(grace_period_seconds=grace)
        for i in range(n):
            try:
                api.delete_namespaced_pod(pod_name(job, run, i), self.namespace, body=body)
            except Exception as exc:  # noqa: BLE001 - already gone is fine; anything else is logged
                if getattr(exc, "status", None) != 404:
                    log.warning("deleting pod %s: %s", pod_name(job, run, i), exc)
        if grace == 0:
            try:
                api.delete_namespaced_secret(secret_name(job, run), self.namespace)
            except Exception:  # noqa: BLE001 - a run without a credential has none
                pass

    def _nnodes(self, handle: str) -> int:
        with self._lock:
            return max(self._sizes.get(handle, 0), self.watch.size(handle), 1)

    async def withdraw(self, handle: str) -> None:
        await self._stop(handle, self._grace.get(handle))  # the kubelet's SIGTERM, then the pod's grace

    async def kill(self, handle: str) -> None:
        await self._stop(handle, 0)

    async def _stop(self, handle: str, grace: Optional[int]) -> None:
        key = parse_run_name(handle)
        if key is None:
            return
        with self._lock:
            self.watch.withdrawn.add(handle)
        await self._call(self._delete, *key, self._nnodes(handle), grace)

    def output(self, handle: str) -> Optional[str]:
        return None  # the pods' output is the cluster's (kubectl logs; a log collector)

    async def runs(self, handles: dict[str, tuple[str, int]]) -> list[RunState]:
        self._core()
        now = time.monotonic()
        fresh = frozenset(h for h, t in self._launched.items() if now - t < 60)
        with self._lock:
            states = self.watch.states(handles, fresh)
        out = []
        for s in states:
            if s.state == ENDED:  # reported now (or, not ours to report: a run of an earlier life that ended)
                await self._call(self._delete, s.job, s.run, max(len(s.nodes), self._nnodes(s.handle)), 0)
                with self._lock:
                    self.watch.forget(s.handle)
                for memo in (self._grace, self._sizes, self._launched):
                    memo.pop(s.handle, None)
            if s.handle in handles or s.state == ACTIVE:
                out.append(s)
        return out
