"""Preemption-safe Keras training: the TensorFlow twin of torch_checkpoint_resume.py.

    etrun --rdzv-id kjob --log-dir runs/keras examples/keras_checkpoint_resume.py --ckpt-dir runs/keras/ckpt
    # kill -TERM <etrun pid>: the callback saves at the next batch, fit stops, exit code 75
    etrun --rdzv-id kjob --log-dir runs/keras examples/keras_checkpoint_resume.py --ckpt-dir runs/keras/ckpt

Data come from the coordinator's shards through ``ElasticTFData``; the callback restores
model, optimizer and dropout-seed state and the data cursor when ``fit`` starts, and
``elastic_fit`` runs ``fit`` epoch by epoch (Keras would otherwise cap every epoch at the
length of the first one it sees, and a resumed epoch is shorter). The final
weights are bitwise equal to an uninterrupted run (deterministic ops, one worker).

With several workers (``etrun --nproc-per-node 2 ...``), etrun sets ``TF_CONFIG`` from the
generation and ``elastic_strategy()`` returns a ``MultiWorkerMirroredStrategy`` over it: the
workers train one model (gradients all-reduced every step) and end with identical weights.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import elastictrain as et  # noqa: E402
from elastictrain_tf import ElasticKerasCallback, ElasticTFData, TFCheckpointer, elastic_fit, elastic_strategy  # noqa: E402,E501


class Progress(keras.callbacks.Callback):
    def __init__(self, path, sleep):
        super().__init__()
        self.path, self.sleep, self.n = path, sleep, 0

    def on_train_batch_end(self, batch, logs=None):
        self.n += 1
        if self.path and os.environ.get("RANK", "0") == "0":  # atomically: never seen half-written
            with open(self.path + ".tmp", "w") as f:
                f.write(str(self.n))
            os.replace(self.path + ".tmp", self.path)
        time.sleep(self.sleep)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--ckpt-dir", default="runs/keras/ckpt")
    ap.add_argument("--ckpt-every", type=int, default=20)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--progress-file", default=None)
    ap.add_argument("--verbose", type=int, default=0, choices=(0, 1, 2), help="Keras progress output, as fit's")
    args = ap.parse_args()

    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    strategy = elastic_strategy()  # before any other TensorFlow op; one worker: the default strategy
    job = et.init()
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((args.samples, 16)).astype(np.float32))
    y = tf.constant((x.numpy()[:, :4].sum(1) > 0).astype(np.int64))
    with strategy.scope():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dropout(0.2), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    spec = et.DatasetSpec("train", args.samples, 200, epochs=args.epochs, seed=3)
    shards = job.shards(spec)
    data = ElasticTFData(shards, args.batch_size, lambda i: (tf.gather(x, i), tf.gather(y, i)))
    ckpt = TFCheckpointer(args.ckpt_dir, model, shards=shards, job=job)
    ckpt.install_preemption_handler()
    cb = ElasticKerasCallback(ckpt, data, every_n_steps=args.ckpt_every)
    print(f"[keras-demo] starting at epoch {cb.initial_epoch}", flush=True)
    history = elastic_fit(model, data, epochs=args.epochs, callback=cb, verbose=args.verbose,
                          callbacks=[Progress(args.progress_file, args.step_sleep)])
    if cb.preempted:
        print(f"[keras-demo] preempted: saved at step {cb.step}, exiting {et.PREEMPTED_EXIT_CODE}", flush=True)
        shards.close(release=False)
        return et.PREEMPTED_EXIT_CODE
    if cb.restored is not None:
        print(f"[keras-demo] resumed from {cb.restored.name}", flush=True)
    digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.trainable_variables)).hexdigest()
    losses = ", ".join(f"{v:.4f}" for v in history.history.get("loss", []))
    print(f"[keras-demo] rank {job.rank}: trained epochs {history.epoch}, loss by epoch [{losses}]", flush=True)
    print(f"[keras-demo] rank {job.rank} done at step {cb.step}; final-params-sha256: {digest}", flush=True)
    shards.close()
    if job.rank == 0:
        print(f"[keras-demo] every sample of every epoch trained: {shards.finished}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
