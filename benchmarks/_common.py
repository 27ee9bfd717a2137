"""What the paired-arm benchmarks share: the tiny world (data, tokenizer, warmed-up base model, or a fresh
one when `results/` has none) and a forward-pass counter on a model's decoder stack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from creditlab import paths
from creditlab.data.io import read_records
from creditlab.data.prepare import prepare_tiny
from creditlab.models.tiny import build_model


def count_forwards(model) -> list[int]:
    """Patch the decoder stack's forward; each call appends 1 to the returned list."""
    calls: list[int] = []
    inner = model.model
    original = inner.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    inner.forward = counted
    return calls


def tiny_world(results: str, backbone: str, cfg: dict[str, Any], tmp: str):
    """(tokenizer, base model, source, train records): the pipeline's tiny data and warmed-up base model when
    `results` has them, else data prepared into `tmp` and a randomly initialised model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data_dir = paths.fmt(paths.DATA_DIR, results=results, scale="tiny")
    base_dir = paths.fmt(paths.BASE_DIR, results=results, scale="tiny", backbone=backbone)
    if not (data_dir / "train.parquet").exists():
        data_dir = Path(tmp) / "data"
        prepare_tiny(cfg["data"], data_dir)
    tok = AutoTokenizer.from_pretrained(str(data_dir / "tokenizer"))
    if (base_dir / "DONE").exists():
        model, source = AutoModelForCausalLM.from_pretrained(str(base_dir)), "warmed-up base"
    else:
        arch = cfg["model"]["arch"]
        model = build_model(arch, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
        source = "random init"
    return tok, model, source, read_records(data_dir / "train.parquet")


def write_result(result: dict[str, Any], out: str) -> None:
    """Write the benchmark's JSON (rows included) and print its summary (rows left out)."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))


def mean_ci(x: np.ndarray, n_boot: int = 2000) -> list[float]:
    """95% percentile-bootstrap CI of the mean of x (per-step differences, say), seed 0."""
    rng = np.random.default_rng(0)
    means = [x[rng.integers(0, len(x), len(x))].mean() for _ in range(n_boot)]
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]
