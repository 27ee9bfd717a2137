"""Paper A diagnostics: where do the base and RL models disagree, token by token?

For responses sampled from either model, both models score every generated token (teacher forcing);
per token we record Δlog p = log pi_RL(y) - log pi_base(y), the entropy of each model and
KL(pi_RL || pi_base). The paper's observation: Δlog p separates base outputs from RL outputs (bimodal)
while entropy and KL overlap. The histograms of this module are its tiny-scale check.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from creditlab.decoding.criteria import entropy, kl_divergence
from creditlab.lm.batch import pack, response_logprobs
from creditlab.lm.sampler import SamplingParams, generate

STATS = ("dlogp", "entropy_base", "entropy_rl", "kl_rl_base")


def token_stats(logp_rl: Tensor, logp_base: Tensor, tokens: Tensor) -> dict[str, Tensor]:
    """Per-token statistics from both models' full log-probs.

    logp_rl, logp_base: Tensor[N, V] normalised log-probs at N positions; tokens: Tensor[N] the tokens
    generated there. Returns Tensor[N] each: dlogp, entropy_base, entropy_rl, kl_rl_base.
    """
    y = tokens[:, None]
    return {
        "dlogp": (logp_rl.gather(1, y) - logp_base.gather(1, y)).squeeze(1),
        "entropy_base": entropy(logp_base),
        "entropy_rl": entropy(logp_rl),
        "kl_rl_base": kl_divergence(logp_rl, logp_base),
    }


@torch.no_grad()
def collect_token_stats(
    base,
    rl,
    prompt_ids: list[list[int]],
    params: SamplingParams,
    *,
    source: str,
    pad_id: int,
    chunk: int = 256,
) -> dict[str, np.ndarray]:
    """Sample one response per prompt from ``source`` ("base" or "rl") with ``params``, score every token with both
    models (``chunk`` rows a forward, padded with ``pad_id``).

    The models may live on different devices (a GPU each): the statistics are computed on the RL model's."""
    sampler_model = base if source == "base" else rl
    gen = generate(sampler_model, prompt_ids, params)
    out: dict[str, list[np.ndarray]] = {k: [] for k in STATS}
    for i in range(0, len(prompt_ids), chunk):
        batch = pack(prompt_ids[i : i + chunk], gen.response_ids[i : i + chunk], pad_id)
        lp_r = response_logprobs(rl, batch)
        lp_b = response_logprobs(base, batch).to(lp_r.device)
        valid = batch.response_mask.bool().to(lp_r.device)
        stats = token_stats(lp_r[valid], lp_b[valid], batch.responses.to(lp_r.device)[valid])
        for k, v in stats.items():
            out[k].append(v.cpu().numpy())
    return {k: np.concatenate(v) for k, v in out.items()}


def summarize(values: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, dict[str, float]]]:
    """Quantiles of every statistic per source: {source: {stat: {n, mean, q01, q05, q25, q50, q75, q95, q99}}}."""
    qs = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
    return {
        src: {
            k: {
                "n": int(v.size),
                "mean": float(v.mean()),
                **{f"q{int(q * 100):02d}": float(np.quantile(v, q)) for q in qs},
            }
            for k, v in stats.items()
        }
        for src, stats in values.items()
    }
