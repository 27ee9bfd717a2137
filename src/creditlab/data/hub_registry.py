"""Registry of the paper-scale Hub datasets: ``name -> HubDataset`` (loader, Hub id, split, files).

A data config names datasets by these names (``dataset: dapo-math-17k``); the name is also the
records' ``source`` and the verl ``data_source``, which :mod:`creditlab.engines.verl.reward` routes
to its verifier (every name here is routed: tested).

Files: a dataset's raw files are looked for under ``<raw_dir>/<hub_id>/`` -- the layout of
``huggingface-cli download <hub_id> --repo-type dataset --local-dir <raw_dir>/<hub_id>`` -- with the
dataset's ``patterns`` (globs relative to that folder, tried in order: the first that matches any
file wins, so a dataset shipped both as parquet and as JSON lines is not read twice). A config may
give ``files`` (paths relative to ``raw_dir`` or absolute) or ``dir`` instead.

The paper-scale configs name datasets by Hub id, dataset config and split (``configs/data/*.yaml`` ``train``,
``configs/suites/paper.yaml``); :func:`lookup` maps those to a registry entry, and :func:`allow_patterns` /
:func:`download_command` say what to fetch (:mod:`creditlab.data.prepare_paper`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditlab.data import hub_loaders, hub_math
from creditlab.data.hub_math import Record, Source, iter_hub_rows

Loader = Callable[..., Iterator[Record]]


@dataclass(frozen=True)
class HubDataset:
    """One Hub dataset: how to find its files and turn their rows into records."""

    name: str
    """Registry name = record ``source`` = verl ``data_source``."""
    hub_id: str
    hub_split: str
    loader: Loader
    """``loader(source, split=..., stats=..., **options) -> iterator of records``."""
    kind: str = "math"
    """``math``, ``multiple_choice`` or ``code`` (the verl ``ability`` and the verifier family)."""
    patterns: tuple[str, ...] = field(default_factory=tuple)
    """Globs under ``<raw_dir>/<hub_id>/``, tried in order."""
    role: str = "eval"
    """What the papers use it for: ``train`` or ``eval`` (informative only)."""
    hub_config: str | None = None
    """The Hub dataset config the ``patterns`` select (None: the default one)."""


def _split_patterns(split: str) -> tuple[str, ...]:
    """The Hub's usual file names for a split: parquet shards first, then JSON lines."""
    return (
        f"data/{split}-*.parquet",
        f"**/{split}-*.parquet",
        f"**/{split}.parquet",
        f"**/{split}.jsonl",
        f"**/{split}.json",
    )


def _wrap_list_loader(fn: Callable[..., list[Record]], **fixed: Any) -> Loader:
    """Adapt an existing list-returning loader (GPQA, MMLU-Pro, LiveCodeBench) to the registry's shape."""

    def loader(
        source: Source, split: str | None = None, stats: dict[str, int] | None = None, **options: Any
    ) -> Iterator[Record]:
        rows = [row for _, row in iter_hub_rows(source)]
        if stats is not None:
            stats["rows"] = stats.get("rows", 0) + len(rows)
            stats.setdefault("skipped", 0)
        kwargs = {**fixed, **options}
        if split is not None:
            kwargs["split"] = split
        records = fn(rows, **kwargs)
        if stats is not None:
            stats["skipped"] += len(rows) - len(records)
        return iter(records)

    loader.__name__ = f"registry_{fn.__name__}"
    return loader


_MATHARENA = ("data/train-*.parquet", "**/train-*.parquet", "**/train.jsonl")

HUB_DATASETS: dict[str, HubDataset] = {
    d.name: d
    for d in (
        # training sets
        HubDataset(
            "deepmath",
            "zwhe99/DeepMath-103K",
            "train",
            hub_math.iter_deepmath,
            patterns=_split_patterns("train"),
            role="train",
        ),
        HubDataset(
            "dapo-math-17k",
            "BytedTsinghua-SIA/DAPO-Math-17k",
            "train",
            hub_math.iter_dapo_math_17k,
            patterns=("data/dapo-math-17k.parquet", "**/dapo-math-17k.parquet", *_split_patterns("train")),
            role="train",
        ),
        HubDataset(
            "math",
            "DigitalLearningGmbH/MATH-lighteval",
            "train",
            hub_math.iter_math_lighteval,
            patterns=_split_patterns("train"),
            role="train",
            hub_config="default",
        ),
        HubDataset(
            "math-test",
            "DigitalLearningGmbH/MATH-lighteval",
            "test",
            hub_math.iter_math_lighteval_test,
            patterns=_split_patterns("test"),
            hub_config="default",
        ),
        # math evaluation sets
        HubDataset(
            "math500", "HuggingFaceH4/MATH-500", "test", hub_math.iter_math500, patterns=_split_patterns("test")
        ),
        HubDataset(
            "aime24", "HuggingFaceH4/aime_2024", "train", hub_math.iter_aime24, patterns=_split_patterns("train")
        ),
        HubDataset("aime25", "math-ai/aime25", "test", hub_math.iter_aime25, patterns=_split_patterns("test")),
        HubDataset(
            "aime25-matharena", "MathArena/aime_2025", "train", hub_math.iter_aime25_matharena, patterns=_MATHARENA
        ),
        HubDataset("amc23", "math-ai/amc23", "test", hub_math.iter_amc23, patterns=_split_patterns("test")),
        HubDataset("minerva", "math-ai/minervamath", "test", hub_math.iter_minerva, patterns=_split_patterns("test")),
        HubDataset(
            "olympiadbench",
            "math-ai/olympiadbench",
            "test",
            hub_math.iter_olympiadbench,
            patterns=_split_patterns("test"),
        ),
        HubDataset(
            "hmmt-feb-2025", "MathArena/hmmt_feb_2025", "train", hub_math.iter_hmmt_feb_2025, patterns=_MATHARENA
        ),
        HubDataset(
            "hmmt-feb-2026", "MathArena/hmmt_feb_2026", "train", hub_math.iter_hmmt_feb_2026, patterns=_MATHARENA
        ),
        HubDataset("brumo-2025", "MathArena/brumo_2025", "train", hub_math.iter_brumo_2025, patterns=_MATHARENA),
        HubDataset(
            "hmmt-nov-2025", "MathArena/hmmt_nov_2025", "train", hub_math.iter_hmmt_nov_2025, patterns=_MATHARENA
        ),
        HubDataset("aime26", "MathArena/aime_2026", "train", hub_math.iter_aime26, patterns=_MATHARENA),
        # multiple choice and code (loaders in creditlab.data.hub_loaders)
        HubDataset(
            "gpqa-diamond",
            "Idavidrein/gpqa",
            "train",
            _wrap_list_loader(hub_loaders.load_gpqa_diamond),
            kind="multiple_choice",
            hub_config="gpqa_diamond",
            patterns=(
                "gpqa_diamond.csv",
                "**/gpqa_diamond.csv",
                "**/gpqa_diamond/train/*.parquet",
                "**/gpqa_diamond/train-*.parquet",
            ),
        ),
        HubDataset(
            "mmlu-pro",
            "TIGER-Lab/MMLU-Pro",
            "test",
            _wrap_list_loader(hub_loaders.load_mmlu_pro),
            kind="multiple_choice",
            patterns=_split_patterns("test"),
        ),
        HubDataset(
            "livecodebench",
            "livecodebench/code_generation_lite",
            "test",
            _wrap_list_loader(hub_loaders.load_livecodebench),
            kind="code",
            hub_config="release_v6",
            patterns=("test*.jsonl", "**/test*.jsonl"),
        ),  # release_v6 = test.jsonl .. test6.jsonl
    )
}
"""Every dataset of SPEC.md's data table, by config name."""


def get_dataset(name: str) -> HubDataset:
    """The registry entry ``name``; a ValueError lists the valid names."""
    try:
        return HUB_DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown hub dataset {name!r}; valid: {sorted(HUB_DATASETS)}") from None


def _config_key(config: str | None) -> str:
    return "default" if config in (None, "", "default") else str(config)


def lookup(hub_id: str, config: str | None, split: str) -> HubDataset:
    """The registry entry of Hub dataset ``hub_id``, dataset config ``config`` (None = ``default``), split ``split``.

    Raises:
        ValueError: no entry reads that (id, config, split); the message lists every entry's.
    """
    for d in HUB_DATASETS.values():
        if (d.hub_id, _config_key(d.hub_config), d.hub_split) == (hub_id, _config_key(config), split):
            return d
    choices = "; ".join(
        f"{d.hub_id} config {_config_key(d.hub_config)} split {d.hub_split} -> {d.name}" for d in HUB_DATASETS.values()
    )
    raise ValueError(
        f"no hub loader for {hub_id} config {_config_key(config)} split {split}; "
        f"the registry (creditlab.data.hub_registry.HUB_DATASETS) reads: {choices}"
    )


def allow_patterns(name: str) -> list[str]:
    """``allow_patterns`` of ``huggingface_hub.snapshot_download`` (``--include`` of ``huggingface-cli download``)
    that fetch what :func:`find_files` reads for dataset ``name``: its patterns, plus each ``**/x`` pattern as ``x``
    (the Hub filters with ``fnmatch``, where ``**/`` needs a folder, unlike ``Path.glob``)."""
    out: list[str] = []
    for pattern in get_dataset(name).patterns:
        for p in (pattern, pattern[3:] if pattern.startswith("**/") else None):
            if p and p not in out:
                out.append(p)
    return out


def download_command(hub_id: str, local_dir: str | Path, patterns: Iterable[str] = ()) -> str:
    """The shell command that fetches ``hub_id`` (a dataset repository) into ``local_dir`` (the layout
    :func:`find_files` reads), restricted to ``patterns`` if given."""
    import shlex

    cmd = ["huggingface-cli", "download", hub_id, "--repo-type", "dataset", "--local-dir", str(local_dir)]
    patterns = list(patterns)
    if patterns:
        cmd += ["--include", *patterns]
    return " ".join(shlex.quote(c) for c in cmd)


def find_files(
    name: str, raw_dir: str | Path, files: Iterable[str | Path] | None = None, dir: str | Path | None = None
) -> list[Path]:
    """The files to read for dataset ``name``.

    ``files`` (relative to ``raw_dir`` unless absolute) are taken as given, in order; otherwise the
    dataset's patterns are globbed under ``dir`` (default ``<raw_dir>/<hub_id>``), sorted.

    Raises:
        FileNotFoundError: naming the folder, the patterns tried and what the folder holds.
    """
    spec = get_dataset(name)
    raw_dir = Path(raw_dir)
    if files:
        paths = [p if p.is_absolute() else raw_dir / p for p in map(Path, files)]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"{name}: file(s) not found: {missing}")
        return paths
    folder = Path(dir) if dir is not None else raw_dir / spec.hub_id
    folder = folder if folder.is_absolute() else raw_dir / folder
    for pattern in spec.patterns:
        found = sorted(p for p in folder.glob(pattern) if p.is_file())
        if found:
            return found
    present = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    present = present[:20]
    raise FileNotFoundError(
        f"{name} ({spec.hub_id}, split {spec.hub_split}): no file in {folder} matches {list(spec.patterns)}; "
        f"the folder holds {present or 'nothing'}"
    )


def iter_dataset(
    name: str, source: Source, split: str | None = None, stats: dict[str, int] | None = None, **options: Any
) -> Iterator[Record]:
    """Records of dataset ``name`` from ``source`` (files or rows), with ``split`` (default: the loader's)."""
    spec = get_dataset(name)
    kwargs: dict[str, Any] = dict(options)
    if split is not None:
        kwargs["split"] = split
    return spec.loader(source, stats=stats, **kwargs)


def load_dataset(name: str, source: Source, split: str | None = None, **options: Any) -> list[Record]:
    """``list(iter_dataset(...))``."""
    return list(iter_dataset(name, source, split=split, **options))


def describe() -> list[Mapping[str, str]]:
    """One line per dataset (name, hub id, config, split, kind, role), for docs and reports."""
    return [
        {
            "name": d.name,
            "hub_id": d.hub_id,
            "hub_config": _config_key(d.hub_config),
            "hub_split": d.hub_split,
            "kind": d.kind,
            "role": d.role,
        }
        for d in HUB_DATASETS.values()
    ]
