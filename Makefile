# Two commands matter (README): `make lab` runs the main job on the embedded lab,
# `make test` runs the tests. Both install what they need themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := venv
PY := $(VENV)/bin/python
TOOLS_BIN = $(shell tools/install.sh --print-bin)
RUN = PATH="$(TOOLS_BIN):$(CURDIR)/$(VENV)/bin:$$PATH"

.PHONY: all venv tools tools-product tools-lab debs test test-unit lab lab-down clean preview

all: test

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

venv: $(VENV)/.installed

# Tools by need (README, "Tools"): a region's pipeline builds only the product's (engine, language
# host, Kubernetes provider, Talos validator); the lab adds its control planes, kwok, Pebble and
# cert-manager; the tests add the S3 server, the Flux Operator and talosctl.
tools:
	tools/install.sh all

tools-product:
	tools/install.sh product

tools-lab:
	tools/install.sh lab

# Debian packages the tests run (a real DNS server, an SSH server); apt-get installs them when root.
debs:
	tools/debian-packages.sh

# Test modules run side by side (most of an e2e module's time is waiting on its lab), grouped
# so that modules sharing loopback addresses never overlap (tests/conftest.py).
TEST_WORKERS ?= 3

test: venv tools debs
	$(RUN) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=30 tests

# The unit tests run our own plugin guard (built in seconds), not the pinned tools.
test-unit: venv
	tools/install.sh kontinuum-plugin-guard >/dev/null
	$(PY) -m pytest tests/unit

# The lab stack uses a throwaway passphrase: its secrets protect nothing outside this machine.
LAB_ENV = KONTINUUM_STATE=$(CURDIR)/.state PULUMI_CONFIG_PASSPHRASE=kontinuum-lab

lab: venv tools-lab
	$(RUN) $(PY) -m lab up
	$(LAB_ENV) tools/pulumi --non-interactive stack select lab --create
	$(LAB_ENV) tools/pulumi --non-interactive up --yes --skip-preview --stack lab
	@$(LAB_ENV) $(PY) -m lab.report --stack lab

lab-down: venv
	-$(LAB_ENV) tools/pulumi --non-interactive destroy --yes --skip-preview --stack lab
	$(RUN) $(PY) -m lab down

clean:
	rm -rf .state .pytest_cache

# Every region stack previewed (README, "CI"): exit 0 no changes, 2 changes, 3 invalid, 4 failed.
# stacks/Pulumi.example-eu.yaml is documentation (no stack), so it is left out here.
# PREVIEW_ARGS="--refresh --expect-no-changes" for a drift check.
PREVIEW_ARGS ?= --exclude example-eu
preview: venv tools-product
	$(RUN) $(PY) -m kontinuum preview --all $(PREVIEW_ARGS)

# Benchmarks (issue 9): figures, not tests; writes bench/RESULTS.md. BENCH_ARGS="--runs 1 --only noop" etc.
.PHONY: bench
bench: venv tools-lab
	$(RUN) $(PY) -m bench $(BENCH_ARGS)
