"""A coordinator served from a thread of the launcher itself (``etrun --standalone``).

In-process rather than a child process: it is up in milliseconds instead of the few
hundred a fresh interpreter needs, which is most of etrun's own start-up budget.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Optional

from ..coordinator.app import Coordinator
from ..coordinator.server import (ServerConfig, build_server, event_loop_runner, load_or_create_token,
                                  write_token_file)
from ..coordinator.store import open_store
from ..errors import CoordinatorUnavailableError

__all__ = ["EmbeddedCoordinator"]


class EmbeddedCoordinator:
    """Serve a coordinator on ``host``:``port`` (0: a free port) with its SQLite file in ``state_dir``.

    ``token``: the bearer token (a node hosting a multi-node job shares it with the others);
    by default a new random one. Either way it is written to ``token_file`` for the workers.

    Raises:
        ConfigError: cannot listen on ``host``:``port``.
    """

    def __init__(self, state_dir: str, host: str = "127.0.0.1", port: int = 0, token: Optional[str] = None) -> None:
        os.makedirs(state_dir, exist_ok=True)
        self.db = os.path.join(state_dir, "coordinator.db")
        self.token_file = os.path.join(state_dir, "token")
        if token is None:
            # workers read the token from this file, so it must exist even if $ET_TOKEN is set
            self.token = load_or_create_token(self.token_file, use_env=False)
        else:
            self.token = token
            write_token_file(self.token_file, token)
        store = open_store(self.db)
        with store.transaction() as tx:  # rounds of a previous etrun of this command: none of its agents lives on
            tx.delete_all_rdzv()
        self._coordinator = Coordinator(store)
        try:
            cfg = ServerConfig(host=host, port=port, gc_freeze=False)  # (etrun's own process: left as it is)
            self._server, self._sock, self.url = build_server(cfg, self._coordinator, self.token)
        except BaseException:
            self._coordinator.close()
            raise
        self._thread: Optional[threading.Thread] = None
        if "ET_LOG_LEVEL" not in os.environ:  # etrun reports failures itself; avoid saying it twice
            logging.getLogger("elastictrain.coordinator").setLevel(logging.ERROR)

    def start(self, timeout: float = 10.0) -> str:
        def serve() -> None:
            with event_loop_runner() as runner:
                runner.run(self._server.serve(sockets=[self._sock]))

        self._thread = threading.Thread(target=serve, name="et-coordinator", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise CoordinatorUnavailableError("the embedded coordinator did not start")
            time.sleep(0.002)
        return self.url

    def linger(self, job: str, agent: str, limit: float, quiet: float = 1.0) -> None:
        """Keep serving while other agents of ``job`` still talk to this coordinator (they learn
        the job's outcome from it), up to ``limit`` seconds."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and self._coordinator.rendezvous.others_polling(job, agent, quiet):
            time.sleep(0.1)

    def stop(self) -> None:
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._thread = None
        self._coordinator.close()
