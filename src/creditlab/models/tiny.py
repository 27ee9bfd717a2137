"""Tiny Qwen3-architecture backbones built from config (random init, then SFT warm-up)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def build_model(arch: dict[str, Any], vocab_size: int, pad_id: int, bos_id: int, eos_id: int, seed: int = 0):
    """Build a randomly initialised Qwen3ForCausalLM.

    arch: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
    intermediate_size, max_position_embeddings, tie_word_embeddings (see configs/model/*.yaml).
    """
    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=arch["hidden_size"],
        intermediate_size=arch["intermediate_size"],
        num_hidden_layers=arch["num_hidden_layers"],
        num_attention_heads=arch["num_attention_heads"],
        num_key_value_heads=arch["num_key_value_heads"],
        head_dim=arch["head_dim"],
        max_position_embeddings=arch.get("max_position_embeddings", 256),
        tie_word_embeddings=arch.get("tie_word_embeddings", True),
        rope_theta=arch.get("rope_theta", 10000.0),
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        use_cache=True,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    return model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())
