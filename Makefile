# Two commands matter (README): `make lab` runs the main job on the embedded lab,
# `make test` runs the tests. Both install what they need themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := venv
PY := $(VENV)/bin/python
TOOLS_BIN = $(shell tools/install.sh --print-bin)
RUN = PATH="$(TOOLS_BIN):$(CURDIR)/$(VENV)/bin:$$PATH"

.PHONY: all venv tools test test-unit lab lab-down clean

all: test

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

venv: $(VENV)/.installed

tools:
	tools/install.sh

test: venv tools
	$(RUN) $(PY) -m pytest tests

test-unit: venv
	$(PY) -m pytest tests/unit

lab: venv tools
	@echo "make lab: the embedded lab (Talos node emulator, local control planes, hub) and the"
	@echo "lab stack have not landed yet (issues #5 and #8). Nothing was started." >&2
	@exit 1

lab-down:
	@echo "make lab-down: nothing to stop; the lab has not landed yet (issue #5)."

clean:
	rm -rf .state .pytest_cache

# Benchmarks (issue 9): figures, not tests; writes bench/RESULTS.md. BENCH_ARGS="--runs 1 --only noop" etc.
.PHONY: bench
bench: venv tools
	$(RUN) $(PY) -m bench $(BENCH_ARGS)
