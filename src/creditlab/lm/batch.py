"""Token batches of a causal LM: packing prompts + responses, and the one per-token forward over them.

Used by the local engine (rollouts' old log-probs, the update), the SFT warm-up and the analyses (flipping,
coupling, decoding diagnostics); it imports no other layer of creditlab.

The one forward used for old log-probs returns, from a single pass, the log-probs of the sampled
tokens, the policy entropy and the final hidden states h_t (the LM-head input), because later
methods (DelTA, ARCA) need h_t and must not pay for an extra forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class TokenBatch:
    """Prompts left-padded to P, responses right-padded to T, concatenated.

    input_ids:      Tensor[B, P + T] long
    attention_mask: Tensor[B, P + T] long
    response_mask:  Tensor[B, T] float, 1 on real response tokens (EOS included)
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor

    @property
    def response_len(self) -> int:
        return self.response_mask.shape[1]

    @property
    def responses(self) -> Tensor:
        """Tensor[B, T] sampled token ids (pad where masked)."""
        return self.input_ids[:, -self.response_len :]

    def select(self, idx: Tensor) -> "TokenBatch":
        """Rows ``idx``, with all-padding columns trimmed on both sides (cheaper forwards)."""
        ids, att, rmask = self.input_ids[idx], self.attention_mask[idx], self.response_mask[idx]
        T = self.response_len
        keep_t = int(rmask.sum(0).nonzero().max()) + 1 if rmask.any() else 1
        prompt_att = att[:, : att.shape[1] - T]
        first = int(prompt_att.any(0).nonzero().min()) if prompt_att.any() else 0
        end = att.shape[1] - T + keep_t
        return TokenBatch(ids[:, first:end], att[:, first:end], rmask[:, :keep_t])


def pack(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> TokenBatch:
    """Left-pad prompts and right-pad responses into one TokenBatch."""
    B = len(prompts)
    P = max(len(p) for p in prompts)
    T = max(1, max(len(r) for r in responses))
    ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    att = torch.zeros((B, P + T), dtype=torch.long)
    rmask = torch.zeros((B, T), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        att[i, P - len(p) : P] = 1
        if r:
            ids[i, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
            att[i, P : P + len(r)] = 1
            rmask[i, : len(r)] = 1.0
    return TokenBatch(ids, att, rmask)


@dataclass
class ForwardOut:
    """Per response token: logp Tensor[B, T]; entropy Tensor[B, T] | None; hidden Tensor[B, T, d] | None;
    topk_logp / topk_ids Tensor[B, T, K] | None (the K most probable next tokens)."""

    logp: Tensor
    entropy: Tensor | None = None
    hidden: Tensor | None = None
    topk_logp: Tensor | None = None
    topk_ids: Tensor | None = None


def response_logprobs(model, batch: TokenBatch) -> "torch.Tensor":
    """Full next-token log-probs at every response position: Tensor[B, T, V] (float32).

    For diagnostics that need whole distributions (KL between two models); training uses
    :func:`response_forward`, which keeps only what the loss needs.
    """
    device = next(model.parameters()).device
    ids, att = batch.input_ids.to(device), batch.attention_mask.to(device)
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    hidden = model.model(input_ids=ids, attention_mask=att, position_ids=pos).last_hidden_state
    return torch.log_softmax(model.lm_head(hidden[:, -batch.response_len - 1 : -1]).float(), dim=-1)


def response_forward(
    model, batch: TokenBatch, *, with_entropy: bool = False, with_hidden: bool = False, topk: int = 0
) -> ForwardOut:
    """One forward of ``model`` over ``batch``; log-probs (and optionally entropy, h_t, top-``topk``
    log-probs and ids, K = min(topk, V)) of the response.

    Position ids restart at 0 on each row's first real token (left padding), as in the sampler.
    The logits at position P - 1 + t predict response token t.
    """
    device = next(model.parameters()).device
    ids = batch.input_ids.to(device)
    att = batch.attention_mask.to(device)
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    T = batch.response_len
    hidden_all = model.model(input_ids=ids, attention_mask=att, position_ids=pos).last_hidden_state
    hidden = hidden_all[:, -T - 1 : -1]  # [B, T, d]: the states that predict the response tokens
    logits = model.lm_head(hidden).float()  # [B, T, V]
    logprobs = torch.log_softmax(logits, dim=-1)
    targets = ids[:, -T:]
    logp = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = -(logprobs.exp() * logprobs).sum(-1)
    top = torch.topk(logprobs, min(topk, logprobs.shape[-1]), dim=-1) if topk > 0 else None
    return ForwardOut(
        logp=logp,
        entropy=entropy,
        hidden=hidden if with_hidden else None,
        topk_logp=None if top is None else top.values,
        topk_ids=None if top is None else top.indices,
    )
