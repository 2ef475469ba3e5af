# The two commands a newcomer needs: `make demo` and `make test`. Each installs what it needs
# into .venv (torch's CPU wheel first, so that no dependency pulls a CUDA build).
VENV ?= .venv
PY := $(VENV)/bin/python
SUM := $(shell cksum pyproject.toml | cut -d' ' -f1)
CORE := $(VENV)/.core-$(SUM)
FULL := $(VENV)/.full-$(SUM)

.PHONY: demo demo-cluster test test-slow bench install clean

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

install: $(FULL)

# Elastic DDP training on CPU under etrun, with an embedded coordinator; rank 1 is killed once
# mid-run and the job recovers from its last committed checkpoint with exactly-once data.
demo: $(CORE)
	rm -rf runs/demo
	$(VENV)/bin/etrun --nproc-per-node 2 --max-restarts 3 --log-dir runs/demo/logs \
	    examples/torch_ddp_elastic.py --crash-at-step 40 --ckpt-dir runs/demo/checkpoints

# The scheduler on real processes: a coordinator running Tiresias-L, two node daemons with 2 CPU
# slots each, three DDP jobs; one is preempted for a short job and resumes from its checkpoint.
demo-cluster: $(CORE)
	$(PY) examples/cluster_demo.py runs/demo-cluster

# The default test run (well under 15 minutes). pytest's exit code 5 ("no tests ran") fails it.
test: $(FULL)
	$(PY) -m pytest -q -p no:cacheprovider

test-slow: $(FULL)
	$(PY) -m pytest -q -p no:cacheprovider -m slow

bench: $(FULL)
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

clean:
	rm -rf $(VENV) runs build *.egg-info
