"""Keras/TensorFlow state for the checkpointer, and a Keras callback around it.

We save the model's and optimizer's variables (Keras 3 tracks every piece of state as a
variable, the dropout seed generators' states included) through elastictrain's checkpointer
rather than ``tf.train.Checkpoint``'s own files: the checkpointer's snapshot is taken in
memory and persisted in the background, its files are atomic and checksummed, and the data
cursor is committed with them.
"""

from __future__ import annotations

from typing import Any, Optional

import keras

from elastictrain.runtime.checkpoint import Checkpointer

__all__ = ["KerasState", "TFCheckpointer", "ElasticKerasCallback"]


class KerasState:
    """``state_dict()``/``load_state_dict()`` over a Keras model and its optimizer."""

    def __init__(self, model: keras.Model) -> None:
        self.model = model

    def state_dict(self) -> dict:
        opt = getattr(self.model, "optimizer", None)
        return {"model": {v.path: v.numpy() for v in self.model.variables},
                "optimizer": {v.path: v.numpy() for v in (opt.variables if opt is not None else [])}}

    def load_state_dict(self, s: dict) -> None:
        variables = {v.path: v for v in self.model.variables}
        missing = sorted(set(s["model"]) ^ set(variables))
        if missing:
            raise ValueError(f"checkpoint and model differ in variables: {missing[:5]}")
        for path, value in s["model"].items():
            variables[path].assign(value)
        opt = getattr(self.model, "optimizer", None)
        if opt is not None and s["optimizer"]:
            if not opt.built:
                opt.build(self.model.trainable_variables)
            ovars = {v.path: v for v in opt.variables}
            for path, value in s["optimizer"].items():
                ovars[path].assign(value)


class TFCheckpointer(Checkpointer):
    """A :class:`Checkpointer` over a (compiled) Keras model, plus any extra ``{name: obj}``."""

    def __init__(self, directory: str, model: keras.Model, *, extra_state: Optional[dict[str, Any]] = None,
                 **kwargs: Any) -> None:
        state: dict[str, Any] = {"keras": KerasState(model)}
        state.update(extra_state or {})
        super().__init__(directory, state, **kwargs)


class ElasticKerasCallback(keras.callbacks.Callback):
    """Save every ``every_n_steps`` batches, at each epoch's end and on preemption; restore when
    ``fit`` starts; count consumed batches for :class:`ElasticTFData`.

    Pass ``initial_epoch=callback.initial_epoch`` to ``fit`` so that a resumed run continues the
    epoch it was in. After ``fit`` returns, ``callback.preempted`` tells whether to exit with
    ``elastictrain.PREEMPTED_EXIT_CODE``.
    """

    def __init__(self, checkpointer: TFCheckpointer, data=None, every_n_steps: int = 100) -> None:
        super().__init__()
        self.ckpt, self.data, self.every = checkpointer, data, every_n_steps
        self.step, self.epoch, self.preempted, self.restored = 0, 0, False, None
        self._began = False
        self._latest = checkpointer.latest()  # verified once, restored from in on_train_begin
        self.initial_epoch = int(self._latest.extra.get("epoch", 0)) if self._latest else 0
        # the epochs completed so far and their logs (History's), carried by every checkpoint so that
        # the History of a resumed run holds the epochs before the resume too
        self._epochs: list = []
        self._logs: dict = {}
        self._merged = False

    def on_train_begin(self, logs=None) -> None:
        if self._began:
            return
        self._began = True
        self.restored = self.ckpt.restore(self._latest)
        if self.restored is not None:
            self.step = int(self.restored.extra.get("step", self.restored.step))
            past = self.restored.extra.get("history") or {}
            self._epochs = [int(e) for e in past.get("epoch", ())]
            self._logs = {str(k): [float(x) for x in v] for k, v in dict(past.get("logs", {})).items()}

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self.epoch = epoch
        history = getattr(self.model, "history", None)
        if not self._merged and isinstance(history, keras.callbacks.History):
            self._merged = True  # (History cleared itself when training began: the restored epochs go first)
            history.epoch[:0] = self._epochs
            for k, v in self._logs.items():
                history.history.setdefault(k, [])[:0] = v
        if self.data is not None:
            self.data.set_epoch(epoch)

    def on_train_batch_end(self, batch, logs=None) -> None:
        if self.data is not None:
            self.data.batch_done()
        self.step += 1
        progress = {"step": self.step, "epoch": self.epoch, "history": self._history()}
        if self.ckpt.preempted(self.step, progress):
            self.preempted = True
            self.model.stop_training = True
        elif self.step % self.every == 0:
            self.ckpt.save(self.step, progress)

    def on_epoch_end(self, epoch, logs=None) -> None:
        if not self.preempted:  # (a preempted epoch is trained again on resume: it is not history yet)
            self._epochs.append(int(epoch))
            for k, v in (logs or {}).items():
                if isinstance(v, (int, float)) or getattr(v, "shape", None) == ():
                    self._logs.setdefault(str(k), [float("nan")] * (len(self._epochs) - 1)).append(float(v))
            self.ckpt.save(self.step, {"step": self.step, "epoch": epoch + 1, "history": self._history()})

    def _history(self) -> dict:
        return {"epoch": list(self._epochs), "logs": {k: list(v) for k, v in self._logs.items()}}

    def on_train_end(self, logs=None) -> None:
        self.ckpt.wait()
