"""PyTorch glue for the checkpointer: tensors as leaves, RNG state, pinned buffers, rank agreement.

    ckpt = TorchCheckpointer("ckpt/", model=model, optimizer=opt, scheduler=sched, shards=shards, job=job)
    info = ckpt.restore()          # None on a fresh start
    ...
    if step % 100 == 0:
        ckpt.save(step)            # blocks only to copy tensors into host memory
    if ckpt.preempted(step):       # SIGTERM/SIGUSR1 seen on any rank: saved and durable
        sys.exit(elastictrain.PREEMPTED_EXIT_CODE)
"""

from __future__ import annotations

import logging
import random
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from elastictrain.errors import ConfigError
from elastictrain.runtime import jobctx
from elastictrain.runtime.checkpoint import Checkpointer, _LeafKind, register_leaf

from .distributed import job_group

__all__ = ["TorchCheckpointer", "RNGState"]
log = logging.getLogger("elastictrain.checkpoint")


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _copy_into(t: torch.Tensor, dst: memoryview, _owner) -> None:
    if t.numel() == 0:
        return
    out = torch.frombuffer(dst, dtype=torch.uint8).view(t.dtype).view(t.shape)
    out.copy_(t.detach(), non_blocking=t.is_cuda)


def _rebuild(dtype: str, shape: tuple, raw: memoryview, _tag: str) -> torch.Tensor:
    dt = getattr(torch, dtype)
    n = 1
    for s in shape:
        n *= s
    if n == 0:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dt).view(shape)


register_leaf(_LeafKind(
    match=lambda x: isinstance(x, torch.Tensor),
    describe=lambda t: (_dtype_name(t), tuple(t.shape), t.numel() * t.element_size()),
    copy_into=_copy_into,
    rebuild=_rebuild,
    tag="torch",
))


class RNGState:
    """Random states, saved and restored together: by default the process's global ones (Python's
    ``random``, NumPy's, torch's CPU and CUDA generators); with ``generators``, those objects' own
    states instead (``torch.Generator``, ``random.Random``, ``numpy.random.Generator`` or
    ``RandomState``, in the order given).

    A job of ``etrun --group`` must take its randomness from its own generators: the global ones
    are shared by the group's jobs (``TorchCheckpointer`` then leaves them out). A checkpoint without
    random states (saved inside a group) restores the rest and leaves these as they are."""

    checkpoint_optional = True  # (Checkpointer.restore)

    def __init__(self, generators: Sequence[Any] = ()) -> None:
        for g in generators:
            if _kind(g) is None:
                raise ConfigError(f"rng: {type(g).__name__} is not a random generator; give torch.Generator, "
                                  "random.Random, numpy.random.Generator or numpy.random.RandomState objects")
        self.generators = tuple(generators)

    def state_dict(self) -> dict:
        if self.generators:
            return {"generators": [_get(g) for g in self.generators]}
        s = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            s["cuda"] = torch.cuda.get_rng_state_all()
        return s

    def load_state_dict(self, s: dict) -> None:
        mine = "generators" if self.generators else "global"
        saved = "generators" if "generators" in s else "global"
        if mine != saved or (self.generators and len(s["generators"]) != len(self.generators)):
            what = {"global": "the global random states", "generators": "generators' states"}
            raise ConfigError(
                f"rng: the checkpoint holds {what[saved]}"
                + (f" ({len(s['generators'])})" if saved == "generators" else "")
                + f", but this checkpointer was given {what[mine]}"
                + (f" ({len(self.generators)})" if self.generators else "")
                + "; pass the same rng= as the run that saved it (rng=False restores none)")
        if self.generators:
            for g, state in zip(self.generators, s["generators"]):
                _set(g, state)
            return
        random.setstate(s["python"])
        np.random.set_state(s["numpy"])
        torch.set_rng_state(s["torch"])
        if "cuda" in s and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(s["cuda"])


def _kind(g) -> Optional[str]:
    if isinstance(g, torch.Generator):
        return "torch"
    if isinstance(g, random.Random):
        return "python"
    if isinstance(g, np.random.Generator):
        return "numpy"
    if isinstance(g, np.random.RandomState):
        return "numpy-legacy"
    return None


def _get(g):
    kind = _kind(g)
    if kind == "torch":
        return g.get_state()
    if kind == "python":
        return g.getstate()
    if kind == "numpy":
        return g.bit_generator.state
    return g.get_state()


def _set(g, state) -> None:
    kind = _kind(g)
    if kind == "torch":
        g.set_state(state)
    elif kind == "python":
        g.setstate(_tuples(state))
    elif kind == "numpy":
        g.bit_generator.state = state
    else:
        g.set_state(state)


def _tuples(x):
    """``random.Random.setstate`` wants tuples where a saved state may hold lists."""
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


class TorchCheckpointer(Checkpointer):
    """A :class:`Checkpointer` over a model, optimizer, LR scheduler, GradScaler and RNG states.

    Any of them may be None. ``rng``: True (the global random states: Python's, NumPy's, torch's
    CPU and CUDA), a generator or a list of them (their own states only: :class:`RNGState`), or
    False. Inside ``etrun --group`` True saves none (the global generators are shared by the
    group's jobs; a warning says so): pass the job's own generators. ``extra_state`` adds more
    ``{name: obj}`` entries. CUDA tensors are
    copied to pinned host memory asynchronously; the background writer waits for the copies.
    With ``torch.distributed`` initialized, :meth:`preempted` agrees across ranks (one tiny
    all-reduce), so every rank stops at the same step.
    """

    def __init__(self, directory: str, *, model: Optional[torch.nn.Module] = None, optimizer=None,
                 scheduler=None, scaler=None, rng: Any = True, extra_state: Optional[dict[str, Any]] = None,
                 **kwargs: Any) -> None:
        state: dict[str, Any] = {}
        for name, obj in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler),
                          ("scaler", scaler)):
            if obj is not None:
                state[name] = obj
        if rng is True and jobctx.current() is not None:
            # (etrun --group: the global generators are every grouped job's; restoring them for this
            # job would reset the others' streams, and they are not this job's anyway)
            log.warning("TorchCheckpointer: the global random generators are shared by the jobs of this group, "
                        "so they are not checkpointed; pass this job's own ones: TorchCheckpointer(..., rng=gen)")
        elif rng is True:
            state["rng"] = RNGState()
        elif rng is not False and rng is not None:
            state["rng"] = RNGState(tuple(rng) if isinstance(rng, (list, tuple)) else (rng,))
        state.update(extra_state or {})
        self.group = job_group()  # this job's own group inside etrun --group
        if self.group is not None:
            kwargs.setdefault("rank", dist.get_rank(self.group))
            kwargs.setdefault("world_size", dist.get_world_size(self.group))
        super().__init__(directory, state, **kwargs)
        if torch.cuda.is_available():
            self.alloc_buffer = self._pinned
            self.copy_fence = self._record
        if self.group is not None and dist.get_world_size(self.group) > 1:
            self.agree = self._agree
        self._pinned_tensor = None
        # fault the host buffer in now, in the background; an optimizer that has not stepped yet
        # holds no state, so leave room for Adam-like moments (two per parameter)
        hint = self.state_nbytes()
        if optimizer is not None and model is not None and not optimizer.state:
            params = list(model.parameters())
            hint += 2 * sum(p.numel() * p.element_size() for p in params) + 3 * 64 * len(params)
        self.reserve(hint + hint // 100 + (1 << 20))  # slack for small state the guess misses

    def use_group(self, group) -> None:
        """Save and agree on ``group`` from now on: this rank's place in it, and (with more than
        one rank) the all-reduce that makes every rank stop at the same step. In-process
        recovery calls it with each new generation's group."""
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.agree = self._agree if self.world_size > 1 else None

    def _pinned(self, size: int, populate: bool = False):
        self._pinned_tensor = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        return self._pinned_tensor.numpy()

    @staticmethod
    def _record():
        event = torch.cuda.Event()
        event.record()
        return event.synchronize

    def _agree(self, flag: bool) -> bool:
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())
