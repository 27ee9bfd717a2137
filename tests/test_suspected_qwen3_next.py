"""Issue 28, suspected item (a): Qwen3-Next (Paper E) under verl 0.9.1's FSDP engine, on a CPU.

verl 0.9.1's FSDP engine with ``use_remove_padding`` (the launcher always sets it) packs a micro-batch's sequences into
one row (``workers/engine/fsdp/transformer_impl.py:1188-1193``: ``input_ids.values().unsqueeze(0)``, position ids
restarting at 0 per sequence, ``attention_mask=None``) and passes ``cu_seqlens`` only to a model whose ``forward`` takes
it (``transformer_impl.py:594``, ``1261-1272``): verl's own Qwen3.5 forward does, transformers' Qwen3NextForCausalLM
does not. Its softmax-attention layers find the sequence boundaries from the position ids (flash-attn varlen on GPU,
the packed-sequence mask of sdpa here); its Gated DeltaNet layers (3 of 4) read boundaries only from a
``cu_seq_lens_q`` kwarg nobody passes (transformers 5.10.4 ``modeling_qwen3_next.py:651, 701``), so the recurrent
state and the causal conv run on from one sequence into the next. With Ulysses sp > 1, verl's monkey patch
(``models/transformers/monkey_patch.py:497-551``) makes only the softmax attention sequence-parallel for this model
type (the Qwen3.5 branch patches its GatedDeltaNet with fla's context parallelism; there is no qwen3_next branch), so
each rank's linear-attention layers would see only their slice of the sequence. The plan refuses these runs at paper
scale (creditlab.engines.verl.sizing.linear_attention_refusal, called by creditlab.plan.check_verl_run): the DAG leaves
them out with the tables that read them and says why (creditlab.plan.RunRefused, tests/test_plan_refusals.py).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from creditlab.models.standin import SHAPES

tf = pytest.importorskip("transformers")

SMALL = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    attn_implementation="sdpa",
)
NEXT = {k: v for k, v in SHAPES["qwen3_next"].items() if k not in ("head_dim", "layer_types")}
"""The smoke stand-in's MoE and Gated DeltaNet sizes (creditlab.models.standin.SHAPES); head_dim and layers here."""


def _model(kind: str):
    torch.manual_seed(0)
    if kind == "qwen3":
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**SMALL)).eval()
    layers = ["linear_attention", "full_attention"] if kind == "next" else ["full_attention", "full_attention"]
    return tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(**SMALL, **NEXT, layer_types=layers)).eval()


@torch.no_grad()
def _packed_vs_alone(model) -> tuple[float, float]:
    """Max |logit| difference of sequences a, b packed as verl packs them (one row, position ids restarting, no
    attention mask) against each forwarded alone: (first sequence, second sequence)."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(0, 64, (9,), generator=g), torch.randint(0, 64, (7,), generator=g)
    alone_a = model(input_ids=a[None], use_cache=False).logits[0]
    alone_b = model(input_ids=b[None], use_cache=False).logits[0]
    packed = model(
        input_ids=torch.cat([a, b])[None],
        attention_mask=None,
        position_ids=torch.cat([torch.arange(9), torch.arange(7)])[None],
        use_cache=False,  # as verl's engine: the sdpa mask then finds the packed sequences from the position ids
    ).logits[0]
    return (packed[:9] - alone_a).abs().max().item(), (packed[9:] - alone_b).abs().max().item()


def test_verl_packing_leaks_qwen3_next_linear_attention_state_into_the_next_sequence():
    """The second of two packed sequences gets other logits than alone on Qwen3-Next (its Gated DeltaNet layer carries
    the first sequence's state), while softmax-attention models (Qwen3; Qwen3-Next with full attention only) give the
    same logits packed or alone: the packing is verl's, the leak is the linear attention's."""
    assert _packed_vs_alone(_model("qwen3"))[1] < 1e-5
    assert _packed_vs_alone(_model("next_full"))[1] < 1e-5
    first, second = _packed_vs_alone(_model("next"))
    assert first < 1e-5  # causal: the first sequence sees nothing of the second
    assert second > 1e-2, second  # 0.18 here
    # verl passes cu_seqlens only to a forward that takes it (transformer_impl.py:594): this one does not
    assert "cu_seqlens" not in inspect.signature(tf.Qwen3NextForCausalLM.forward).parameters


@torch.no_grad()
def test_qwen3_next_is_right_without_remove_padding():
    """verl's padded path (use_remove_padding=false: right-padded rows with an attention mask, transformer_impl.py
    1271-1308) gives every sequence its own logits: the alternative the refusal names (it needs Ulysses sp 1)."""
    model = _model("next")
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(0, 64, (9,), generator=g), torch.randint(0, 64, (7,), generator=g)
    ids = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros(2, 9, dtype=torch.long)
    ids[0], mask[0] = a, 1
    ids[1, :7], mask[1, :7] = b, 1
    pos = torch.arange(9)[None].expand(2, 9)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    assert (out[0] - model(input_ids=a[None], use_cache=False).logits[0]).abs().max() < 1e-5
    assert (out[1, :7] - model(input_ids=b[None], use_cache=False).logits[0]).abs().max() < 1e-5


def test_verl_ulysses_patch_leaves_qwen3_next_linear_attention_alone(monkeypatch):
    """verl 0.9.1's apply_monkey_patch with Ulysses sp 2 on Qwen3-Next replaces the softmax attention's
    _flash_attention_forward (all models) but not the Gated DeltaNet's forward, as it does Qwen3.5's."""
    pytest.importorskip("verl")
    from transformers.integrations import flash_attention
    from transformers.models.qwen3_next import modeling_qwen3_next as mq
    from verl.models.transformers import monkey_patch

    # restored after the test: apply_monkey_patch patches these process-wide
    monkeypatch.setattr(flash_attention, "_flash_attention_forward", flash_attention._flash_attention_forward)
    if hasattr(mq, "_flash_attention_forward"):
        monkeypatch.setattr(mq, "_flash_attention_forward", mq._flash_attention_forward)
    gdn = mq.Qwen3NextGatedDeltaNet.forward
    before = flash_attention._flash_attention_forward
    monkey_patch.apply_monkey_patch(_model("next"), ulysses_sp_size=2, use_remove_padding=True)
    assert flash_attention._flash_attention_forward is monkey_patch._ulysses_flash_attention_forward
    assert flash_attention._flash_attention_forward is not before
    assert mq.Qwen3NextGatedDeltaNet.forward is gdn  # not sequence-parallel: each rank would see its slice only
    source = inspect.getsource(monkey_patch.apply_monkey_patch)
    assert "qwen3_5_gated_delta_net_forward" in source and "qwen3_next" not in source


def test_the_plan_refuses_qwen3_next_at_paper_scale_and_keeps_it_at_smoke():
    """check_verl_run refuses every paper-scale run of the Qwen3-Next backbone (naming the key, the family and the
    launcher's settings); the smoke run of the same backbone (numbers mean nothing there) and a Qwen3-32B run pass.
    The DAG's own validation (validate_runs) collects the refusals (Plan.refused_runs) instead of failing the plan."""
    from creditlab.engines.verl.sizing import linear_attention_refusal
    from creditlab.plan import RunRefused, build_plan, check_verl_run, run_config

    pipe = {"papers": ["dfpo"], "seeds": [0], "results": "results"}
    # on H200s (141 GB): no run refused for memory (DFPO's G = 16 rows on H100s are: tests/test_resources.py)
    refused = build_plan({**pipe, "scale": "paper", "cluster": {"gpu_mem_gb": 141}}).refused_runs
    assert {k.rsplit("/", 2)[0] for k in refused} == {"paper/qwen3-next-80b-a3b"} and len(refused) == 10
    assert all(why.startswith("model.arch.family=qwen3_next") for why in refused.values())
    paper = build_plan({**pipe, "scale": "paper"}, validate=False)
    run = paper.get("qwen3-next-80b-a3b", "dfpo", 0)
    cfg = run_config(run)
    with pytest.raises(RunRefused, match=r"refused at plan time: .*qwen3_next.*use_remove_padding") as err:
        check_verl_run(cfg, run.key)
    assert err.value.key == run.key and run.key in str(err.value) and err.value.reason == refused[run.key]
    check_verl_run(run_config(paper.get("qwen3-32b", "dfpo", 0)), "paper/qwen3-32b/dfpo/s0")
    # the settings under which verl 0.9.1 computes Qwen3-Next right: padded batches, sp 1
    assert linear_attention_refusal(cfg, remove_padding=False, ulysses_sp=1) is None
    assert "Ulysses" in linear_attention_refusal(cfg, remove_padding=False, ulysses_sp=2)
    smoke = build_plan({**pipe, "scale": "smoke"}, validate=False)
    srun = smoke.get("qwen3-next-80b-a3b", "dfpo", 0)
    check_verl_run(run_config(srun), srun.key)
