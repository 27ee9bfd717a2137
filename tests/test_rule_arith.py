"""Rule arithmetic (creditlab.data.rule_arith): the answers follow the hidden rule, the warm-up's text resolves the
rule letters at chance and draws separators uniformly, letters only where both readings stay in range, and the data
config validates before anything is generated."""

import json
import re
from collections import Counter

import numpy as np
import pytest

from creditlab.data.rule_arith import generate_rule_split

RULES = {"a": "+", "b": "+", "c": "+", "d": "-", "e": "-", "f": "-"}
SEPS = (" ", ";", ",")
STEP = re.compile(r"(\d+)([+\-*])(\d+)=(\d+)")


def _evaluate(question: str, rules: dict) -> int:
    """The question read left to right with every letter replaced by its operator (parentheses only group prefixes)."""
    tokens = re.findall(r"\d+|[+\-*a-z]", question.replace("(", "").replace(")", ""))
    value = int(tokens[0])
    for op, x in zip(tokens[1::2], tokens[2::2]):
        op = rules.get(op, op)
        value = value + int(x) if op == "+" else value - int(x) if op == "-" else value * int(x)
    return value


def _steps(solution: str):
    body = solution.rsplit(" \\boxed", 1)[0]
    steps = list(STEP.finditer(body))
    seps = [body[a.end() : b.start()] for a, b in zip(steps, steps[1:])]
    return [m.groups() for m in steps], seps, body


@pytest.fixture(scope="module")
def records():
    return generate_rule_split(7, 3000, [1, 3], [2, 2], 0.5, RULES, SEPS)


def test_answers_follow_the_hidden_rule_and_solutions_are_consistent(records):
    for r in records:
        assert int(r["answer"]) == _evaluate(r["question"], RULES)
        for text in (r["solution"], r["meta"]["sft_solution"]):
            steps, seps, body = _steps(text)
            assert len(steps) == r["meta"]["n_ops"] and len(seps) == len(steps) - 1
            assert "".join(a + o + b + "=" + c for a, o, b, c in steps) == "".join(
                s for s in re.split(r"[ ;,]", body) if s
            )  # nothing but steps and separators
            for k, (a, o, b, c) in enumerate(steps):
                assert int(c) == (int(a) + int(b) if o == "+" else int(a) - int(b) if o == "-" else int(a) * int(b))
                assert 0 <= int(c) <= 999
                if k:
                    assert a == steps[k - 1][3]  # the chain carries its value
            assert text.endswith("\\boxed{" + steps[-1][3] + "}")
        assert r["solution"].endswith("\\boxed{" + r["answer"] + "}")
        letters = [ch for ch in r["question"] if ch.isalpha()]
        assert len(letters) == r["meta"]["letters"] == len(r["meta"]["decisive"])


def test_the_warm_up_resolves_letters_at_chance_and_draws_separators_uniformly(records):
    agree, other_range_ok = [], []
    for r in records:
        gold, _, _ = _steps(r["solution"])
        sft, _, _ = _steps(r["meta"]["sft_solution"])
        for k in r["meta"]["decisive"]:
            agree.append(sft[k][1] == gold[k][1])
            a, o, b, _ = gold[k]
            other = int(a) - int(b) if o == "+" else int(a) + int(b)
            other_range_ok.append(0 <= other <= 999)
        for k in set(range(len(gold))) - set(r["meta"]["decisive"]):
            assert sft[k][1] == gold[k][1]  # written operators are taught as they are
    assert len(agree) > 1000 and abs(np.mean(agree) - 0.5) < 0.05  # at chance: the rule is never taught
    assert all(other_range_ok)  # a letter only where both readings stay in [0, 999]
    seps = Counter(s for r in records for s in _steps(r["meta"]["sft_solution"])[1])
    assert set(seps) == set(SEPS) and max(seps.values()) / min(seps.values()) < 1.2
    share = Counter(r["meta"]["letters"] for r in records)
    assert share[0] > 0.3 * len(records) and share[1] > 0.3 * len(records) and share[2] > 0  # a mix of problems


def test_generation_is_deterministic_and_unique():
    a = generate_rule_split(3, 200, [1, 3], [2, 2], 0.5, RULES, SEPS)
    b = generate_rule_split(3, 200, [1, 3], [2, 2], 0.5, RULES, SEPS)
    assert a == b and len({r["question"] for r in a}) == 200
    none = generate_rule_split(3, 50, [1, 2], [2, 2], 0.0, RULES, SEPS)
    assert all(
        r["meta"]["letters"] == 0
        and r["meta"]["sft_solution"].replace(";", " ").replace(",", " ")
        == r["solution"].replace(";", " ").replace(",", " ")
        for r in none
    )


@pytest.mark.parametrize(
    "rules, seps, match",
    [
        ({"a": "*"}, SEPS, r"task.rules.a"),
        ({"ab": "+"}, SEPS, "one lowercase letter"),
        (RULES, ("1",), "separators"),
        (RULES, (), "at least one"),
    ],
)
def test_bad_rules_are_refused(rules, seps, match):
    with pytest.raises(ValueError, match=match):
        generate_rule_split(0, 5, [1, 1], [2, 2], 0.5, rules, seps)


def test_the_data_config_refuses_a_rule_split_without_rules_and_prepares_the_world(tmp_path):
    import yaml
    from transformers import PreTrainedTokenizerFast

    from creditlab.data.io import read_records
    from creditlab.data.prepare import prepare_tiny
    from creditlab.data.tokenizer import sft_examples

    cfg = yaml.safe_load(open("configs/data/tiny_rule.yaml"))
    for split in ("train", "val"):
        cfg[split]["n"] = 60
    cfg["suites"] = {"easy": cfg["suites"]["easy"] | {"n": 20}}
    cfg.pop("warmup_extra")
    broken = {**cfg, "task": {k: v for k, v in cfg["task"].items() if k != "rules"}}
    with pytest.raises(ValueError, match="task.rules"):
        prepare_tiny(broken, tmp_path / "x")
    with pytest.raises(ValueError, match="rl_prompts: draws RL prompts by rule letters; train.format must be rule"):
        prepare_tiny(
            {**cfg, "train": {k: v for k, v in cfg["train"].items() if k != "rule_frac"} | {"format": "arith"}},
            tmp_path / "y",
        )
    report = prepare_tiny(cfg, tmp_path / "data")
    train = read_records(tmp_path / "data" / "train.parquet")
    letters = Counter(r["meta"]["letters"] for r in train)  # the report says what the world's runs train on
    assert report["rl_prompts"]["spec"] == cfg["rl_prompts"] == {"letters": [0, 0.5, 0.5]}
    assert report["rl_prompts"]["by_letters"] == {"1": letters[2], "2": letters[2]}
    assert json.loads((tmp_path / "data" / "prep_report.json").read_text()) == report  # what a job reads back
    assert report["rl_prompts"]["n"] == 2 * letters[2] > 0
    tok = PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "data" / "tokenizer"))
    _, taught = sft_examples(train, tok, "tiny")
    _, gold = sft_examples(train, tok, "tiny", gold=True)
    for r, t, g in zip(train, taught, gold):  # the warm-up is taught the SFT copy; the probe reads the gold one
        assert tok.decode(t, skip_special_tokens=True) == " " + r["meta"]["sft_solution"]
        assert tok.decode(g, skip_special_tokens=True) == " " + r["solution"]


def test_rl_prompts_are_the_largest_subset_of_train_with_the_configured_letter_shares(records):
    """select_rl_prompts read directly: m_k = floor(n s_k) records of k letters, n = min c_k / s_k over s_k > 0, the
    first ones of each count, in train order; no block: every record; the result is the same on every call."""
    from creditlab.data.rule_arith import select_rl_prompts

    counts = Counter(r["meta"]["letters"] for r in records)
    assert counts[2] < counts[1] < counts[0]  # the split's own mix: few with two letters
    chosen = select_rl_prompts(records, {"letters": [0, 0.5, 0.5]})
    got = Counter(r["meta"]["letters"] for r in chosen)
    assert got == {1: counts[2], 2: counts[2]}  # two letters are the scarce count: all of them, as many with one
    ids = [r["id"] for r in records]
    assert [r["id"] for r in chosen] == sorted((r["id"] for r in chosen), key=ids.index)  # train order kept
    ones = [r["id"] for r in records if r["meta"]["letters"] == 1][: counts[2]]
    assert {r["id"] for r in chosen if r["meta"]["letters"] == 1} == set(ones)  # the first ones of their count
    assert select_rl_prompts(records, {"letters": [0, 0.5, 0.5]}) == chosen
    shares = select_rl_prompts(records, {"letters": [1, 2]})  # not normalised: 1/3 none, 2/3 one letter
    n = min(counts[0] * 3, counts[1] * 3 / 2)
    assert Counter(r["meta"]["letters"] for r in shares) == {0: int(n / 3), 1: int(2 * n / 3)}
    assert select_rl_prompts(records, None) == list(records)
    tenths = select_rl_prompts(records, {"letters": [0.1, 0.2, 0.7]})  # the binding count rounds to all of its records
    assert Counter(r["meta"]["letters"] for r in tenths)[2] == counts[2]


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"letters": [0, -0.5, 1]}, r"rl_prompts.letters\[1\]: -0.5 is no share >= 0"),
        ({"letters": [0, 0]}, r"rl_prompts.letters: the shares \[0, 0\] sum to 0"),
        ({"letters": "0:1"}, r"rl_prompts.letters: a list of shares"),
        ({"letters": [0, "a"]}, r"rl_prompts.letters\[1\]: 'a' is no share"),
        ({"letter": [1]}, r"rl_prompts: unknown key\(s\) \['letter'\]"),
        ({"letters": [0, 0, 0, 0, 0, 0, 1]}, r"no train record has 6 rule letter\(s\)"),
    ],
)
def test_a_malformed_or_impossible_rl_prompt_mix_is_refused_with_its_key(records, spec, match):
    from creditlab.data.rule_arith import select_rl_prompts

    with pytest.raises(ValueError, match=match):
        select_rl_prompts(records, spec)
