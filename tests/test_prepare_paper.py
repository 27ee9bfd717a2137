"""`python -m creditlab --scale paper prepare` (creditlab.data.prepare_paper): the hub datasets of the paper-scale plan
-> verl train/val parquet per training set, the normalised suites, the contamination report, DATA_DONE last.

On the Hub fixture files (tests/fixtures/hub/) laid out as a raw_dir in the `huggingface-cli download --local-dir`
layout, HF_HUB_OFFLINE=1; the download itself is a patched `huggingface_hub.snapshot_download` (no network here).
The fixtures hold a few rows per dataset, so the tests relax the catalogue's `n` (and the hold-out's `val.n`, and
math-test-200's `sample.n`) explicitly, to the fixture counts below.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
from pathlib import Path

import pytest
import yaml

from creditlab import cli, paths
from creditlab.data import prepare_paper as pp
from creditlab.data.hub_registry import HUB_DATASETS, allow_patterns, download_command, get_dataset, lookup
from creditlab.data.io import read_records
from creditlab.data.prepare_hub import load_suites
from creditlab.data.verl_format import read_verl_parquet, record_from_verl_row
from creditlab.plan import CONFIG_DIR, build_plan
from hub_fixtures import LAYOUT, place

PAPERS = ["arca", "delta", "cancellation"]  # every training set (MATH, DeepMath, DAPO) and all 15 suites
PIPE = {"scale": "paper", "papers": PAPERS, "seeds": [0], "results": "results"}

# hf_id (config, split) of our configs -> registry name (configs/data/*.yaml train, configs/suites/paper.yaml)
MAPPING = {
    "dapo_math_17k": "dapo-math-17k",
    "deepmath_103k": "deepmath",
    "math_lighteval": "math",
    "aime24": "aime24",
    "aime25": "aime25",
    "aime26": "aime26",
    "amc23": "amc23",
    "hmmt25-feb": "hmmt-feb-2025",
    "hmmt25-nov": "hmmt-nov-2025",
    "hmmt26-feb": "hmmt-feb-2026",
    "brumo25": "brumo-2025",
    "math500": "math500",
    "minerva-math": "minerva",
    "olympiadbench": "olympiadbench",
    "math-test-200": "math-test",
    "gpqa-diamond": "gpqa-diamond",
    "mmlu-pro": "mmlu-pro",
    "livecodebench-v6": "livecodebench",
}
# questions per suite in the fixtures (math-test-200: 1 of MATH test's 2 fixture rows, drawn with seed 1337)
FIXTURE_N = {
    "aime24": 2,
    "aime25": 2,
    "aime26": 2,
    "amc23": 2,
    "hmmt25-feb": 2,
    "hmmt25-nov": 2,
    "hmmt26-feb": 1,
    "brumo25": 2,
    "math500": 3,
    "minerva-math": 2,
    "olympiadbench": 2,
    "math-test-200": 1,
    "gpqa-diamond": 3,
    "mmlu-pro": 3,
    "livecodebench-v6": 2,
}


@pytest.fixture(scope="module")
def real_inputs():
    """What the paper-scale plan of PAPERS needs, from the real configs."""
    return pp.plan_inputs(build_plan(PIPE, validate=False))


def fixture_inputs(inputs: pp.PaperData) -> pp.PaperData:
    """``inputs`` with the counts the fixtures can meet, set explicitly: every suite's `n` to its fixture count,
    math-test-200's sample to 1 question, every training set's val hold-out to 1 question."""
    out = copy.deepcopy(inputs)
    for suite, entry in out.catalogue.items():
        entry["n"] = FIXTURE_N[suite]
    out.catalogue["math-test-200"]["sample"] = {"n": 1, "seed": 1337}
    for data in out.datasets.values():
        data["val"]["n"] = 1
    return out


def raw_for(root: Path, inputs: pp.PaperData, skip=()) -> Path:
    """A raw_dir with the fixture of every dataset ``inputs`` needs (but ``skip``)."""
    raw = root / "raw"
    for need in pp.needs(inputs):
        if need.dataset not in skip:
            place(raw, need.dataset)
    return raw


def _prepare(tmp_path, monkeypatch, inputs, *extra):
    """`python -m creditlab --scale paper prepare` with the plan's inputs replaced by ``inputs``."""
    seen = []

    def fake_plan_inputs(plan, config_dir=None):
        seen.append(sorted(plan.papers))
        return inputs

    monkeypatch.setattr(pp, "plan_inputs", fake_plan_inputs)
    cli.main(
        ["--results", str(tmp_path / "results"), "--scale", "paper", "--papers", ",".join(PAPERS), "prepare", *extra]
    )
    assert seen == [sorted(PAPERS)]


# ------------------------------------------------------------------------------------------------ configs


def test_the_paper_plan_needs_every_training_set_and_suite(real_inputs):
    catalogue = yaml.safe_load((CONFIG_DIR / "suites" / "paper.yaml").read_text())
    assert sorted(real_inputs.datasets) == ["dapo_math_17k", "deepmath_103k", "math_lighteval"]
    assert real_inputs.suites == list(catalogue) and real_inputs.catalogue == catalogue
    # DeepMath: 23 DelTA-paper runs + delta-global-stats (paper scale only)
    assert len(real_inputs.runs["math_lighteval"]) == 7 and len(real_inputs.runs["deepmath_103k"]) == 24
    # each config's hf_id (+ config, split) -> its loader
    got = {name: pp.hub_config(d)["train"][0]["dataset"] for name, d in real_inputs.datasets.items()}
    got |= {s: pp.suite_entry(s, catalogue[s])["dataset"] for s in catalogue}
    assert got == MAPPING
    assert pp.suite_entry("math-test-200", catalogue["math-test-200"]) == {
        "dataset": "math-test",
        "sample": {"n": 200, "seed": 1337},
    }
    dapo = pp.hub_config(real_inputs.datasets["dapo_math_17k"])
    assert dapo["dedupe"] == {"train": True, "eval": False}  # SPEC: DAPO-Math-17k rows are ~100x duplicated
    assert dapo["contamination"]["action"] == "drop" and dapo["val"] == {"n": 256, "seed": 1234}
    assert pp.hub_config(real_inputs.datasets["deepmath_103k"])["dedupe"]["train"] is False


def test_registry_lookup_and_download_patterns():
    assert lookup("DigitalLearningGmbH/MATH-lighteval", "default", "test").name == "math-test"
    assert lookup("DigitalLearningGmbH/MATH-lighteval", None, "train").name == "math"
    assert lookup("Idavidrein/gpqa", "gpqa_diamond", "train").name == "gpqa-diamond"
    with pytest.raises(
        ValueError,
        match=r"no hub loader for Idavidrein/gpqa config gpqa_main split train; .*"
        r"Idavidrein/gpqa config gpqa_diamond split train -> gpqa-diamond",
    ):
        lookup("Idavidrein/gpqa", "gpqa_main", "train")
    with pytest.raises(
        pp.PaperDataError,
        match=r"configs/suites/paper.yaml x: no hub loader for math-ai/aime25 "
        r"config default split train",
    ):
        pp.suite_entry("x", {"hf_id": "math-ai/aime25", "config": None, "split": "train"})
    with pytest.raises(pp.PaperDataError, match="kind 'math', but its loader 'gpqa-diamond' reads 'multiple_choice'"):
        pp.suite_entry("x", {"hf_id": "Idavidrein/gpqa", "config": "gpqa_diamond", "split": "train", "kind": "math"})
    # the Hub filters allow_patterns with fnmatch: each fixture's path in its repository is selected
    from huggingface_hub.utils import filter_repo_objects

    for name, (_, rel) in {**LAYOUT, "gpqa-diamond": (None, "gpqa_diamond.csv")}.items():
        assert list(filter_repo_objects([rel], allow_patterns=allow_patterns(name))) == [rel], name
    assert "test.jsonl" in allow_patterns("math500")  # top-level file: `**/test.jsonl` alone would not match
    assert list(
        filter_repo_objects(
            ["algebra/test-00000-of-00001.parquet", "data/train-00000-of-00001.parquet"],
            allow_patterns=allow_patterns("math-test"),
        )
    ) == ["algebra/test-00000-of-00001.parquet"]  # [ours: harmless] MATH-lighteval's per-subject copies match too
    assert download_command("math-ai/aime25", "/r/math-ai/aime25", ["test.jsonl", "**/test.jsonl"]) == (
        "huggingface-cli download math-ai/aime25 --repo-type dataset --local-dir /r/math-ai/aime25 "
        "--include test.jsonl '**/test.jsonl'"
    )


def test_sample_option_of_prepare_hub(tmp_path):
    raw = tmp_path / "raw"
    place(raw, "math-test")
    entry = {"dataset": "math-test", "sample": {"n": 1, "seed": 1337}}
    loaded = load_suites({"math-test-200": entry}, raw)
    order = [0, 1]
    random.Random(1337).shuffle(order)
    everything = load_suites({"all": "math-test"}, raw).records["all"]
    assert [r["id"] for r in loaded.records["math-test-200"]] == [everything[order[0]]["id"]]
    assert loaded.records["math-test-200"][0]["split"] == "math-test-200"
    assert loaded.sources["math-test-200"]["sample"] == {"n": 1, "seed": 1337}
    assert loaded.sources["math-test-200"]["rows"] == 2 and loaded.sources["math-test-200"]["records"] == 1
    two = load_suites({"s": {"dataset": "math-test", "sample": {"n": 2, "seed": 5}}}, raw).records["s"]
    assert [r["id"] for r in two] == [r["id"] for r in everything]  # kept in file order
    with pytest.raises(ValueError, match=r"eval.s \(math-test\): sample.n=3 but only 2 records were loaded"):
        load_suites({"s": {"dataset": "math-test", "sample": {"n": 3, "seed": 0}}}, raw)
    with pytest.raises(ValueError, match=r"eval.s.sample: expected \{n: <int>, seed: <int>\}"):
        load_suites({"s": {"dataset": "math-test", "sample": {"count": 3}}}, raw)


# ------------------------------------------------------------------------------------------------ prepare


def test_paper_prepare_end_to_end(tmp_path, monkeypatch, real_inputs):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    inputs = fixture_inputs(real_inputs)
    raw = raw_for(tmp_path, inputs)
    monkeypatch.setenv(pp.RAW_ENV, str(raw))
    fill = dict(results=tmp_path / "results", scale="paper")
    done = paths.fmt(paths.DATA_DONE, **fill)

    _prepare(tmp_path, monkeypatch, inputs)
    report = json.loads(done.read_text())
    data_dir = done.parent
    outputs = [p for p in data_dir.rglob("*") if p.is_file() and p != done]
    assert max(p.stat().st_mtime_ns for p in outputs) <= done.stat().st_mtime_ns  # DONE written last
    assert {h: r["status"] for h, r in report["downloads"].items()} == dict.fromkeys(
        {get_dataset(n).hub_id for n in MAPPING.values()}, "present"
    )
    assert report["raw_dir"] == str(raw) and report["offline"] is True

    # the suites, where the evaluation reads them, with their counts
    for suite, n in FIXTURE_N.items():
        records = read_records(paths.fmt(paths.SUITE, suite=suite, **fill))
        assert len(records) == n == report["suites"][suite]["count"], suite
        assert {r["split"] for r in records} == {suite} and {r["source"] for r in records} == {MAPPING[suite]}
    assert sorted(p.stem for p in (data_dir / "suites").glob("*.parquet")) == sorted(FIXTURE_N)

    # each training set: verl train/val where the launcher reads them (paths.VERL_TRAIN / VERL_VAL)
    expected = {"dapo_math_17k": (3, 1), "deepmath_103k": (2, 1), "math_lighteval": (3, 1)}
    planted = {
        "dapo_math_17k": ("dapo-math-17k/train/000006", "math500", "by_ngram"),
        "deepmath_103k": ("deepmath/train/000002", "aime24", "by_exact"),
    }
    contamination = json.loads(paths.fmt(paths.CONTAMINATION, **fill).read_text())
    assert sorted(contamination) == sorted(expected)
    for name, (n_train, n_val) in expected.items():
        train = read_verl_parquet(paths.fmt(paths.VERL_TRAIN, dataset=name, **fill))
        val = read_verl_parquet(paths.fmt(paths.VERL_VAL, dataset=name, **fill))
        assert (len(train), len(val)) == (n_train, n_val) and report["training_sets"][name]["counts"] == {
            "train": n_train,
            "val": n_val,
        }
        assert {r["data_source"] for r in train + val} == {MAPPING[name]}
        records = [record_from_verl_row(r) for r in train + val]
        assert records == read_records(
            paths.fmt(paths.TRAIN_SET_DIR, dataset=name, **fill) / "train.parquet"
        ) + read_records(paths.fmt(paths.TRAIN_SET_DIR, dataset=name, **fill) / "val.parquet")
        c = contamination[name]
        assert sorted(c["per_eval"]) == sorted(FIXTURE_N) and c["method"]["action"] == "drop"
        if name in planted:  # the planted contaminated item is dropped
            item, suite, how = planted[name]
            assert item not in {r["id"] for r in records}
            assert c["per_eval"][suite][how] == 1 and report["training_sets"][name]["contaminated_by_suite"][suite] == 1
    dedupe = report["training_sets"]["dapo_math_17k"]["dedupe"]
    assert dedupe == {"applied": True, "n_in": 11, "n_kept": 5, "n_dropped": 6}  # SPEC: DAPO's duplicates
    assert report["training_sets"]["deepmath_103k"]["dedupe"]["applied"] is False

    # the real catalogue's counts (aime24: 30 ...) are not the fixtures': a clear error, and the failed job leaves
    # no DONE (the previous one is removed first)
    real_n = copy.deepcopy(inputs)
    real_n.catalogue["aime24"]["n"] = 30
    with pytest.raises(
        SystemExit,
        match=r"suite aime24 \(aime24\): 2 questions after the loader's filters, but "
        r"configs/suites/paper.yaml aime24 says n: 30",
    ):
        _prepare(tmp_path, monkeypatch, real_n)
    assert not done.exists()

    # verl's own RLHFDataset reads the train files (as in tests/test_hub_data.py)
    verl = pytest.importorskip("verl")  # noqa: F841
    import datasets
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from creditlab.data.tokenizer import build_tokenizer

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    files = [str(paths.fmt(paths.VERL_TRAIN, dataset=name, **fill)) for name in expected]
    rows = [r for f in files for r in read_verl_parquet(f)]
    tok = build_tokenizer([r["prompt"][0]["content"] for r in rows] + ["user: assistant:"])
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    ds = RLHFDataset(
        files,
        tok,
        OmegaConf.create(
            {
                "cache_dir": str(tmp_path / "verl-cache"),
                "max_prompt_length": 4096,
                "filter_overlong_prompts_workers": 1,
                "truncation": "error",
            }
        ),
    )
    assert len(ds) == len(rows) and [ds[i]["extra_info"]["id"] for i in range(len(ds))] == [
        r["extra_info"]["id"] for r in rows
    ]


def test_offline_and_a_missing_dataset_names_it_and_the_download_command(tmp_path, monkeypatch, real_inputs):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    inputs = fixture_inputs(real_inputs)
    raw = raw_for(tmp_path, inputs, skip={"aime26", "math-test"})
    monkeypatch.setenv(pp.RAW_ENV, str(raw))
    # an unfinished download (its marker says so) counts as missing although a file is there
    place(raw, "math-test")
    (raw / "DigitalLearningGmbH/MATH-lighteval" / pp.MARKER).write_text(
        json.dumps({"repo_id": "DigitalLearningGmbH/MATH-lighteval", "complete": False, "started": "then"})
    )
    with pytest.raises(SystemExit) as err:
        _prepare(tmp_path, monkeypatch, inputs)
    msg = str(err.value)
    assert "HF_HUB_OFFLINE=1 and 2 hub dataset(s) are missing from" in msg
    assert (
        f"- MathArena/aime_2026 (aime26; for suite aime26): aime26 (MathArena/aime_2026, split train): no file in {raw}"
    ) in msg
    assert (
        f"huggingface-cli download MathArena/aime_2026 --repo-type dataset --local-dir {raw}/MathArena/aime_2026 "
        f"--include 'data/train-*.parquet' '**/train-*.parquet' 'train-*.parquet' '**/train.jsonl' "
        f"train.jsonl"
    ) in msg
    assert (
        "- DigitalLearningGmbH/MATH-lighteval (math, math-test; for training set math_lighteval, suite "
        "math-test-200): an unfinished download" in msg
    )
    assert f"--local-dir {raw}/DigitalLearningGmbH/MATH-lighteval --include 'data/train-*.parquet'" in msg
    assert not paths.fmt(paths.DATA_DONE, results=tmp_path / "results", scale="paper").exists()


def test_download_calls_snapshot_download(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []
    by_hub_id = {get_dataset(n).hub_id: n for n in ("math", "aime24")}

    def fake_snapshot_download(**kwargs):
        calls.append(kwargs)
        local = Path(kwargs["local_dir"])
        for name, ds in HUB_DATASETS.items():  # "download": the repository's fixture files
            if ds.hub_id == kwargs["repo_id"] and name in LAYOUT:
                place(local.parents[len(Path(ds.hub_id).parts) - 1], name)
        return str(local)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    raw = tmp_path / "raw"
    wanted = [
        pp.Need("math", ("training set math_lighteval",)),
        pp.Need("math-test", ("suite math-test-200",)),
        pp.Need("aime24", ("suite aime24",)),
    ]
    report = pp.fetch(wanted, raw)
    patterns = {
        h: list(dict.fromkeys(p for n in wanted if n.hub_id == h for p in allow_patterns(n.dataset))) for h in by_hub_id
    }
    assert calls == [
        {"repo_id": h, "repo_type": "dataset", "local_dir": str(raw / h), "allow_patterns": patterns[h]}
        for h in by_hub_id
    ]
    assert "data/train-*.parquet" in calls[0]["allow_patterns"] and "data/test-*.parquet" in calls[0]["allow_patterns"]
    assert {h: r["status"] for h, r in report.items()} == dict.fromkeys(by_hub_id, "downloaded")
    marker = json.loads((raw / "HuggingFaceH4/aime_2024" / pp.MARKER).read_text())
    assert marker["complete"] is True and marker["repo_id"] == "HuggingFaceH4/aime_2024"
    # present now: no second download, online or not
    assert {h: r["status"] for h, r in pp.fetch(wanted, raw).items()} == dict.fromkeys(by_hub_id, "present")
    assert len(calls) == 2

    # a failed download: the error says what to do; the marker stays unfinished, so the files are not trusted
    def failing(**kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing)
    shutil.rmtree(raw / "HuggingFaceH4/aime_2024")
    with pytest.raises(
        pp.PaperDataError,
        match=r"downloading HuggingFaceH4/aime_2024 failed \(OSError: Network is "
        r"unreachable\).*huggingface-cli download HuggingFaceH4/aime_2024",
    ):
        pp.fetch(wanted, raw)
    place(raw, "aime24")  # a partial copy next to the unfinished marker
    with pytest.raises(pp.MissingHubData, match="an unfinished download of HuggingFaceH4/aime_2024"):
        pp.fetch(wanted, raw, offline=True)


def test_download_only_fetches_every_needed_repository_and_prepares_nothing(tmp_path, monkeypatch, real_inputs, capsys):
    import huggingface_hub

    calls = []

    def fake_snapshot_download(repo_id, repo_type, local_dir, allow_patterns):
        calls.append((repo_id, repo_type, local_dir))
        for name, ds in HUB_DATASETS.items():
            if ds.hub_id == repo_id and (name in LAYOUT or name == "gpqa-diamond"):
                place(raw, name)
        return local_dir

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    raw = tmp_path / "hub"
    monkeypatch.setenv(pp.RAW_ENV, str(raw))
    _prepare(tmp_path, monkeypatch, fixture_inputs(real_inputs), "--download-only")
    hub_ids = sorted({get_dataset(n).hub_id for n in MAPPING.values()})
    assert sorted(calls) == [(h, "dataset", str(raw / h)) for h in hub_ids]  # one per repository (MATH: train + test)
    assert json.loads(capsys.readouterr().out)["downloads"] == dict.fromkeys(hub_ids, "downloaded")
    assert not (tmp_path / "results").exists()
    _prepare(tmp_path, monkeypatch, fixture_inputs(real_inputs), "--download-only")
    assert len(calls) == len(hub_ids)  # all present now
    assert json.loads(capsys.readouterr().out)["downloads"] == dict.fromkeys(hub_ids, "present")


def test_raw_dir_default_and_env(tmp_path, monkeypatch):
    monkeypatch.delenv(pp.RAW_ENV, raising=False)
    assert pp.raw_dir("res") == Path("res/paper/raw")
    monkeypatch.setenv(pp.RAW_ENV, str(tmp_path))
    assert pp.raw_dir("res") == tmp_path
