"""The MASTER_PORT an agent proposes is held from the rendezvous until the next one, so that no
other process on the host is handed it by ``bind(0)`` before rank 0's TCPStore listens there."""

import datetime
import socket

import pytest

from elastictrain.launcher.workers import reserve_port


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
