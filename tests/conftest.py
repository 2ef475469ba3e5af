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


@pytest.fixture(scope="session")
def slurm():
    """A real Slurm (munged, slurmctld, two slurmd: n1 and n2, 2 fake GPUs each) for this test
    session; the tests that use it skip, saying how to install it, where it cannot start."""
    from tests.integration.slurm_kit import SlurmKit, missing

    why = missing()
    if why:
        pytest.skip(why)
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="et-slurm-")  # not under pytest's 0700 directory: munged must reach it
    os.chmod(root, 0o755)
    kit = SlurmKit(root)
    try:
        kit.start()
    except Exception as exc:  # noqa: BLE001 - reported as the reason to skip, with the logs' place
        kit.stop()
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"Slurm did not start here: {exc}")
    yield kit
    kit.stop()
    shutil.rmtree(root, ignore_errors=True)

