"""Local engine pieces: packing, the one forward (log-probs, entropy, hidden states), shaping, DS."""

from __future__ import annotations

import math

import pytest
import torch

from creditlab.algos.shaping import overlong_penalty
from creditlab.engines.local.trainer import Rollouts, _Filtered, lr_lambda
from creditlab.lm.batch import chunked_response_forward, length_chunks, pack, response_forward
from creditlab.models.tiny import build_model

ARCH = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=64
)


@pytest.fixture(scope="module")
def model():
    return build_model(ARCH, vocab_size=24, pad_id=0, bos_id=1, eos_id=2, seed=3).eval()


def test_pack_left_pads_prompts_and_right_pads_responses():
    b = pack([[1, 5, 6], [1, 7]], [[8, 2], [9, 10, 11, 2]], pad_id=0)
    assert b.input_ids.tolist() == [[1, 5, 6, 8, 2, 0, 0], [0, 1, 7, 9, 10, 11, 2]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1]]
    assert b.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    sub = b.select(torch.tensor([0]))  # all-padding columns trimmed on both sides
    assert sub.input_ids.tolist() == [[1, 5, 6, 8, 2]] and sub.response_mask.tolist() == [[1, 1]]


def test_response_forward_matches_per_sequence_reading(model):
    prompts, responses = [[1, 5, 6, 7], [1, 9]], [[3, 4, 2], [10, 11, 12, 13, 2]]
    b = pack(prompts, responses, pad_id=0)
    with torch.no_grad():
        out = response_forward(model, b, with_entropy=True, with_hidden=True)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            logits = model(torch.tensor([p + r])).logits[0].float()  # unpadded, alone
            lp = torch.log_softmax(logits, -1)
            for t, tok in enumerate(r):
                row = lp[len(p) - 1 + t]
                assert out.logp[i, t].item() == pytest.approx(row[tok].item(), abs=1e-4)
                assert out.entropy[i, t].item() == pytest.approx(-(row.exp() * row).sum().item(), abs=1e-4)
        # h_t is the LM-head input: lm_head(h) reproduces the log-probs of the same forward
        relp = torch.log_softmax(model.lm_head(out.hidden).float(), -1)
        torch.testing.assert_close(relp.gather(-1, b.responses.unsqueeze(-1)).squeeze(-1), out.logp)


def test_length_chunks_sort_rows_by_length_within_a_token_budget():
    lengths = torch.tensor([5, 9, 1, 7, 3, 8, 2])
    chunks = length_chunks(lengths, 16)
    flat = torch.cat(chunks)
    assert sorted(flat.tolist()) == list(range(7))  # every row once
    assert lengths[flat].tolist() == sorted(lengths.tolist())  # similar lengths share a chunk
    # greedy in length order: rows x longest row <= 16 -> [1, 2, 3] (9), [5, 7] (14), [8] (8: 8, 9 = 16 + 2), [9]
    assert [lengths[c].tolist() for c in chunks] == [[1, 2, 3], [5, 7], [8], [9]]
    assert [len(c) for c in length_chunks(lengths, 4)] == [2, 1, 1, 1, 1, 1]  # a row over the budget: alone
    assert len(length_chunks(lengths, 10_000)) == 1
    with pytest.raises(ValueError, match="max_tokens"):
        length_chunks(lengths, 0)


def _ragged_batch(n: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lens_p = torch.randint(2, 7, (n,), generator=g).tolist()
    lens_r = torch.randint(1, 11, (n,), generator=g).tolist()
    prompts = [[1] + torch.randint(3, 24, (k - 1,), generator=g).tolist() for k in lens_p]
    responses = [torch.randint(3, 24, (k - 1,), generator=g).tolist() + [2] for k in lens_r]
    return pack(prompts, responses, pad_id=0)


def test_chunked_forward_equals_the_one_padded_forward_and_its_gradient(model):
    """Length-sorted chunks change only padding: every field at real response positions, and the gradient of a
    loss over the reassembled batch, equal the one forward's; positions past a row's chunk width are 0."""
    b = _ragged_batch()
    mask = b.response_mask
    one = response_forward(model, b, with_entropy=True, with_hidden=True, topk=3)
    many = chunked_response_forward(model, b, 40, with_entropy=True, with_hidden=True, topk=3)
    real = mask.bool()
    for field in ("logp", "entropy", "hidden", "topk_logp"):
        a, c = getattr(one, field), getattr(many, field)
        assert a.shape == c.shape, field
        torch.testing.assert_close(c[real], a[real], atol=1e-5, rtol=1e-5)
    assert torch.equal(many.topk_ids[real], one.topk_ids[real])
    assert (many.logp[~real] == 0).sum() > 0  # some chunk is narrower than the batch: padding it never computed

    def grads(fn):
        model.zero_grad(set_to_none=True)
        out = fn()
        (-(out.logp * mask).sum() / mask.sum()).backward()
        return [p.grad.clone() for p in model.parameters()]

    for g1, g4 in zip(grads(lambda: response_forward(model, b)), grads(lambda: chunked_response_forward(model, b, 40))):
        torch.testing.assert_close(g4, g1, atol=1e-6, rtol=1e-4)
    model.zero_grad(set_to_none=True)


def test_overlong_penalty_reads_dapo_formula():
    assert overlong_penalty(40, max_len=64, buffer=16, factor=1.0) == 0.0
    assert overlong_penalty(48, 64, 16, 1.0) == 0.0
    assert overlong_penalty(56, 64, 16, 1.0) == pytest.approx(-0.5)
    assert overlong_penalty(64, 64, 16, 1.0) == pytest.approx(-1.0)


def test_lr_schedule():
    assert lr_lambda(0, 10, 100, "constant") == pytest.approx(0.1)
    assert lr_lambda(50, 10, 100, "constant") == 1.0
    assert lr_lambda(10, 10, 100, "cosine") == pytest.approx(1.0)
    assert lr_lambda(100, 10, 100, "cosine") == pytest.approx(0.1)
    assert lr_lambda(55, 10, 100, "cosine") == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    with pytest.raises(ValueError, match="valid choices"):
        lr_lambda(0, 0, 10, "linear")


def test_dynamic_sampling_keeps_only_groups_with_differing_scores():
    G = 2

    def ro(scores, gid0):
        n = len(scores)
        return Rollouts(
            [[1]] * n, [[2]] * n, [True] * n, scores, [s - 0.1 for s in scores], [gid0 + i // G for i in range(n)]
        )

    f = _Filtered()
    f.add_informative(ro([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], 0), G)  # only group 0 informative
    assert f.n_groups(G) == 1
    f.add_informative(ro([0.0, 1.0, 1.0, 0.0], 10), G)
    out = f.take(4)
    assert out.group_ids == [0, 0, 10, 10] and out.scores == [1.0, 0.0, 0.0, 1.0]
    assert out.rewards == pytest.approx([0.9, -0.1, -0.1, 0.9])


def test_warmup_with_forward_chunks_trains_the_same_model(tmp_path):
    """warmup.forward_chunk_tokens only changes padding: three SFT steps from the same init reach the same losses
    and weights (up to float rounding) as one padded forward per batch."""
    from creditlab.data.synthetic import generate_split
    from creditlab.data.tokenizer import build_tokenizer
    from creditlab.engines.local.sft import warmup
    from creditlab.plan import compose

    records = generate_split(0, 40, [1, 2], [1, 2])
    tok = build_tokenizer([r["question"] + r["solution"] for r in records] + ["Q: A:\n \\boxed{}0123456789+-*"])
    runs = {}
    for k in (0, 48):
        cfg = compose("micro", "micro-s", overrides=["warmup.steps=3", f"warmup.forward_chunk_tokens={k}"])
        m = build_model(cfg["model"]["arch"], len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, seed=0)
        hist = warmup(m, tok, records, cfg, seed=0, progress=False)
        runs[k] = ([h["sft_loss"] for h in hist], torch.cat([p.detach().flatten() for p in m.parameters()]))
    assert runs[48][0] == pytest.approx(runs[0][0], rel=1e-4)
    assert (runs[48][1] - runs[0][1]).abs().mean() <= 1e-4 * runs[0][1].abs().mean()
