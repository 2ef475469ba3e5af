# The two commands a newcomer needs: `make demo` and `make test`. Each installs what it needs
# into .venv (torch's CPU wheel first, so that no dependency pulls a CUDA build).
VENV ?= .venv
PY := $(VENV)/bin/python
SUM := $(shell cksum pyproject.toml | cut -d' ' -f1)
CORE := $(VENV)/.core-$(SUM)
# pytest-xdist workers for `make test`: most tests wait on real processes (servers, workers, Slurm),
# so 3 workers keep 2 cores busy (the tests on the one Slurm share a worker: tests/conftest.py)
TEST_WORKERS ?= 3
FULL := $(VENV)/.full-$(SUM)

.PHONY: demo demo-cluster test test-slow test-horovod test-ray horovod bench install clean chromium slurm postgres \
    bytecode

# torch (CPU) + elastictrain: what the demo needs
$(CORE): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	rm -f $(VENV)/.core-* && touch $(CORE)

# + tensorflow-cpu: what the whole test suite needs
$(FULL): $(CORE)
	$(PY) -m pip install -q -e '.[dev,tf]'
	rm -f $(VENV)/.full-* && touch $(FULL)

install: $(FULL) bytecode

# Our modules' bytecode, compiled ahead (only what changed since): where PYTHONDONTWRITEBYTECODE is
# set, as on our CI machines, Python would otherwise compile every module of ours again in every
# process that imports it (etrun, its zygote, each coordinator and worker): about 0.1 s each.
bytecode: $(CORE)
	@$(PY) -m compileall -q -j 0 elastictrain integrations >/dev/null

# Elastic DDP training on CPU under etrun, with an embedded coordinator; rank 1 is killed once
# mid-run and the job recovers from its last committed checkpoint with exactly-once data.
demo: $(CORE) bytecode
	rm -rf runs/demo
	$(VENV)/bin/etrun --nproc-per-node 2 --max-restarts 3 --log-dir runs/demo/logs \
	    examples/torch_ddp_elastic.py --crash-at-step 40 --ckpt-dir runs/demo/checkpoints

# The scheduler on real processes: a coordinator running Tiresias-L, two node daemons with 2 CPU
# slots each, three DDP jobs; one is preempted for a short job and resumes from its checkpoint.
demo-cluster: $(CORE) bytecode
	$(PY) examples/cluster_demo.py runs/demo-cluster

# Debian's Chromium for the status page's browser test, where this machine lets us install it
# (root and apt-get); elsewhere that one test skips and says how to install it.
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    { apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && \
	      apt-get install -y -q chromium >/dev/null 2>&1; }; }; } || \
	    echo "chromium could not be installed: the browser test will skip"

# Debian's Slurm and munge for the Slurm engine's tests (a private slurmctld and three slurmd on this
# host, started by the tests themselves), where this machine lets us install them; elsewhere
# those tests skip and say how to install it.
slurm:
	@command -v slurmctld >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    { apt-get install -y -q slurmctld slurmd slurm-client munge >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null 2>&1 && \
	        apt-get install -y -q slurmctld slurmd slurm-client munge >/dev/null 2>&1; }; }; } || \
	    echo "Slurm could not be installed: the Slurm engine's tests will skip"

# Debian's PostgreSQL for the coordinator's PostgreSQL store and failover tests (the tests start a
# private server in a temporary directory), where this machine lets us install it; elsewhere those
# tests skip and say how to install it.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    { apt-get install -y -q postgresql >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && \
	      apt-get install -y -q postgresql >/dev/null 2>&1; }; }; } || \
	    echo "PostgreSQL could not be installed: the PostgreSQL tests will skip"

# The default test run. pytest's exit code 5 ("no tests ran") fails it.
test: $(FULL) bytecode chromium slurm postgres
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) --dist loadgroup

test-slow: $(FULL) bytecode chromium slurm postgres
	$(PY) -m pytest -q -p no:cacheprovider -m slow

bench: $(FULL) bytecode
	$(PY) benchmarks/coordinator_throughput.py --quick
	$(PY) benchmarks/launcher.py --quick
	$(PY) benchmarks/checkpoint.py --quick
	$(PY) benchmarks/simulator.py --quick
	$(PY) benchmarks/grouping.py --quick
	$(PY) benchmarks/interleave.py --quick
	$(PY) benchmarks/profiling_overhead.py --quick
	$(PY) benchmarks/fairness.py --quick
	$(PY) benchmarks/scheduler.py --quick
	$(PY) benchmarks/autoscale.py --quick
	$(PY) benchmarks/history_period.py --quick
	$(PY) benchmarks/job_listing.py --quick

# Horovod (optional): 0.28.1, the last release, built from its PyPI sdist for CPU + gloo + PyTorch.
# Its CMake files ask for C++14 and torch 2.x headers need C++17 (fixed upstream after the
# release, never released), so the standard is raised before the build (~10 minutes on 2 cores).
# CMake 4 refuses the gloo submodule's cmake_minimum_required, so CMake 3 is pinned.
HVD_VERSION := 0.28.1
HVD := $(VENV)/.horovod-$(HVD_VERSION)
$(HVD): $(CORE)
	$(PY) -m pip install -q 'cmake>=3.13,<4' cloudpickle psutil pyyaml packaging numpy wheel setuptools
	rm -rf build/horovod && mkdir -p build/horovod
	$(PY) -m pip download -q --no-deps --no-binary :all: -d build/horovod horovod==$(HVD_VERSION)
	tar -xzf build/horovod/horovod-$(HVD_VERSION).tar.gz -C build/horovod
	sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' \
	    build/horovod/horovod-$(HVD_VERSION)/CMakeLists.txt \
	    build/horovod/horovod-$(HVD_VERSION)/horovod/torch/CMakeLists.txt
	cd build/horovod/horovod-$(HVD_VERSION) && PATH=$(abspath $(VENV))/bin:$$PATH \
	    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
	    HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 MAKEFLAGS=-j2 \
	    $(abspath $(PY)) -m pip install -q --no-build-isolation --no-deps .
	$(PY) -c 'import horovod.torch as hvd; assert hvd.gloo_built(), "horovod built without gloo"'
	touch $(HVD)

horovod: $(HVD)

# The Horovod tests (they skip in `make test` when Horovod is not built).
test-horovod: $(FULL) $(HVD)
	$(PY) -m pytest -q -p no:cacheprovider -m horovod

# Ray (optional): the Ray engine's tests on a real local Ray cluster (they skip in `make test`
# when Ray is not installed; here a Ray that cannot start fails them).
RAY := $(VENV)/.ray-$(SUM)
$(RAY): $(FULL)
	$(PY) -m pip install -q -e '.[dev,tf,ray]'
	rm -f $(VENV)/.ray-* && touch $(RAY)

test-ray: $(RAY)
	ET_REQUIRE_RAY=1 $(PY) -m pytest -q -p no:cacheprovider -m ray

clean:
	rm -rf $(VENV) runs build *.egg-info
