import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# etrun keeps its state (the embedded coordinator's commit records) per command under
# $ET_STATE_DIR: tests keep theirs in one temporary directory, not in the user's home, removed at
# the end of the session
_STATE_DIR = None
if "ET_STATE_DIR" not in os.environ:
    import tempfile

    _STATE_DIR = os.environ["ET_STATE_DIR"] = tempfile.mkdtemp(prefix="et-test-state-")


def pytest_unconfigure(config):
    if _STATE_DIR is not None:
        import shutil

        shutil.rmtree(_STATE_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres():
    """A private PostgreSQL server for this test session (Debian's binaries; `make test`
    installs them where it can); the tests that use it skip, saying why, where it cannot start."""
    from elastictrain.coordinator.pg_local import LocalPostgres, find_postgres

    if find_postgres() is None:
        pytest.skip("PostgreSQL is not installed: apt-get install postgresql (make test does, as root)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed: pip install 'elastictrain[postgres]' (make install does)")
    pg = LocalPostgres()
    try:
        pg.start()
    except Exception as exc:  # noqa: BLE001 - reported as the reason to skip
        pg.stop()
        pytest.skip(f"PostgreSQL did not start here: {exc}")
    pg.databases = 0
    yield pg
    pg.stop()


def new_database(pg) -> str:
    """A fresh database on the session's PostgreSQL; its URL."""
    pg.databases += 1
    return pg.create_database(f"t{pg.databases}")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """The coordinator's database: a SQLite file, or a fresh database on the session's PostgreSQL
    (every test that takes a coordinator runs on both)."""
    if request.param == "sqlite":
        return str(tmp_path / "coord.db")
    return new_database(request.getfixturevalue("postgres"))


@pytest.fixture
def coordinator(tmp_path, db_url):
    """A real coordinator process on a free loopback port, stopped after the test (on SQLite, and
    on PostgreSQL with a 2 s lease, so that a restart after kill -9 leads again within 2 s)."""
    from elastictrain.coordinator.process import CoordinatorProcess

    extra = ("--lease", "2") if db_url.startswith("postgresql://") else ()
    proc = CoordinatorProcess(db_url, str(tmp_path / "token"), log_file=str(tmp_path / "coordinator.log"),
                              extra_args=extra)
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
    """A real Slurm (munged, slurmctld, three slurmd: n1 and n2, 2 fake GPUs each; n3 with CPUs only) for this test
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



@pytest.fixture(scope="session")
def ray_cluster():
    """A real Ray cluster (a head and one more node, 2 fake GPUs each) for this test session; the
    tests that use it skip, saying why, where Ray is not installed or cannot start (`make
    test-ray` installs it and sets ET_REQUIRE_RAY=1: there, a Ray that cannot run fails)."""
    from tests.integration.ray_kit import RayKit, missing

    def skip(why):
        if os.environ.get("ET_REQUIRE_RAY") == "1":
            pytest.fail(why)
        pytest.skip(why)

    why = missing()
    if why:
        skip(why)
    kit = RayKit()
    try:
        kit.start()
    except Exception as exc:  # noqa: BLE001 - reported as the reason to skip, with the log's tail
        kit.stop()
        skip(f"Ray did not start here: {exc}")
    yield kit
    kit.stop()


# The heaviest coordinator tests run on PostgreSQL in `make test-slow` (their SQLite runs stay in
# the default run, and every other coordinator test runs on both there): the default run stays
# near 15 minutes.
_PG_IN_SLOW_RUN = {"test_exactly_once_with_kills_and_rescaling", "test_two_agents_shrink_and_grow_with_exactly_once_data",
                   "test_a_node_that_leaves_is_a_scale_down_not_a_failure"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        spec = getattr(item, "callspec", None)
        if spec is not None and spec.params.get("db_url") == "postgresql" and item.originalname in _PG_IN_SLOW_RUN:
            item.add_marker(pytest.mark.slow)
        # `make test` runs the tests on several pytest-xdist workers (--dist loadgroup): the tests on the
        # session's Slurm share one worker, so that one Slurm runs them one at a time, as its 4 GPUs need
        if "slurm" in item.fixturenames or (spec is not None and spec.params.get("engine_cluster") == "slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
