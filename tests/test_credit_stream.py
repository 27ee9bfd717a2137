"""Streamed credit passes (issue 30, item 1): DelTA's coefficients from per-micro-batch statistics on verl's
engine, with a peak memory that does not grow with the rollouts per rank."""

from __future__ import annotations

import importlib

import pytest
import torch

for _required in ("verl", "tensordict"):
    importlib.import_module(_required)

from tensordict import TensorDict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402

from creditlab.algos.credit.delta import (  # noqa: E402
    COEF_VARIANTS,
    DeltaStream,
    delta_coefficients,
    delta_pass_peak_bytes,
    delta_passes,
    delta_weights,
)
from creditlab.engines.verl import workers as vworkers  # noqa: E402
from verl_cpu import cpu_engine, peak_bytes  # noqa: E402

D = 512  # the hidden size: large enough that every token's d-vector, not its scalars, dominates what a pass holds
MICRO = 4  # rollouts per micro-batch (verl's infer micro-batch size per GPU)


@pytest.fixture
def engine(monkeypatch, tmp_path):
    """verl's FSDPEngineWithLMHead around a one-layer Qwen3 of hidden size D on CPU, in a one-process gloo group
    (verl's forward_backward_batch all-reduces the token count over the data-parallel group)."""
    import torch.distributed as dist

    eng = cpu_engine(monkeypatch, hidden_size=D, heads=4, head_dim=32, intermediate=128)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield eng
    finally:
        dist.destroy_process_group()


class _TrainingWorker:
    """verl's TrainingWorker.infer_batch without its GPU metrics: the engine's own infer_batch (verl's micro-batching,
    forward_step per micro-batch, postprocess_batch_func's reassembly), outputs moved to the host."""

    def __init__(self, engine):
        self.engine = engine

    def infer_batch(self, data):
        out = self.engine.infer_batch(data)["model_output"]
        return TensorDict(dict(out), batch_size=data.batch_size).cpu()


def _data(B: int, seed: int = 0, dynamic: bool = False) -> TensorDict:
    """B rollouts in groups of 4 (prompt 4 tokens, responses of 12-24 tokens, advantages of both signs and 0)."""
    g = torch.Generator().manual_seed(seed)
    P = [4] * B
    R = torch.randint(12, 25, (B,), generator=g).tolist()
    prompts = [torch.randint(3, 40, (p,), generator=g) for p in P]
    resps = [torch.randint(3, 40, (r,), generator=g) for r in R]
    ids = [torch.cat([a, b]) for a, b in zip(prompts, resps)]
    adv = torch.randn(B, generator=g)
    adv[::5] = 0.0

    def nt(xs):
        return torch.nested.as_nested_tensor([torch.as_tensor(x) for x in xs], layout=torch.jagged)

    data = TensorDict(
        {
            "input_ids": nt(ids),
            "position_ids": nt(torch.arange(len(x)) for x in ids),
            "prompts": nt(prompts),
            "responses": nt(resps),
            "response_mask": nt(torch.ones(r, dtype=torch.int64) for r in R),
            "loss_mask": nt(torch.cat([torch.zeros(p - 1), torch.ones(r + 1)]) for p, r in zip(P, R)),
            "temperature": torch.ones(B),
            vworkers.SEQ_ADV: adv,
        },
        batch_size=[B],
    )
    data["uid"] = tu.get_tensordict({"uid": [str(i // 4) for i in range(B)]})["uid"]
    tu.assign_non_tensor(
        data,
        use_remove_padding=False,
        calculate_entropy=True,
        use_dynamic_bsz=dynamic,
        micro_batch_size_per_gpu=MICRO,
        max_token_len_per_gpu=3 * 28,
    )
    return data


def _direct(engine, data):
    """What the in-memory path sees: each rollout's last hidden state and log-probs from the model itself, padded
    response positions (responses, mask, old_logp Tensor[B, T]; hidden Tensor[B, T, d])."""
    ids, P = data["input_ids"].unbind(), [len(p) for p in data["prompts"].unbind()]
    R = [len(r) for r in data["responses"].unbind()]
    B, T = len(R), max(R)
    hidden, old, mask = torch.zeros(B, T, D), torch.zeros(B, T), torch.zeros(B, T)
    responses = torch.nested.to_padded_tensor(data["responses"], 0)
    with torch.no_grad():
        for i in range(B):
            o = engine.module(ids[i][None], output_hidden_states=True)
            sl = slice(P[i] - 1, P[i] + R[i] - 1)
            hidden[i, : R[i]] = o.hidden_states[-1][0, sl]
            old[i, : R[i]] = torch.log_softmax(o.logits[0, sl], -1).gather(-1, responses[i, : R[i], None]).squeeze(-1)
            mask[i, : R[i]] = 1.0
    return responses, mask, old, hidden


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dp_stats", ["rank", "global"])
def test_streamed_credit_pass_equals_the_in_memory_coefficients(engine, dynamic, dp_stats):
    """credit_pass on verl's micro-batched forward (fixed micro-batches, or verl's dynamic batch sizes that reorder
    the rollouts) gives the weights of delta_weights on the whole batch's hidden states (to 1e-5), with the top-50%
    DelTA selection beside it, in K + 3 forwards (K = 2)."""
    data = _data(12, dynamic=dynamic)
    responses, mask, old, hidden = _direct(engine, data)
    adv = data[vworkers.SEQ_ADV]
    forwards = []
    engine.module.register_forward_hook(lambda *a: forwards.append(1))
    spec = {
        "credit": [{"name": "delta", "refine_steps": 2}],
        "token_filter": [{"name": "delta_select", "mode": "top", "frac": 0.5}],
        "seed": 0,
        "step": 3,
        "dp_stats": dp_stats,
    }
    out = vworkers.credit_pass(type("W", (), {"actor": _TrainingWorker(engine)})(), data, spec)
    pad = lambda nt: torch.nested.to_padded_tensor(nt, 0.0)  # noqa: E731
    want = delta_weights(responses, mask, old, adv, hidden, refine_steps=2)
    assert (pad(out[vworkers.OUT_WEIGHTS]) - want).abs().max() < 1e-5
    assert (want * mask).sum() / mask.sum() == pytest.approx(1.0, abs=1e-5) and want.std() > 1e-3
    from creditlab.algos.credit.delta import delta_select_mask

    assert torch.equal(pad(out[vworkers.OUT_FILTER]), delta_select_mask(responses, mask, old, adv, hidden))
    n_micro = -(-12 // MICRO) if not dynamic else len(forwards) // delta_passes("full", 2)
    assert len(forwards) == delta_passes("full", 2) * n_micro == (2 + 3) * n_micro
    assert "hidden" not in out.keys() and not any(str(k).startswith("creditlab_stream") for k in out.keys())


@pytest.mark.parametrize("method", ["delta", "arca"])
def test_credit_pass_peak_memory_does_not_grow_with_the_rollouts(engine, method):
    """The whole worker-side credit pass (verl's infer_batch outputs included) at 16 and 32 rollouts with the same
    4-rollout micro-batch: its peak allocation grows by less than 15% (what grows is per-token scalars: log-probs,
    entropy, weights), where holding every rollout's hidden states (B x T x d) doubles it. DelTA (K = 1: four
    forwards) and ARCA on a LoRA adapter (h and h_base: the forward with the adapter on and off)."""
    spec = {"credit": [{"name": "delta", "refine_steps": 1}], "token_filter": [], "seed": 0, "step": 1}
    if method == "arca":
        from creditlab.engines.local.lora import wrap_lora

        lcfg = {"enable": True, "rank": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "down_proj"]}
        engine.module = wrap_lora(engine.module, lcfg, seed=0)
        with torch.no_grad():
            for name, p in engine.module.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2)  # a trained adapter: h != h_base
        engine.disable_adapter = engine.module.disable_adapter
        spec = {"credit": [{"name": "arca"}], "token_filter": [], "seed": 0, "step": 1, "fused_ref": True}
    worker = type("W", (), {"actor": _TrainingWorker(engine)})()
    peaks = {}
    for B in (16, 32):
        data = _data(B, seed=1)
        out = vworkers.credit_pass(worker, data.clone(), spec)  # warm-up (first-call allocations)
        assert torch.nested.to_padded_tensor(out[vworkers.OUT_WEIGHTS], 0.0).std() > 0
        peaks[B] = peak_bytes(lambda: vworkers.credit_pass(worker, data.clone(), spec))
    hidden_16 = sum(len(x) for x in _data(16, seed=1)["input_ids"].unbind()) * D * 4  # float32 hidden states
    print(method, "credit_pass peak bytes by rollouts:", peaks, "hidden states of 16 rollouts:", hidden_16)
    assert peaks[32] < 1.15 * peaks[16], peaks
    assert peaks[32] - peaks[16] < 0.25 * hidden_16, (peaks, hidden_16)


def test_stream_passes_match_the_official_count_and_memory_model():
    """DeltaStream makes delta_passes(variant, K) passes over micro-batches (the official code's K + 3 for the full
    method) and, read one micro-batch at a time, gives delta_coefficients on the whole batch for every variant; the
    memory model does not depend on the number of passes or rollouts and scales with the micro-batch."""
    g = torch.Generator().manual_seed(3)
    N, d = 600, 24
    v = torch.randn(N, d, generator=g) + torch.randn(d, generator=g)
    adv = torch.randn(N, generator=g)
    adv[::7] = 0.0
    for variant in COEF_VARIANTS:
        if variant == "random":
            continue  # one draw per micro-batch: a different (equally uniform) stream of draws
        for K in (0, 1, 3):
            s, passes, outs = DeltaStream(refine_steps=K, variant=variant), 0, []
            while not s.done:
                outs = [s.update(v[i : i + 50], adv[i : i + 50]) for i in range(0, N, 50)]
                s.end_pass()
                passes += 1
            assert passes == delta_passes(variant, K), (variant, K)
            whole = delta_coefficients(v, adv, refine_steps=K, variant=variant)
            assert torch.allclose(torch.cat(outs) * s.scale, whole, rtol=1e-5, atol=1e-5), (variant, K)
    assert delta_passes("full", 1) == 4 and delta_passes("no_refine") == 3 and delta_passes("random") == 1
    one = delta_pass_peak_bytes(20_000, 4096, 1)
    assert one == delta_pass_peak_bytes(20_000, 4096, 5) and one < delta_pass_peak_bytes(40_000, 4096) < 2 * one
