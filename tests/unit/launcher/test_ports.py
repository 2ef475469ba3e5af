"""The MASTER_PORT an agent proposes is held from the rendezvous until the next one, so that no
other process on the host is handed it by ``bind(0)`` before rank 0's TCPStore listens there; so
are the workers' own ports (TF_CONFIG), until their TensorFlow servers bind them."""

import datetime
import socket

import pytest

import subprocess
import sys

from elastictrain.launcher.workers import reserve_port, reserve_ports


def test_a_held_port_is_refused_to_other_binds_but_not_to_the_store():
    held = reserve_port()
    port = held.getsockname()[1]
    try:
        other = socket.socket()  # a plain bind (what most servers do) is refused while it is held
        with pytest.raises(OSError):
            other.bind(("", port))
        other.close()
        # the kernel's choice of a free port passes it by (a port freed at once could come back)
        seen = set()
        for _ in range(3000):
            with socket.socket() as s:
                s.bind(("", 0))
                seen.add(s.getsockname()[1])
        assert port not in seen
        dist = pytest.importorskip("torch.distributed")
        store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=datetime.timedelta(seconds=10))
        store.set("k", "v")
        assert store.get("k") == b"v"
        del store
    finally:
        held.close()


def test_held_worker_ports_are_distinct_and_tensorflow_binds_beside_the_hold():
    held = reserve_ports(3)
    ports = [s.getsockname()[1] for s in held]
    try:
        assert len(set(ports)) == 3
        for port in ports:
            other = socket.socket()
            with pytest.raises(OSError):
                other.bind(("", port))
            other.close()
        pytest.importorskip("tensorflow")
        # a worker's gRPC server (what MultiWorkerMirroredStrategy starts from TF_CONFIG) binds the
        # held port: the hold keeps other processes off it, not the worker
        code = ("import os, sys; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'; import tensorflow as tf; "
                "c = tf.train.ClusterSpec({'worker': ['localhost:' + sys.argv[1]]}); "
                "tf.distribute.Server(c, job_name='worker', task_index=0, start=True); print('started')")
        r = subprocess.run([sys.executable, "-c", code, str(ports[0])], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "started" in r.stdout, r.stderr[-2000:]
    finally:
        for s in held:
            s.close()
