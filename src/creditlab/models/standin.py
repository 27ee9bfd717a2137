"""Stand-in checkpoints of the paper backbones for scale ``smoke``: random-init, real architecture class, tiny.

A stand-in is written as a hub snapshot directory (``config.json``, ``model.safetensors``, tokenizer files with the
backbone's chat template, ``generation_config.json`` with its stop tokens), so that everything downstream (verl's
FSDP engine and model merger, the CPU rollout, vLLM) loads it as it would load the real snapshot. It proves that
the paper-scale code paths execute; its numbers mean nothing (a random model answers at chance).

Architecture classes by the backbone's ``arch.family`` (``config.json`` ``model_type`` of the real checkpoint):
``qwen3`` -> Qwen3ForCausalLM, ``qwen2`` (Qwen2.5) -> Qwen2ForCausalLM, ``olmo3`` -> Olmo3ForCausalLM,
``qwen3_next`` (the MoE backbone of Paper E) -> Qwen3NextForCausalLM with a few experts (:data:`SHAPES`).
The tokenizer is byte-level without merges (one token per UTF-8 byte, :func:`standin_tokenizer`) with the backbone's
special tokens; the chat template is the backbone's format: ChatML (``<|im_start|>role ... <|im_end|>``) for the Qwen
families and Olmo 3 [ours: Olmo 3's own template is ChatML as well; the tokens are what matters here].
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""The chat format of Qwen2.5, Qwen3 and Olmo 3 (their instruct templates without system or tool branches)."""
SPECIAL = ["<|im_start|>", "<|im_end|>"]
STOP = "<|im_end|>"
"""A chat turn's end: the checkpoint's generation_config stop token beside the tokenizer's EOS."""
STOP_PROB = 0.15
"""Mean probability of a stop token per generated position (:func:`calibrate_stop`): 8-token responses then end
within 4 tokens about half the time and run to the budget about a quarter of it, so lengths vary within a group and
overlong shaping gives rewards that vary (a random model is never right) and every update path runs."""

BASE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3": dict(head_dim=32),  # head sizes >= 32: vLLM's CPU attention serves 32, 64, 80, ...
    "qwen2": dict(),
    "olmo3": dict(),
    "qwen3_next": dict(
        head_dim=32,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        decoder_sparse_step=1,
        layer_types=["linear_attention", "full_attention"],
    ),
}
"""Per family: the stand-in's config beyond :data:`BASE` (a few small layers)."""


def _classes(family: str):
    import transformers as tf

    names = {
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "olmo3": ("Olmo3Config", "Olmo3ForCausalLM"),
        "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
    }
    if family not in names:
        raise ValueError(f"no stand-in for architecture family {family!r}; valid choices: {sorted(names)}")
    return getattr(tf, names[family][0]), getattr(tf, names[family][1])


def standin_tokenizer():
    """A byte-level tokenizer without merges (every UTF-8 byte one token, spelt as GPT-2 / Qwen / Olmo byte-level BPE
    spell bytes: " " is "Ġ", "\\n" is "Ċ"), the ``<pad> <bos> <eos> <unk>`` specials, the chat special tokens and
    :data:`CHATML`; no BOS is prepended (as Qwen's). Byte-level because transformers loads a ``qwen2`` checkpoint's
    tokenizer as its own ``Qwen2Tokenizer`` whatever tokenizer_config says, which rebuilds a byte-level BPE from the
    vocabulary: a character-level vocabulary then loses spaces and newlines (verl's Qwen chat handling refused it)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from creditlab.data.tokenizer import BOS, EOS, PAD, SPECIAL_TOKENS, UNK

    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *sorted(pre_tokenizers.ByteLevel.alphabet())])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in [*SPECIAL_TOKENS, *SPECIAL]])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        additional_special_tokens=SPECIAL,
    )
    tok.chat_template = CHATML
    return tok


def check_reload(tok, out: Path, texts: Iterable[str]) -> None:
    """The snapshot's tokenizer as ``AutoTokenizer`` loads it (the class transformers picks for its model_type) encodes
    and decodes ``texts`` and a chat turn exactly as ``tok`` does; ValueError naming the first text that differs."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(out))
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "1 + 1?\n"}], tokenize=False, add_generation_prompt=True
    )
    for text in [chat, *list(texts)[:200]]:
        ids = tok.encode(text, add_special_tokens=False)
        if loaded.encode(text, add_special_tokens=False) != ids or loaded.decode(ids) != text:
            raise ValueError(
                f"{out}: the stand-in's tokenizer loads as {type(loaded).__name__}, which encodes "
                f"{text[:60]!r} differently from the tokenizer written"
            )


@torch.no_grad()
def calibrate_stop(
    model, tok, texts: Iterable[str], stop_ids: list[int], p_stop: float = STOP_PROB, max_positions: int = 4096
) -> float:
    """Set the LM-head rows of ``stop_ids`` to s * u, u the unit mean of the final hidden states h over the
       chat-rendered
    ``texts``, with s chosen so that the mean over those positions of P(stop | h) = ``p_stop``. A random head's stop
    logits are otherwise whatever h . w gives: one stand-in stopped at its first token, another never (measured).
    P(stop | h) = sum_k exp(s h.u) / (sum_k exp(s h.u) + sum_other exp(h.w_j)) is found by bisection on s over
    [-1e3, 1e3] (monotone where h.u > 0, which holds for most positions; the closest value is kept otherwise).
    Returns s."""
    head = model.get_output_embeddings()
    stash: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda mod, args, out: stash.append(args[0].detach()))
    try:
        for text in list(texts)[:32] or ["1 + 1?"]:
            ids = tok.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
            model(torch.tensor([tok.encode(ids, add_special_tokens=False)[-512:]]))
    finally:
        hook.remove()
    h = torch.cat([x.reshape(-1, x.shape[-1]) for x in stash])[:max_positions].float()
    u = h.mean(0) / h.mean(0).norm()
    others = torch.ones(head.weight.shape[0], dtype=torch.bool)
    others[stop_ids] = False
    lse_other = torch.logsumexp(h @ head.weight[others].float().T, -1)
    proj, n_stop = h @ u, torch.tensor(float(len(stop_ids))).log()

    def prob(scale: float) -> float:
        return torch.sigmoid(n_stop + scale * proj - lse_other).mean().item()

    lo, hi = -1e3, 1e3
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if prob(mid) < p_stop else (lo, mid)
    head.weight[stop_ids] = (lo * u).to(head.weight.dtype)
    return lo


def write_standin(family: str, texts: Iterable[str], out: str | Path, seed: int = 0) -> Path:
    """Write a random-init stand-in of an ``arch.family`` backbone as a hub snapshot directory ``out``.

    texts: what the run will tokenize (prompts and answers): the reloaded tokenizer must encode them as the one written
    (:func:`check_reload`). Returns ``out``.
    """
    config_cls, model_cls = _classes(family)
    texts = list(texts)
    tok = standin_tokenizer()
    stop = tok.convert_tokens_to_ids(STOP)
    extra = dict(SHAPES[family])
    if family == "olmo3":
        extra |= {
            "layer_types": ["full_attention"] * BASE["num_hidden_layers"],
            "sliding_window": BASE["max_position_embeddings"],
        }
    cfg = config_cls(
        **BASE,
        **extra,
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    model = model_cls(cfg).float()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(3.0)  # a peakier random policy
    calibrate_stop(model, tok, texts, [tok.eos_token_id, stop])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": tok.bos_token_id,
                "eos_token_id": [tok.eos_token_id, stop],
                "pad_token_id": tok.pad_token_id,
            }
        )
    )
    check_reload(tok, out, texts)
    return out
