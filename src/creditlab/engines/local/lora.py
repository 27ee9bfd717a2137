"""LoRA RL in the local engine (Paper D, ARCA): wrapping, the reference pass, merged sampling, export.

The trainer (``engines/local/trainer.py``) keeps working on the plain causal LM (``.model`` /
``.lm_head``, what the sampler and ``response_forward`` use): :func:`wrap_lora` injects peft LoRA
layers into that model *in place* and returns the ``PeftModel`` around it, which the trainer keeps for
the adapter switches only:

* ``peft_model.disable_adapter()``: the reference pass. A peft LoRA ``Linear`` with its adapter
  disabled calls its ``base_layer`` alone, so with ``dropout = 0`` this forward is the base model's,
  bit for bit (tests/test_lora.py checks ``torch.equal`` after a trained step). Its log-probs are
  ``ref_logp`` (policy-divergence weighting) and its last hidden states ``base_hidden`` (ARCA's
  h^base): one forward serves both.
* :func:`merged_for_sampling`: rollouts decoded with W + scale * B A in the base layers (adapter
  branch off) instead of W x + scale * B (A x) per token; the original weight tensors are put back
  afterwards (swapped, never subtracted), so merging never perturbs the base weights.
* :func:`random_adapter`: the random-adapter control [ours]: fresh Gaussian A', B' rescaled, per module,
  to the trained adapter's ||B A||_F, swapped in for one forward.
* :func:`merged_copy`: a plain model (``merge_and_unload`` on a copy) saved in the format of every
  other run, so evaluation needs no LoRA code; the adapter itself is saved beside it
  (:func:`save_adapter`).

peft is imported lazily: runs without LoRA never load it.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import Tensor

ADAPTER = "default"
"""The name of the one adapter the engine trains (peft's default)."""

LORA_KEYS = {
    "enable",
    "rank",
    "alpha",
    "dropout",
    "target_modules",
    "merge_for_sampling",
    "random_control",
    "reference_pass",
}
REFERENCE_PASS = ("always", "when_needed")


def wrap_lora(model: torch.nn.Module, lcfg: dict[str, Any], seed: int):
    """Inject a LoRA adapter (``trainer.lora`` config) into ``model`` in place; return the PeftModel.

    Only the adapter's parameters keep ``requires_grad``. A is initialised by peft (Kaiming-uniform),
    B = 0 (so the adapted model starts as the base model), from a torch RNG seeded with ``seed`` alone
    (the global RNG state is left untouched): the adapter's initial weights are a pure function of
    the run's seed, so a resumed run rebuilds the same module before loading its checkpoint.
    Unknown keys in ``lcfg`` -> ValueError naming the valid ones.
    """
    from peft import LoraConfig, get_peft_model

    unknown = sorted(set(lcfg) - LORA_KEYS)
    if unknown:
        raise ValueError(f"unknown trainer.lora keys {unknown}; valid keys: {sorted(LORA_KEYS)}")
    if lcfg.get("reference_pass", "when_needed") not in REFERENCE_PASS:
        raise ValueError(
            f"trainer.lora.reference_pass must be one of {list(REFERENCE_PASS)}, got {lcfg['reference_pass']!r}"
        )
    config = LoraConfig(
        r=int(lcfg["rank"]),
        lora_alpha=float(lcfg["alpha"]),
        lora_dropout=float(lcfg["dropout"]),
        target_modules=list(lcfg["target_modules"]),
        bias="none",
        init_lora_weights=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, config)
    if not lora_layers(peft_model):
        raise ValueError(f"trainer.lora.target_modules {list(lcfg['target_modules'])} matched no module of the model")
    return peft_model


def lora_layers(peft_model) -> list[tuple[str, torch.nn.Module]]:
    """(qualified name, peft LoRA layer) of every adapted module, in module order."""
    from peft.tuners.lora import LoraLayer

    return [(n, m) for n, m in peft_model.base_model.model.named_modules() if isinstance(m, LoraLayer)]


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates: those with ``requires_grad`` (all of them without LoRA)."""
    return [p for p in model.parameters() if p.requires_grad]


@contextmanager
def merged_for_sampling(peft_model) -> Iterator[None]:
    """Inside the block every LoRA layer computes (W + scale * B A) x with its adapter branch off.

    Numerically a reassociation of W x + scale * B (A x) (not bit-identical to it). The base weights are
    restored by swapping the original tensors back, exactly. For no-grad decoding only.
    """
    layers = [m for _, m in lora_layers(peft_model)]
    originals = [m.base_layer.weight.data for m in layers]
    with torch.no_grad():
        merged = [w + m.get_delta_weight(ADAPTER).to(w.dtype) for w, m in zip(originals, layers)]
    with peft_model.disable_adapter():
        try:
            for m, w in zip(layers, merged):
                m.base_layer.weight.data = w
            yield
        finally:
            for m, w in zip(layers, originals):
                m.base_layer.weight.data = w


@contextmanager
def random_adapter(peft_model, generator: torch.Generator) -> Iterator[None]:
    """Inside the block each LoRA layer holds a random adapter of the trained one's norm.

    Per module: A', B' with i.i.d. N(0, 1) entries (CPU ``generator``: deterministic), then both
    multiplied by sqrt(||B A||_F / ||B' A'||_F), so ||B' A'||_F = ||B A||_F (a trained B = 0 gives a
    zero random adapter). The trained tensors are swapped back afterwards, exactly.
    """
    layers = [m for _, m in lora_layers(peft_model)]
    saved = []
    with torch.no_grad():
        for m in layers:
            A, B = m.lora_A[ADAPTER].weight, m.lora_B[ADAPTER].weight
            a = torch.randn(A.shape, generator=generator, dtype=torch.float32)
            b = torch.randn(B.shape, generator=generator, dtype=torch.float32)
            target = torch.linalg.matrix_norm(B.float() @ A.float()).cpu()
            c = torch.sqrt(target / torch.linalg.matrix_norm(b @ a).clamp(min=1e-30))
            saved.append((A.data, B.data))
            A.data = (a * c).to(A.device, A.dtype)
            B.data = (b * c).to(B.device, B.dtype)
    try:
        yield
    finally:
        for m, (a, b) in zip(layers, saved):
            m.lora_A[ADAPTER].weight.data = a
            m.lora_B[ADAPTER].weight.data = b


def merged_copy(peft_model) -> torch.nn.Module:
    """A plain ``transformers`` model with the adapter merged in (W + scale * B A), on a copy: the
    trained PeftModel is left as it is. Saved with ``save_pretrained`` like any other run."""
    return copy.deepcopy(peft_model).merge_and_unload()


def save_adapter(peft_model, out_dir: Path) -> None:
    """peft ``save_pretrained``: adapter_config.json + adapter_model.safetensors (the adapter alone)."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out_dir))


def hidden_of(model: torch.nn.Module, batch) -> Tensor:
    """Last hidden states (LM-head input) at the positions that predict the response: Tensor[B, T, d].

    The hidden-state half of ``batch.response_forward`` (no LM head): for the random-adapter control.
    """
    device = next(model.parameters()).device
    ids, att = batch.input_ids.to(device), batch.attention_mask.to(device)
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    T = batch.response_len
    return model.model(input_ids=ids, attention_mask=att, position_ids=pos).last_hidden_state[:, -T - 1 : -1]
