"""Token kinds and the credit-structure summaries of creditlab.analysis.structure (issue 29 item 2)."""

import numpy as np
import pytest

from creditlab.analysis.structure import advantage_structure, boxed_reward, char_kinds, token_kinds


def test_char_kinds_label_decisive_operators_separators_and_the_answer():
    text = " 23+45=68;68-7=61 61*3=183 \\boxed{183}"
    k = char_kinds(text, [1])
    at = lambda s, start=0: k[text.index(s, start)]  # noqa: E731
    assert at("+") == "operator" and at("-") == "decisive" and at("*") == "operator"
    assert at(";") == "separator" and k[text.index("61 ") + 2] == "separator"
    assert [k[i] for i in range(text.index("{") + 1, text.index("}"))] == ["answer"] * 3
    assert at("=") == "other" and k[0] == "other" and k[text.index("\\")] == "other"
    assert char_kinds("12+3=15 \\boxed{15", []).count("answer") == 2  # an unclosed box: its digits still


def test_token_kinds_follow_the_characters_of_the_tiny_tokenizer():
    from creditlab.data.tokenizer import build_tokenizer

    tok = build_tokenizer(["Q: 1+2=3;,\\boxed{3} 0123456789-*"])
    text = " 12+3=15,15-2=13 \\boxed{13}"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    kinds = token_kinds(ids, tok, [1])
    assert len(kinds) == len(ids) and kinds[-1] == "other"  # EOS
    decoded = [tok.decode([i], skip_special_tokens=True) for i in ids]
    assert [d for d, k in zip(decoded, kinds) if k == "decisive"] == ["-"]
    assert [d for d, k in zip(decoded, kinds) if k == "separator"] == [","]
    assert [d for d, k in zip(decoded, kinds) if k == "answer"] == ["1", "3"]
    assert "\\boxed{" in decoded  # one token for the box


def test_advantage_structure_shares_and_zeros():
    adv = [np.array([0.0, 0.5, -0.25]), np.array([0.25, 0.0])]
    kinds = [["other", "decisive", "separator"], ["decisive", "separator"]]
    s = advantage_structure(adv, kinds)
    assert s["decisive"]["abs_share"] == pytest.approx(0.75) and s["separator"]["abs_share"] == pytest.approx(0.25)
    assert s["separator"]["zero_frac"] == pytest.approx(0.5) and s["other"]["zero_frac"] == 1.0
    assert s["decisive"]["abs_mean"] == pytest.approx(0.375) and s["answer"]["n"] == 0


def test_decisive_steps_are_read_from_the_question_and_label_the_rollouts():
    """The k-th operator symbol of a rule question is step k's: a rollout's decisive tokens follow from its prompt
    alone (what credit_fidelity's by-kind credit needs: its rollouts carry no record meta)."""
    from creditlab.analysis.structure import question_decisive_steps, rollout_kinds
    from creditlab.data.rule_arith import generate_rule_problem
    from creditlab.data.tokenizer import build_tokenizer

    assert question_decisive_steps("(23a45d7)*3") == [0, 1]
    assert question_decisive_steps("Q: 12+3e4*2\nA:") == [1]  # the template's letters are uppercase
    assert question_decisive_steps("12+3") == []
    rng = np.random.default_rng(0)
    rules = {"a": "+", "b": "+", "d": "-", "e": "-"}
    for _ in range(200):  # against the generator's own record of its letters
        p = generate_rule_problem(rng, int(rng.integers(1, 4)), 2, rules, 0.5, [" ", ";"])
        assert question_decisive_steps(p["question"]) == p["decisive"], p
    tok = build_tokenizer(["Q: A: abde (23a45d7)*3 0123456789+-*=;,\\boxed{}"])
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    kinds = rollout_kinds(tok, [enc("Q: 12a3-4\nA:")], [enc(" 12-3=9;9-4=5 \\boxed{5}")])
    resp = [tok.decode([i]) for i in enc(" 12-3=9;9-4=5 \\boxed{5}")]
    assert [r for r, k in zip(resp, kinds[0]) if k == "decisive"] == ["-"]  # the first '-': step 0, written for 'a'
    assert [r for r, k in zip(resp, kinds[0]) if k == "operator"] == ["-"]
    assert rollout_kinds(tok, [enc("Q: 12+3\nA:")], [enc(" 12+3=15 \\boxed{15}")]) is None  # no rule letter


def test_boxed_reward_reads_the_last_box_exactly():
    from creditlab.data.tokenizer import build_tokenizer

    tok = build_tokenizer(["\\boxed{} 0123456789+-=;"])
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    fn = boxed_reward(tok)
    assert fn([enc("1+2=3 \\boxed{3}"), enc("\\boxed{3} \\boxed{4}"), enc("\\boxed{03}"), enc("3")], ["3"] * 4) == [
        1.0,
        0.0,
        0.0,
        0.0,
    ]


def test_decisive_ranking_finds_the_tokens_where_the_two_models_differ():
    """Two micro models that differ only in the logits of one token id ('-', the decisive operator): Δlog p and KL put
    the decisive tokens first (precision 1), where the base entropy of an untrained model is no guide."""
    import torch

    from creditlab.analysis.structure import decisive_ranking, token_kinds
    from creditlab.data.tokenizer import build_tokenizer
    from creditlab.models.tiny import build_model
    from creditlab.plan import compose

    tok = build_tokenizer(["Q: A:\n \\boxed{}0123456789+-*;,=x"])
    cfg = compose("micro", "micro-s", "dapo", [])
    base = build_model(cfg["model"]["arch"], len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    rl = build_model(cfg["model"]["arch"], len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    rl.load_state_dict(base.state_dict())
    minus = tok.convert_tokens_to_ids("-")
    with torch.no_grad():  # untie the head, then raise only the '-' logit of the RL model
        rl.lm_head.weight = torch.nn.Parameter(rl.lm_head.weight.clone())
        rl.lm_head.bias = torch.nn.Parameter(torch.zeros(len(tok)))
        rl.lm_head.bias[minus] = 3.0
    texts = [" 12-3=9 \\boxed{9}", " 40+2=42,42-5=37 \\boxed{37}", " 7+1=8;8+1=9 \\boxed{9}"]
    prompts = [tok("Q: x\nA:")["input_ids"]] * 3
    responses = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    kinds = [token_kinds(r, tok, d) for r, d in zip(responses, ([0], [1], []))]
    out = decisive_ranking(rl, base, prompts, responses, kinds, tok.pad_token_id)
    assert out["n_decisive"] == 2 and out["dlogp"] == 1.0
    assert 0.0 <= out["random"] <= 1.0 and out["n_tokens"] == sum(len(r) for r in responses)
