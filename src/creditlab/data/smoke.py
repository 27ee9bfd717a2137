"""Hub-format data of scale ``smoke``: the hub fixture files (``tests/fixtures/hub``) laid out as a raw_dir.

The fixtures are a few real-schema rows of every dataset the paper-scale plan reads (written by
``tests/fixtures/hub/make_math_fixtures.py``), in the layout ``huggingface-cli download --local-dir`` gives, so that
``creditlab.data.prepare_paper`` prepares them exactly as it prepares the real downloads. Their counts are not the
catalogue's: :func:`smoke_inputs` unsets the catalogue counts and holds out one validation question per training set.
The fixtures live in the source checkout (an editable install), not in the wheel.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

from creditlab.data.hub_registry import get_dataset

HUB = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "hub"
"""The hub fixture files of the source checkout."""
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
"""registry name -> (fixture file, path inside the Hub repository as ``huggingface-cli download`` lays it out)."""
GPQA_FIXTURE, GPQA_REL = "gpqa_diamond.jsonl", "gpqa_diamond.csv"
"""GPQA-Diamond: our fixture is JSON lines; the Hub ships a CSV."""


def fixture(name: str) -> Path:
    """The fixture file of registry dataset ``name``."""
    return HUB / (GPQA_FIXTURE if name == "gpqa-diamond" else LAYOUT[name][0])


def place(raw: str | Path, name: str) -> Path:
    """Put dataset ``name``'s fixture into ``raw`` at its Hub path; the file written."""
    raw = Path(raw)
    if name == "gpqa-diamond":
        import pyarrow as pa
        import pyarrow.csv as pacsv

        dst = raw / get_dataset(name).hub_id / GPQA_REL
        dst.parent.mkdir(parents=True, exist_ok=True)
        rows = [json.loads(line) for line in fixture(name).read_text().splitlines()]
        pacsv.write_csv(pa.Table.from_pylist(rows), dst)
        return dst
    src, rel = LAYOUT[name]
    dst = raw / get_dataset(name).hub_id / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(HUB / src, dst)
    return dst


def smoke_inputs(inputs: Any) -> Any:
    """The paper plan's data needs (``prepare_paper.PaperData``) with what the fixtures can meet: no catalogue counts
    to check, a sampled suite sampled down to 1 question, one validation question held out per training set."""
    out = copy.deepcopy(inputs)
    for entry in out.catalogue.values():
        entry["n"] = None
        if entry.get("sample"):
            entry["sample"] = {**entry["sample"], "n": 1}
    for data in out.datasets.values():
        data["val"]["n"] = 1
    return out


def data_texts(data_dir: str | Path) -> list[str]:
    """Every string of every prepared parquet file under ``data_dir`` (training sets, suites): what a stand-in's
    character-level tokenizer must cover."""
    import pyarrow.parquet as pq

    out: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, str):
            out.append(x)
            if x[:1] in "[{":  # JSON kept as text (meta, extra_info): its strings' characters too
                try:
                    walk(json.loads(x))
                except ValueError:
                    pass
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    for path in sorted(Path(data_dir).rglob("*.parquet")):
        walk(pq.read_table(path).to_pylist())
    return out


def training_questions(data_dir: str | Path) -> list[tuple[list[dict[str, str]], str, int]]:
    """(chat messages, gold answer, row index in its file) of every row of every prepared verl training file under
    ``data_dir``: what a smoke stand-in is taught to answer (creditlab.models.standin.write_standin)."""
    import pyarrow.parquet as pq

    out = []
    for path in sorted(Path(data_dir).glob("verl/*/train.parquet")):
        for i, row in enumerate(pq.read_table(path).to_pylist()):
            out.append(([dict(m) for m in row["prompt"]], str(row["reward_model"]["ground_truth"]), i))
    return out
