"""The Hub fixture files (tests/fixtures/hub/, written by make_math_fixtures.py) laid out as a raw_dir in the
``huggingface-cli download --local-dir`` layout: shared by tests/test_hub_data.py and tests/test_prepare_paper.py."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from creditlab.data.hub_registry import get_dataset

HUB = Path(__file__).parent / "fixtures" / "hub"
_spec = importlib.util.spec_from_file_location("make_math_fixtures", HUB / "make_math_fixtures.py")
fx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fx)

# registry name -> (fixture file, path inside the Hub repository as `huggingface-cli download` lays it out)
LAYOUT = {
    "deepmath": ("deepmath_103k.parquet", "data/train-00000-of-00010.parquet"),
    "dapo-math-17k": ("dapo_math_17k.parquet", "data/dapo-math-17k.parquet"),
    "math": ("math_lighteval_train.parquet", "data/train-00000-of-00001.parquet"),
    "math-test": ("math_lighteval_test.parquet", "data/test-00000-of-00001.parquet"),
    "math500": ("math500.jsonl", "test.jsonl"),
    "aime24": ("aime_2024.parquet", "data/train-00000-of-00001.parquet"),
    "aime25": ("aime25.jsonl", "test.jsonl"),
    "aime25-matharena": ("matharena_aime_2025.parquet", "data/train-00000-of-00001.parquet"),
    "amc23": ("amc23.jsonl", "test.jsonl"),
    "minerva": ("minervamath.jsonl", "test.jsonl"),
    "olympiadbench": ("olympiadbench.jsonl", "test.jsonl"),
    "hmmt-feb-2025": ("hmmt_feb_2025.parquet", "data/train-00000-of-00001.parquet"),
    "hmmt-feb-2026": ("hmmt_feb_2026.parquet", "data/train-00000-of-00001.parquet"),
    "hmmt-nov-2025": ("hmmt_nov_2025.parquet", "data/train-00000-of-00001.parquet"),
    "aime26": ("aime_2026.parquet", "data/train-00000-of-00001.parquet"),
    "brumo-2025": ("brumo_2025.parquet", "data/train-00000-of-00001.parquet"),
    "mmlu-pro": ("mmlu_pro.jsonl", "test.jsonl"),
    "livecodebench": ("livecodebench.jsonl", "test.jsonl"),
}
GPQA_REL = "gpqa_diamond.csv"
"""GPQA-Diamond's file in its Hub repository (the CSV the Hub ships; our fixture is JSON lines)."""


def fixture(name: str) -> Path:
    return HUB / LAYOUT[name][0]


def place(raw: Path, name: str) -> Path:
    """Put dataset ``name``'s fixture into ``raw`` at its Hub path; the file written."""
    if name == "gpqa-diamond":
        dst = raw / get_dataset(name).hub_id / GPQA_REL
        dst.parent.mkdir(parents=True, exist_ok=True)
        rows = [json.loads(line) for line in (HUB / "gpqa_diamond.jsonl").read_text().splitlines()]
        pacsv.write_csv(pa.Table.from_pylist(rows), dst)
        return dst
    src, rel = LAYOUT[name]
    dst = raw / get_dataset(name).hub_id / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(HUB / src, dst)
    return dst


def make_raw_dir(root: Path, names=None) -> Path:
    """A raw_dir ``root/raw`` in the Hub download layout holding ``names`` (default: every fixture), GPQA always."""
    raw = root / "raw"
    for name in names or LAYOUT:
        place(raw, name)
    place(raw, "gpqa-diamond")
    return raw
