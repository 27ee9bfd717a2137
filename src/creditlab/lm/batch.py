"""Token batches of a causal LM: packing prompts + responses, and the one per-token forward over them.

Used by the local engine (rollouts' old log-probs, the update), the SFT warm-up and the analyses (flipping,
coupling, decoding diagnostics); it imports no other layer of creditlab.

The one forward used for old log-probs returns, from a single pass, the log-probs of the sampled
tokens, the policy entropy and the final hidden states h_t (the LM-head input), because later
methods (DelTA, ARCA) need h_t and must not pay for an extra forward pass. :func:`chunked_response_forward`
runs that forward over length-sorted row chunks, each padded only to its own longest row, and reassembles the
batch (what verl's dynamic micro-batches do for its workers), so the loss and its backward are unchanged.
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

    @property
    def row_lengths(self) -> Tensor:
        """Tensor[B] long: real tokens per row (prompt + response)."""
        return self.attention_mask.sum(-1)

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


def length_chunks(lengths: Tensor, max_tokens: int) -> list[Tensor]:
    """Row indices sorted by ``lengths`` (Tensor[B]) and cut greedily into contiguous chunks whose padded size
    (rows x the chunk's longest row) stays within ``max_tokens`` (a row longer than that is a chunk alone):
    Tensor[b_c] long each, together a permutation of range(B). Rows of similar length share a chunk, so each
    chunk's padding is small; verl's dynamic micro-batches (``ppo_max_token_len_per_gpu``) bound the same size."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = torch.argsort(lengths, stable=True)
    sorted_lengths = lengths[order].tolist()
    chunks, start = [], 0
    for i in range(1, len(order) + 1):
        if i == len(order) or (i - start + 1) * sorted_lengths[i] > max_tokens:
            chunks.append(order[start:i])
            start = i
    return chunks


def chunked_response_forward(
    model, batch: TokenBatch, max_tokens: int, *, with_entropy: bool = False, with_hidden: bool = False, topk: int = 0
) -> ForwardOut:
    """:func:`response_forward` over ``batch`` in length-sorted row chunks of at most ``max_tokens`` padded
    positions each (:func:`length_chunks`),
    each trimmed to its own longest prompt and response (``TokenBatch.select``), reassembled in the batch's row
    order: every field has the shape ``response_forward`` gives (logp Tensor[B, T], ...), with 0 at response
    positions past a row's chunk width (masked positions: ``response_mask`` is 0 there).

    Rows are independent under the attention mask, so the real positions equal the one-forward values up to
    float rounding, and gradients flow through the reassembly: one loss and one backward over the whole batch
    give the same update. ``max_tokens=0`` is the one padded forward itself.
    """
    if max_tokens <= 0:
        return response_forward(model, batch, with_entropy=with_entropy, with_hidden=with_hidden, topk=topk)
    B, T = batch.response_mask.shape
    parts = [
        (idx, response_forward(model, batch.select(idx), with_entropy=with_entropy, with_hidden=with_hidden, topk=topk))
        for idx in length_chunks(batch.row_lengths, max_tokens)
    ]

    def gather(field: str) -> Tensor | None:
        first = getattr(parts[0][1], field)
        if first is None:
            return None
        full = first.new_zeros((B, T, *first.shape[2:]))
        for idx, out in parts:
            value = getattr(out, field)
            full[idx.to(full.device), : value.shape[1]] = value
        return full

    return ForwardOut(**{f: gather(f) for f in ("logp", "entropy", "hidden", "topk_logp", "topk_ids")})
