# The two commands a newcomer runs: `make demo` and `make test`. Both set everything up first.
VENV ?= .venv
BIN := $(VENV)/bin
# Debian packages the tests need: a real Docker engine (dockerd, started by the tests) and a static busybox
# (the root file system of the vLLM-like test images); a real single-node Slurm (slurmctld, slurmd and the
# client tools) with munge, started by the isolated-rerun tests. Installed only when missing; needs root or sudo.
SYSTEM_PACKAGES := docker.io busybox-static slurm-wlm munge

.PHONY: setup system-packages demo test lint

$(BIN)/.installed: pyproject.toml
	python3 -m venv $(VENV)
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

setup: system-packages $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/k3repro demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest
