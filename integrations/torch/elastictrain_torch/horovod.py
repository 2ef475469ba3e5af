"""elastictrain inside Horovod jobs: durable commits with exactly-once data, even batches, and
Horovod's allreduce times in the communication profile.

Horovod Elastic keeps survivors' processes when a worker dies (``hvd.elastic.run``) and rolls
them back to their last ``state.commit()``, in memory. :class:`State` is a ``hvd.elastic.State``
whose commit is a checkpoint of :class:`~elastictrain_torch.TorchCheckpointer` (atomic,
verified, on disk) with the data cursor of the job's exactly-once shards, so that after a failure
every rank, survivors and replacements alike, goes on from the same committed step and no sample
is lost or trained twice::

    import horovod.torch as hvd
    import elastictrain as et
    from elastictrain_torch import TorchCheckpointer, horovod as et_hvd

    hvd.init()
    job = et.init()
    shards = job.shards(et.DatasetSpec("train", len(data), 256, epochs=3))
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    ckpt = TorchCheckpointer("ckpt", model=model, optimizer=opt, shards=shards, job=job,
                             extra_state={"progress": {"step": 0}})
    state = et_hvd.State(ckpt, model, opt)     # restores the newest checkpoint, if any

    @hvd.elastic.run
    def train(state):
        step = ckpt.state["progress"]["step"]
        for batch in et_hvd.even_batches(loader):
            ...
            if step % 50 == 0:
                ckpt.state["progress"] = {"step": step}
                state.commit(step)             # checkpoint + data cursor, then Horovod's host check

    train(state)

Under ``etrun`` (which serves Horovod's rendezvous), a survivor's ``reset`` takes its place in the
new generation from the agent and restores the newest committed checkpoint. Outside etrun (e.g.
under horovodrun) the same code works; the data cursor then follows the rank Horovod assigns.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterable, Iterator, Optional

import horovod.torch as hvd
from horovod.common.elastic import State as _HorovodState
import torch

from elastictrain.runtime.control import ControlChannel
from elastictrain.runtime.profiler import CommStats, comm_profile, register_comm
from elastictrain.wire import CommProfile

from .elastic import _load, _snapshot
from .profiling import tensor_bytes

__all__ = ["State", "even_batches", "HorovodCommProfiler"]

log = logging.getLogger("elastictrain.horovod")


class State(_HorovodState):
    """A ``hvd.elastic.State`` committed through ``ckpt`` (see the module docstring).

    Args:
        ckpt: the job's :class:`~elastictrain_torch.TorchCheckpointer` (with ``shards`` and
            ``job`` for exactly-once data).
        model, optimizer: broadcast from rank 0 by :meth:`sync` (Horovod calls it after every
            reset and before the first call), as ``hvd.elastic.TorchState`` does.
        timeout: seconds a survivor waits for its place in the next generation.
    """

    def __init__(self, ckpt, model: Optional[torch.nn.Module] = None, optimizer=None, *,
                 timeout: float = 120.0) -> None:
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)
        self.ckpt, self.model, self.optimizer, self.timeout = ckpt, model, optimizer, timeout
        self._channel = ControlChannel.from_env()
        ckpt.agree = _agree if hvd.size() > 1 else None
        info = ckpt.restore()
        self._initial = _snapshot(ckpt.state) if info is None else None  # before the first checkpoint
        self._rollback = False

    # Horovod's commit() is save() then check_host_updates(); a durable commit needs the step
    def commit(self, step: Optional[int] = None) -> None:  # type: ignore[override]
        """Checkpoint ``ckpt.state`` at ``step`` (data cursor included), then raise Horovod's
        ``HostsUpdatedInterrupt`` if the membership changed."""
        if step is None:
            raise TypeError("State.commit(step): the step names the checkpoint")
        self.ckpt.save(step)
        self.check_host_updates()

    def save(self) -> None:
        """Nothing to do: :meth:`commit` checkpoints."""

    def restore(self) -> None:
        """Called by Horovod after a failure, before the new generation is formed: the rollback
        waits for :meth:`reset`, because the data cursor is restored in the new generation."""
        self._rollback = True

    def reset(self) -> None:
        """After Horovod re-initialised: move to the new generation and load the newest commit."""
        t0 = time.monotonic()
        ckpt = self.ckpt
        if self._channel is not None:  # under etrun: the agent's assignment names the generation
            data = self._channel.wait(ckpt.generation, self.timeout)
            os.environ.update(data["env"])
            generation, rank, world = (int(os.environ["ET_GENERATION"]), int(os.environ["RANK"]),
                                       int(os.environ["WORLD_SIZE"]))
        else:
            generation, rank, world = ckpt.generation + 1, hvd.rank(), hvd.size()
        if ckpt.job is not None:
            ckpt.job.rebase()
        ckpt.rebase(rank, world, generation)
        if ckpt.shards is not None:
            ckpt.shards.rebase(generation, rank)
        ckpt.agree = _agree if hvd.size() > 1 else None
        info = ckpt.restore()
        if info is None and self._initial is not None:
            _load(ckpt.state, self._initial)
        self._rollback = False
        log.warning("rank %d: in generation %d after %.3f s (%s)", rank, generation, time.monotonic() - t0,
                    f"restored {info.name}" if info else "initial state")

    def sync(self) -> None:
        if self.model is not None:
            hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)


def _agree(flag: bool) -> bool:
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    return bool(hvd.allreduce(t, op=hvd.Max, name="elastictrain.agree").item())


def even_batches(batches: Iterable[Any]) -> Iterator[Optional[Any]]:
    """Yield ``batches`` until every rank has run out, then stop on all ranks together (a rank
    that ran out yields None meanwhile: run a step with no samples so that the gradient
    allreduces still match). One small allreduce per step."""
    it = iter(batches)
    while True:
        batch = next(it, None)
        flag = torch.tensor([0 if batch is None else 1], dtype=torch.int32)
        if hvd.allreduce(flag, op=hvd.Max, name="elastictrain.even_batches").item() == 0:
            return
        yield batch


class HorovodCommProfiler:
    """Horovod's gradient allreduces in elastictrain's communication profile (as
    :class:`~elastictrain_torch.CommProfiler` does for DDP).

    Wraps a ``hvd.DistributedOptimizer``: each gradient's allreduce is timed from its launch (the
    backward hook) to the end of ``synchronize()``, where the optimizer waits for them all; one
    ``synchronize`` is one iteration. Registered for the profiling run's report.
    """

    def __init__(self, optimizer, model: torch.nn.Module) -> None:
        self.stats = CommStats()
        self.sizes = tensor_bytes(model)
        self._started: dict[Any, tuple[float, int]] = {}
        launch, sync = optimizer._allreduce_grad_async, optimizer.synchronize

        def timed_launch(p):
            self._started[p] = (time.perf_counter(), p.grad.numel() * p.grad.element_size() if p.grad is not None
                                else 0)
            return launch(p)

        def timed_sync():
            out = sync()
            end = time.perf_counter()
            started, self._started = self._started, {}
            for t0, nbytes in started.values():
                self.stats.record(nbytes, end - t0)
            if started:
                self.stats.step()
            return out

        optimizer._allreduce_grad_async = timed_launch
        optimizer.synchronize = timed_sync
        register_comm(self)

    def profile(self, worker: Optional[int] = None) -> CommProfile:
        return comm_profile(self.stats, self.sizes, hvd.rank() if worker is None else worker)
