"""Two processes racing for one port (etrun agents hosting torchrun's c10d endpoint): the loser
gets a ConfigError (it then joins the winner), never a raw OSError."""

import socket

import pytest

from elastictrain.coordinator import server
from elastictrain.errors import ConfigError


def test_the_loser_of_a_bind_race_gets_a_config_error(monkeypatch):
    rival = socket.socket()
    rival.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    rival.bind(("127.0.0.1", 0))
    port = rival.getsockname()[1]

    class Racing(socket.socket):
        def bind(self, addr):
            super().bind(addr)  # both bound (SO_REUSEADDR, nobody listens yet) ...
            rival.listen(1)  # ... and the rival listens first

    monkeypatch.setattr(server.socket, "socket", Racing)
    try:
        with pytest.raises(ConfigError, match="cannot listen on 127.0.0.1"):
            server._bind("127.0.0.1", port)
    finally:
        rival.close()
