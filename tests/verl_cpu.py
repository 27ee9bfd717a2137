"""Test helpers on verl's real code on a CPU: its FSDP engine around a tiny Qwen3, and torch's peak allocations."""

from __future__ import annotations

import torch


def cpu_engine(monkeypatch, hidden_size: int = 32, heads: int = 2, head_dim: int = 16, intermediate: int = 64):
    """verl's real FSDPEngineWithLMHead around a one-layer Qwen3 on CPU (no FSDP wrapping, no process group; verl
    has no CPU platform, so its device lookups are patched to "cpu")."""
    import verl.utils.torch_functional as verl_F
    import verl.workers.engine.fsdp.transformer_impl as impl
    from verl.utils import seqlen_balancing
    from verl.workers.config import FSDPEngineConfig

    from creditlab.models.tiny import build_model

    monkeypatch.setattr(impl, "get_device_id", lambda: "cpu")
    monkeypatch.setattr(impl, "get_device_name", lambda: "cpu")
    monkeypatch.setattr(seqlen_balancing, "get_device_name", lambda: "cpu")  # dynamic batch sizes' count sync
    arch = dict(
        family="qwen3",
        hidden_size=hidden_size,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=1,
        head_dim=head_dim,
        intermediate_size=intermediate,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        rope_theta=1e4,
    )
    eng = object.__new__(impl.FSDPEngineWithLMHead)
    eng.module = build_model(arch, 40, 0, 1, 2).eval()
    eng.use_ulysses_sp, eng.ulysses_device_mesh, eng.pad_to_length = False, None, False
    eng.ulysses_sequence_parallel_size = 1
    eng._autocast_dtype = torch.float32
    eng.engine_config = FSDPEngineConfig(use_torch_compile=False)
    eng.compute_entropy_from_logits = verl_F.entropy_from_logits
    return eng


def peak_bytes(fn) -> int:
    """Peak of the live bytes torch allocates while ``fn`` runs (every device: here the host), from the profiler's
    allocation and free events in order: deterministic for a given computation, unlike the process's RSS."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak
