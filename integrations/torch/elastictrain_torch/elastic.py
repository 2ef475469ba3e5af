"""In-process recovery: survivors of a peer's failure keep their process.

Horovod Elastic's ``hvd.elastic.run`` is the model: the training function is wrapped, and when a
peer fails the surviving workers do not exit. Here::

    ckpt = TorchCheckpointer("checkpoints", model=model, optimizer=opt, shards=shards, job=job,
                             extra_state={"progress": {"step": 0, "epoch": 0}})

    @elastic.run(ckpt)
    def train(group):                     # called again after each recovery, with the new group
        ddp = DDP(model, process_group=group)
        step = ckpt.state["progress"]["step"]
        ...                               # the usual loop; ckpt.save(step) now and then

    train()

What happens on a peer's failure: a collective raises in the survivors; ``run`` leaves the
process group, waits for etrun to hand it its place in the next generation (a file in
``ET_CONTROL_DIR``; etrun starts a warm replacement only for the worker that died), joins the new
group, and every rank restores the newest committed checkpoint (or, before the first one, the
state as it was when ``train`` was first called), data cursor included, so no sample is lost or
repeated. Imports, the model object, the optimizer, the data pipeline and (on GPU) the CUDA
context survive. Membership changes that raise nothing (a node joining) are noticed at the next
``ckpt.preempted(step)`` or ``ckpt.save(step)``.

Outside etrun, or when etrun cannot keep survivors (a worker that did not opt in), ``run`` calls
the function once and a failure ends the process as usual; etrun then restarts the group.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import time
from typing import Any, Callable, Optional

import torch.distributed as dist

from elastictrain.errors import ConfigError, StaleGenerationError
from elastictrain.runtime.control import PEER_GONE, ControlChannel, MembershipChanged
from elastictrain.runtime.jobctx import current

__all__ = ["run", "MembershipChanged"]

log = logging.getLogger("elastictrain.elastic")

#: the launcher's words for a collective whose peer is gone, and broader ones: a survivor may also
#: fail connecting, timing out, or anywhere in the backend while its peer's process is gone
_PEER_GONE = PEER_GONE + ("connection refused", "peer", "gloo", "nccl", "timed out", "socket")


def _peer_failure(exc: BaseException, channel: ControlChannel, generation: int) -> bool:
    if isinstance(exc, (MembershipChanged, StaleGenerationError)):
        return True
    if isinstance(exc, getattr(dist, "DistError", ())) or isinstance(exc, RuntimeError):
        text = str(exc).lower()
        if any(word in text for word in _PEER_GONE):
            return True
    return channel.newer(generation) is not None  # whatever it was, the job has moved on


def _snapshot(state: dict) -> dict:
    out = {}
    for k, v in state.items():
        out[k] = copy.deepcopy(v.state_dict()) if hasattr(v, "state_dict") else copy.deepcopy(v)
    return out


def _load(state: dict, snap: dict) -> None:
    for k, v in list(state.items()):
        if k not in snap:
            continue
        if hasattr(v, "load_state_dict"):
            v.load_state_dict(snap[k])
        else:
            state[k] = copy.deepcopy(snap[k])


def run(ckpt, *, backend: str = "gloo", timeout: float = 120.0, **init_kwargs: Any) -> Callable:
    """Decorate the training function ``fn(group, *args, **kwargs)``; see the module docstring.

    Args:
        ckpt: the job's :class:`TorchCheckpointer` (its ``job`` and ``shards`` are moved to
            each new generation).
        backend: for ``torch.distributed.init_process_group`` ("nccl" on GPUs).
        timeout: seconds a survivor waits for its place in the next generation.
    """
    if current() is not None:
        raise ConfigError("elastic.run inside etrun --group is not supported: a group's jobs share one process; "
                          "let etrun restart the group instead")

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            channel = ControlChannel.from_env()
            group = _join(ckpt, backend, init_kwargs)
            info = ckpt.restore()
            initial = _snapshot(ckpt.state) if info is None else None  # before the first checkpoint
            if channel is None:
                return fn(group, *args, **kwargs)
            channel.announce(ckpt.generation)
            ckpt.membership_check = lambda: _check(channel, ckpt)
            try:
                while True:
                    generation = ckpt.generation
                    try:
                        return fn(group, *args, **kwargs)
                    except Exception as exc:  # noqa: BLE001 - re-raised unless a peer failed
                        if not _peer_failure(exc, channel, generation):
                            raise
                        t0 = time.monotonic()
                        log.warning("rank %d, generation %d: %s: %s; recovering in process", ckpt.rank, generation,
                                    type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
                    _leave()
                    data = channel.wait(generation, timeout)
                    os.environ.update(data["env"])
                    _rebase(ckpt)
                    group = _join(ckpt, backend, init_kwargs)
                    channel.announce(ckpt.generation)  # (a member of the new group: keep me if a peer fails)
                    info = ckpt.restore()
                    if info is None and initial is not None:
                        _load(ckpt.state, initial)
                    log.warning("rank %d: in generation %d after %.3f s (%s)", ckpt.rank, ckpt.generation,
                                time.monotonic() - t0, f"restored {info.name}" if info else "initial state")
            finally:
                ckpt.membership_check = None
        return wrapper
    return deco


def _check(channel: ControlChannel, ckpt) -> None:
    if channel.newer(ckpt.generation) is not None:
        raise MembershipChanged(f"generation {ckpt.generation} was superseded")


def _join(ckpt, backend: str, init_kwargs: dict):
    if not dist.is_initialized():
        dist.init_process_group(backend, **init_kwargs)
    group = dist.group.WORLD
    ckpt.use_group(group)
    return group


def _leave() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as exc:  # noqa: BLE001 - the group is broken anyway
            log.debug("destroy_process_group: %s", exc)


def _rebase(ckpt) -> None:
    job = ckpt.job
    if job is not None:
        job.rebase()
    ckpt.rebase(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["ET_GENERATION"]))
    if ckpt.shards is not None:
        ckpt.shards.rebase(ckpt.generation, ckpt.rank)
