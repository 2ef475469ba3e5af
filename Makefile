# The two commands a newcomer needs: `make demo` and `make test`. Each installs what it needs
# into .venv (torch's CPU wheel first, so that no dependency pulls a CUDA build).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test test-slow bench install clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,tf]'
	rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

# Elastic DDP training on CPU under etrun, with an embedded coordinator; rank 1 is killed once
# mid-run and the job recovers from its last committed checkpoint with exactly-once data.
demo: $(STAMP)
	rm -rf runs/demo
	$(VENV)/bin/etrun --nproc-per-node 2 --max-restarts 3 --log-dir runs/demo/logs \
	    examples/torch_ddp_elastic.py --crash-at-step 40 --ckpt-dir runs/demo/checkpoints

# The default test run (well under 15 minutes). pytest's exit code 5 ("no tests ran") fails it.
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow

bench: $(STAMP)
	$(PY) benchmarks/coordinator_throughput.py --quick
	$(PY) benchmarks/launcher.py --quick

clean:
	rm -rf $(VENV) runs build *.egg-info
