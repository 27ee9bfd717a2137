"""LoRA RL in the local engine (Paper D, ARCA): the reference pass is the base model exactly, only the
adapter trains, one reference forward per step when a weighting needs it (none for uniform), ARCA's
weights move off uniform once the adapter is trained, the merged export equals the adapter model,
resume is exact, and the diagnostics are logged."""

from __future__ import annotations

import copy

import pytest
import torch

from creditlab.engines.local import lora
from creditlab.lm.batch import pack, response_forward


def _trainer(method, tmp_path, overrides=(), backbone="micro-s"):
    """conftest.make_trainer's micro Trainer (scores alternate 0/1) on ``backbone``, plus an untouched copy
    of its base model (the Trainer wraps the one it gets in place)."""
    from conftest import _RandomScorer
    from creditlab.data.synthetic import generate_split
    from creditlab.data.tokenizer import build_tokenizer
    from creditlab.engines.local.trainer import Trainer
    from creditlab.models.tiny import build_model
    from creditlab.plan import compose

    cfg = compose("micro", backbone, method, ["trainer.steps=1", "trainer.overlong.enable=false", *overrides])
    records = generate_split(0, 20, [1, 1], [1, 1])
    tok = build_tokenizer([r["question"] + r["solution"] for r in records] + ["Q: A:\n \\boxed{}0123456789+-*"])
    model = build_model(cfg["model"]["arch"], len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    base = copy.deepcopy(model)
    return Trainer(cfg, model, tok, records, _RandomScorer(), tmp_path / method, progress=False), base


def _batch(t, step=0):
    ro, _ = t.collect(step)
    return ro, pack(ro.prompts, ro.responses, t.tok.pad_token_id)


def _count_forwards(t) -> list[bool]:
    """Patch the decoder stack's forward; each call appends whether the adapter was disabled in it."""
    calls: list[bool] = []
    inner = t.model.model
    original = inner.forward
    layers = [m for _, m in lora.lora_layers(t.peft)]

    def counted(*args, **kwargs):
        calls.append(all(m.disable_adapters for m in layers))
        return original(*args, **kwargs)

    inner.forward = counted
    return calls


@pytest.mark.parametrize("backbone", ["micro-s", "micro-olmo"])
def test_disabled_adapter_is_the_base_model_exactly(backbone, tmp_path):
    t, base = _trainer("arca", tmp_path, backbone=backbone)
    t.train_step(0)
    assert all(m.lora_B[lora.ADAPTER].weight.abs().max() > 0 for _, m in lora.lora_layers(t.peft))  # B trained
    _, batch = _batch(t, 1)
    t.model.eval()
    with torch.no_grad():
        h_base = lora.hidden_of(base.eval(), batch)
        ref_base = response_forward(base, batch)
        with t.peft.disable_adapter():
            h_ref = lora.hidden_of(t.model, batch)
            ref = response_forward(t.model, batch)
        h_adapted = lora.hidden_of(t.model, batch)
    assert torch.equal(h_ref, h_base) and torch.equal(ref.logp, ref_base.logp)
    assert not torch.equal(h_adapted, h_base)
    # merged sampling swaps the base weights back exactly
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    with torch.no_grad(), lora.merged_for_sampling(t.peft):
        h_merged = lora.hidden_of(t.model, batch)
    torch.testing.assert_close(h_merged, h_adapted, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(p, before[n]) for n, p in t.model.named_parameters())


def test_only_the_adapter_trains(tmp_path):
    t, _ = _trainer("arca", tmp_path)
    adapter = {n for n, p in t.model.named_parameters() if "lora_" in n}
    assert adapter and {n for n, p in t.model.named_parameters() if p.requires_grad} == adapter
    assert sum(len(g["params"]) for g in t.opt.param_groups) == len(adapter)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    t.train_step(0)
    for n, p in t.model.named_parameters():
        if n in adapter:
            if "lora_B" in n:
                assert not torch.equal(p, before[n]), n
        else:
            assert torch.equal(p, before[n]), n


@pytest.mark.parametrize(
    "method, control, extra",
    [
        ("arca_uniform", False, 0),
        ("arca_surprisal", False, 0),
        ("arca_entropy", False, 0),
        ("arca", False, 1),
        ("arca_divergence", False, 1),
        ("arca", True, 2),
    ],
)
def test_reference_forwards_per_step(method, control, extra, tmp_path):
    """learn() = 1 old forward + the update forwards, + ONE adapter-disabled forward for ARCA / divergence
    (both inputs from the same pass), + one more (adapter on, random) for the random control."""
    t, _ = _trainer(
        method,
        tmp_path,
        [f"trainer.lora.random_control={str(control).lower()}", "trainer.lora.reference_pass=when_needed"],
    )
    ro, _ = t.collect(0)
    calls = _count_forwards(t)
    m = t.learn(0, ro)
    updates = t.tcfg["mini_batches"] * t.tcfg["ppo_epochs"]
    assert len(calls) == 1 + updates + extra
    assert sum(calls) == min(extra, 1)  # the reference pass is the one forward with the adapter disabled
    assert (m["t_ref_forward"] > 0) == (extra > 0)


@pytest.mark.parametrize("method", ["arca_uniform", "arca"])
def test_reference_pass_always_is_shared_not_repeated(method, tmp_path):
    """reference_pass=always (the default): every LoRA step runs ONE adapter-disabled forward, uniform too
    (ref_kl and the residual logged for every scheme); ARCA reuses it: the same forward count."""
    t, _ = _trainer(method, tmp_path, ["trainer.lora.reference_pass=always"])
    ro, _ = t.collect(0)
    calls = _count_forwards(t)
    t.learn(0, ro)
    m = t.learn(1, ro)
    assert len(calls) == 2 * (1 + t.tcfg["mini_batches"] * t.tcfg["ppo_epochs"] + 1) and sum(calls) == 2
    assert m["t_ref_forward"] > 0 and m["ref_kl"] == m["ref_kl"] and "arca_residual_mean" in m


def test_arca_weights_leave_uniform_once_the_adapter_is_trained(tmp_path):
    t, _ = _trainer("arca", tmp_path, ["trainer.lora.random_control=true"])
    m0 = t.train_step(0)  # B = 0: the residual is exactly 0, the eps floor makes the weights uniform
    assert m0["arca_residual_max"] == 0.0
    assert m0["weight_gini"] == pytest.approx(0.0, abs=1e-6) and m0["eff_token_ratio"] == pytest.approx(1.0)
    assert m0["random_residual_gini"] == 0.0  # a random adapter of norm 0
    m1 = t.train_step(1)
    assert 0 < m1["arca_residual_mean"] <= m1["arca_residual_max"]
    assert m1["weight_gini"] > 1e-3 and m1["eff_token_ratio"] < 1 - 1e-4
    assert 0 < m1["arca_residual_gini"] < 1 and 0 < m1["random_residual_gini"] < 1
    for k in (
        "weight_gini",
        "eff_token_ratio",
        "arca_residual_mean",
        "arca_residual_max",
        "t_ref_forward",
        "arca_residual_gini",
        "random_residual_gini",
    ):
        assert k in m1


def test_uniform_and_full_finetuning_diagnostics(tmp_path):
    u = _trainer("arca_uniform", tmp_path, ["trainer.lora.reference_pass=when_needed"])[0].train_step(0)
    assert u["weight_gini"] == 0.0 and u["eff_token_ratio"] == pytest.approx(1.0) and u["t_ref_forward"] == 0.0
    assert "arca_residual_mean" not in u and "random_residual_gini" not in u
    d = _trainer("dapo", tmp_path)[0]  # full fine-tuning: no peft, every parameter trains
    assert d.peft is None and len(d.params) == len(list(d.model.parameters()))
    assert d.train_step(0)["weight_gini"] == 0.0


def test_reference_inputs_need_lora(tmp_path):
    with pytest.raises(ValueError, match="trainer.lora.enable=true"):
        _trainer("arca", tmp_path, ["trainer.lora.enable=false"])
    with pytest.raises(ValueError, match="unknown trainer.lora keys"):
        _trainer("arca", tmp_path, ["+trainer.lora.ranks=4"])


def test_merged_export_equals_the_adapter_model(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from creditlab.engines.local.sft import save_model

    t, base = _trainer("arca", tmp_path)
    t.train_step(0)
    t.train_step(1)
    _, batch = _batch(t, 2)
    t.model.eval()
    with torch.no_grad():
        want = response_forward(t.model, batch).logp
    save_model(t.export_model(), t.tok, tmp_path / "final")
    assert t.save_adapter(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
    assert lora.lora_layers(t.peft)  # the trainer's model keeps its adapter
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "final")).eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    reloaded = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        torch.testing.assert_close(response_forward(merged, batch).logp, want, rtol=0, atol=1e-5)
        torch.testing.assert_close(response_forward(reloaded.base_model.model, batch).logp, want, rtol=0, atol=1e-6)


def test_lora_run_resumes_exactly(tmp_path):
    """Stop after 2 steps, resume from the checkpoint, equal to 4 uninterrupted steps (adapter, optimizer,
    history; the random control's draws included)."""
    over = ["trainer.steps=4", "trainer.checkpoint_every=2", "trainer.lora.random_control=true"]
    a = _trainer("arca", tmp_path / "a", over)[0]
    b = _trainer("arca", tmp_path / "b", over)[0]
    c = _trainer("arca", tmp_path / "b", over)[0]
    a.fit()
    b.tcfg["steps"] = 2
    b.fit()
    assert c.maybe_resume() and c.step == 2
    c.fit()
    for (n, pa), (_, pc) in zip(a.model.named_parameters(), c.model.named_parameters()):
        assert torch.equal(pa, pc), n
    strip = [{k: v for k, v in h.items() if not k.startswith("t_")} for h in a.history]
    assert strip == [{k: v for k, v in h.items() if not k.startswith("t_")} for h in c.history]
    assert a.history[-1]["weight_gini"] > 0
