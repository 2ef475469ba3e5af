"""Ray as an engine: a run is a placement group pinned to the decided nodes, one actor per node.

``elastictrain coordinator --policy P --backend ray --ray-address HOST:PORT`` connects to a Ray
cluster as a driver (Ray is an optional extra, ``pip install 'elastictrain[ray]'``; nothing else
imports it). The scheduler decides as on any engine; the bridge (:mod:`.bridge`) turns each
decided run into one :meth:`RayAdapter.launch`:

* a **placement group** named ``et.<job>.r<run>``, one bundle of ``{"GPU": n}`` per node (on a
  cluster without GPUs, ``cpus_per_worker``: ``{"CPU": n x cpus_per_worker}``, and a node offers
  ``CPU // cpus_per_worker`` worker slots), each bundle pinned to its node by the node's
  ``ray.io/node-id`` label, so Ray reserves the whole run at once (a gang) and exactly where the
  policy put it;
* one **actor** per bundle (:class:`~elastictrain.engines.ray_task.RunProcess`), detached and
  named ``et.<job>.r<run>.n<i>`` in this coordinator's namespace, which starts ``etrun`` as a
  subprocess: the same command, environment and account rules as a node daemon's task, joining
  this coordinator with the job's id and run, so shards, generations and checkpoints are those of
  every other engine.

Stopping: :meth:`withdraw` has each actor send SIGTERM to its ``etrun`` (its workers checkpoint
and exit 75); the bridge calls :meth:`kill` only after the grace period (SIGKILL to the session,
then ``ray.kill`` and the placement group removed). ``ray.kill`` alone would skip the checkpoint.

States come from Ray: each actor's ``poll`` (exit status and new output, copied to a file here,
so no filesystem need be shared with the nodes); an actor that died with its node, or a node
Ray no longer counts alive, is a lost run (requeued from its checkpoint). Capacity is Ray's alive
nodes and their ``GPU`` resources. Actors and placement groups are detached: a coordinator that
restarts finds its runs by name in its namespace and adopts them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

import msgspec

from ..errors import ConfigError, ElasticTrainError
from .api import (ACTIVE, ENDED, EngineNode, RunLaunch, RunState, check_cpus_per_worker, combine_codes,
                  gpu_type_name, parse_run_name, run_name)

__all__ = ["RayAdapter", "RayEngineError", "node_name"]

log = logging.getLogger(__name__)

_WAIT = 2.0  # seconds a round of polls waits for the actors (a pending actor answers later)
_CALL = 30.0  # seconds any other Ray call may take


class RayEngineError(ElasticTrainError):
    """Ray could not be reached or refused a request; the message says what to check."""

    http_status = 502
    code = "ray"


def node_name(node_id: str) -> str:
    """Our name for a Ray node: ``ray-`` and the first 12 hex digits of its id (``ray list nodes``)."""
    return f"ray-{node_id[:12]}"


@dataclass
class _RayRun:
    handle: str
    job: str
    run: int
    actors: list  # actor handles, in node order
    nodes: list
    offsets: list = field(default_factory=list)


class RayAdapter:
    """Ray behind :class:`~elastictrain.engines.api.EngineAdapter`.

    Args:
        address: the Ray cluster (``HOST:PORT`` of its GCS, as ``ray start --head`` printed; or ``auto``).
        coordinator: the URL the Ray nodes reach the coordinator at.
        state_dir: where the runs' output is kept on the coordinator's host.
        tag: this coordinator's id: its namespace is ``elastictrain-<tag>``, so the runs of another
            coordinator on the same Ray cluster are never adopted.
    """

    name = "ray"

    def __init__(self, address: str, coordinator: str, state_dir: str, *, tag: str = "",
                 cpus_per_worker: int = 0) -> None:
        if not address or any(c.isspace() for c in address):
            raise ConfigError(f"--ray-address {address!r}: give the head's HOST:PORT (as `ray start --head` printed)")
        self.cpus_per_worker = check_cpus_per_worker(cpus_per_worker)  # 0: the nodes' GPUs
        self.gpus_from = f"the Ray cluster at {address}"
        self.address, self.coordinator = address, coordinator
        self.state_dir = os.path.abspath(state_dir)
        self.namespace = f"elastictrain-{tag}" if tag else "elastictrain"
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="et-ray")  # Ray's calls block: one thread
        self._runs: dict[str, _RayRun] = {}
        self._ended: dict[str, RunState] = {}
        self._ids: dict[str, str] = {}  # our node name -> Ray node id
        self._alive: set[str] = set()  # Ray ids of the nodes alive at the last look
        self._actor_cls = None

    # ------------------------------------------------------------------ plumbing
    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _ray(self):
        try:
            import ray
        except ImportError:
            raise ConfigError("--backend ray needs Ray: pip install 'elastictrain[ray]'") from None
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, namespace=self.namespace, log_to_driver=False,
                         configure_logging=False, include_dashboard=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise RayEngineError(f"cannot connect to Ray at {self.address}: {exc}; is `ray start --head` up "
                                     "there, and is this Ray's version the cluster's?") from None
            from .ray_task import RunProcess

            self._actor_cls = ray.remote(RunProcess)
            log.info("connected to Ray at %s (namespace %s)", self.address, self.namespace)
        return ray

    # ------------------------------------------------------------------ capacity
    async def nodes(self) -> list[EngineNode]:
        return await self._call(self._nodes)

    def _nodes(self) -> list[EngineNode]:
        ray = self._ray()
        out: dict[str, EngineNode] = {}
        alive = set()
        for n in ray.nodes():
            nid = n.get("NodeID", "")
            if not nid:
                continue
            name = node_name(nid)
            up = bool(n.get("Alive"))
            if up:
                alive.add(nid)
            if name in out and out[name].up:  # a dead node's record beside its alive namesake
                continue
            self._ids[name] = nid
            res, per = n.get("Resources") or {}, self.cpus_per_worker
            if per:
                out[name] = EngineNode(name, int(float(res.get("CPU", 0))) // per, up, "alive" if up else "dead", "slot")
            else:
                kinds = [k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")]  # (Ray names it)
                kind = gpu_type_name(kinds[0]) if len(kinds) == 1 else ""
                out[name] = EngineNode(name, int(float(res.get("GPU", 0))), up, "alive" if up else "dead",
                                       gpu_type=kind)
        self._alive = alive
        return [out[k] for k in sorted(out)]

    # ------------------------------------------------------------------ runs
    async def launch(self, run: RunLaunch) -> str:
        return await self._call(self._launch, run)

    def _launch(self, run: RunLaunch) -> str:
        self._ray()
        from ray.util import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if any(n not in self._ids for n in run.nodes):
            self._nodes()
        missing = [n for n in run.nodes if n not in self._ids]
        if missing:
            raise RayEngineError(f"Ray has no node {', '.join(missing)} (left the cluster?)")
        handle = run_name(run.job, run.run)
        self._stale(handle)
        per = self.cpus_per_worker
        pg = placement_group([{"CPU": float(t.slots * per)} if per else {"GPU": float(t.slots)} for t in run.tasks],
                             strategy="PACK", name=handle,
                             lifetime="detached",
                             bundle_label_selector=[{"ray.io/node-id": self._ids[n]} for n in run.nodes])
        actors = []
        for i, (node, task) in enumerate(zip(run.nodes, run.tasks)):
            actors.append(self._actor_cls.options(
                name=f"{handle}.n{i}", lifetime="detached", num_cpus=0, num_gpus=0 if per else task.slots,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote(
                    msgspec.json.encode(task), self.coordinator, node))
        self._runs[handle] = _RayRun(handle, run.job, run.run, actors, list(run.nodes), [0] * len(actors))
        self._ended.pop(handle, None)
        return handle

    def _stale(self, handle: str) -> None:
        """Actors or a placement group left under ``handle`` by an earlier life: removed first."""
        ray = self._ray()
        for actor in self._actors(self._named().get(handle, [])):
            ray.kill(actor)
        self._remove_pg(handle)

    async def withdraw(self, handle: str) -> None:
        await self._call(self._signal, handle, 15, False)  # SIGTERM to etrun: a checkpoint, then exit 75

    async def kill(self, handle: str) -> None:
        await self._call(self._kill, handle)

    def _kill(self, handle: str) -> None:
        r = self._runs.get(handle)
        if r is not None:
            self._release(r)
        self._ended.setdefault(handle, RunState(handle, *(parse_run_name(handle) or ("?", 0)), ENDED, code=137,
                                                detail="killed (SIGKILL) by the coordinator"))

    def _signal(self, handle: str, sig: int, group: bool) -> None:
        ray = self._ray()
        r = self._runs.get(handle)
        if r is None:
            return
        refs = [a.signal.remote(sig, group) for a in r.actors]
        ray.wait(refs, num_returns=len(refs), timeout=_WAIT)

    def _release(self, r: _RayRun) -> None:
        """Nothing of the run outlives this: its processes, actors and placement group."""
        ray = self._ray()
        refs = [a.stop.remote() for a in r.actors]
        ray.wait(refs, num_returns=len(refs), timeout=_WAIT)
        for a in r.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead with its node
                pass
        self._remove_pg(r.handle)
        self._runs.pop(r.handle, None)

    def _remove_pg(self, handle: str) -> None:
        from ray.util import get_placement_group, remove_placement_group

        try:
            remove_placement_group(get_placement_group(handle))
        except ValueError:  # none under that name
            pass

    def output(self, handle: str) -> Optional[str]:
        key = parse_run_name(handle)
        return self._out_path(*key) if key else None

    def _out_path(self, job: str, run: int) -> str:
        return os.path.join(self.state_dir, "ray", job, f"run{run}", "etrun.log")

    async def runs(self, handles: dict[str, tuple[str, int]]) -> list[RunState]:
        return await self._call(self._states, handles)

    def _actors(self, names: list[str]) -> list:
        """The live actors of these names (one gone meanwhile is left out)."""
        ray = self._ray()
        out = []
        for n in names:
            try:
                out.append(ray.get_actor(n))
            except ValueError:
                pass
        return out

    def _named(self) -> dict[str, list[str]]:
        """This namespace's run actors, by run handle."""
        ray = self._ray()
        out: dict[str, list[str]] = {}
        for name in ray.util.list_named_actors():
            handle, sep, idx = name.rpartition(".n")
            if sep and idx.isdigit() and parse_run_name(handle):
                out.setdefault(handle, []).append(name)
        for names in out.values():
            names.sort(key=lambda n: int(n.rpartition(".n")[2]))
        return out

    def _states(self, handles: dict[str, tuple[str, int]]) -> list[RunState]:
        ray = self._ray()
        named = self._named()
        for handle, names in named.items():  # a run of ours the engine still has: adopted
            if handle not in self._runs and handle not in self._ended:
                job, run = parse_run_name(handle)
                actors = self._actors(names)
                if actors:
                    self._runs[handle] = _RayRun(handle, job, run, actors, [], self._offsets(job, run, len(actors)))
        for handle in list(self._ended):
            if handle not in handles:
                del self._ended[handle]  # reported already
        polls = {h: [a.poll.remote(r.offsets[i]) for i, a in enumerate(r.actors)] for h, r in self._runs.items()}
        every = [ref for refs in polls.values() for ref in refs]
        if every:
            ray.wait(every, num_returns=len(every), timeout=_WAIT)
        states: dict[str, RunState] = {}
        for handle, refs in polls.items():
            states[handle] = self._state(self._runs[handle], refs)
        for handle, s in self._ended.items():
            states.setdefault(handle, s)
        for handle, key in handles.items():
            if handle not in states:
                states[handle] = RunState(handle, *key, ENDED, detail=f"Ray has no actor of run {handle} any more")
        return list(states.values())

    def _state(self, r: _RayRun, refs: list) -> RunState:
        ray = self._ray()
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        codes, details, lost, nodes = [], [], [], list(r.nodes)
        copied = list(r.offsets)
        for i, ref in enumerate(refs):
            if ref not in ready:
                codes.append(None)
                continue
            try:
                code, detail, data, nid = ray.get(ref, timeout=_CALL)
            except (ActorUnavailableError, GetTimeoutError):  # unreachable a moment: ask again next time
                codes.append(None)
                continue
            except RayActorError as exc:  # it died: its node failed, or someone killed it
                lost.append(i)
                codes.append(None)
                details.append(f"actor {i} died: {str(exc).splitlines()[0][:200]}")
                continue
            if data:
                self._append(r, data)
                r.offsets[i] += len(data)
            if len(nodes) <= i:
                nodes.append(node_name(nid))
            if nid not in self._alive and self._alive:
                lost.append(i)
            codes.append(code)
            if detail:
                details.append(detail)
        if r.offsets != copied:
            self._save_offsets(r)  # once per poll, after every actor's output is in the mirror
        if not r.nodes:
            r.nodes = nodes
        if lost:
            self._release(r)
            s = RunState(r.handle, r.job, r.run, ENDED, detail=f"Ray lost the run: {'; '.join(details)}", lost=True,
                         nodes=r.nodes)
        elif all(c is not None for c in codes):
            self._release(r)
            code = combine_codes(codes)
            s = RunState(r.handle, r.job, r.run, ENDED, code=code, detail=f"Ray run {r.handle} ended (exit {code}"
                         + (f"; {details[0]}" if details else "") + ")", nodes=r.nodes)
        else:
            return RunState(r.handle, r.job, r.run, ACTIVE, nodes=r.nodes)
        self._ended[r.handle] = s
        return s

    def _offsets(self, job: str, run: int, actors: int) -> list:
        """How much of each actor's output an earlier life of this coordinator copied (an adopted
        run goes on from there rather than copying it twice)."""
        try:
            with open(self._out_path(job, run) + ".offsets", "rb") as f:
                got = msgspec.json.decode(f.read(), type=list[int])
        except (OSError, msgspec.DecodeError):
            return [0] * actors
        return got if len(got) == actors and all(n >= 0 for n in got) else [0] * actors

    def _save_offsets(self, r: _RayRun) -> None:
        path = self._out_path(r.job, r.run) + ".offsets"
        with open(path + ".tmp", "wb") as f:
            f.write(msgspec.json.encode(r.offsets))
        os.replace(path + ".tmp", path)

    def _append(self, r: _RayRun, data: bytes) -> None:
        path = self._out_path(r.job, r.run)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "ab") as f:
            f.write(data)


def release_all(address: str, state_dir: str) -> int:
    """Stop every run the coordinator whose engine state is in ``state_dir`` has on Ray (its
    processes, actors and placement groups); returns how many runs. For an operator retiring a
    coordinator, and the tests: ``python -m elastictrain.engines.ray_engine ADDRESS STATE_DIR``."""
    path = os.path.join(state_dir, "coordinator-id")
    with open(path) as f:
        tag = f.read().strip()
    adapter = RayAdapter(address, "", state_dir, tag=tag)
    named = adapter._named()
    for handle, names in named.items():
        adapter._release(_RayRun(handle, *parse_run_name(handle), adapter._actors(names), []))
    return len(named)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3:
        sys.exit("usage: python -m elastictrain.engines.ray_engine RAY_ADDRESS ENGINE_STATE_DIR")
    print(f"released {release_all(sys.argv[1], sys.argv[2])} run(s)")
