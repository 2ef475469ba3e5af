"""``elastic_fit``: Keras training over elastic shards, one worker or many.

Why not ``model.fit``:

- Keras learns an epoch's length from the first epoch it sees of a dataset of unknown size and
  cuts later epochs there, while elastic epochs differ in length (a resumed epoch is shorter;
  with dynamic shards each worker's share varies). Calling ``fit`` once per epoch instead prints
  ``Epoch 2/2``, a warning per epoch and returns only the last epoch's ``History``.
- Keras 3's TensorFlow trainer cannot run under ``MultiWorkerMirroredStrategy``: it reduces
  each scalar metric across workers with ``axis=0`` and fails, and before the first step it
  pulls a batch from the dataset to build the model, which would lose that batch's samples.

So this is a small ``fit`` of our own: Keras's ``train_step`` under ``strategy.run``, Keras's
callbacks (progress bar, ``History``) driven exactly as ``fit`` drives them, and one
``History`` for the whole run. With several workers, every step asks all workers whether any
still has data (``get_next_as_optional``); a worker whose shards ran out takes part with an
empty batch, so no worker waits in a collective the others never reach and no sample is
dropped or repeated. The preemption flag is summed across workers in the same step, so every
worker checkpoints and stops at the same step. The metrics every worker logs (the progress bar,
``History``) are the job's: each worker's running mean weighted by the samples it trained this
epoch, summed across workers after each step (a few scalars), the same on every worker, as a
single-process ``fit`` reports them.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import keras
import tensorflow as tf

from elastictrain.errors import ConfigError

__all__ = ["elastic_strategy", "elastic_fit"]


def elastic_strategy() -> tf.distribute.Strategy:
    """The strategy for this worker: ``MultiWorkerMirroredStrategy`` over the workers of the
    current generation when ``etrun`` started several (it sets ``TF_CONFIG``), else the default
    strategy. Call it first thing, before any other TensorFlow op, and build and compile the
    model under ``strategy.scope()``."""
    cluster = os.environ.get("TF_CONFIG")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return tf.distribute.get_strategy()
    if not cluster:
        raise ConfigError(f"WORLD_SIZE is {world} but TF_CONFIG is not set: start the workers with etrun "
                          "(it sets TF_CONFIG from the generation) or set TF_CONFIG yourself")
    workers = json.loads(cluster).get("cluster", {}).get("worker", [])
    if len(workers) != world:
        raise ConfigError(f"TF_CONFIG lists {len(workers)} workers but WORLD_SIZE is {world}; "
                          "start the workers with etrun, which sets both from the same generation")
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def _verbose(verbose) -> int:
    if verbose == "auto":  # a progress bar on rank 0 only: the others would print the same bar again
        return 1 if int(os.environ.get("RANK", "0")) == 0 else 0
    if verbose not in (0, 1, 2):
        raise ConfigError(f"verbose must be 'auto', 0, 1 or 2, not {verbose!r}")
    return int(verbose)


def _local(value):
    """A replica's value as a Python float (a worker's own metric under several workers)."""
    if isinstance(value, tf.distribute.DistributedValues):
        value = tf.distribute.get_strategy().experimental_local_results(value)[0]
    return float(value)


def elastic_fit(model: keras.Model, data, *, epochs: int, callback, callbacks=(), verbose="auto",
                validation_data=None, strategy: Optional[tf.distribute.Strategy] = None) -> keras.callbacks.History:
    """Train ``model`` on ``data`` (an :class:`ElasticTFData`) from the checkpoint's epoch to
    ``epochs``, like ``model.fit``; stop early when preempted (``callback.preempted``).

    Args:
        callback: the :class:`ElasticKerasCallback` that saves and restores.
        callbacks: more Keras callbacks, called as ``fit`` calls them.
        verbose: as ``fit``'s: "auto" (a progress bar on rank 0, nothing on the others), 0, 1 or 2.
        validation_data: evaluated at each epoch's end (``val_`` logs); one worker only.
        strategy: default: the strategy the model was built under.

    Returns:
        One ``History`` for the whole job: every epoch trained, those before a resume included
        (the checkpoint carries them).
    """
    if not isinstance(epochs, int) or not 1 <= epochs <= 1_000_000:
        raise ConfigError(f"epochs must be an integer in [1, 1000000], got {epochs!r}")
    verbose = _verbose(verbose)
    strategy = strategy or model.distribute_strategy
    replicas = strategy.num_replicas_in_sync
    if validation_data is not None and replicas > 1:
        raise ConfigError("validation_data with several workers is not supported (Keras 3 cannot reduce metrics "
                          "across workers); evaluate on rank 0 after training instead")
    ckpt = callback.ckpt

    def replica_step(batch):
        rows = tf.shape(tf.nest.flatten(batch)[0])[0]
        return model.train_step(batch), rows

    @tf.function
    def step(batch, flag):
        logs, rows = strategy.run(replica_step, args=(batch,))
        if replicas > 1:
            flag = strategy.reduce("SUM", strategy.run(lambda: tf.identity(flag)), axis=None)
        return logs, rows, flag

    @tf.function
    def job_sums(local):  # [samples this epoch, metric x samples ...] summed over the workers
        return strategy.reduce("SUM", strategy.run(lambda: tf.identity(local)), axis=None)

    agreed = {"flag": False}
    previous_agree = ckpt.agree
    ckpt.agree = lambda _local_flag: agreed["flag"]  # the value all workers summed in this step
    dataset = data.distributed(strategy) if replicas > 1 else data.dataset
    cbs = keras.callbacks.CallbackList([callback, *callbacks], add_history=True, add_progbar=verbose != 0,
                                       model=model, verbose=verbose, epochs=epochs, steps=None)
    logs: dict = {}
    try:
        with strategy.scope():
            model.stop_training = False
            cbs.on_train_begin()
            for epoch in range(callback.initial_epoch, epochs):
                model.reset_metrics()
                hint = data.steps_hint(epoch, replicas)
                cbs.set_params({"verbose": verbose, "epochs": epochs, "steps": hint})
                cbs.on_epoch_begin(epoch)
                iterator = iter(dataset)
                batch_no, seen, mine = 0, 0.0, {}
                while True:
                    nxt = iterator.get_next_as_optional()
                    if not nxt.has_value():
                        break
                    cbs.on_train_batch_begin(batch_no)
                    out, rows, flag = step(nxt.get_value(), tf.constant(1.0 if ckpt.preemption_requested else 0.0))
                    agreed["flag"] = float(flag) > 0
                    if _local(rows) > 0:  # an empty batch (this worker ran out first) keeps its last logs
                        seen += _local(rows)
                        mine = {k: _local(v) for k, v in out.items()}
                    logs = mine
                    if replicas > 1:  # the job's metrics: every worker's running mean, by its samples
                        keys = sorted(out)  # (the same on every worker: one model)
                        local = [seen] + [mine.get(k, 0.0) * seen for k in keys]
                        total = job_sums(tf.constant(local, tf.float64)).numpy()
                        if total[0] > 0:
                            logs = {k: float(v / total[0]) for k, v in zip(keys, total[1:])}
                    cbs.on_train_batch_end(batch_no, logs)
                    batch_no += 1
                    if model.stop_training:
                        break
                epoch_logs = dict(logs)
                if validation_data is not None and not model.stop_training:
                    val = model.evaluate(validation_data, verbose=0, return_dict=True)
                    epoch_logs.update({f"val_{k}": v for k, v in val.items()})
                cbs.on_epoch_end(epoch, epoch_logs)
                if model.stop_training:
                    break
            cbs.on_train_end(logs)
    finally:
        ckpt.agree = previous_agree
    return model.history

