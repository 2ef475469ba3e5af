import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# etrun keeps its state (the embedded coordinator's commit records) per command under
# $ET_STATE_DIR: tests keep theirs in one temporary directory, not in the user's home
if "ET_STATE_DIR" not in os.environ:
    import tempfile

    os.environ["ET_STATE_DIR"] = tempfile.mkdtemp(prefix="et-test-state-")


@pytest.fixture
def coordinator(tmp_path):
    """A real coordinator process on a free loopback port, stopped after the test."""
    from elastictrain.coordinator.process import CoordinatorProcess

    proc = CoordinatorProcess(str(tmp_path / "coord.db"), str(tmp_path / "token"),
                              log_file=str(tmp_path / "coordinator.log"))
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def client(coordinator):
    from elastictrain import CoordinatorClient

    c = CoordinatorClient(coordinator.url, coordinator.token, timeout=5.0, retry_for=10.0)
    yield c
    c.close()


def python() -> str:
    return sys.executable
