# Two commands on a fresh machine (Python 3.10+ with venv): `make analyze` and `make test`.
# Each creates the virtual environment it needs in .venv. torch is pinned to the CPU build
# (constraints.txt): an unpinned torch would pull several GB of CUDA packages.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: analyze lint test test-slow test-all test-launchers test-tools bench clean

$(VENV)/.core: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel
	$(PIP) -e .
	touch $@

$(VENV)/.train: $(VENV)/.core constraints-tested.txt
	$(PIP) torch==2.13.0
	$(PIP) -c constraints-tested.txt -e '.[train,report,test]'
	touch $@

analyze: $(VENV)/.core
	$(VENV)/bin/trainfit analyze

test: $(VENV)/.train
	$(PY) -m pytest -q

# The long end-to-end tests (multi-process launches, kill-and-resume cycles, FSDP, multi-node)
# that the default run leaves out to stay under ten minutes on two cores.
test-slow: $(VENV)/.train
	$(PY) -m pytest -q -m slow

# The import rules (pyproject.toml's [tool.importlinter] contracts): the layers, no import circle,
# no heavy library in core. lint-imports comes with the test extra.
lint: $(VENV)/.train
	$(VENV)/bin/lint-imports --no-cache

# Every tier: the lint, then the default and the slow tests in one run. (`make test-tools` and
# `make test-launchers` check the exported files with other tools' own environments.)
test-all: lint
	$(PY) -m pytest -q -m 'slow or not slow'

# `plan --for TOOL`: each tool in its own environment (.venv-tools/<tool>), which sees the test
# environment's packages (torch 2.13.0 CPU) through a .pth file and installs only the tool and the
# versions it pins over them; then the tool's parser tests, its short CPU runs (slow tests) and
# bench/tool_exports.py (bench/results/tool_exports.{json,md}). Axolotl 0.19.0 is its newest release
# for Python 3.11 (0.20+ need 3.12); LLaMA-Factory 0.9.5 pins Transformers <= 5.6 and TRL <= 0.24;
# torchtune 0.6.1 needs torchao's nf4tensor, which 0.15 still has and builds against torch 2.13.
TOOLS_VENV := .venv-tools
TOOL_PKGS_axolotl := axolotl==0.19.0
TOOL_PKGS_llama-factory := --no-deps llamafactory==0.9.5 && $$PIP transformers==5.6.0 trl==0.24.0 peft==0.18.1 \
	accelerate==1.11.0 datasets==4.0.0 omegaconf
TOOL_PKGS_torchtune := --no-deps torchtune==0.6.1 torchao==0.15.0 && $$PIP omegaconf blobfile tiktoken kagglehub \
	torchdata sentencepiece
TOOL_PKGS_litgpt := --no-deps litgpt==0.5.13 && $$PIP lightning 'jsonargparse[signatures]>=4.30' requests
TOOLS := axolotl llama-factory torchtune litgpt

$(TOOLS_VENV)/%/.installed: $(VENV)/.train
	test -x $(TOOLS_VENV)/$*/bin/python || python3 -m venv $(TOOLS_VENV)/$*
	$(PY) -c "import site; print(site.getsitepackages()[0])" > \
		"$$($(TOOLS_VENV)/$*/bin/python -c 'import site; print(site.getsitepackages()[0])')/trainfit_test_env.pth"
	PIP="$(TOOLS_VENV)/$*/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt" && \
		$$PIP $(TOOL_PKGS_$*)
	$(TOOLS_VENV)/$*/bin/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $@

test-tools: $(foreach t,$(TOOLS),$(TOOLS_VENV)/$(t)/.installed)
	for t in $(TOOLS); do PYTHONPATH=src DISABLE_VERSION_CHECK=1 AXOLOTL_DO_NOT_TRACK=1 \
		$(TOOLS_VENV)/$$t/bin/python -m pytest -q -m 'slow or not slow' tests/export/test_tool_exports.py || exit 1; done
	$(PY) bench/tool_exports.py --venvs $(TOOLS_VENV)

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
