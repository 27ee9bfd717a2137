"""Tiny backbones built from config (random init, then SFT warm-up), in two architecture families.

``arch["family"]`` (configs/model/*.yaml, default ``qwen3``) picks the ``transformers`` class:

* ``qwen3``: ``Qwen3ForCausalLM`` (pre-norm blocks, per-head QK RMSNorm, GQA);
* ``olmo``: the OLMo family, ``Olmo3ForCausalLM`` (``Olmo2ForCausalLM`` on a ``transformers`` without
  OLMo 3): norm *after* attention and MLP (before the residual add), QK RMSNorm over the whole
  projection. OLMo 3 interleaves sliding-window layers (window 4096 in Olmo3-7B); tiny-world sequences
  are under ``max_position_embeddings`` (256) tokens, far inside such a window, so every layer is
  built as full attention, which is what those layers compute there. (The local sampler also passes
  one attention mask to every layer, which is only right when no layer slides.)

  Measured (SFT warm-up of configs/scale/tiny.yaml, val greedy accuracy on 200 problems; tiny-s: 68%):
  tiny-olmo (the shape of tiny-s, untied) 51% (seed 0) / 36% (seed 1). Other ~0.4M shapes, seed 0:
  Olmo3-7B-like (4 KV heads = MHA, rope_theta 5e5, FFN 336) 38%; the same with rope_theta 1e4 30%,
  tied 28%; 3 layers 33%; 8 heads of 16 with 4 / 2 KV heads 55% / 47%; tiny-s's exact shape, tied
  52%; input embeddings initialised with std 1 (fast start, same end) 30%. The family learns slower
  than qwen3 under the shared SFT settings at this size; no shape tried closes the gap.

Both are plain causal LMs with ``.model`` (returns ``last_hidden_state``) and ``.lm_head``, which is what
the local engine uses, and save/reload with ``save_pretrained`` / ``AutoModelForCausalLM.from_pretrained``
(the saved ``config.json`` names the class).
"""

from __future__ import annotations

from typing import Any

import torch

DEFAULT_FAMILY = "qwen3"

_COMMON_KEYS = {
    "family",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "rope_theta",
}
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")


def _olmo_classes():
    """(config class, model class, has sliding-window layer types) of the newest OLMo in ``transformers``."""
    try:
        from transformers import Olmo3Config, Olmo3ForCausalLM

        return Olmo3Config, Olmo3ForCausalLM, True
    except ImportError:  # transformers without OLMo 3: OLMo 2 is the same block without sliding layers
        from transformers import Olmo2Config, Olmo2ForCausalLM

        return Olmo2Config, Olmo2ForCausalLM, False


def _qwen3(arch: dict[str, Any], common: dict[str, Any]):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if "head_dim" not in arch:
        raise ValueError("qwen3 arch needs head_dim")
    return Qwen3ForCausalLM, Qwen3Config(
        **common, head_dim=arch["head_dim"], rope_theta=arch.get("rope_theta", 10000.0)
    )


def _olmo(arch: dict[str, Any], common: dict[str, Any]):
    config_cls, model_cls, sliding = _olmo_classes()
    derived = arch["hidden_size"] // arch["num_attention_heads"]
    if arch.get("head_dim", derived) != derived or derived * arch["num_attention_heads"] != arch["hidden_size"]:
        raise ValueError(
            f"olmo arch: head_dim must be hidden_size / num_attention_heads = "
            f"{arch['hidden_size']} / {arch['num_attention_heads']}, got {arch.get('head_dim')}"
        )
    extra: dict[str, Any] = {"rope_parameters": {"rope_type": "default", "rope_theta": arch.get("rope_theta", 10000.0)}}
    if sliding:
        # every layer full attention; Olmo3Model still builds a sliding mask each forward (unused), which
        # needs a window: the context length
        extra |= {
            "layer_types": ["full_attention"] * arch["num_hidden_layers"],
            "sliding_window": common["max_position_embeddings"],
        }
    if "full_attention" in (config_cls().rope_parameters or {}):  # transformers >= 5.17: one rope dict per layer type
        rope = extra["rope_parameters"]
        extra["rope_parameters"] = {"full_attention": dict(rope), "sliding_attention": dict(rope)}
    return model_cls, config_cls(**common, **extra)


FAMILIES = {"qwen3": _qwen3, "olmo": _olmo}
"""Architecture family name -> builder of (model class, config)."""


def build_model(arch: dict[str, Any], vocab_size: int, pad_id: int, bos_id: int, eos_id: int, seed: int = 0):
    """Build a randomly initialised causal LM of family ``arch.get("family", "qwen3")``.

    arch: family (qwen3 | olmo), hidden_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads, head_dim (qwen3; olmo: optional, must be hidden_size / num_attention_heads),
    intermediate_size, max_position_embeddings, tie_word_embeddings, rope_theta (see
    configs/model/*.yaml). Unknown family or key -> ValueError naming the choices. The weights depend
    only on (arch, vocab_size, seed).
    """
    family = arch.get("family", DEFAULT_FAMILY)
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; valid choices: {sorted(FAMILIES)}")
    unknown = sorted(set(arch) - _COMMON_KEYS)
    if unknown:
        raise ValueError(f"unknown arch keys {unknown}; valid keys: {sorted(_COMMON_KEYS)}")
    missing = [k for k in _REQUIRED if k not in arch]
    if missing:
        raise ValueError(f"{family} arch is missing {missing}")
    common = dict(
        vocab_size=vocab_size,
        hidden_size=arch["hidden_size"],
        intermediate_size=arch["intermediate_size"],
        num_hidden_layers=arch["num_hidden_layers"],
        num_attention_heads=arch["num_attention_heads"],
        num_key_value_heads=arch["num_key_value_heads"],
        max_position_embeddings=arch.get("max_position_embeddings", 256),
        tie_word_embeddings=arch.get("tie_word_embeddings", True),
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        use_cache=True,
    )
    model_cls, cfg = FAMILIES[family](arch, common)
    torch.manual_seed(seed)
    return model_cls(cfg)


def n_params(model) -> int:
    """Distinct parameters (a tied LM head is counted once)."""
    return sum(p.numel() for p in model.parameters())
