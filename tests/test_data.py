"""Tests of the tiny world's data layer: schema, synthetic task, tokenizer, parquet I/O, prepare."""

from __future__ import annotations

import ast
import copy
import json
import os
import random
import re
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from transformers import AutoTokenizer

from creditlab.data.io import read_records, write_records
from creditlab.data.prepare import check_disjoint, prepare_tiny
from creditlab.data.schema import FIELDS, make_record, render_prompt, render_response, validate_record
from creditlab.data.synthetic import count_problems, generate_problem, generate_split
from creditlab.data.tokenizer import build_tokenizer

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SMALL_CFG = {
    "name": "tiny_arith",
    "seed": 7,
    "template": "tiny",
    "task": {"ops": ["+", "-", "*"], "max_value": 999},
    "train": {"n": 500, "n_ops": [1, 3], "digits": [1, 2]},
    "val": {"n": 40, "n_ops": [1, 3], "digits": [1, 2]},
    "suites": {
        "easy": {"n": 60, "n_ops": [1, 1], "digits": [1, 1]},
        "medium": {"n": 40, "n_ops": [2, 2], "digits": [1, 2]},
        "ood": {"n": 40, "n_ops": [4, 4], "digits": [1, 2]},
    },
}
STEP = re.compile(r"^(\d+)([+\-*])(\d+)=(\d+)$")


# --- an evaluator independent of the generator -------------------------------------------------


def evaluate_question(question: str) -> int:
    """Evaluate ``question`` with ordinary precedence via Python's AST (+, -, * on integers only)."""
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        raise AssertionError(f"unexpected syntax {ast.dump(node)} in {question!r}")

    return ev(ast.parse(question, mode="eval").body)


def check_problem(question: str, answer: str, solution: str, n_ops: int, digits: int, max_value: int) -> None:
    """Assert the answer, every written step and the question/step correspondence are right."""
    assert answer == str(evaluate_question(question))
    assert solution.endswith(" \\boxed{" + answer + "}")
    steps = solution[: -len(" \\boxed{" + answer + "}")].split(" ")
    assert len(steps) == n_ops
    parsed = [STEP.match(step).groups() for step in steps]  # AttributeError if malformed
    value = int(parsed[0][0])
    tokens = [value]
    for left, op, right, result in parsed:
        left, right, result = int(left), int(right), int(result)
        assert left == value, f"step does not continue the chain: {solution!r}"
        assert result == {"+": left + right, "-": left - right, "*": left * right}[op]
        assert 0 <= result <= max_value
        if op == "*":
            assert 2 <= right <= 9
        else:
            assert 1 <= right < 10**digits
        tokens += [op, right]
        value = result
    assert str(value) == answer
    question_tokens = [t if t in "+-*" else int(t) for t in re.findall(r"\d+|[+\-*]", question)]
    assert question_tokens == tokens, f"steps do not follow the question {question!r}"
    assert 1 <= tokens[0] < 10**digits


def check_record(rec: dict) -> None:
    """Validate a generated record and check its problem with the knobs stored in ``meta``."""
    validate_record(rec)
    meta = rec["meta"]
    check_problem(rec["question"], rec["answer"], rec["solution"], meta["n_ops"], meta["digits"], meta["max_value"])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The small config prepared once for the module."""
    out = tmp_path_factory.mktemp("prep")
    return out, prepare_tiny(copy.deepcopy(SMALL_CFG), out)


def _all_texts(out: Path) -> list[str]:
    texts = []
    for path in [out / "train.parquet", out / "val.parquet", *sorted((out / "suites").glob("*.parquet"))]:
        for rec in read_records(path):
            texts += [render_prompt(rec["question"], "tiny"), render_response(rec["solution"], "tiny")]
    return texts


# --- schema ---------------------------------------------------------------------------------


def test_render_prompt_templates() -> None:
    assert render_prompt("23+45-7", "tiny") == "Q: 23+45-7\nA:"
    assert render_prompt("1+1", "boxed") == (
        "1+1\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    assert render_response("1+1=2 \\boxed{2}", "tiny") == " 1+1=2 \\boxed{2}"
    with pytest.raises(ValueError, match="boxed.*tiny"):
        render_prompt("1+1", "chatml")


def _valid() -> dict:
    return make_record("s/train/0", "s", "train", "2+3", "5", "2+3=5 \\boxed{5}", {"n_ops": 1})


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r.pop("answer"), "answer"),
        (lambda r: r.update(extra=1), "extra"),
        (lambda r: r.update(id=""), "id"),
        (lambda r: r.update(source=3), "source"),
        (lambda r: r.update(question="  "), "question"),
        (lambda r: r.update(split=None), "split"),
        (lambda r: r.update(solution="2+3=5 \\boxed{6}"), "solution"),
        (lambda r: r.update(solution=5), "solution"),
        (lambda r: r.update(meta=[1]), "meta"),
        (lambda r: r.update(meta={"x": {1, 2}}), "meta"),
        (lambda r: r.update(meta={1: "a"}), "meta"),
    ],
)
def test_validate_record_names_bad_field(mutate, field: str) -> None:
    rec = _valid()
    validate_record(rec)
    mutate(rec)
    with pytest.raises(ValueError, match=field):
        validate_record(rec)


def test_make_record_fields_and_none_solution() -> None:
    rec = make_record("a", "b", "hard", "1+1", "2")
    assert tuple(rec) == FIELDS and rec["solution"] is None and rec["meta"] == {}
    with pytest.raises(ValueError, match="record must be a dict"):
        validate_record([rec])


# --- synthetic task --------------------------------------------------------------------------


def test_evaluator_uses_precedence() -> None:
    assert evaluate_question("5+3*2") == 11 and evaluate_question("(5+3)*2") == 16


@pytest.mark.parametrize("n_ops", [1, 2, 3, 4])
@pytest.mark.parametrize("digits", [1, 2])
def test_generated_problems_are_correct(n_ops: int, digits: int) -> None:
    rng = np.random.default_rng(n_ops * 10 + digits)
    for _ in range(300):
        check_problem(*generate_problem(rng, n_ops, digits), n_ops=n_ops, digits=digits, max_value=999)
    for _ in range(300):
        question, answer, solution = generate_problem(rng, n_ops, digits, max_value=30)
        check_problem(question, answer, solution, n_ops=n_ops, digits=digits, max_value=30)


def test_generate_split_is_deterministic_unique_and_valid() -> None:
    a = generate_split(3, 300, [1, 3], [1, 2], split="val")
    assert a == generate_split(3, 300, [1, 3], [1, 2], split="val")
    assert a != generate_split(4, 300, [1, 3], [1, 2], split="val")
    assert len({r["question"] for r in a}) == len({r["id"] for r in a}) == 300
    assert {r["meta"]["n_ops"] for r in a} == {1, 2, 3}
    for rec in a:
        check_record(rec)
        assert len(render_prompt(rec["question"], "tiny") + render_response(rec["solution"], "tiny")) < 64


def _brute_force(n_ops: int, digits: int, max_value: int) -> set[tuple]:
    """All admissible (operand, op, operand, ...) chains, enumerated without the generator."""
    top = 10**digits - 1
    chains = {(a,) for a in range(1, min(top, max_value) + 1)}
    values = {chain: chain[0] for chain in chains}
    for _ in range(n_ops):
        nxt = {}
        for chain, v in values.items():
            moves = [("+", b, v + b) for b in range(1, top + 1)]
            moves += [("-", b, v - b) for b in range(1, top + 1)]
            moves += [("*", k, v * k) for k in range(2, 10)]
            for op, operand, result in moves:
                if 0 <= result <= max_value:
                    nxt[chain + (op, operand)] = result
        values = nxt
    return set(values)


def _one_op_questions(digits: int, max_value: int) -> set[str]:
    return {f"{a}{op}{b}" for a, op, b in _brute_force(1, digits, max_value)}


@pytest.mark.parametrize(
    ("n_ops", "digits", "max_value"), [(1, 1, 999), (1, 2, 30), (2, 1, 30), (3, 1, 12), (2, 2, 40)]
)
def test_count_problems_matches_brute_force(n_ops: int, digits: int, max_value: int) -> None:
    assert count_problems(n_ops, digits, max_value=max_value) == len(_brute_force(n_ops, digits, max_value))


def test_space_can_be_exhausted_exactly() -> None:
    space = _one_op_questions(1, 999)
    assert len(space) == 198
    records = generate_split(0, 198, [1, 1], [1, 1])
    assert {r["question"] for r in records} == space
    with pytest.raises(ValueError, match="only 198 exist"):
        generate_split(0, 199, [1, 1], [1, 1])
    small = _one_op_questions(2, 30)
    assert {r["question"] for r in generate_split(1, len(small), [1, 1], [1, 2], max_value=30)} == small


def test_exclusion_respected_and_stall_reported() -> None:
    space = sorted(_one_op_questions(1, 999))
    excluded = set(random.Random(0).sample(space, 150))
    records = generate_split(1, 48, [1, 1], [1, 1], exclude=excluded)
    assert not {r["question"] for r in records} & excluded
    with pytest.raises(ValueError, match="draws in a row"):
        generate_split(1, 49, [1, 1], [1, 1], exclude=excluded)


def test_bad_knobs_rejected() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="must contain"):
        generate_problem(rng, 2, 1, ops=("+", "*"))
    with pytest.raises(ValueError, match="n_ops"):
        generate_problem(rng, 0, 1)
    with pytest.raises(ValueError, match="n_ops_range"):
        generate_split(0, 5, [3, 1], [1, 1])


# --- tokenizer -------------------------------------------------------------------------------


def test_tokenizer_roundtrip_and_reload(prepared: tuple[Path, dict], tmp_path: Path) -> None:
    out, report = prepared
    texts = _all_texts(out)
    tok = build_tokenizer(texts)
    assert len(tok) == report["tokenizer"]["vocab_size"] == tok.vocab_size < 64
    reloaded = AutoTokenizer.from_pretrained(out / "tokenizer")
    assert reloaded.get_vocab() == tok.get_vocab()
    ids = tok(texts)["input_ids"]
    assert ids == reloaded(texts)["input_ids"]
    for text, row in zip(texts, ids):
        assert row[0] == tok.bos_token_id and tok.unk_token_id not in row
        assert len(row) == 1 + len(text) - 6 * text.count("\\boxed{")  # one token per character
        assert reloaded.decode(row, skip_special_tokens=True) == text
    assert (reloaded.padding_side, reloaded.pad_token, reloaded.eos_token) == ("left", "<pad>", "<eos>")


def test_tokenizer_is_deterministic_and_exact() -> None:
    texts = ["Q: 1+2\nA:", " 1+2=3 \\boxed{3}", "Q: (40-3)*2\nA:"]
    tok = build_tokenizer(texts)
    assert tok.get_vocab() == build_tokenizer(list(reversed(texts))).get_vocab()
    assert tok.convert_tokens_to_ids(["<pad>", "<bos>", "<eos>", "<unk>"]) == [0, 1, 2, 3]
    assert tok.convert_ids_to_tokens(tok(" \\boxed{3}")["input_ids"]) == ["<bos>", " ", "\\boxed{", "3", "}"]
    tricky = "  Q:\n\n 1 +  2\nA:  "
    assert tok.decode(tok(tricky)["input_ids"], skip_special_tokens=True) == tricky
    assert tok("Q: 7")["input_ids"][-1] == tok.unk_token_id  # 7 never seen
    padded = tok(["Q:", "Q: 12"], padding=True)["input_ids"]
    assert padded[0][:3] == [tok.pad_token_id] * 3


# --- parquet I/O -----------------------------------------------------------------------------


def test_parquet_roundtrip(tmp_path: Path) -> None:
    records = generate_split(5, 50, [1, 2], [1, 2], split="easy")
    meta = {"year": 2024, "tags": ["a"]}
    records.append(make_record("x/1", "math", "aime", "What is $1+1$?", "2", None, meta))
    path = write_records(records, tmp_path / "sub" / "r.parquet")
    assert read_records(path) == records
    with pytest.raises(ValueError, match="duplicate"):
        write_records(records + records[:1], tmp_path / "dup.parquet")
    with pytest.raises(ValueError, match="answer"):
        write_records([{**records[0], "answer": ""}], tmp_path / "bad.parquet")


def test_read_validates(tmp_path: Path) -> None:
    row = {f: "x" for f in FIELDS} | {"meta": "{}", "solution": "no box"}
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="solution"):
        read_records(tmp_path / "bad.parquet")


# --- prepare ---------------------------------------------------------------------------------


def test_prepare_outputs_and_report(prepared: tuple[Path, dict]) -> None:
    out, report = prepared
    assert json.loads((out / "prep_report.json").read_text()) == report
    splits = {"train": read_records(out / "train.parquet"), "val": read_records(out / "val.parquet")}
    splits |= {s: read_records(out / "suites" / f"{s}.parquet") for s in SMALL_CFG["suites"]}
    expected = {"train": 500, "val": 40, "easy": 60, "medium": 40, "ood": 40}
    assert report["counts"] == {k: len(v) for k, v in splits.items()} == expected
    for name, records in splits.items():
        assert {r["split"] for r in records} == {name}
        n_lo, n_hi = (SMALL_CFG["suites"].get(name) or SMALL_CFG[name])["n_ops"]
        assert all(n_lo <= r["meta"]["n_ops"] <= n_hi for r in records)
        for rec in records:
            check_record(rec)
    questions = {name: {r["question"] for r in recs} for name, recs in splits.items()}
    names = list(questions)
    for i, a in enumerate(names):  # all pairwise disjoint, recomputed here
        for b in names[i + 1 :]:
            assert not questions[a] & questions[b], (a, b)
    assert report["overlap"]["train"] == {"easy": 0, "medium": 0, "ood": 0, "val": 0}
    assert report["overlap"]["val"] == {"easy": 0, "medium": 0, "ood": 0}
    tok = AutoTokenizer.from_pretrained(out / "tokenizer")
    prompts = [render_prompt(r["question"], "tiny") for r in splits["ood"]]
    assert report["splits"]["ood"]["max_prompt_tokens"] == max(len(tok(p)["input_ids"]) for p in prompts)
    # worst cases: n_ops=4 -> "((12+34)*5-67)*8" prompt 22+BOS, response 4 steps of 10 chars
    assert report["max_prompt_tokens"] <= 23 and report["max_response_tokens"] <= 51
    train = report["splits"]["train"]
    assert train["max_prompt_tokens"] + train["max_response_tokens"] <= 59 and train["max_chars"] < 64


def test_check_disjoint_detects_injected_overlap(prepared: tuple[Path, dict]) -> None:
    out, _ = prepared
    train = read_records(out / "train.parquet")
    easy = read_records(out / "suites" / "easy.parquet")
    assert check_disjoint(train, {"easy": easy}) == {"easy": 0}
    leaked = {**train[3], "question": " " + train[3]["question"].replace("+", " + ")}
    assert check_disjoint(train, {"easy": easy + [leaked], "val": []}) == {"easy": 1, "val": 0}


def test_prepare_is_deterministic(prepared: tuple[Path, dict], tmp_path: Path) -> None:
    out, report = prepared
    again = prepare_tiny(copy.deepcopy(SMALL_CFG), tmp_path)
    assert again == report
    for rel in report["files"].values():
        assert read_records(tmp_path / rel) == read_records(out / rel)
    tokenizer_json = Path("tokenizer") / "tokenizer.json"
    assert (tmp_path / tokenizer_json).read_text() == (out / tokenizer_json).read_text()


def test_prepare_config_errors(tmp_path: Path) -> None:
    infeasible = copy.deepcopy(SMALL_CFG)
    infeasible["suites"]["easy"]["n"] = 300
    with pytest.raises(ValueError, match="only 198 exist"):
        prepare_tiny(infeasible, tmp_path)
    missing = {k: v for k, v in SMALL_CFG.items() if k != "val"}
    with pytest.raises(ValueError, match="'val'"):
        prepare_tiny(missing, tmp_path)
    reserved = copy.deepcopy(SMALL_CFG)
    reserved["suites"]["train"] = reserved["suites"].pop("ood")
    with pytest.raises(ValueError, match="invalid suite name 'train'"):
        prepare_tiny(reserved, tmp_path)
    typo = copy.deepcopy(SMALL_CFG)
    typo["train"]["n_op"] = [1, 2]
    with pytest.raises(ValueError, match="n_op"):
        prepare_tiny(typo, tmp_path)


def test_shipped_config_is_feasible_and_graded() -> None:
    cfg = yaml.safe_load((REPO / "configs" / "data" / "tiny_arith.yaml").read_text())
    arith = {name: spec for name, spec in cfg["suites"].items() if spec.get("format", "arith") == "arith"}
    assert cfg["template"] == "tiny" and set(arith) == {"easy", "medium", "hard", "ood"}  # transfer suites:
    train_max_ops = cfg["train"]["n_ops"][1]  # test_tiny_transfer.py
    assert cfg["suites"]["ood"]["n_ops"][0] > train_max_ops  # ood really is out of distribution
    for name, spec in {**arith, "val": cfg["val"], "train": cfg["train"]}.items():
        lo, hi = spec["n_ops"]
        available = sum(count_problems(k, spec["digits"][1], **cfg["task"]) for k in range(lo, hi + 1))
        assert available >= 5 * spec["n"], name


def test_prepare_refuses_leaky_splits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import creditlab.data.prepare as prepare_module

    monkeypatch.setattr(prepare_module, "_questions", lambda splits: set())  # exclusion disabled
    with pytest.raises(RuntimeError, match="overlap.*train vs easy"):
        prepare_tiny(copy.deepcopy(SMALL_CFG), tmp_path)
