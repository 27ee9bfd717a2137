"""The shape of the network a run trains (layers, widths, vocabulary, parameters): what the resource model sizes.

Paper scale: the published ``config.json`` of each backbone's hub checkpoint (:data:`HUB_SHAPES`, keyed by
``model.hf_id``); smoke scale: the stand-in checkpoint that scale writes (``creditlab.models.standin``: its ``BASE``
and ``SHAPES`` and the byte-level tokenizer's size); tiny and micro: the run config's own ``model.arch``.
Parameters are counted from the shape (:meth:`Shape.params`), the count a checkpoint's size follows
(tests/test_resources.py checks it against a stand-in built with transformers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's shape (HF config.json names)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    qk_norm: str | None = "head"
    """RMSNorm of queries and keys: per head (Qwen3: head_dim weights each), over the whole width (Olmo 3: q and kv
    widths), or None (Qwen2.5)."""
    full_attention_layers: int | None = None
    """Layers with softmax attention (a KV cache growing with the context); None: all. Qwen3-Next: 1 in 4."""
    params_total: float | None = None
    """Total parameters where the dense formula does not apply (MoE, linear attention), from the model card."""
    params_active: float | None = None
    """Parameters each token goes through (MoE: the routed experts' share), from the model card."""

    @property
    def attn_width(self) -> int:
        """Query width: heads x head_dim (the attention FLOPs per position scale with it)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_layers(self) -> int:
        return self.num_hidden_layers if self.full_attention_layers is None else self.full_attention_layers

    def layer_params(self) -> int:
        """One dense decoder layer: q, k, v, o projections (+ q/k/v biases), gate/up/down MLP, norms."""
        d, hd = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        attn = d * q + 2 * d * kv + q * d + ((q + 2 * kv) if self.qkv_bias else 0)
        mlp = 3 * d * self.intermediate_size
        qk = {"head": 2 * hd, "width": q + kv, None: 0}[self.qk_norm]
        norms = 2 * d + qk  # two RMSNorms of width d per layer, and the q / k norms
        return attn + mlp + norms

    def params(self) -> int:
        """Parameters of the whole model (the checkpoint's tensors; a tied LM head counted once)."""
        if self.params_total is not None:
            return int(self.params_total)
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return embed + head + self.num_hidden_layers * self.layer_params() + self.hidden_size

    def active_params(self) -> int:
        """Parameters a token's forward multiplies (2 FLOPs each): all for a dense model, the routed share for MoE;
        the input embedding is a lookup and is left out."""
        if self.params_active is not None:
            return int(self.params_active)
        return self.params() - self.vocab_size * self.hidden_size * (0 if self.tie_word_embeddings else 1)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """vLLM's KV cache per token of context: K and V of every softmax-attention layer, bf16."""
        return 2 * self.kv_layers * self.num_key_value_heads * self.head_dim * dtype_bytes


def _qwen3(d: int, layers: int, heads: int, inter: int, tie: bool) -> Shape:
    return Shape(d, layers, heads, 8, 128, inter, 151936, tie)


HUB_SHAPES: dict[str, Shape] = {
    # config.json of each checkpoint on the Hugging Face hub (hidden_size, num_hidden_layers, num_attention_heads,
    # num_key_value_heads, head_dim, intermediate_size, vocab_size, tie_word_embeddings); the counts they give match
    # the model cards (Qwen3-1.7B: 1.7B, 1.4B without embeddings; the hub's "2.03B" counts the tied head twice)
    "Qwen/Qwen3-1.7B-Base": _qwen3(2048, 28, 16, 6144, True),
    "Qwen/Qwen3-4B-Base": _qwen3(2560, 36, 32, 9728, True),
    "Qwen/Qwen3-8B-Base": _qwen3(4096, 36, 32, 12288, False),
    "Qwen/Qwen3-14B-Base": _qwen3(5120, 40, 40, 17408, False),
    "Qwen/Qwen3-32B": _qwen3(5120, 64, 64, 25600, False),
    "Qwen/Qwen2.5-Math-7B": Shape(3584, 28, 28, 4, 128, 18944, 152064, False, qkv_bias=True, qk_norm=None),
    "Qwen/Qwen2.5-32B": Shape(5120, 64, 40, 8, 128, 27648, 152064, False, qkv_bias=True, qk_norm=None),
    "allenai/Olmo-3-1025-7B": Shape(4096, 32, 32, 32, 128, 11008, 100278, False, qk_norm="width"),
    # Qwen3-Next: 48 layers, 3 of 4 Gated DeltaNet (no growing KV cache), 512 experts (10 routed + 1 shared) of
    # width 512; model card: 80B parameters, 3B activated
    "Qwen/Qwen3-Next-80B-A3B-Thinking": Shape(
        2048, 48, 16, 2, 256, 512, 151936, False, full_attention_layers=12, params_total=80e9, params_active=3e9
    ),
}


@lru_cache(maxsize=1)
def _standin_vocab() -> int:
    from creditlab.models.standin import standin_tokenizer

    return len(standin_tokenizer())


def standin_shape(family: str) -> Shape:
    """The smoke stand-in of an ``arch.family`` backbone (creditlab.models.standin ``BASE`` + ``SHAPES``)."""
    from creditlab.models.standin import BASE, SHAPES

    a = {**BASE, **SHAPES[family]}
    heads = int(a["num_attention_heads"])
    shape = Shape(
        hidden_size=int(a["hidden_size"]),
        num_hidden_layers=int(a["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(a["num_key_value_heads"]),
        head_dim=int(a.get("head_dim") or a["hidden_size"] // heads),
        intermediate_size=int(a["intermediate_size"]),
        vocab_size=_standin_vocab(),
        tie_word_embeddings=bool(a["tie_word_embeddings"]),
        qkv_bias=family == "qwen2",
        qk_norm={"qwen2": None, "olmo3": "width"}.get(family, "head"),
    )
    if family == "qwen3_next":  # experts and linear attention: no dense formula; the resource model needs none here
        return Shape(**{**shape.__dict__, "full_attention_layers": 1})
    return shape


def shape_of(run_cfg: Mapping[str, Any]) -> Shape:
    """The shape of the network ``run_cfg`` trains: a hub backbone's published one at paper scale, its stand-in at
    smoke scale, the config's ``model.arch`` at tiny / micro. KeyError naming the model when it is unknown."""
    m = run_cfg["model"]
    arch = m.get("arch") or {}
    if run_cfg.get("scale") == "smoke":
        return standin_shape(str(arch["family"]))
    if m.get("kind") == "hub":
        if m["hf_id"] not in HUB_SHAPES:
            raise KeyError(
                f"model {m.get('name')!r} ({m['hf_id']}): no published shape in creditlab.resources.shapes.HUB_SHAPES; "
                f"add its config.json's sizes there"
            )
        return HUB_SHAPES[m["hf_id"]]
    heads = int(arch["num_attention_heads"])
    return Shape(
        hidden_size=int(arch["hidden_size"]),
        num_hidden_layers=int(arch["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(arch.get("num_key_value_heads", heads)),
        head_dim=int(arch.get("head_dim") or int(arch["hidden_size"]) // heads),
        intermediate_size=int(arch["intermediate_size"]),
        vocab_size=int(arch.get("vocab_size") or (run_cfg.get("data") or {}).get("vocab_size") or 0),
        tie_word_embeddings=bool(arch.get("tie_word_embeddings", False)),
    )
