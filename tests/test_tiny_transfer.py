"""The tiny world's transfer formats (creditlab.data.transfer): the code task and multiple choice, their
records, their place in prepare (disjointness, warm-up extras, tokenizer), their verifiers, and their
wiring into the DelTA transfer table and the DFPO table."""

from __future__ import annotations

import ast
import copy
import json
import os
import re
import shutil
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
import yaml
from transformers import AutoTokenizer

from creditlab.data.io import read_records
from creditlab.data.prepare import WARMUP_EXTRA, prepare_tiny, warmup_records
from creditlab.data.schema import make_record, render_record_prompt, render_response, validate_record
from creditlab.data.transfer import (
    CHOICE_SOURCE,
    CODE_SOURCE,
    generate_choice_split,
    generate_code_split,
    problem_key,
)
from creditlab.rewards.code.cases import parse_tests
from creditlab.rewards.code.extract import extract_code
from creditlab.rewards.code.reward import code_exec_score
from creditlab.rewards.code.runner import run_tests
from creditlab.rewards.multiple_choice import LETTERS, multiple_choice_score
from creditlab.rewards.routing import data_source_kind, records_kind

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
CODE = {"n": 30, "at": [1, 9], "slope": [2, 9], "intercept": [1, 99], "tests": 3, "time_limit_s": 1.0}
CFG = {
    "name": "tiny_arith",
    "seed": 11,
    "template": "tiny",
    "task": {"ops": ["+", "-", "*"], "max_value": 999},
    "train": {"n": 400, "n_ops": [1, 2], "digits": [1, 2]},
    "val": {"n": 20, "n_ops": [1, 2], "digits": [1, 2]},
    "suites": {
        "easy": {"n": 20, "n_ops": [1, 1], "digits": [1, 2]},
        "code": {"format": "code", **CODE},
        "choice4": {"format": "choice", "n": 30, "n_ops": [1, 2], "digits": [1, 2], "options": 4},
        "choice10": {"format": "choice", "n": 30, "n_ops": [1, 2], "digits": [1, 2], "options": 10},
    },
    WARMUP_EXTRA: {
        "code": {"format": "code", **CODE, "n": 200},
        "choice": {"format": "choice", "n": 200, "n_ops": [1, 2], "digits": [1, 2], "options": [4, 10]},
    },
}
STEP = re.compile(r"^(\d+)([+\-*])(\d+)=(\d+)$")


def arith_value(expr: str) -> int:
    """``expr`` (+, -, * on integers) with ordinary precedence, via Python's AST (independent of the generator)."""
    ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__}

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        assert isinstance(node, ast.Constant) and type(node.value) is int, ast.dump(node)
        return node.value

    return ev(ast.parse(expr, mode="eval").body)


def options_of(rec: dict) -> dict[str, str]:
    """Letter -> option text of an MC record's question (its ``X) value`` lines)."""
    return dict(re.findall(r"(?m)^([A-Z])\) (.*)$", rec["question"]))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("transfer")
    return out, prepare_tiny(copy.deepcopy(CFG), out)


# --- generators -----------------------------------------------------------------------------------------------


def test_code_records_are_deterministic_and_their_gold_passes_the_verifier() -> None:
    recs = generate_code_split(5, 40, [1, 9], [2, 9], [1, 99], 3, 1.0, split="s")
    assert recs == generate_code_split(5, 40, [1, 9], [2, 9], [1, 99], 3, 1.0, split="s")
    assert recs != generate_code_split(6, 40, [1, 9], [2, 9], [1, 99], 3, 1.0, split="s")
    assert len({problem_key(r) for r in recs}) == 40
    for rec in recs:
        validate_record(rec)
        assert rec["source"] == CODE_SOURCE and data_source_kind(rec["source"]) == "code"
        m = rec["meta"]
        a, b, x0 = m["slope"], m["intercept"], m["at"]
        assert rec["question"] == f"code f: f({x0})={a * x0 + b} f({x0 + 1})={a * (x0 + 1) + b}"
        steps, _, code = rec["solution"].partition(" ```python\n")
        for step in steps.split(" "):  # the slope and intercept steps are right arithmetic
            left, op, right, result = STEP.match(step).groups()
            assert int(result) == {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}[op](int(left), int(right))
        assert steps.split(" ")[-1].endswith(f"={b}") and steps.split(" ")[0].endswith(f"={a}")
        tests, options = parse_tests(rec["answer"])
        assert options == {"time_limit_s": 1.0} and len(tests) == 3
        assert all(t.testtype == "functional" and t.func_name == "f" for t in tests)
        xs = [int(t.input) for t in tests]
        assert len(set(xs)) == 3 and not {x0, x0 + 1} & set(xs)  # held-out inputs only
        assert all(json.loads(t.output) == a * x + b for t, x in zip(tests, xs))
    for rec in recs[:4]:  # the gold program passes in the sandbox; a wrong intercept fails
        assert code_exec_score(render_response(rec["solution"], "tiny"), rec["answer"]) == 1.0
        wrong = rec["solution"].replace(f"+{rec['meta']['intercept']}\n", f"+{rec['meta']['intercept'] + 1}\n")
        own_tests, own_options = parse_tests(rec["answer"])
        verdict = run_tests(extract_code(wrong), own_tests, **own_options)
        assert verdict.status == "fail" and verdict.tests[0].verdict == "fail"


def test_choice_records_shuffle_options_and_the_gold_letter_is_the_value() -> None:
    recs = generate_choice_split(3, 60, [1, 3], [2, 2], [4, 10], split="s")
    assert recs == generate_choice_split(3, 60, [1, 3], [2, 2], [4, 10], split="s")
    assert {r["meta"]["n_options"] for r in recs} == {4, 10}
    letters = set()
    for rec in recs:
        validate_record(rec)
        assert rec["source"] == CHOICE_SOURCE and data_source_kind(rec["source"]) == "multiple_choice"
        opts = options_of(rec)
        k = rec["meta"]["n_options"]
        assert list(opts) == list(LETTERS[:k]) and len(set(opts.values())) == k
        expr = rec["question"].split("\n")[0]
        assert expr == rec["meta"]["problem"] and problem_key(rec) == expr
        assert opts[rec["answer"]] == str(arith_value(expr))  # the gold letter names the right value
        assert all(int(v) >= 0 for v in opts.values())
        assert rec["solution"].endswith("\\boxed{" + rec["answer"] + "}")
        assert rec["solution"].split(" ")[-2].endswith("=" + str(arith_value(expr)))  # the last step
        assert multiple_choice_score(render_response(rec["solution"], "tiny"), rec["answer"]) == 1.0
        other = next(x for x in opts if x != rec["answer"])
        assert multiple_choice_score(rec["solution"].replace(rec["answer"] + "}", other + "}"), rec["answer"]) == 0
        letters.add(rec["answer"])
    assert len(letters) >= 6  # shuffled: the answer is not always in one place


def test_knob_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="slope"):
        generate_code_split(0, 5, [1, 2], [1, 9], [1, 9], 3, 1.0)
    with pytest.raises(ValueError, match="only 16 exist"):
        generate_code_split(0, 17, [1, 1], [2, 3], [1, 8], 3, 1.0)
    with pytest.raises(ValueError, match="options"):
        generate_choice_split(0, 5, [1, 1], [1, 1], 12)


# --- schema and routing ---------------------------------------------------------------------------------------


def test_schema_of_code_and_choice_records() -> None:
    rec = generate_code_split(1, 1, [1, 9], [2, 9], [1, 99], 2, 1.0)[0]
    for bad_solution in ("f=lambda x:x \\boxed{1}", "```python\nf=lambda x:x\n", "```python\n\n```"):
        with pytest.raises(ValueError, match="closed fenced code block"):
            validate_record({**rec, "solution": bad_solution})
    with pytest.raises(ValueError, match="test spec"):
        validate_record({**rec, "answer": "42"})
    with pytest.raises(ValueError, match="test spec"):
        validate_record({**rec, "answer": json.dumps({"tests": []})})
    validate_record({**rec, "solution": None})  # a code record without an SFT target
    mc = generate_choice_split(1, 1, [1, 1], [1, 2], 4)[0]
    with pytest.raises(ValueError, match="solution"):
        make_record(mc["id"], mc["source"], "s", mc["question"], mc["answer"], mc["solution"][:-2] + "Z}", mc["meta"])
    assert records_kind([rec], "x") == "code" and records_kind([mc], "x") == "multiple_choice"


# --- prepare ------------------------------------------------------------------------------------------------


def test_prepare_keeps_transfer_formats_out_of_rl_and_disjoint(prepared: tuple[Path, dict]) -> None:
    out, report = prepared
    assert report["counts"] == {
        "train": 400,
        "val": 20,
        WARMUP_EXTRA: 400,
        "easy": 20,
        "code": 30,
        "choice4": 30,
        "choice10": 30,
    }
    train = read_records(out / "train.parquet")
    assert {r["source"] for r in train} == {"tiny_arith"}  # RL prompts: arithmetic only
    suites = {s: read_records(out / "suites" / f"{s}.parquet") for s in CFG["suites"]}
    assert {s: records_kind(r, s) for s, r in suites.items()} == {
        "easy": "math",
        "code": "code",
        "choice4": "multiple_choice",
        "choice10": "multiple_choice",
    }
    assert {r["meta"]["n_options"] for r in suites["choice4"]} == {4}
    assert {r["meta"]["n_options"] for r in suites["choice10"]} == {10}
    extra = read_records(out / f"{WARMUP_EXTRA}.parquet")
    assert {r["source"] for r in extra} == {CODE_SOURCE, CHOICE_SOURCE}
    assert warmup_records(out) == train + extra  # the SFT warm-up reads both
    # MC problems are arithmetic expressions: never a training or val question, nor in another split
    train_questions = {r["question"] for r in train + read_records(out / "val.parquet")}
    for name in ("choice4", "choice10"):
        assert not {r["meta"]["problem"] for r in suites[name]} & train_questions
    keys = {
        name: {problem_key(r) for r in recs}
        for name, recs in {**suites, "train": train, "extra": extra, "val": read_records(out / "val.parquet")}.items()
    }
    names = list(keys)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not keys[a] & keys[b], (a, b)
    assert all(v == 0 for row in report["overlap"].values() for v in row.values())
    assert set(report["overlap"][WARMUP_EXTRA]) == {*CFG["suites"], "val"}


def test_prepare_refuses_leaky_transfer_splits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import creditlab.data.prepare as prepare_module

    cfg = copy.deepcopy(CFG)  # a tiny code space that the extras must share with the suite without exclusion
    cfg["suites"] = {"code": {"format": "code", **CODE, "at": [1, 1], "slope": [2, 3], "intercept": [1, 4], "n": 4}}
    cfg[WARMUP_EXTRA] = {"code": {"format": "code", **CODE, "at": [1, 1], "slope": [2, 3], "intercept": [1, 4], "n": 8}}
    monkeypatch.setattr(prepare_module, "_questions", lambda splits: set())  # exclusion disabled
    with pytest.raises(RuntimeError, match="overlap"):
        prepare_tiny(cfg, tmp_path)


def test_tokenizer_covers_the_new_formats(prepared: tuple[Path, dict]) -> None:
    out, _ = prepared
    tok = AutoTokenizer.from_pretrained(out / "tokenizer")
    vocab = tok.get_vocab()
    for ch in "`pythonlambdxf=:()\n" + LETTERS[:10]:
        assert ch in vocab, ch
    for name in ("code", "choice10"):
        for rec in read_records(out / "suites" / f"{name}.parquet")[:5]:
            for text in (render_record_prompt(rec, "tiny"), render_response(rec["solution"], "tiny")):
                ids = tok(text, add_special_tokens=False)["input_ids"]
                assert tok.unk_token_id not in ids and tok.decode(ids) == text


def test_config_errors_of_the_formats(tmp_path: Path) -> None:
    bad = copy.deepcopy(CFG)
    bad["suites"]["code"]["n_ops"] = [1, 1]
    with pytest.raises(ValueError, match=r"suites.code: unknown key\(s\) \['n_ops'\]"):
        prepare_tiny(bad, tmp_path)
    bad = copy.deepcopy(CFG)
    bad["train"]["format"] = "code"
    with pytest.raises(ValueError, match=r"train.format: 'code' is not allowed here; valid: \['arith', 'rule'\]"):
        prepare_tiny(bad, tmp_path)
    bad = copy.deepcopy(CFG)
    bad[WARMUP_EXTRA]["more"] = {"n": 5, "n_ops": [1, 1], "digits": [1, 1]}
    with pytest.raises(ValueError, match="warmup_extra.more.format: 'arith' is not allowed"):
        prepare_tiny(bad, tmp_path)
    bad = copy.deepcopy(CFG)
    bad["suites"]["choice4"].pop("options")
    with pytest.raises(ValueError, match=r"missing key\(s\) \['options'\]"):
        prepare_tiny(bad, tmp_path)


def test_shipped_configs_have_the_transfer_suites() -> None:
    cfg = yaml.safe_load((REPO / "configs" / "data" / "tiny_arith.yaml").read_text())
    formats = {name: spec.get("format", "arith") for name, spec in cfg["suites"].items()}
    assert formats == {
        "easy": "arith",
        "medium": "arith",
        "hard": "arith",
        "ood": "arith",
        "code": "code",
        "choice4": "choice",
        "choice10": "choice",
    }
    assert cfg["suites"]["choice4"]["options"] == 4 and cfg["suites"]["choice10"]["options"] == 10
    micro = yaml.safe_load((REPO / "configs" / "scale" / "micro.yaml").read_text())["data"]
    assert set(micro["suites"]) == set(cfg["suites"]) and set(micro[WARMUP_EXTRA]) == set(cfg[WARMUP_EXTRA])
    mapped = (("delta", "GPQA-D"), ("delta", "MMLU-Pro"), ("delta", "CodeGen"), ("dfpo", "LiveCodeBench-v6"))
    for paper, bench in mapped:
        spec = yaml.safe_load((REPO / "configs" / "papers" / f"{paper}.yaml").read_text())["benchmarks"][bench]
        assert spec["tiny"] == spec["micro"] and spec["tiny"] in cfg["suites"], (paper, bench)


# --- evaluation and tables ------------------------------------------------------------------------------------


def test_evaluator_judges_each_transfer_suite_by_its_verifier(prepared: tuple[Path, dict], tmp_path: Path) -> None:
    """`creditlab evaluate`'s path with scripted responses: gold solutions score 1 on every suite, wrong ones 0."""
    from creditlab.jobs.evaluate import evaluate_suites
    from creditlab.lm.sampler import Generation, SamplingParams
    from creditlab.plan import compose

    out, _ = prepared
    tok = AutoTokenizer.from_pretrained(out / "tokenizer")
    suites = {s: read_records(out / "suites" / f"{s}.parquet")[:6] for s in ("code", "choice4", "choice10", "easy")}
    by_prompt = {tuple(tok(render_record_prompt(r, "tiny"))["input_ids"]): r for recs in suites.values() for r in recs}
    cfg = compose("micro", "micro-s")
    cfg["eval"] |= {"k": 2, "ks": [1, 2]}

    def wrong(rec: dict) -> str:
        if rec["source"] == CODE_SOURCE:
            return rec["solution"].replace("*x+", "*x+1+")
        if rec["source"] == CHOICE_SOURCE:
            return rec["solution"][:-2] + next(x for x in options_of(rec) if x != rec["answer"]) + "}"
        return rec["solution"].replace("\\boxed{", "\\boxed{1")

    def scripted(right: bool):
        def fn(prompt_ids, params, **loop):  # a GenerateFn: (prompt_ids, SamplingParams, *, batch_size, progress)
            assert isinstance(params, SamplingParams) and params.max_new_tokens == cfg["eval"]["max_new_tokens"]
            texts = [
                render_response((by_prompt[tuple(p)]["solution"] if right else wrong(by_prompt[tuple(p)])), "tiny")
                for p in prompt_ids
            ]
            responses = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
            return Generation([list(p) for p in prompt_ids], responses, [True] * len(responses)), {}

        return fn

    for right in (True, False):
        result = evaluate_suites(None, tok, suites, cfg, 0, tmp_path / str(right), True, scripted(right))
        for suite, res in result["suites"].items():
            assert res["metrics"]["greedy"]["mean"] == float(right), (suite, right)
            assert res["metrics"]["avg@2"]["mean"] == float(right), (suite, right)
        assert result["suites"]["code"]["reward"] == "code_exec"
        assert result["suites"]["choice10"]["reward"] == "multiple_choice"


def test_plan_refuses_a_table_suite_the_data_config_lacks(tmp_path: Path) -> None:
    from creditlab.plan import PlanError, build_plan

    configs = tmp_path / "configs"
    shutil.copytree(REPO / "configs", configs)
    dfpo = configs / "papers" / "dfpo.yaml"
    dfpo.write_text(
        dfpo.read_text().replace(
            "LiveCodeBench-v6: {tiny: code, micro: code,", "LiveCodeBench-v6: {tiny: code, micro: kode,"
        )
    )
    pipeline = {"scale": "micro", "papers": ["dfpo"], "seeds": [0]}
    with pytest.raises(PlanError, match=r"paper 'dfpo' table 'main' reads suite\(s\) \['kode'\] at scale 'micro'"):
        build_plan(pipeline, configs)
    plan = build_plan({**pipeline, "scale": "tiny"}, configs)  # the tiny mapping is fine
    assert plan.table_suites("dfpo", "main") == ["medium", "code", "hard"]
