# creditlab — the two commands of the README:
#   make run    install what is needed, then build every table at tiny scale (Snakemake DAG)
#   make test   install what is needed, then run the test suite (CI calls exactly this)
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2
export HF_HUB_OFFLINE := 1

.PHONY: install sysdeps run test test-fast lint dag report mlflow-ui bench clean-results

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first, pinned: any other torch spec pulls gigabytes of CUDA wheels on CPU machines.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# bubblewrap: the sandbox of the code-execution verifier (creditlab.rewards.code_exec). Installed with
# apt only when missing and when running as root on Debian/Ubuntu; otherwise the verifier falls back to a
# weaker sandbox (see code_exec.sandbox_report()) and its file/network isolation tests fail.
sysdeps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null) \
	      || echo "warning: apt-get install bubblewrap failed; code_exec uses its fallback sandbox" >&2; \
	  else echo "note: bwrap (Debian package bubblewrap) missing and not root: code_exec uses its fallback sandbox" >&2; fi; }

install: sysdeps $(VENV)/.installed

run: install
	$(BIN)/snakemake --cores $(CORES)
	$(BIN)/snakemake --report results/report.html

test: install
	$(BIN)/python -m pytest -q --timeout=900

test-fast: install
	$(BIN)/python -m pytest -q -m "not e2e"

lint: install
	$(BIN)/snakemake --lint

dag: install
	$(BIN)/snakemake -n

report: install
	$(BIN)/snakemake --report results/report.html

mlflow-ui: install
	$(BIN)/python -m creditlab mlflow-ui

bench: install
	$(BIN)/python benchmarks/bench_sampler.py
	$(BIN)/python benchmarks/bench_rl_step.py
	$(BIN)/python benchmarks/bench_extrapolation.py
	$(BIN)/python benchmarks/bench_delta_overhead.py
	$(BIN)/python benchmarks/bench_arca_overhead.py
	$(BIN)/python benchmarks/bench_code_exec.py

clean-results:
	rm -rf results/tiny results/micro results/mlflow.db results/mlartifacts results/.mlflow_ready
