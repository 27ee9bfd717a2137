"""The resource model's activation and logits terms against a GPU: peak memory of one update micro-batch.

``python benchmarks/bench_resource_model_gpu.py [--tokens 16384] [--layers 2]`` on a CUDA device. A Qwen3-8B-Base
shaped model (hidden 4096, 32 heads, 8 KV heads, MLP 12288, vocabulary 151936, untied head) cut to ``--layers``
decoder layers, in bf16 with gradient checkpointing (as verl trains), takes one packed sequence of ``--tokens``
tokens: forward, per-token log-probs of the labels the way verl 0.9.1 computes them without flash-attn
(``logprobs_from_logits_v2``: a bf16 log-softmax per row), mean, backward. It prints the peak of
``torch.cuda.max_memory_allocated`` above the parameters and their gradients, beside the terms of
``creditlab.resources.estimate`` for the same tokens: checkpointed inputs (tokens x d x 2 x layers), one recomputed
layer (``act_bytes_per_token``) and the logits (tokens x V x ``LOGIT_BYTES_TRAIN``). A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
try:  # the device image has no omegaconf; creditlab.config_compose only names its DictConfig type
    import omegaconf  # noqa: F401
except ImportError:
    sys.modules["omegaconf"] = types.SimpleNamespace(DictConfig=dict)

from creditlab.resources.estimate import LOGIT_BYTES_TRAIN, act_bytes_per_token  # noqa: E402
from creditlab.resources.shapes import HUB_SHAPES  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--layers", type=int, default=2)
    a = p.parse_args()
    from transformers import Qwen3Config, Qwen3ForCausalLM

    shape = HUB_SHAPES["Qwen/Qwen3-8B-Base"]
    cfg = Qwen3Config(
        hidden_size=shape.hidden_size,
        num_hidden_layers=a.layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        intermediate_size=shape.intermediate_size,
        vocab_size=shape.vocab_size,
        tie_word_embeddings=shape.tie_word_embeddings,
        max_position_embeddings=max(40960, a.tokens),
        attn_implementation="sdpa",
    )
    dev = torch.device("cuda")
    model = Qwen3ForCausalLM(cfg).to(dev, torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    ids = torch.randint(0, shape.vocab_size, (1, a.tokens + 1), device=dev)
    inp, labels = ids[:, :-1], ids[:, 1:]

    def step() -> None:
        logits = model(input_ids=inp).logits  # [1, N, V] bf16
        logp = torch.stack(  # verl's logprobs_from_logits_v2 for bf16 logits: a log-softmax per row
            [torch.log_softmax(row, -1).gather(-1, lab[:, None]).squeeze(-1) for row, lab in zip(logits, labels)]
        )
        (-logp.float().mean()).backward()

    step()  # allocates the parameters' gradients
    torch.cuda.synchronize()
    static = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - static
    n, d, L, V = a.tokens, shape.hidden_size, a.layers, shape.vocab_size
    terms = {
        "checkpointed inputs": n * d * 2 * L,
        "recomputed layer": n * act_bytes_per_token(shape),
        "logits": n * V * LOGIT_BYTES_TRAIN,
    }
    out = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "tokens": n,
        "layers": L,
        "measured_peak_gb": peak / 1e9,
        "model_gb": {k: v / 1e9 for k, v in terms.items()},
        "model_total_gb": sum(terms.values()) / 1e9,
        "ratio_measured_over_model": peak / sum(terms.values()),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
