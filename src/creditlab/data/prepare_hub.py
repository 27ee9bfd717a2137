"""Prepare paper-scale data from local Hub files: train set, evaluation suites, dedupe, contamination.

:func:`prepare_hub` is the paper-scale counterpart of :func:`creditlab.data.prepare.prepare_tiny`:
same layout for the normalised records (what creditlab's own evaluation and analyses read), plus
the verl parquet files the verl engine trains and validates on::

    out_dir/
      train.parquet  [val.parquet]  suites/<suite>.parquet     normalised records (creditlab.data.io)
      verl/train.parquet  [verl/val.parquet]  verl/suites/<suite>.parquet    verl RL format
      contamination_report.json                               the contamination report
      prep_report.json                                        the full report (written last)

The verl files may go to another folder (``verl_dir``), and the suites may be loaded once by the caller
(:func:`load_suites`) and shared by several training sets (``suites=``, ``write_suites=False``): what
:mod:`creditlab.data.prepare_paper` does for the paper-scale layout.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditlab.data.dedupe import (
    CONTAMINATION_ACTIONS,
    DEFAULT_NGRAM,
    Deduper,
    check_contamination,
    normalize_text,
    write_json,
)
from creditlab.data.hub_registry import find_files, get_dataset, iter_dataset
from creditlab.data.io import read_records, write_records
from creditlab.data.schema import check_template, render_record_prompt
from creditlab.data.verl_format import write_verl_parquet

log = logging.getLogger(__name__)

Records = list[dict[str, Any]]

_TOP_KEYS = ("name", "template", "train", "eval", "val", "dedupe", "contamination", "limit")
_SPEC_KEYS = ("dataset", "files", "dir", "options", "sample")
_SAMPLE_KEYS = ("n", "seed")
_DEDUPE_KEYS = ("train", "eval")
_CONTAM_KEYS = ("enable", "ngram", "min_overlap", "action")
_VAL_KEYS = ("n", "seed")
_RESERVED = ("train", "val")


def _spec(entry: Any, where: str) -> dict[str, Any]:
    """A dataset entry: a registry name, or ``{dataset, files?, dir?, options?}``."""
    if isinstance(entry, str):
        entry = {"dataset": entry}
    if not isinstance(entry, Mapping):
        raise ValueError(f"data config {where}: expected a dataset name or a mapping, got {entry!r}")
    unknown = sorted(set(entry) - set(_SPEC_KEYS))
    if unknown:
        raise ValueError(f"data config {where}: unknown key(s) {unknown}; expected {list(_SPEC_KEYS)}")
    if "dataset" not in entry:
        raise ValueError(f"data config {where}: missing key 'dataset'")
    get_dataset(str(entry["dataset"]))  # raises with the valid names
    files = entry.get("files")
    if isinstance(files, (str, Path)):
        files = [files]
    sample = entry.get("sample")
    if sample is not None:
        if not isinstance(sample, Mapping) or "n" not in sample or set(sample) - set(_SAMPLE_KEYS):
            raise ValueError(f"data config {where}.sample: expected {{n: <int>, seed: <int>}}, got {sample!r}")
        if int(sample["n"]) < 1:
            raise ValueError(f"data config {where}.sample.n must be >= 1, got {sample['n']}")
        sample = {"n": int(sample["n"]), "seed": int(sample.get("seed", 0))}
    return {
        "dataset": str(entry["dataset"]),
        "files": list(files) if files else None,
        "dir": entry.get("dir"),
        "options": dict(entry.get("options") or {}),
        "sample": sample,
    }


def _sample(records: Records, sample: Mapping[str, int] | None, where: str) -> Records:
    """``sample = {n, seed}``: the first ``n`` records after a shuffle of their indices by ``random.Random(seed)``,
    kept in their file order; None: every record."""
    if sample is None:
        return records
    n = sample["n"]
    if n > len(records):
        raise ValueError(f"{where}: sample.n={n} but only {len(records)} records were loaded")
    order = list(range(len(records)))
    random.Random(sample["seed"]).shuffle(order)
    chosen = set(order[:n])
    return [r for i, r in enumerate(records) if i in chosen]


def _parse_eval(raw_eval: Any) -> dict[str, dict[str, Any]]:
    """The ``eval`` block: suite name -> dataset entry."""
    raw_eval = raw_eval or {}
    if isinstance(raw_eval, list):
        pairs = [((e if isinstance(e, str) else e.get("dataset")), e) for e in raw_eval]
    elif isinstance(raw_eval, Mapping):
        pairs = list(raw_eval.items())
    else:
        raise ValueError(f"data config eval: expected a list or a mapping, got {raw_eval!r}")
    suites: dict[str, dict[str, Any]] = {}
    for suite, entry in pairs:
        suite = str(suite)
        if suite in _RESERVED or not suite or "/" in suite or suite.startswith("."):
            raise ValueError(f"data config eval: invalid suite name {suite!r}")
        if suite in suites:
            raise ValueError(f"data config eval: suite {suite!r} given twice")
        suites[suite] = _spec(entry if entry is not None else suite, f"eval.{suite}")
    return suites


def _block(cfg: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    block = cfg.get(key) or {}
    if not isinstance(block, Mapping):
        raise ValueError(f"data config {key}: expected a mapping, got {block!r}")
    unknown = sorted(set(block) - set(allowed))
    if unknown:
        raise ValueError(f"data config {key}: unknown key(s) {unknown}; expected {list(allowed)}")
    return dict(block)


def parse_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a paper-scale data config and fill in the defaults (see :func:`prepare_hub`)."""
    unknown = sorted(set(cfg) - set(_TOP_KEYS))
    if unknown:
        raise ValueError(f"data config: unknown key(s) {unknown}; expected {list(_TOP_KEYS)}")
    for key in ("name", "train"):
        if not cfg.get(key):
            raise ValueError(f"data config: missing key {key!r}")
    template = str(cfg.get("template", "boxed"))
    check_template(template)
    train = cfg["train"] if isinstance(cfg["train"], list) else [cfg["train"]]
    train_specs = [_spec(entry, f"train[{i}]") for i, entry in enumerate(train)]
    suites = _parse_eval(cfg.get("eval"))
    dedupe = {"train": True, "eval": False, **_block(cfg, "dedupe", _DEDUPE_KEYS)}
    contam = {
        "enable": True,
        "ngram": DEFAULT_NGRAM,
        "min_overlap": 1,
        "action": "drop",
        **_block(cfg, "contamination", _CONTAM_KEYS),
    }
    if contam["action"] not in CONTAMINATION_ACTIONS:
        raise ValueError(
            f"data config contamination.action must be one of {CONTAMINATION_ACTIONS}, got {contam['action']!r}"
        )
    val = {"n": 0, "seed": 0, **_block(cfg, "val", _VAL_KEYS)}
    if int(val["n"]) < 0:
        raise ValueError(f"data config val.n must be >= 0, got {val['n']}")
    limit = cfg.get("limit")
    if limit is not None and int(limit) < 1:
        raise ValueError(f"data config limit must be >= 1 or null, got {limit}")
    return {
        "name": str(cfg["name"]),
        "template": template,
        "train": train_specs,
        "eval": suites,
        "val": {"n": int(val["n"]), "seed": int(val["seed"])},
        "dedupe": {k: bool(v) for k, v in dedupe.items()},
        "contamination": {
            "enable": bool(contam["enable"]),
            "ngram": int(contam["ngram"]),
            "min_overlap": int(contam["min_overlap"]),
            "action": str(contam["action"]),
        },
        "limit": None if limit is None else int(limit),
    }


def _display(path: Path, raw_dir: Path) -> str:
    try:
        return str(path.resolve().relative_to(raw_dir.resolve()))
    except ValueError:
        return str(path)


def _resolve(spec: dict[str, Any], raw_dir: Path) -> list[Path]:
    return find_files(spec["dataset"], raw_dir, files=spec["files"], dir=spec["dir"])


def _source_entry(
    spec: dict[str, Any], files: list[Path], raw_dir: Path, stats: dict[str, int], n_records: int
) -> dict[str, Any]:
    ds = get_dataset(spec["dataset"])
    return {
        "dataset": ds.name,
        "hub_id": ds.hub_id,
        "hub_split": ds.hub_split,
        "files": [_display(p, raw_dir) for p in files],
        "options": spec["options"],
        "sample": spec["sample"],
        "rows": stats.get("rows", 0),
        "skipped": stats.get("skipped", 0),
        "records": n_records,
    }


def _questions(records: Records) -> set[str]:
    return {normalize_text(r["question"]) for r in records}


def _overlap(a: Records, others: Mapping[str, Records]) -> dict[str, int]:
    keys = _questions(a)
    return {name: sum(normalize_text(r["question"]) in keys for r in recs) for name, recs in others.items()}


@dataclass
class LoadedSuites:
    """Evaluation suites loaded by :func:`load_suites`, to share between :func:`prepare_hub` calls."""

    records: dict[str, Records]
    """suite name -> its records (``split`` = the suite name)."""
    specs: dict[str, dict[str, Any]]
    """suite name -> its parsed dataset entry."""
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    """suite name -> provenance (as ``sources.eval`` of the :func:`prepare_hub` report)."""
    dedupe: dict[str, dict[str, Any]] = field(default_factory=dict)
    """suite name -> dedupe report."""


def _load_suites(
    specs: dict[str, dict[str, Any]], raw_dir: Path, dedupe: bool, files: Mapping[str, list[Path]] | None = None
) -> LoadedSuites:
    files = dict(files) if files is not None else {suite: _resolve(spec, raw_dir) for suite, spec in specs.items()}
    loaded = LoadedSuites(records={}, specs=dict(specs))
    for suite, spec in specs.items():
        stats: dict[str, int] = {}
        deduper = Deduper()
        records = []
        for rec in iter_dataset(spec["dataset"], files[suite], split=suite, stats=stats, **spec["options"]):
            if deduper.add(rec) or not dedupe:
                records.append(rec)
        records = _sample(records, spec["sample"], f"eval.{suite} ({spec['dataset']})")
        loaded.records[suite] = records
        loaded.dedupe[suite] = {**deduper.report(), "applied": dedupe}
        loaded.sources[suite] = _source_entry(spec, files[suite], raw_dir, stats, len(records))
        log.info("suite %s: %d records from %s", suite, len(records), spec["dataset"])
    return loaded


def load_suites(eval_cfg: Any, raw_dir: str | Path, dedupe: bool = False) -> LoadedSuites:
    """Load evaluation suites given as the ``eval`` block of a data config (see :func:`prepare_hub`), every file
    resolved before any is read; ``dedupe`` drops duplicate questions within each suite.

    Raises: as :func:`prepare_hub`.
    """
    return _load_suites(_parse_eval(eval_cfg), Path(raw_dir), dedupe)


def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start)


def prepare_hub(
    data_cfg: Mapping[str, Any],
    raw_dir: str | Path,
    out_dir: str | Path,
    *,
    suites: LoadedSuites | None = None,
    write_suites: bool = True,
    verl_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Build the train set and evaluation suites of a paper-scale data config from local Hub files.

    Config keys (``data_cfg``, e.g. the content of ``configs/data/<name>.yaml``):

    - ``name`` (str, required): the data set's name, copied to the report.
    - ``template`` (str, default ``boxed``): the prompt template of the verl files
      (:data:`creditlab.data.schema.TEMPLATES`).
    - ``train`` (required): a dataset entry or a list of them (concatenated in order). A dataset
      entry is a registry name (:data:`creditlab.data.hub_registry.HUB_DATASETS`, e.g.
      ``dapo-math-17k``) or a mapping ``{dataset: <name>, files: [...], dir: <folder>, options:
      {...}}``: ``files`` are paths relative to ``raw_dir`` (or absolute), read in order; without
      them the files are found under ``dir`` (default ``<raw_dir>/<hub_id>``, the
      ``huggingface-cli download --local-dir`` layout) by the dataset's file patterns; ``options``
      are passed to the loader (e.g. ``{skip_unboxed: true}`` for ``math``); ``sample: {n, seed}`` keeps ``n`` of
      the entry's records (after dedupe): the first ``n`` after a shuffle of their indices by
      ``random.Random(seed)``, in file order (e.g. ARCA's 200 MATH test problems, seed 1337).
    - ``eval`` (optional): the evaluation suites, a mapping ``suite name -> dataset entry`` or a list
      of dataset entries (suite name = dataset name). Suite names other than ``train`` / ``val``.
    - ``val`` (optional): ``{n: 0, seed: 0}`` -- hold ``n`` training items out as ``val``
      (a seeded random sample, taken after dedupe and decontamination).
    - ``dedupe`` (optional): ``{train: true, eval: false}`` -- drop duplicate questions (exact or
      normalised, first kept: :mod:`creditlab.data.dedupe`) in the training set / in each suite.
      Duplicates are counted in the report either way.
    - ``contamination`` (optional): ``{enable: true, ngram: 13, min_overlap: 1, action: drop}`` --
      check the training items against every suite (normalised exact match, or ``min_overlap``
      shared word ``ngram``-grams) and ``drop`` or ``flag`` (``meta.contaminated_with``) them.
    - ``limit`` (optional int): keep only the first ``limit`` training items (smoke runs).

    Keyword arguments: ``suites`` -- suites already loaded by :func:`load_suites` (then the config has no
    ``eval``), used as the config's suites; ``write_suites`` (default true) -- write the suites' files (else only
    the training set's, the suites being the caller's); ``verl_dir`` -- the folder of the verl files (default
    ``out_dir/verl``; the report's paths are relative to ``out_dir`` either way).

    Writes the files listed in the module docstring and returns the report (also in
    ``prep_report.json``): ``counts``, ``files``, ``verl_files``, ``sources`` (per dataset: Hub id,
    split, files, rows read, rows skipped, records kept after dedupe), ``dedupe``,
    ``contamination``, ``overlap`` (the written splits re-checked for normalised-question overlap)
    and ``max_prompt_chars``.

    Raises:
        ValueError: a malformed config, an unknown dataset, a row missing a field (naming the file,
            the row and the field).
        FileNotFoundError: a dataset's files are not in ``raw_dir``.
        RuntimeError: the written train / val split shares a question with a suite although
            contamination action is ``drop``, or val shares one with train.
    """
    cfg = parse_config(data_cfg)
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    verl_dir = Path(verl_dir) if verl_dir is not None else out_dir / "verl"
    template = cfg["template"]
    (out_dir / "prep_report.json").unlink(missing_ok=True)  # the done marker: never left stale
    if suites is not None and cfg["eval"]:
        raise ValueError("prepare_hub: give the suites either in the config's `eval` or as `suites=`, not both")

    # Resolve every file first: a missing dataset fails before hours of loading.
    train_files = [_resolve(spec, raw_dir) for spec in cfg["train"]]
    if suites is None:
        suite_files = {suite: _resolve(spec, raw_dir) for suite, spec in cfg["eval"].items()}
        suites = _load_suites(cfg["eval"], raw_dir, cfg["dedupe"]["eval"], suite_files)
    cfg["eval"] = dict(suites.specs)
    suite_records = suites.records

    sources: dict[str, list[dict[str, Any]] | dict[str, Any]] = {"train": [], "eval": dict(suites.sources)}
    dedupe_report: dict[str, Any] = {"train": None, "eval": dict(suites.dedupe)}

    deduper = Deduper()
    train: Records = []
    for i, (spec, files) in enumerate(zip(cfg["train"], train_files)):
        stats = {}
        kept: Records = []
        for rec in iter_dataset(spec["dataset"], files, split="train", stats=stats, **spec["options"]):
            if deduper.add(rec) or not cfg["dedupe"]["train"]:
                kept.append(rec)
        kept = _sample(kept, spec["sample"], f"train[{i}] ({spec['dataset']})")
        train += kept
        sources["train"].append(_source_entry(spec, files, raw_dir, stats, len(kept)))
        log.info("train: %d rows of %s -> %d kept so far", stats.get("rows", 0), spec["dataset"], len(train))
    dedupe_report["train"] = {**deduper.report(), "applied": cfg["dedupe"]["train"]}

    contamination: dict[str, Any] | None = None
    (out_dir / "contamination_report.json").unlink(missing_ok=True)
    if cfg["contamination"]["enable"] and suite_records:
        c = cfg["contamination"]
        train, contamination = check_contamination(
            train,
            suite_records,
            n=c["ngram"],
            min_overlap=c["min_overlap"],
            action=c["action"],
            report_path=out_dir / "contamination_report.json",
        )

    val: Records = []
    if cfg["val"]["n"]:
        n_val = cfg["val"]["n"]
        if n_val >= len(train):
            raise ValueError(f"data config val.n={n_val} leaves no training items (have {len(train)})")
        chosen = set(random.Random(cfg["val"]["seed"]).sample(range(len(train)), n_val))
        val = [{**r, "split": "val"} for i, r in enumerate(train) if i in chosen]
        train = [r for i, r in enumerate(train) if i not in chosen]
    if cfg["limit"] is not None:
        train = train[: cfg["limit"]]
    if not train:
        raise ValueError("data config: the training set is empty after dedupe / decontamination")

    splits = {"train": train, **({"val": val} if val else {})}
    files: dict[str, str] = {}
    verl_files: dict[str, str] = {}
    for name, records in {**splits, **(suite_records if write_suites else {})}.items():
        rel = f"{name}.parquet" if name in splits else f"suites/{name}.parquet"
        write_records(records, out_dir / rel)
        files[name] = rel
        write_verl_parquet(records, verl_dir / rel, template=template)  # every kind (code: a fenced-program prompt)
        verl_files[name] = _rel(verl_dir / rel, out_dir)

    written = {name: read_records(out_dir / rel) for name, rel in files.items()}
    written_suites = {name: written.get(name, suite_records[name]) for name in suite_records}
    overlap = {"train": _overlap(written["train"], written_suites)}
    if val:
        overlap["val"] = _overlap(written["val"], {**written_suites, "train": written["train"]})
    suites_clean = cfg["contamination"]["enable"] and cfg["contamination"]["action"] == "drop"
    leaks = {
        f"{a} vs {b}": n
        for a, row in overlap.items()
        for b, n in row.items()
        if n and (cfg["dedupe"]["train"] if b == "train" else suites_clean)
    }
    if leaks:
        raise RuntimeError(f"prepared splits share normalised questions: {leaks}")

    everything = {**written_suites, **written}
    counts = {name: len(records) for name, records in everything.items()}
    max_prompt = {
        name: max(len(render_record_prompt(r, template)) for r in recs) for name, recs in everything.items() if recs
    }
    report = {
        "name": cfg["name"],
        "template": template,
        "config": cfg,
        "counts": counts,
        "files": files,
        "verl_files": verl_files,
        "sources": sources,
        "dedupe": dedupe_report,
        "contamination": contamination,
        "contamination_file": "contamination_report.json" if contamination is not None else None,
        "overlap": overlap,
        "max_prompt_chars": max_prompt,
    }
    write_json(report, out_dir / "prep_report.json")
    log.info("prepared %s in %s: %s", cfg["name"], out_dir, counts)
    return report
