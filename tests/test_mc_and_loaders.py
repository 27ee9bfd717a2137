"""Multiple-choice verifier, hub loaders (GPQA-Diamond, MMLU-Pro, LiveCodeBench) and verl's compute_score."""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import types
import zlib
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from creditlab.data.hub_loaders import (
    StrictStrUnpickler,
    decode_private_test_cases,
    encode_private_test_cases,
    load_gpqa_diamond,
    load_livecodebench,
    load_mmlu_pro,
    read_rows,
    restricted_loads,
)
from creditlab.data.schema import validate_record
from creditlab.engines.verl import reward as verl_reward
from creditlab.rewards import registry
from creditlab.rewards.multiple_choice import (
    MULTIPLE_CHOICE_SPEC,
    extract_choice,
    multiple_choice_score,
    shuffle_options,
)

HUB = Path(__file__).parent / "fixtures" / "hub"
GPQA, MMLU, LCB = HUB / "gpqa_diamond.jsonl", HUB / "mmlu_pro.jsonl", HUB / "livecodebench.jsonl"


# ---------------------------------------------------------------------------- extraction

EXTRACTION_TABLE = [
    ("Answer: C", 4, "C"),
    ("The answer is (C).", 4, "C"),
    ("Therefore the final answer is \\boxed{C}.", 4, "C"),
    ("**C**", 4, "C"),
    ("C.", 4, "C"),
    ("(C)", 4, "C"),
    ("B", 4, "B"),
    ("A or B? I think B", 4, "B"),  # a hedge, then a decision: the decision counts
    ("answer: d", 4, "D"),  # lower case right after an answer statement
    ("ANSWER: c.", 4, "C"),
    ("answer: (a)", 4, "A"),
    ("The answer is a little tricky; I'd say answer: b", 4, "B"),  # "a little" is the article
    ("Answer: B. Because the enzyme is denatured, option A is wrong.", 4, "B"),  # trailing explanation
    ("The correct answer is C.\n\n**Explanation:** A) is wrong since it ignores spin.", 4, "C"),
    ("Answer: A\nWait, let me recheck the sign.\nAnswer: D", 4, "D"),  # last occurrence wins
    ("The answer is A or B.", 4, None),  # hedged final answer
    ("The answer is A/B", 4, None),
    ("Answer: E", 4, None),  # beyond the 4 options
    ("\\boxed{F}", 4, None),
    ("\\boxed{F}", 10, "F"),
    ("Thus the answer is (J).", 10, "J"),  # MMLU-Pro: ten options
    ("Answer: I", 10, "I"),
    ("Answer: I think it's B", 4, "B"),  # the pronoun, not option I
    ("Answer: $\\boxed{\\text{B}}$", 4, "B"),
    ("So the answer is \\(\\boxed{B}\\)", 4, "B"),
    ("\\boxed{c}", 4, "C"),
    ("\\boxed{C) 42 eV}", 4, "C"),
    ("\\boxed{x+1}", 4, None),
    ("Final Answer: The final answer is $\\boxed{A}$. I hope it is correct.", 4, "A"),
    ("The correct option is D because the others violate parity.", 4, "D"),
    ("After weighing them, **(B)** is the best choice.\n\nThe others fail because they ignore spin.", 4, "B"),
    ("Answer:\n\nC) 4.5 eV", 4, "C"),
    ("Answer: **D**", 4, "D"),
    ("I'm going with C.", 4, "C"),
    ("The answer is not A; it is C", 4, "C"),
    ("A) 12\nB) 15\nC) 18\nD) 21\n\nThe answer is C", 4, "C"),
    ("Let me restate:\nA) 1\nB) 2\nC) 3\nD) 4\nI'm not sure.", 4, None),  # a restated list is no answer
    ("Answer: Carbon dioxide", 4, None),
    ("No idea.", 4, None),
    ("", 4, None),
]


@pytest.mark.parametrize("response, n_options, expected", EXTRACTION_TABLE)
def test_extract_choice_table(response, n_options, expected):
    assert extract_choice(response, n_options) == expected


def test_extract_choice_rejects_bad_option_count():
    with pytest.raises(ValueError, match="n_options"):
        extract_choice("Answer: A", 0)


@pytest.mark.timeout(60)
def test_extract_choice_ends_on_long_hostile_text():
    """Ends (the work bound itself is asserted by counting lines: test_extract_choice_work_is_linear_in_the_response),
    and the hedge between the boxed fragments is read as no answer."""
    text = " ".join(["answer", "\\boxed{", "(C)", "or", "I", "**D**", "\n"] * 3000)
    assert extract_choice(text, 4) is None or extract_choice(text, 4) in "ABCD"


HEDGED_BOXES = [
    ("\\boxed{A} or \\boxed{B}", None),  # issue 21: read as B
    ("The answer is \\boxed{A} or \\boxed{B}.", None),
    ("$\\boxed{A}$ or $\\boxed{B}$", None),
    ("\\boxed{A}, \\boxed{B}", None),
    ("\\boxed{\\text{A}} / \\boxed{\\text{C}}", None),
    ("\\boxed{A} and \\boxed{D}", None),
    ("\\boxed{A}\\quad\\boxed{B}", None),
    ("\\boxed{A or B}", None),  # one box, two letters
    ("\\boxed{A, C}", None),
    ("\\boxed{A} or B", None),
    ("A or \\boxed{B}", None),
    # not hedges: a correction after a sentence, a rejected option, one letter twice
    ("\\boxed{A}. Wait, that ignores the spin; the answer is \\boxed{B}.", "B"),
    ("The answer is \\boxed{C}, not D.", "C"),
    ("\\boxed{A}\n\nFinal answer: \\boxed{A}", "A"),
]


@pytest.mark.parametrize("response, expected", HEDGED_BOXES)
def test_two_boxed_letters_are_a_hedge(response, expected):
    assert extract_choice(response, 4) == expected
    if expected is None:
        assert multiple_choice_score(response, "A") == multiple_choice_score(response, "B") == 0.0


def _python_line_events(fn, *args) -> int:
    """Python lines executed by ``fn(*args)``: an operation count, independent of the machine's load."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn(*args)
    finally:
        sys.settrace(previous)
    return count


@pytest.mark.parametrize(
    "unit", ["\\boxed{", "answer: \\boxed{(", "\\boxed{\\text{", "\\boxed{A} or ", "{\\boxed{x}", "A) x\nB) y\n(C) "]
)
def test_extract_choice_work_is_linear_in_the_response(unit):
    """Issue 21: 700 KB of repeated ``\\boxed{`` took over 2 s (each box scanned 256 characters ahead, about
    180 Python lines per character; a restated option list with many letters was quadratic). Counted in
    Python lines executed, not seconds: at most 10 per character, and 4x the text is at most 4.5x the work."""
    small, big = unit * 250, unit * 1000
    n_small, n_big = _python_line_events(extract_choice, small, 4), _python_line_events(extract_choice, big, 4)
    assert n_big <= 10 * len(big), (n_big, len(big))
    assert n_big <= 4.5 * n_small, (n_small, n_big)


def test_extract_choice_on_700kb_of_unclosed_boxes():
    junk = "\\boxed{" * 100_000  # 700 KB (no wall-clock assertion: the suite's timeout bounds it)
    assert extract_choice(junk, 4) is None
    assert extract_choice(junk + " so the answer is \\boxed{C}", 4) == "C"
    assert extract_choice("\\boxed{A} " * 50_000 + "or \\boxed{B}", 4) is None


# ---------------------------------------------------------------------------- shuffling


def test_shuffle_is_deterministic_per_question():
    opts = ["right", "w1", "w2", "w3"]
    assert shuffle_options(opts, 0, 0, "recX") == shuffle_options(opts, 0, 0, "recX")
    perms = {tuple(shuffle_options(opts, 0, 0, f"rec{i}")[0]) for i in range(40)}
    assert len(perms) > 5  # the question id changes the permutation
    by_seed = {tuple(shuffle_options(opts, 0, seed, "recX")[0]) for seed in range(40)}
    assert len(by_seed) > 5  # and so does the seed


def test_shuffle_correct_letter_follows_the_correct_text():
    counts = Counter()
    for i in range(200):
        opts = ["right", "w1", "w2", "w3"]
        shuffled, letter = shuffle_options(opts, 0, 7, f"q{i}")
        assert sorted(shuffled) == sorted(opts)
        assert shuffled["ABCD".index(letter)] == "right"
        counts[letter] += 1
    assert set(counts) == set("ABCD") and min(counts.values()) > 25  # roughly uniform
    shuffled, letter = shuffle_options(["w", "x", "right", "y", "z"], 2, 0, "q")
    assert shuffled["ABCDE".index(letter)] == "right"
    with pytest.raises(ValueError):
        shuffle_options(["a", "b"], 2, 0, "q")


# ---------------------------------------------------------------------------- reward


def test_multiple_choice_reward_registered_and_binary():
    assert registry.get("multiple_choice") is multiple_choice_score
    assert multiple_choice_score("so the answer is (B)", "B") == 1.0
    assert multiple_choice_score("so the answer is (B)", "C") == 0.0
    assert multiple_choice_score("no letter here", "C") == 0.0
    assert multiple_choice_score("Answer: E", "E", n_options=4) == 0.0
    assert MULTIPLE_CHOICE_SPEC.judge(MULTIPLE_CHOICE_SPEC.extract("Answer: j"), "J") == 1.0


# ---------------------------------------------------------------------------- GPQA-Diamond


def test_gpqa_loader_field_mapping():
    rows = read_rows(GPQA)
    records = load_gpqa_diamond(GPQA, seed=0)
    assert len(records) == 3
    for row, rec in zip(rows, records):
        validate_record(rec)
        meta = rec["meta"]
        assert rec["id"] == f"gpqa-diamond/{row['Record ID']}" and rec["source"] == "gpqa-diamond"
        assert rec["split"] == "gpqa-diamond" and rec["solution"] is None
        assert meta["record_id"] == row["Record ID"] and meta["n_options"] == 4
        # the gold letter points at the (stripped) correct answer text
        assert meta["options"]["ABCD".index(rec["answer"])] == row["Correct Answer"].strip()
        assert sorted(meta["options"]) == sorted(
            row[k].strip() for k in ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
        )
        assert rec["question"].startswith(row["Question"].strip() + "\n\nA) ")
        assert rec["question"].endswith("\nD) " + meta["options"][3])
        assert meta["subdomain"] == row["Subdomain"] and meta["high_level_domain"] == row["High-level domain"]


def test_gpqa_shuffle_fixed_seed_and_order_independent(tmp_path):
    a = load_gpqa_diamond(GPQA, seed=0)
    assert a == load_gpqa_diamond(GPQA, seed=0)
    reversed_rows = list(reversed(read_rows(GPQA)))
    assert {r["id"]: r for r in load_gpqa_diamond(reversed_rows, seed=0)} == {r["id"]: r for r in a}
    assert load_gpqa_diamond(reversed_rows[:1], seed=0)[0] == a[-1]  # subsets keep their letters
    others = [load_gpqa_diamond(GPQA, seed=s) for s in range(1, 6)]
    assert any(o[i]["answer"] != a[i]["answer"] for o in others for i in range(3))
    # parquet export of the same rows loads the same
    path = tmp_path / "gpqa.parquet"
    pq.write_table(pa.Table.from_pylist(read_rows(GPQA)), path)
    assert load_gpqa_diamond(path, seed=0) == a


# ---------------------------------------------------------------------------- MMLU-Pro


def test_mmlu_pro_loader_field_mapping():
    rows = read_rows(MMLU)
    records = load_mmlu_pro(MMLU)
    assert [r["id"] for r in records] == [f"mmlu-pro/{row['question_id']}" for row in rows]
    for row, rec in zip(rows, records):
        validate_record(rec)
        assert rec["answer"] == row["answer"] and rec["meta"]["answer_index"] == row["answer_index"]
        assert rec["meta"]["options"] == row["options"]  # dataset order kept
        assert rec["meta"]["n_options"] == len(row["options"])
        assert rec["meta"]["category"] == row["category"] and rec["meta"]["src"] == row["src"]
        letter = "ABCDEFGHIJ"[len(row["options"]) - 1]
        assert f"\n{letter}) {row['options'][-1]}" in rec["question"]
    assert records[2]["meta"]["n_options"] == 8  # fewer than ten options happens
    bad = dict(rows[0], answer="A")
    with pytest.raises(ValueError, match="disagrees"):
        load_mmlu_pro([bad])


# ---------------------------------------------------------------------------- LiveCodeBench


def _lcb_reference_decode(value: str) -> list:
    """LiveCodeBench's own decoding (plain pickle.loads) -- only ever on our trusted fixture."""
    return json.loads(pickle.loads(zlib.decompress(base64.b64decode(value.encode("utf-8")))))


def test_livecodebench_v6_window_and_mapping():
    rows = {r["question_id"]: r for r in read_rows(LCB)}
    records = load_livecodebench(LCB)  # default: the v6 window [2025-02-01, 2025-05-01)
    assert [r["id"] for r in records] == ["livecodebench/abc395_a", "livecodebench/3801"]
    assert "abc380_a" in rows  # the 2024 problem is in the file, and filtered out
    for rec in records:
        validate_record(rec)
        row = rows[rec["meta"]["question_id"]]
        assert rec["source"] == "livecodebench" and rec["split"] == "livecodebench-v6"
        assert rec["question"] == row["question_content"].strip()
        tests = json.loads(rec["answer"])
        public = json.loads(row["public_test_cases"])
        private = _lcb_reference_decode(row["private_test_cases"])
        func = {"func_name": rec["meta"]["func_name"]}  # functional tests carry it: the gold alone is runnable
        assert tests == [t | func if t["testtype"] == "functional" else t for t in public + private]  # public first
        assert rec["meta"]["num_public_tests"] == len(public)
        assert rec["meta"]["num_private_tests"] == len(private)
        functional_keys = {"input", "output", "testtype", "func_name"}
        assert all(
            set(t) == (functional_keys if t["testtype"] == "functional" else functional_keys - {"func_name"})
            for t in tests
        )
        assert rec["meta"]["starter_code"] == row["starter_code"]
        assert rec["meta"]["contest_date"] == row["contest_date"]
    stdin, functional = records
    assert stdin["meta"]["func_name"] is None and {t["testtype"] for t in json.loads(stdin["answer"])} == {"stdin"}
    assert functional["meta"]["func_name"] == "maxPairSum"
    assert functional["meta"]["starter_code"].startswith("class Solution:")
    assert {t["testtype"] for t in json.loads(functional["answer"])} == {"functional"}
    # the gold alone judges a solution (what both engines and the evaluator give the verifier)
    from creditlab.rewards.code.cases import parse_tests
    from creditlab.rewards.code.reward import judge_code_exec

    assert {t.func_name for t in parse_tests(functional["answer"])[0]} == {"maxPairSum"}
    solution = (
        "from typing import List\nclass Solution:\n    def maxPairSum(self, nums: List[int]) -> int:\n"
        "        a = sorted(nums)\n        return a[-1] + a[-2]\n"
    )
    assert judge_code_exec(solution, functional["answer"]) == 1.0
    assert judge_code_exec(solution.replace("a[-2]", "a[0]"), functional["answer"]) == 0.0
    assert judge_code_exec("a, b = map(int, input().split())\nprint(a + b)\n", stdin["answer"]) == 1.0


def test_livecodebench_window_bounds():
    assert len(load_livecodebench(LCB, start_date=None, end_date=None)) == 3
    # start inclusive, end exclusive
    in_march = load_livecodebench(LCB, "2025-03-01", "2025-03-29T19:30:00")
    assert [r["id"] for r in in_march] == ["livecodebench/abc395_a"]
    assert load_livecodebench(LCB, "2024-01-01", "2025-01-01")[0]["id"] == "livecodebench/abc380_a"


def test_private_tests_decoding_matches_lcb_and_all_pickle_protocols():
    for row in read_rows(LCB):
        blob = row["private_test_cases"]
        assert decode_private_test_cases(blob) == _lcb_reference_decode(blob)
    tests = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
    payload = json.dumps(tests)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        for obj in (payload, payload.encode()):
            blob = base64.b64encode(zlib.compress(pickle.dumps(obj, protocol=protocol))).decode()
            assert decode_private_test_cases(blob) == tests
    assert restricted_loads(pickle.dumps(b"", protocol=2)) == b""
    assert decode_private_test_cases(payload) == tests  # plain JSON, as older LCB releases
    assert decode_private_test_cases(encode_private_test_cases(tests)) == tests


class _Exploit:
    """Unpickling this runs a shell command (that creates a file): what a hostile dataset could ship."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_restricted_unpickler_refuses_os_system(tmp_path):
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Exploit(marker))
    assert b"system" in evil
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        restricted_loads(evil)
    blob = base64.b64encode(zlib.compress(evil)).decode()
    with pytest.raises(pickle.UnpicklingError):
        decode_private_test_cases(blob)
    row = dict(read_rows(LCB)[0], private_test_cases=blob)
    with pytest.raises(pickle.UnpicklingError):
        load_livecodebench([row])
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):  # every protocol spells the global its own way
        with pytest.raises(pickle.UnpicklingError):
            restricted_loads(pickle.dumps(_Exploit(marker), protocol=protocol))
    assert not marker.exists()  # never executed
    with pytest.raises(pickle.UnpicklingError, match="str or bytes"):
        restricted_loads(pickle.dumps({"input": "1"}))
    assert issubclass(StrictStrUnpickler, pickle.Unpickler)


def test_private_tests_size_cap_and_garbage():
    big = encode_private_test_cases([{"input": "x" * 5000, "output": "y", "testtype": "stdin"}])
    with pytest.raises(ValueError, match="decompresses past"):
        decode_private_test_cases(big, max_bytes=1000)
    with pytest.raises(ValueError):
        decode_private_test_cases("not base64 at all!")


def test_livecodebench_functional_needs_func_name():
    row = next(r for r in read_rows(LCB) if r["platform"] == "leetcode")
    with pytest.raises(ValueError, match="func_name"):
        load_livecodebench([dict(row, metadata="{}")])


# ---------------------------------------------------------------------------- verl compute_score


def test_verl_compute_score_math_and_mc():
    cs = verl_reward.compute_score
    # keyword call, as verl's reward managers make it
    score = cs(data_source="math500", solution_str="so \\boxed{\\frac{1}{2}}", ground_truth="0.5", extra_info={})
    assert score == 1.0
    assert cs("aime25", "\\boxed{7}", "8") == 0.0
    gpqa = load_gpqa_diamond(GPQA)[0]
    extra = {"meta": json.dumps(gpqa["meta"])}  # our parquet stores meta as JSON
    assert cs("gpqa-diamond", f"Answer: {gpqa['answer']}", gpqa["answer"], extra, sandbox_fusion_url=None) == 1.0
    assert cs("Idavidrein/gpqa", "Answer: E", "E") == 0.0  # GPQA has 4 options by default
    assert cs("mmlu-pro", "the answer is (J)", "J") == 1.0  # MMLU-Pro: 10
    assert cs("TIGER-Lab/MMLU-Pro", "the answer is (J)", "J", {"n_options": 8}) == 0.0
    with pytest.raises(NotImplementedError):
        cs("openai/gsm8k_unknown_kind", "x", "y")


def test_verl_compute_score_dispatches_code_lazily(monkeypatch):
    """A fake creditlab.rewards.code.reward stands in for the verifier: compute_score dispatches to whatever module is
    importable under that name at call time (the record is loaded first: validating a code record reads the real
    module's test parser)."""
    rec = load_livecodebench(LCB)[1]
    seen = {}

    def fake_code_exec_score(response, gold, func_name=None):
        seen.update(response=response, gold=gold, func_name=func_name)
        return 1.0

    fake = types.ModuleType("creditlab.rewards.code.reward")
    fake.code_exec_score = fake_code_exec_score
    import creditlab.rewards.code

    monkeypatch.setitem(sys.modules, "creditlab.rewards.code.reward", fake)
    monkeypatch.setattr(creditlab.rewards.code, "reward", fake, raising=False)
    score = verl_reward.compute_score(
        data_source="livecodebench",
        solution_str="```python\nclass Solution: ...\n```",
        ground_truth=rec["answer"],
        extra_info={"meta": rec["meta"]},
    )
    assert score == 1.0
    assert seen["gold"] == rec["answer"] and seen["func_name"] == "maxPairSum"
    assert seen["response"].startswith("```python")
    # starter_code is not passed to a verifier that does not declare it; **kw gets both
    got = {}
    fake.code_exec_score = lambda response, gold, **kw: got.update(kw) or 0.0
    extra = {"meta": rec["meta"]}
    assert verl_reward.compute_score("livecodebench/code_generation_lite", "x", rec["answer"], extra) == 0.0
    assert got == {"func_name": "maxPairSum", "starter_code": rec["meta"]["starter_code"]}
