"""Loading a saved causal LM and the tiny world's tokenizer (what every job and analysis reads from disk)."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(data_dir: Path):
    """The tiny world's tokenizer, saved by the `prepare` job under ``data_dir``."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(data_dir) / "tokenizer"))


def load_model(model_dir: Path):
    """A saved causal LM (a warmed-up base model or a run's final/)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir))
