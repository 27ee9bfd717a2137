"""Paper-scale Hub data: loaders of SPEC.md's datasets, dedupe, contamination, verl parquet, prepare_hub.

All on the small fixture files of the real schemas under tests/fixtures/hub/ (written by
tests/fixtures/hub/make_math_fixtures.py).
"""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from creditlab.data.dedupe import (
    ContaminationIndex,
    Deduper,
    check_contamination,
    dedupe,
    ngrams,
    normalize_text,
    words,
)
from creditlab.data.hub_math import DAPO_PREFIX, DAPO_SUFFIX, iter_hub_rows, last_boxed_answer
from creditlab.data.hub_registry import HUB_DATASETS, find_files, get_dataset, load_dataset
from creditlab.data.io import read_records
from creditlab.data.prepare_hub import parse_config, prepare_hub
from creditlab.data.schema import render_prompt, validate_record
from creditlab.data.verl_format import (
    VERL_SCHEMA,
    read_verl_parquet,
    record_from_verl_row,
    verl_row,
    write_verl_parquet,
)
from creditlab.engines.verl import reward as verl_reward
from hub_fixtures import HUB, LAYOUT, fixture, fx, make_raw_dir

MATH_NAMES = [n for n, d in HUB_DATASETS.items() if d.kind == "math"]


# ---------------------------------------------------------------------------------------------- fixtures


def test_fixture_files_hold_the_generators_rows():
    for name, (rows, schema) in fx.FIXTURES.items():
        got = [row for _, row in iter_hub_rows(HUB / name)]
        assert got == rows, name
        if schema is not None:
            assert pq.read_schema(HUB / name).remove_metadata() == schema, name
        assert (HUB / name).stat().st_size < 8000


# ---------------------------------------------------------------------------------------------- registry


SPEC_TABLE = {  # SPEC.md "Data at paper scale": Hub id -> (registry name, split)
    "zwhe99/DeepMath-103K": ("deepmath", "train"),
    "BytedTsinghua-SIA/DAPO-Math-17k": ("dapo-math-17k", "train"),
    "DigitalLearningGmbH/MATH-lighteval": ("math", "train"),
    "HuggingFaceH4/MATH-500": ("math500", "test"),
    "HuggingFaceH4/aime_2024": ("aime24", "train"),
    "math-ai/aime25": ("aime25", "test"),
    "MathArena/aime_2025": ("aime25-matharena", "train"),
    "math-ai/amc23": ("amc23", "test"),
    "math-ai/minervamath": ("minerva", "test"),
    "math-ai/olympiadbench": ("olympiadbench", "test"),
    "MathArena/hmmt_feb_2025": ("hmmt-feb-2025", "train"),
    "MathArena/hmmt_feb_2026": ("hmmt-feb-2026", "train"),
    "MathArena/brumo_2025": ("brumo-2025", "train"),
    "Idavidrein/gpqa": ("gpqa-diamond", "train"),
    "TIGER-Lab/MMLU-Pro": ("mmlu-pro", "test"),
}


def test_registry_covers_the_spec_table():
    for hub_id, (name, split) in SPEC_TABLE.items():
        spec = get_dataset(name)
        assert (spec.hub_id, spec.hub_split, spec.name) == (hub_id, split, name)
    assert get_dataset("math-test").hub_split == "test"
    with pytest.raises(ValueError, match="unknown hub dataset 'aime2024'.*'aime24'"):
        get_dataset("aime2024")


# ---------------------------------------------------------------------------------------------- loaders

# name -> (question column, expected answers, expected ids)
MAPPING = {
    "deepmath": ("question", ["3", "\\dfrac{\\pi^2}{6}", "144", "3"], [f"deepmath/train/{i:06d}" for i in range(4)]),
    "math500": (
        "problem",
        ["\\left( 3, \\frac{\\pi}{2} \\right)", "13", "4\\frac{2}{3}"],
        ["math500/test/precalculus/807.json", "math500/test/algebra/1147.json", "math500/test/prealgebra/1024.json"],
    ),
    "aime24": ("problem", ["144", "61"], ["aime24/60", "aime24/61"]),
    "aime25": ("problem", ["70", "26"], ["aime25/0", "aime25/1"]),
    "aime25-matharena": ("problem", ["70", "26"], ["aime25-matharena/1", "aime25-matharena/2"]),
    "amc23": ("question", ["27", "13"], ["amc23/0", "amc23/1"]),  # float64 27.0 -> "27"
    "minerva": ("question", ["1.6", "1"], ["minerva/test/000000", "minerva/test/000001"]),
    "olympiadbench": ("question", ["\\frac{1}{2}", "1, 2"], ["olympiadbench/1606", "olympiadbench/1607"]),
    "hmmt-feb-2025": ("problem", ["\\frac{1}{576}", "2\\sqrt{3}"], ["hmmt-feb-2025/1", "hmmt-feb-2025/2"]),
    "hmmt-feb-2026": ("problem", ["103"], ["hmmt-feb-2026/1"]),
    "brumo-2025": ("problem", ["\\sqrt{2}", "x^2+1"], ["brumo-2025/1", "brumo-2025/2"]),
    "hmmt-nov-2025": ("problem", ["24", "385"], ["hmmt-nov-2025/1", "hmmt-nov-2025/2"]),
    "aime26": ("problem", ["120", "864"], ["aime26/1", "aime26/2"]),
    "math": ("problem", ["4", "\\frac{5}{8}", "3", "\\{-1, 1\\}"], [f"math/train/{i:06d}" for i in range(4)]),
    "math-test": ("problem", ["13", "56"], ["math-test/test/000000", "math-test/test/000001"]),
}


@pytest.mark.parametrize("name", sorted(MAPPING))
def test_loader_field_mapping_and_provenance(name):
    q_field, answers, ids = MAPPING[name]
    rows = [row for _, row in iter_hub_rows(fixture(name))]
    stats = {}
    records = load_dataset(name, fixture(name), stats=stats)
    assert stats == {"rows": len(rows), "skipped": 0}
    assert [r["answer"] for r in records] == answers
    assert [r["id"] for r in records] == ids
    spec = get_dataset(name)
    for i, (row, rec) in enumerate(zip(rows, records)):
        validate_record(rec)
        assert rec["question"] == row[q_field].strip() and rec["source"] == name and rec["solution"] is None
        assert rec["split"] == ("train" if spec.role == "train" else name)
        assert {k: rec["meta"][k] for k in ("hub_id", "hub_split", "file", "row")} == {
            "hub_id": spec.hub_id,
            "hub_split": spec.hub_split,
            "file": LAYOUT[name][0],
            "row": i,
        }
        json.dumps(rec["meta"])
    assert load_dataset(name, fixture(name), split="eval-x")[0]["split"] == "eval-x"


def test_loader_meta_keeps_the_useful_columns():
    deep = load_dataset("deepmath", fixture("deepmath"))[1]["meta"]
    assert deep["difficulty"] == 5.5 and deep["topic"].startswith("Mathematics -> Calculus")
    assert "r1_solution_1" not in deep  # the long R1 solutions are dropped
    assert load_dataset("math500", fixture("math500"))[0]["meta"]["subject"] == "Precalculus"
    assert load_dataset("aime25-matharena", fixture("aime25-matharena"))[1]["meta"]["problem_type"] == [
        "Geometry",
        "Combinatorics",
    ]
    ob = load_dataset("olympiadbench", fixture("olympiadbench"))[1]["meta"]
    assert ob["is_multiple_answer"] is True and ob["answer_type"] == "Numerical"
    assert load_dataset("math", fixture("math"))[0]["meta"]["level"] == "Level 1"


def test_dapo_chat_prompt_and_nested_ground_truth(tmp_path):
    rows = fx.DAPO
    records = load_dataset("dapo-math-17k", fixture("dapo-math-17k"))
    assert len(records) == len(rows) == 11  # every duplicated row is yielded; dedupe is separate
    for row, rec in zip(rows, records):
        content = row["prompt"][0]["content"]
        assert rec["question"] == content[len(DAPO_PREFIX) : -len(DAPO_SUFFIX)].strip()
        assert "Answer:" not in rec["question"] and rec["meta"]["dapo_wrapper"] is True
        assert rec["answer"] == row["reward_model"]["ground_truth"]
        assert rec["meta"]["index"] == row["extra_info"]["index"] and rec["meta"]["data_source"] == "math_dapo"
        assert rec["meta"]["reward_style"] == "rule-lighteval/MATH_v2"
    # a JSON-lines export of the same rows loads the same (apart from the file name)
    jl = tmp_path / "dapo.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = load_dataset("dapo-math-17k", jl)
    assert [(r["question"], r["answer"]) for r in again] == [(r["question"], r["answer"]) for r in records]
    # a prompt without DAPO's wrapper is kept whole; a system message is skipped
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " What is 1+1? "}]
    plain = dict(rows[0], prompt=chat)
    rec = load_dataset("dapo-math-17k", [plain])[0]
    assert rec["question"] == "What is 1+1?" and rec["meta"]["dapo_wrapper"] is False
    # a re-export that reworded the wrapper (slime's "Answer: \\boxed{$Answer}") still loses it
    reworded = (
        "Solve the following math problem step by step. The last line of your response should be of the "
        "form Answer: \\boxed{$Answer} where $Answer is the answer to the problem.\n\nCompute $2+2$.\n\n"
        'Remember to put your answer on its own line after "Answer:".'
    )
    rec = load_dataset("dapo-math-17k", [dict(rows[0], prompt=[{"role": "user", "content": reworded}])])[0]
    assert rec["question"] == "Compute $2+2$." and rec["meta"]["dapo_wrapper"] is True
    with pytest.raises(ValueError, match=r"<rows> row 0: missing field 'reward_model.ground_truth'"):
        load_dataset("dapo-math-17k", [dict(rows[0], reward_model={"style": "rule"})])
    with pytest.raises(ValueError, match=r"row 0: field 'prompt' has no message with role 'user'"):
        load_dataset("dapo-math-17k", [dict(rows[0], prompt=[{"role": "assistant", "content": "x"}])])


def test_math_answer_is_the_last_boxed_answer(tmp_path):
    assert last_boxed_answer("a $\\boxed{2}$ and $\\boxed{\\frac{1}{\\sqrt{2}}}$.") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed_answer("so $\\fbox{7}$") == "7"
    assert last_boxed_answer("$\\boxed{\\{-1, 1\\}}$") == "\\{-1, 1\\}"  # escaped braces are literal
    assert last_boxed_answer("no box here") is None and last_boxed_answer("\\boxed{1") is None
    unboxed = dict(fx.MATH_TRAIN[0], solution="The answer is 4.")
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist([fx.MATH_TRAIN[1], unboxed]), path)
    with pytest.raises(ValueError, match=r"math: .*train-00000-of-00001.parquet row 1: field 'solution' has no"):
        load_dataset("math", path)
    stats = {}
    kept = load_dataset("math", path, skip_unboxed=True, stats=stats)
    assert [r["answer"] for r in kept] == ["\\frac{5}{8}"] and stats == {"rows": 2, "skipped": 1}


def test_answer_types_and_schema_variants():
    amc = dict(fx.AMC23[0], answer=3.5)
    assert load_dataset("amc23", [amc])[0]["answer"] == "3.5"
    assert load_dataset("hmmt-feb-2025", [dict(fx.HMMT_FEB_2025[0], answer=7)])[0]["answer"] == "7"
    # SPEC's table names OlympiadBench's columns problem / answer: accepted too, $...$ removed
    ob = load_dataset("olympiadbench", [{"problem": "Compute $1+1$.", "answer": "$2$"}])[0]
    assert (ob["question"], ob["answer"], ob["id"]) == ("Compute $1+1$.", "2", "olympiadbench/test/000000")
    with pytest.raises(ValueError, match="field 'answer' must be a string or a number, got True"):
        load_dataset("aime24", [dict(fx.AIME24[0], answer=True)])
    with pytest.raises(ValueError, match="field 'final_answer' is an empty list"):
        load_dataset("olympiadbench", [dict(fx.OLYMPIADBENCH[0], final_answer=[])])


@pytest.mark.parametrize(
    "name, field",
    [
        ("deepmath", "final_answer"),
        ("deepmath", "question"),
        ("math500", "problem"),
        ("aime24", "answer"),
        ("aime25", "problem"),
        ("amc23", "question"),
        ("minerva", "answer"),
        ("hmmt-feb-2025", "problem"),
        ("brumo-2025", "answer"),
        ("math", "solution"),
        ("dapo-math-17k", "prompt"),
        ("dapo-math-17k", "reward_model"),
        ("olympiadbench", "final_answer"),
        ("math500", "unique_id"),
        ("aime25-matharena", "problem_idx"),
    ],
)
def test_missing_field_error_names_file_row_and_field(tmp_path, name, field):
    rows = [row for _, row in iter_hub_rows(fixture(name))]
    rows[1] = {k: v for k, v in rows[1].items() if k != field}
    path = tmp_path / f"broken_{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError) as err:
        load_dataset(name, path)
    msg = str(err.value)
    assert msg.startswith(f"{name}: {path} row 1:") and repr(field) in msg, msg


def test_empty_field_and_duplicate_ids_are_errors(tmp_path):
    with pytest.raises(ValueError, match=r"aime24: <rows> row 0: field 'problem' must be a non-empty string"):
        load_dataset("aime24", [dict(fx.AIME24[0], problem="   ")])
    with pytest.raises(ValueError, match="duplicate record id 'aime24/60'"):
        load_dataset("aime24", [fx.AIME24[0], fx.AIME24[0]])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(fx.AIME25[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl: line 2 is not JSON"):
        load_dataset("aime25", bad)


def test_find_files_in_the_hub_layout(tmp_path):
    raw = make_raw_dir(tmp_path)
    assert find_files("deepmath", raw) == [raw / "zwhe99/DeepMath-103K/data/train-00000-of-00010.parquet"]
    assert find_files("math-test", raw)[0].name == "test-00000-of-00001.parquet"
    assert find_files("gpqa-diamond", raw)[0].name == "gpqa_diamond.csv"
    # shards are read in order; parquet wins over a JSON-lines copy of the same split
    shard2 = raw / "zwhe99/DeepMath-103K/data/train-00001-of-00010.parquet"
    shutil.copy(fixture("deepmath"), shard2)
    (raw / "zwhe99/DeepMath-103K/train.jsonl").write_text("{}\n")
    files = find_files("deepmath", raw)
    assert [p.name for p in files] == ["train-00000-of-00010.parquet", "train-00001-of-00010.parquet"]
    records = load_dataset("deepmath", files)
    assert [r["id"] for r in records][-1] == "deepmath/train/000007"  # index runs over the shards
    assert records[-1]["meta"]["file"] == shard2.name and records[-1]["meta"]["row"] == 3
    assert find_files("aime24", raw, files=["HuggingFaceH4/aime_2024/data/train-00000-of-00001.parquet"])
    with pytest.raises(FileNotFoundError, match=r"minerva \(math-ai/minervamath, split test\): no file in"):
        find_files("minerva", tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="file\\(s\\) not found"):
        find_files("aime24", raw, files=["nope.parquet"])
    # the registry's GPQA entry reads the CSV the Hub ships
    gpqa = load_dataset("gpqa-diamond", find_files("gpqa-diamond", raw))
    from_jsonl = load_dataset("gpqa-diamond", HUB / "gpqa_diamond.jsonl")
    assert [r["answer"] for r in gpqa] == [r["answer"] for r in from_jsonl]


# ---------------------------------------------------------------------------------------------- dedupe


def test_normalize_text():
    assert normalize_text("Find  $X + 1$ .") == normalize_text("find x+1.") == "find x+1."
    assert normalize_text("\\left( 3, \\dfrac{\\pi}{2} \\right)") == normalize_text("(3,\\frac{\\pi}{2})")
    assert normalize_text("a\\,b \\quad c~d") == "a b c d"
    assert normalize_text("\\(x\\) and \\[y\\]") == "x and y"
    assert normalize_text("\\leftarrow") == "\\leftarrow"  # a command that merely starts with \left is kept
    assert normalize_text("ab cd") != normalize_text("abcd")  # word boundaries are kept
    assert words("$\\frac{1}{2}$ of x_1") == ["frac", "1", "2", "of", "x", "1"]
    assert ngrams("a b c", 2) == {"a b", "b c"} and ngrams("a b", 3) == set()


def test_dedupe_collapses_dapo_duplicates():
    records = load_dataset("dapo-math-17k", fixture("dapo-math-17k"))
    kept, report = dedupe(records)
    assert [r["id"] for r in kept] == [f"dapo-math-17k/train/{i:06d}" for i in (0, 1, 3, 6, 8)]  # first copies
    assert [r["answer"] for r in kept] == ["84", "7", "15", "117", "4"]
    assert {
        k: report[k]
        for k in (
            "n_in",
            "n_kept",
            "n_dropped",
            "exact_duplicates",
            "normalized_duplicates",
            "answer_conflicts",
            "max_copies",
        )
    } == {
        "n_in": 11,
        "n_kept": 5,
        "n_dropped": 6,
        "exact_duplicates": 5,
        "normalized_duplicates": 1,
        "answer_conflicts": 1,
        "max_copies": 4,
    }
    assert report["duplication_factor"] == 2.2
    assert {
        "kept": "dapo-math-17k/train/000003",
        "dropped": "dapo-math-17k/train/000007",
        "kind": "normalized",
    } in report["examples"]
    assert report["conflict_examples"] == [
        {
            "kept": "dapo-math-17k/train/000001",
            "dropped": "dapo-math-17k/train/000009",
            "kept_answer": "7",
            "dropped_answer": "8",
        }
    ]


def test_dedupe_streams_a_100x_duplicated_set():
    unique = load_dataset("dapo-math-17k", fixture("dapo-math-17k"))
    rows = [{**r, "id": f"{r['id']}#{k}"} for k in range(100) for r in unique]  # ~ the Hub's 100x
    deduper = Deduper()
    kept = [r for r in rows if deduper.add(r)]
    report = deduper.report()
    assert len(kept) == 5 and report["n_in"] == 1100 and report["max_copies"] == 400
    assert report["exact_duplicates"] + report["normalized_duplicates"] == 1095


# ---------------------------------------------------------------------------------------------- contamination


def _train():
    """DeepMath's 4 rows and DAPO's 5 distinct problems."""
    dapo = dedupe(load_dataset("dapo-math-17k", fixture("dapo-math-17k")))[0]
    return load_dataset("deepmath", fixture("deepmath")) + dapo


def _evals():
    return {name: load_dataset(name, fixture(name)) for name in ("aime24", "math500", "amc23")}


def test_contamination_exact_and_13gram(tmp_path):
    train = _train()
    path = tmp_path / "contamination.json"
    kept, report = check_contamination(train, _evals(), report_path=path)
    assert json.loads(path.read_text()) == report
    assert report["method"]["ngram"] == 13 and report["method"]["action"] == "drop"
    assert (report["n_train"], report["n_contaminated"], report["n_dropped"], report["n_kept"]) == (9, 2, 2, 7)
    assert "deepmath/train/000002" not in {r["id"] for r in kept} and "dapo-math-17k/train/000006" not in {
        r["id"] for r in kept
    }
    aime, math500, amc = (report["per_eval"][k] for k in ("aime24", "math500", "amc23"))
    counts = ("n_eval", "train_items", "by_exact", "by_ngram", "eval_items_hit")
    assert tuple(aime[k] for k in counts) == (2, 1, 1, 0, 1)
    assert aime["examples"][0]["train_id"] == "deepmath/train/000002"
    assert aime["examples"][0]["hits"][0] == {
        "eval": "aime24",
        "eval_id": "aime24/60",
        "kind": "exact",
        "shared_ngrams": 15,
    }  # 27 words
    assert (math500["train_items"], math500["by_exact"], math500["by_ngram"]) == (1, 0, 1)
    hit = math500["examples"][0]["hits"][0]
    assert hit["eval_id"] == "math500/test/algebra/1147.json" and hit["kind"] == "ngram" and hit["shared_ngrams"] == 8
    assert amc["train_items"] == 0 and amc["examples"] == []


def test_contamination_flag_mode_and_thresholds():
    train = _train()
    kept, report = check_contamination(train, _evals(), action="flag")
    assert len(kept) == 9 and report["n_dropped"] == 0 and report["n_contaminated"] == 2
    flagged = {r["id"]: r["meta"]["contaminated_with"] for r in kept if "contaminated_with" in r["meta"]}
    assert flagged == {"deepmath/train/000002": ["aime24"], "dapo-math-17k/train/000006": ["math500"]}
    # the shared span is the whole 20-word MATH-500 question: 8 shared 13-grams; at n = 20 still one,
    # at n = 21 none (only the exact AIME match is left), and none when 9 shared 13-grams are required
    assert check_contamination(train, _evals(), n=20)[1]["n_contaminated"] == 2
    assert check_contamination(train, _evals(), n=21)[1]["n_contaminated"] == 1
    assert check_contamination(train, _evals(), min_overlap=9)[1]["n_contaminated"] == 1
    assert ContaminationIndex(_evals()).hits("Nothing like any evaluation problem at all here.") == []
    with pytest.raises(ValueError, match="action"):
        check_contamination(train, _evals(), action="delete")


# ---------------------------------------------------------------------------------------------- verl


def test_verl_rows_have_verls_fields(tmp_path):
    records = load_dataset("math500", fixture("math500")) + load_dataset("gpqa-diamond", HUB / "gpqa_diamond.jsonl")
    path = write_verl_parquet(records, tmp_path / "v.parquet", template="boxed")
    assert pq.read_schema(path).remove_metadata() == VERL_SCHEMA
    rows = read_verl_parquet(path)
    for i, (rec, row) in enumerate(zip(records, rows)):
        assert row["data_source"] == rec["source"]
        assert row["prompt"] == [{"role": "user", "content": render_prompt(rec["question"], "boxed")}]
        assert row["ability"] == ("multiple_choice" if rec["source"] == "gpqa-diamond" else "math")
        assert row["reward_model"] == {"style": "rule", "ground_truth": rec["answer"]}
        assert row["extra_info"]["index"] == i and row["extra_info"]["split"] == rec["split"]
        assert json.loads(row["extra_info"]["meta"]) == rec["meta"]
        assert record_from_verl_row(row) == rec
    lcb = load_dataset("livecodebench", fixture("livecodebench"))
    assert {bool(r["meta"]["starter_code"].strip()) for r in lcb} == {True, False}  # functional and stdin problems
    for rec in lcb:  # code records: a fenced-program prompt (starter code or stdin format), round-tripped
        row = verl_row(rec, 0, "boxed")
        content = row["prompt"][0]["content"]
        assert row["ability"] == "code" and rec["question"] in content and "```python" in content
        assert (rec["meta"]["starter_code"] in content) and ("\\boxed" not in content)
        assert ("stdin" in content) == (not rec["meta"]["starter_code"].strip())
        assert record_from_verl_row(row) == rec
    with pytest.raises(ValueError, match="no creditlab reward for data_source 'gsm8k'"):
        verl_row(dict(records[0], source="gsm8k"), 0, "boxed")
    with pytest.raises(ValueError, match="duplicate record id"):
        write_verl_parquet([records[0], records[0]], tmp_path / "dup.parquet")


def _all_math_records():
    return [rec for name in MATH_NAMES for rec in load_dataset(name, fixture(name))]


def test_compute_score_routes_every_dataset_and_accepts_its_gold():
    records = _all_math_records()
    assert {r["source"] for r in records} == set(MATH_NAMES)
    for rec in records:
        assert verl_reward.data_source_kind(rec["source"]) == "math"
        extra = {"meta": json.dumps(rec["meta"])}
        response = f"So the answer is \\boxed{{{rec['answer']}}}."
        gold = verl_reward.compute_score(
            data_source=rec["source"], solution_str=response, ground_truth=rec["answer"], extra_info=extra
        )
        wrong = verl_reward.compute_score(
            data_source=rec["source"], solution_str="\\boxed{999983}", ground_truth=rec["answer"], extra_info=extra
        )
        assert (gold, wrong) == (1.0, 0.0), rec["id"]
    for name, path in (("gpqa-diamond", HUB / "gpqa_diamond.jsonl"), ("mmlu-pro", fixture("mmlu-pro"))):
        for rec in load_dataset(name, path):
            extra = {"meta": json.dumps(rec["meta"])}
            assert verl_reward.compute_score(name, f"Answer: {rec['answer']}", rec["answer"], extra) == 1.0


def test_verl_rlhf_dataset_reads_our_parquet(tmp_path, monkeypatch):
    """verl's own RLHFDataset loads the parquet on CPU with the tiny character tokenizer, filters by
    prompt length through the chat template, and its samples feed compute_score as the reward manager does."""
    import datasets
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from creditlab.data.tokenizer import build_tokenizer

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    records = [load_dataset(name, fixture(name))[0] for name in MATH_NAMES]
    path = write_verl_parquet(records, tmp_path / "train.parquet")
    prompts = [render_prompt(r["question"], "boxed") for r in records]
    tok = build_tokenizer([*prompts, "user: assistant:"])
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    cfg = {"cache_dir": str(tmp_path / "verl-cache"), "filter_overlong_prompts_workers": 1, "truncation": "error"}

    big = RLHFDataset([str(path)], tok, OmegaConf.create({**cfg, "max_prompt_length": 4096}))
    assert len(big) == len(records)
    batch = collate_fn([big[i] for i in range(len(big))])
    assert list(batch["data_source"]) == [r["source"] for r in records]
    assert list(batch["index"]) == list(range(len(records)))
    for i, rec in enumerate(records):
        sample = big[i]
        assert sample["raw_prompt"] == [{"role": "user", "content": prompts[i]}]
        assert sample["extra_info"]["id"] == rec["id"]
        score = verl_reward.compute_score(
            data_source=sample["data_source"],
            solution_str=f"\\boxed{{{rec['answer']}}}",
            ground_truth=sample["reward_model"]["ground_truth"],
            extra_info=sample["extra_info"],
        )
        assert score == 1.0, rec["id"]

    # the length filter runs the chat template over our prompt column
    lengths = sorted(
        len(
            tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)[
                "input_ids"
            ]
        )
        for p in prompts
    )
    cut = lengths[len(lengths) // 2]
    small = RLHFDataset([str(path)], tok, OmegaConf.create({**cfg, "max_prompt_length": cut}))
    assert len(small) == sum(n <= cut for n in lengths) < len(records)


# ---------------------------------------------------------------------------------------------- prepare_hub


CFG = {
    "name": "paper-fixture",
    "template": "boxed",
    "train": ["deepmath", {"dataset": "dapo-math-17k"}],
    "eval": [
        "aime24",
        "aime25",
        "math500",
        "amc23",
        "minerva",
        "olympiadbench",
        "hmmt-feb-2025",
        "brumo-2025",
        "gpqa-diamond",
        "livecodebench",
    ],
    "val": {"n": 1, "seed": 0},
}


def test_prepare_hub_end_to_end(tmp_path):
    raw = make_raw_dir(tmp_path)
    out = tmp_path / "out"
    report = prepare_hub(CFG, raw, out)
    assert json.loads((out / "prep_report.json").read_text()) == json.loads(json.dumps(report))
    assert json.loads((out / "contamination_report.json").read_text()) == report["contamination"]
    # 4 DeepMath + 11 DAPO rows -> 9 unique -> 2 contaminated dropped -> 7 -> 1 held out as val
    assert report["counts"]["train"] == 6 and report["counts"]["val"] == 1
    assert report["dedupe"]["train"]["n_in"] == 15 and report["dedupe"]["train"]["n_kept"] == 9
    assert report["contamination"]["n_dropped"] == 2
    assert report["contamination"]["per_eval"]["aime24"]["by_exact"] == 1
    assert report["contamination"]["per_eval"]["math500"]["by_ngram"] == 1
    assert report["sources"]["train"][1] == {
        "dataset": "dapo-math-17k",
        "hub_id": "BytedTsinghua-SIA/DAPO-Math-17k",
        "hub_split": "train",
        "files": ["BytedTsinghua-SIA/DAPO-Math-17k/data/dapo-math-17k.parquet"],
        "options": {},
        "sample": None,
        "rows": 11,
        "skipped": 0,
        "records": 5,
    }
    assert report["overlap"]["train"] == {s: 0 for s in CFG["eval"]}
    train = read_records(out / "train.parquet")
    val = read_records(out / "val.parquet")
    assert len(train) == 6 and len(val) == 1 and val[0]["split"] == "val"
    ids = {r["id"] for r in train + val}
    assert "deepmath/train/000002" not in ids and "dapo-math-17k/train/000006" not in ids
    for suite in CFG["eval"]:
        recs = read_records(out / "suites" / f"{suite}.parquet")
        assert recs and all(r["split"] == suite for r in recs)
    assert report["counts"]["minerva"] == 2 and report["counts"]["gpqa-diamond"] == 3
    # verl files for every suite, the code suite included
    assert "livecodebench" in report["verl_files"] and "verl_skipped" not in report
    lcb = read_verl_parquet(out / report["verl_files"]["livecodebench"])
    assert {r["ability"] for r in lcb} == {"code"} and all("```python" in r["prompt"][0]["content"] for r in lcb)
    verl_train = read_verl_parquet(out / report["verl_files"]["train"])
    assert [record_from_verl_row(r) for r in verl_train] == train
    aime = read_verl_parquet(out / "verl/suites/aime24.parquet")
    assert [r["reward_model"]["ground_truth"] for r in aime] == ["144", "61"]


def test_prepare_hub_flag_mode_options_and_limit(tmp_path):
    raw = make_raw_dir(tmp_path, ["deepmath", "dapo-math-17k", "math", "aime24", "math500"])
    cfg = {
        "name": "flagged",
        "train": [
            {"dataset": "deepmath", "files": ["zwhe99/DeepMath-103K/data/train-00000-of-00010.parquet"]},
            "dapo-math-17k",
            {"dataset": "math", "options": {"skip_unboxed": True}},
        ],
        "eval": {"aime-2024": "aime24", "math-500": {"dataset": "math500", "dir": "HuggingFaceH4/MATH-500"}},
        "contamination": {"action": "flag", "ngram": 13},
        "limit": 10,
    }
    report = prepare_hub(cfg, raw, tmp_path / "out")
    train = read_records(tmp_path / "out" / "train.parquet")
    assert len(train) == 10 and report["counts"]["train"] == 10  # 4 + 5 + 4 = 13 unique, cut to 10
    flagged = {r["id"]: r["meta"]["contaminated_with"] for r in train if "contaminated_with" in r["meta"]}
    assert flagged == {"deepmath/train/000002": ["aime-2024"], "dapo-math-17k/train/000006": ["math-500"]}
    assert report["overlap"]["train"]["aime-2024"] == 1  # allowed: flagged, not dropped
    assert set(report["files"]) == {"train", "aime-2024", "math-500"}
    assert read_records(tmp_path / "out" / "suites" / "math-500.parquet")[0]["split"] == "math-500"


def test_prepare_hub_config_errors(tmp_path):
    raw = make_raw_dir(tmp_path, ["deepmath", "aime24"])
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['evals'\]"):
        parse_config({**CFG, "evals": []})
    with pytest.raises(ValueError, match="unknown hub dataset 'aime2024'"):
        parse_config({"name": "x", "train": "deepmath", "eval": ["aime2024"]})
    with pytest.raises(ValueError, match="missing key 'train'"):
        parse_config({"name": "x"})
    with pytest.raises(ValueError, match="invalid suite name 'val'"):
        parse_config({"name": "x", "train": "deepmath", "eval": {"val": "aime24"}})
    with pytest.raises(ValueError, match="contamination.action"):
        parse_config({"name": "x", "train": "deepmath", "contamination": {"action": "remove"}})
    with pytest.raises(ValueError, match="unknown prompt template"):
        parse_config({"name": "x", "train": "deepmath", "template": "chatml"})
    with pytest.raises(FileNotFoundError, match="math-ai/minervamath"):
        prepare_hub({"name": "x", "train": "deepmath", "eval": ["minerva"]}, raw, tmp_path / "out")
    assert not (tmp_path / "out" / "prep_report.json").exists()
    cfg = parse_config({"name": "x", "train": "deepmath"})
    assert cfg["dedupe"] == {"train": True, "eval": False} and cfg["contamination"]["ngram"] == 13
