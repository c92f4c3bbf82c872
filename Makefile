# Two commands on a fresh machine (Python 3.10+ with venv): `make analyze` and `make test`.
# Each creates the virtual environment it needs in .venv. torch is pinned to the CPU build
# (constraints.txt): an unpinned torch would pull several GB of CUDA packages.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: analyze test test-slow test-launchers bench clean

$(VENV)/.core: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel
	$(PIP) -e .
	touch $@

$(VENV)/.train: $(VENV)/.core
	$(PIP) torch==2.13.0
	$(PIP) -e '.[train,report,test]'
	touch $@

analyze: $(VENV)/.core
	$(VENV)/bin/trainfit analyze

test: $(VENV)/.train
	$(PY) -m pytest -q

# The long end-to-end tests (multi-process launches, kill-and-resume cycles, FSDP, multi-node)
# that the default run leaves out to stay under ten minutes on two cores.
test-slow: $(VENV)/.train
	$(PY) -m pytest -q -m slow

# Every bench/*.py in turn (results in bench/results/); e.g. `make bench BENCH_ARGS=--quick`,
# `make bench BENCH_ARGS='--only cli_latency'`.
bench: $(VENV)/.train
	$(PY) bench/run_all.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV)

# The launch specs of `plan --launcher` checked by SkyPilot's task loader, the PyTorchJob CRD
# schema and the Kubernetes client's models, in a venv of their own (skypilot takes ~1.5 min to
# install, so it is not a test dependency); results in bench/results/launcher_parsers.{json,md}.
test-launchers:
	python3 bench/launcher_parsers.py
