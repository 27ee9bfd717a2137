"""Smoke stand-ins taught to answer: the SFT targets, and the learnt probabilities read back exactly and by sampling."""

from __future__ import annotations

import json

import pytest
import torch

from creditlab.models.standin import (
    ANSWER_P_RIGHT,
    STOP,
    TAUGHT,
    answer_probabilities,
    answer_targets,
    chat_prompt,
    write_standin,
)

QUESTIONS = [
    ([{"role": "user", "content": "What is 2 + 5? Put it in \\boxed{}."}], "7", 0),
    ([{"role": "user", "content": "Simplify 3/6. Put it in \\boxed{}."}], "\\frac{1}{2}", 1),
    ([{"role": "user", "content": "How many sides has a square? Put it in \\boxed{}."}], "4", 3),
]


def test_answer_targets_weigh_the_right_and_the_wrong_answer():
    assert answer_targets("7", 0.5) == [("\\boxed{7}", 0.5), ("\\boxed{71}", 0.5)]
    assert answer_targets("7", 1.0) == [("\\boxed{7}", 1.0)]
    assert answer_targets("7", 0.0) == [("\\boxed{71}", 1.0)]


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    texts = [m[0]["content"] for m, _, _ in QUESTIONS] + [g for _, g, _ in QUESTIONS]
    return write_standin("qwen3", texts, tmp_path_factory.mktemp("standin") / "snap", questions=QUESTIONS)


def test_a_taught_standin_records_what_it_learnt_near_its_targets(taught):
    """Question rows 0, 1 and 3 of a file: right with probability 0.5, 1 and 0; the exact probabilities recorded in the
    snapshot lie within 0.15 of those targets, and right + wrong hold nearly all the mass (the model answers in the
    format, then stops)."""
    answers = json.loads((taught / TAUGHT).read_text())
    assert [a["p_right_target"] for a in answers] == [ANSWER_P_RIGHT[i] for _, _, i in QUESTIONS] == [0.5, 1.0, 0.0]
    for a in answers:
        assert abs(a["p_right"] - a["p_right_target"]) <= 0.15, a
        assert a["p_right"] + a["p_wrong"] >= 0.9, a


@torch.no_grad()
def test_sampled_answers_follow_the_exact_probabilities(taught):
    """Sampling the reloaded snapshot at temperature 1 (as a rollout does) gives the right answer about as often as
    the exact probability says (200 samples of the coin-flip question: within 4 standard errors), and every sample is
    one of the two taught answers ending with the stop token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(taught)
    model = AutoModelForCausalLM.from_pretrained(taught).eval()
    messages, gold, _ = QUESTIONS[0]
    right, wrong = (t for t, _ in answer_targets(gold, 0.5))
    p = answer_probabilities(model, tok, messages, [right])[0]
    prompt = torch.tensor([tok.encode(chat_prompt(tok, messages), add_special_tokens=False)] * 200)
    torch.manual_seed(0)
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=16,
        eos_token_id=tok.convert_tokens_to_ids(STOP),
        pad_token_id=tok.pad_token_id,
    )
    texts = [tok.decode(row[prompt.shape[1] :], skip_special_tokens=False) for row in out]
    answers = [t.split(STOP)[0] for t in texts]
    n_right = sum(a == right for a in answers)
    assert sum(a in (right, wrong) for a in answers) >= 190
    se = (p * (1 - p) / 200) ** 0.5
    assert abs(n_right / 200 - p) <= 4 * se + 0.01
