"""Prepare the tiny world's data: evaluation suites, train and val splits, tokenizer, report.

Order matters for leakage: the held-out suites are drawn first (each from its own seed derived
from the config seed and the suite name), then the train split excluding every suite question,
then the val split excluding both. What was written is read back from disk and checked for
overlap before the report is written; any overlap raises.

Layout of ``out_dir``::

    train.parquet  val.parquet  suites/<name>.parquet  tokenizer/  prep_report.json
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from creditlab.data.io import read_records, write_records
from creditlab.data.schema import check_template, render_record_prompt, render_response
from creditlab.data.synthetic import (
    DEFAULT_MAX_VALUE,
    DEFAULT_OPS,
    canonical_question,
    generate_split,
)
from creditlab.data.tokenizer import build_tokenizer
from creditlab.seeds import derive_seed

log = logging.getLogger(__name__)

Records = list[dict[str, Any]]
_RESERVED_SPLITS = ("train", "val")
_SPLIT_KEYS = ("n", "n_ops", "digits")


def check_disjoint(
    train: Iterable[dict[str, Any]], others: Mapping[str, Iterable[dict[str, Any]]]
) -> dict[str, int]:
    """Count, for each named split in ``others``, its records whose canonical question is in ``train``."""
    seen = {canonical_question(rec["question"]) for rec in train}
    return {
        name: sum(canonical_question(rec["question"]) in seen for rec in records)
        for name, records in others.items()
    }


def _split_spec(cfg: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validate one split's config block ``{n, n_ops: [lo, hi], digits: [lo, hi]}``."""
    missing = [k for k in _SPLIT_KEYS if k not in cfg]
    if missing:
        raise ValueError(f"data config {where}: missing key(s) {missing}; expected {list(_SPLIT_KEYS)}")
    unknown = sorted(set(cfg) - set(_SPLIT_KEYS))
    if unknown:
        raise ValueError(f"data config {where}: unknown key(s) {unknown}; expected {list(_SPLIT_KEYS)}")
    if int(cfg["n"]) < 1:
        raise ValueError(f"data config {where}.n must be >= 1, got {cfg['n']}")
    return {"n": int(cfg["n"]), "n_ops": list(cfg["n_ops"]), "digits": list(cfg["digits"])}


def _validate_cfg(cfg: Mapping[str, Any]) -> None:
    """Fail early, naming the key, on a malformed data config."""
    for key in ("name", "seed", "template", "train", "val", "suites"):
        if key not in cfg:
            raise ValueError(f"data config: missing key {key!r}")
    if not cfg["suites"]:
        raise ValueError("data config: 'suites' must name at least one evaluation suite")
    for name in cfg["suites"]:
        if name in _RESERVED_SPLITS or not str(name).isidentifier():
            raise ValueError(f"data config: invalid suite name {name!r} (identifier, not train/val)")
    unknown_task = sorted(set(cfg.get("task") or {}) - {"ops", "max_value"})
    if unknown_task:
        raise ValueError(f"data config task: unknown key(s) {unknown_task}; expected ['max_value', 'ops']")


def _task_knobs(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The problem-family knobs (``ops``, ``max_value``), defaults filled in."""
    task = cfg.get("task") or {}
    return {
        "ops": list(task.get("ops", DEFAULT_OPS)),
        "max_value": int(task.get("max_value", DEFAULT_MAX_VALUE)),
    }


def _generate(cfg: Mapping[str, Any], name: str, spec: dict[str, Any], exclude: set[str]) -> Records:
    """Draw one split with its derived seed, excluding the given canonical questions."""
    task = _task_knobs(cfg)
    log.info("generating %s: n=%d n_ops=%s digits=%s", name, spec["n"], spec["n_ops"], spec["digits"])
    return generate_split(
        derive_seed(int(cfg["seed"]), name),
        spec["n"],
        spec["n_ops"],
        spec["digits"],
        exclude,
        source=str(cfg["name"]),
        split=name,
        ops=tuple(task["ops"]),
        max_value=task["max_value"],
    )


def _questions(splits: Iterable[Records]) -> set[str]:
    """Canonical questions of all records in ``splits``."""
    return {canonical_question(rec["question"]) for records in splits for rec in records}


def _texts(records: Records, template: str) -> tuple[list[str], list[str]]:
    """Rendered prompts and responses (without EOS) of ``records``."""
    prompts = [render_record_prompt(rec, template) for rec in records]
    responses = [render_response(rec["solution"], template) for rec in records]
    return prompts, responses


def _split_stats(records: Records, template: str, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """Counts and lengths of one split; checks the tokenizer round trip on its texts.

    Prompt lengths include BOS, response lengths include EOS (as the SFT/RL code sees them).
    """
    prompts, responses = _texts(records, template)
    prompt_ids = tokenizer(prompts, add_special_tokens=True)["input_ids"]
    response_ids = tokenizer(responses, add_special_tokens=False)["input_ids"]
    for text, ids in zip(prompts + responses, prompt_ids + response_ids):
        decoded = tokenizer.decode(ids, skip_special_tokens=True)
        if decoded != text or tokenizer.unk_token_id in ids:
            raise RuntimeError(f"tokenizer round trip failed: {text!r} -> {decoded!r}")
    return {
        "n": len(records),
        "n_ops_counts": dict(sorted(Counter(str(r["meta"]["n_ops"]) for r in records).items())),
        "max_prompt_tokens": max(len(ids) for ids in prompt_ids),
        "max_response_tokens": max(len(ids) + 1 for ids in response_ids),
        "max_chars": max(len(p) + len(r) for p, r in zip(prompts, responses)),
    }


def _assert_no_overlap(overlap: dict[str, dict[str, int]]) -> None:
    """Raise if any recomputed overlap count is non-zero."""
    leaks = {f"{a} vs {b}": n for a, row in overlap.items() for b, n in row.items() if n}
    if leaks:
        raise RuntimeError(f"prepared splits overlap (canonical question matches): {leaks}")


def _write_splits(out_dir: Path, splits: dict[str, Records], suite_names: list[str]) -> dict[str, str]:
    """Write every split to parquet; return split name -> path relative to ``out_dir``."""
    files = {}
    for name, records in splits.items():
        rel = f"suites/{name}.parquet" if name in suite_names else f"{name}.parquet"
        write_records(records, out_dir / rel)
        files[name] = rel
    return files


def prepare_tiny(cfg: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    """Generate, write and check the tiny arithmetic data set described by ``cfg``.

    ``cfg`` is the content of ``configs/data/tiny_arith.yaml``. Returns the report that is also
    written to ``out_dir/prep_report.json``.

    Raises:
        ValueError: for a malformed config or an infeasible request (too few unique problems).
        RuntimeError: if the written splits overlap or the tokenizer fails to round-trip.
    """
    _validate_cfg(cfg)
    out_dir = Path(out_dir)
    template = str(cfg["template"])
    check_template(template)
    suite_specs = {name: _split_spec(spec, f"suites.{name}") for name, spec in cfg["suites"].items()}
    train_spec, val_spec = _split_spec(cfg["train"], "train"), _split_spec(cfg["val"], "val")

    suites: dict[str, Records] = {}
    for name, spec in suite_specs.items():
        suites[name] = _generate(cfg, name, spec, _questions(suites.values()))
    train = _generate(cfg, "train", train_spec, _questions(suites.values()))
    val = _generate(cfg, "val", val_spec, _questions([*suites.values(), train]))

    files = _write_splits(out_dir, {"train": train, "val": val, **suites}, list(suites))
    written = {name: read_records(out_dir / rel) for name, rel in files.items()}
    written_suites = {name: written[name] for name in suites}
    overlap = {
        "train": check_disjoint(written["train"], {**written_suites, "val": written["val"]}),
        "val": check_disjoint(written["val"], written_suites),
    }
    _assert_no_overlap(overlap)

    all_records = [rec for records in written.values() for rec in records]
    prompts, responses = _texts(all_records, template)
    build_tokenizer(prompts + responses).save_pretrained(out_dir / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(out_dir / "tokenizer")
    stats = {name: _split_stats(records, template, tokenizer) for name, records in written.items()}

    report = {
        "name": cfg["name"],
        "seed": int(cfg["seed"]),
        "template": template,
        "task": _task_knobs(cfg),
        "knobs": {"train": train_spec, "val": val_spec, "suites": suite_specs},
        "seeds": {name: derive_seed(int(cfg["seed"]), name) for name in files},
        "counts": {name: len(records) for name, records in written.items()},
        "splits": stats,
        "tokenizer": {"path": "tokenizer", "vocab_size": len(tokenizer)},
        "max_prompt_tokens": max(s["max_prompt_tokens"] for s in stats.values()),
        "max_response_tokens": max(s["max_response_tokens"] for s in stats.values()),
        "overlap": overlap,
        "files": files,
    }
    (out_dir / "prep_report.json").write_text(json.dumps(report, indent=2) + "\n")
    log.info("prepared %s in %s: %s", cfg["name"], out_dir, report["counts"])
    return report
