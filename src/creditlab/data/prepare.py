"""Prepare the tiny world's data: evaluation suites, train and val splits, warm-up extras, tokenizer, report.

Formats: a split is arithmetic (:mod:`creditlab.data.synthetic`, the RL task) unless its config says
``format: code`` or ``format: choice`` (:mod:`creditlab.data.transfer`, the transfer suites). ``warmup_extra``
(optional) names SFT-only parts of those formats, mixed into the warm-up next to ``train`` and never used as
RL prompts (:func:`warmup_records`).

Order matters for leakage: the held-out suites are drawn first (each from its own seed derived
from the config seed and the suite name), then the train split excluding every suite problem,
then the val split excluding both, then the warm-up extras excluding all of them. Problems are compared by
their key (:func:`creditlab.data.transfer.problem_key`: an MC record's arithmetic expression, so an MC suite
problem is never an arithmetic training question). What was written is read back from disk and checked for
overlap before the report is written; any overlap raises.

Layout of ``out_dir``::

    train.parquet  val.parquet  warmup_extra.parquet  suites/<name>.parquet  tokenizer/  prep_report.json
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
from creditlab.data.rule_arith import (
    DEFAULT_SEPARATORS,
    check_rl_prompts,
    check_rules,
    generate_rule_split,
    select_rl_prompts,
)
from creditlab.data.schema import check_template, render_record_prompt, render_response
from creditlab.data.synthetic import DEFAULT_MAX_VALUE, DEFAULT_OPS, generate_split
from creditlab.data.tokenizer import build_tokenizer
from creditlab.data.transfer import generate_choice_split, generate_code_split, problem_key
from creditlab.seeds import derive_seed

log = logging.getLogger(__name__)

Records = list[dict[str, Any]]
_RESERVED_SPLITS = ("train", "val")
FORMAT_KEYS: dict[str, tuple[str, ...]] = {
    "arith": ("n", "n_ops", "digits"),
    "code": ("n", "at", "slope", "intercept", "tests", "time_limit_s"),
    "choice": ("n", "n_ops", "digits", "options"),
    "rule": ("n", "n_ops", "digits", "rule_frac"),
}
"""The keys of a split's config by its ``format`` (besides ``format`` itself; default ``arith``)."""
WARMUP_EXTRA = "warmup_extra"
"""Name (file ``warmup_extra.parquet``, seeds ``warmup_extra.<part>``) of the SFT-only records."""


def check_disjoint(train: Iterable[dict[str, Any]], others: Mapping[str, Iterable[dict[str, Any]]]) -> dict[str, int]:
    """Count, for each named split in ``others``, its records whose problem key (the canonical question; an MC
    record's arithmetic expression: :func:`~creditlab.data.transfer.problem_key`) is in ``train``."""
    seen = {problem_key(rec) for rec in train}
    return {name: sum(problem_key(rec) in seen for rec in records) for name, records in others.items()}


def _split_spec(cfg: Mapping[str, Any], where: str, formats: Iterable[str] = tuple(FORMAT_KEYS)) -> dict[str, Any]:
    """Validate one split's config block: ``format`` (one of ``formats``, default ``arith``) and that format's
    keys (:data:`FORMAT_KEYS`), e.g. ``{n, n_ops: [lo, hi], digits: [lo, hi]}`` for arithmetic."""
    fmt = str(cfg.get("format", "arith"))
    formats = list(formats)
    if fmt not in formats:
        raise ValueError(f"data config {where}.format: {fmt!r} is not allowed here; valid: {formats}")
    keys = FORMAT_KEYS[fmt]
    missing = [k for k in keys if k not in cfg]
    if missing:
        raise ValueError(f"data config {where}: missing key(s) {missing}; expected {list(keys)} (format {fmt})")
    unknown = sorted(set(cfg) - set(keys) - {"format"})
    if unknown:
        raise ValueError(f"data config {where}: unknown key(s) {unknown}; expected {list(keys)} (format {fmt})")
    if int(cfg["n"]) < 1:
        raise ValueError(f"data config {where}.n must be >= 1, got {cfg['n']}")
    spec: dict[str, Any] = {"n": int(cfg["n"])}
    for key in keys[1:]:
        value = cfg[key]
        spec[key] = value if isinstance(value, (int, float, str)) else list(value)  # [lo, hi] ranges as lists
    return spec | ({"format": fmt} if fmt != "arith" else {})


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
    # rl_overrides: the world's RL budget, read (and checked) by the plan (plan.world_run_overrides), not by prepare
    unknown = sorted(set(cfg) - {*TOP_KEYS, WARMUP_EXTRA})
    if unknown:
        raise ValueError(f"data config: unknown key(s) {unknown}")
    unknown_task = sorted(set(cfg.get("task") or {}) - set(TASK_KEYS))
    if unknown_task:
        raise ValueError(f"data config task: unknown key(s) {unknown_task}; expected {sorted(TASK_KEYS)}")
    task = _task_knobs(cfg)
    uses_rules = any(
        (spec or {}).get("format") == "rule" for spec in [cfg["train"], cfg["val"], *cfg["suites"].values()]
    )
    if uses_rules:
        if not task["rules"]:
            raise ValueError("data config: a split of format rule needs task.rules (letter: + or -)")
        check_rules(task["rules"], task["separators"])
    if cfg.get("rl_prompts") is not None:
        if (cfg["train"] or {}).get("format") != "rule":
            raise ValueError("data config rl_prompts: draws RL prompts by rule letters; train.format must be rule")
        check_rl_prompts(cfg["rl_prompts"])


TOP_KEYS = ("name", "seed", "template", "task", "train", "val", "suites", "rl_overrides", "rl_prompts")
"""A tiny data config's top-level keys besides ``warmup_extra``. ``rl_overrides`` (the world's RL budget) is read and
checked by the plan (plan.world_run_overrides); ``rl_prompts`` (which train records are RL prompts:
:func:`~creditlab.data.rule_arith.select_rl_prompts`) by both."""


TASK_KEYS = ("ops", "max_value", "rules", "separators")
"""The problem-family knobs of a data config's ``task`` block (rules / separators: the rule format only)."""


def _task_knobs(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The problem-family knobs (``ops``, ``max_value``; ``rules``, ``separators`` of the rule format), defaults
    filled in."""
    task = cfg.get("task") or {}
    return {
        "ops": list(task.get("ops", DEFAULT_OPS)),
        "max_value": int(task.get("max_value", DEFAULT_MAX_VALUE)),
        "rules": {str(k): str(v) for k, v in (task.get("rules") or {}).items()},
        "separators": [str(x) for x in task.get("separators", DEFAULT_SEPARATORS)],
    }


def _generate(
    cfg: Mapping[str, Any], name: str, spec: dict[str, Any], exclude: set[str], seed_name: str | None = None
) -> Records:
    """Draw one split of its format with the seed derived from ``seed_name`` (default: the split name), excluding
    the given problem keys. Arithmetic records get the data set's name as ``source``; the transfer formats
    theirs (:data:`~creditlab.data.transfer.CODE_SOURCE`, :data:`~creditlab.data.transfer.CHOICE_SOURCE`)."""
    task = _task_knobs(cfg)
    seed = derive_seed(int(cfg["seed"]), seed_name or name)
    fmt = spec.get("format", "arith")
    log.info("generating %s (%s): %s", name, fmt, {k: v for k, v in spec.items() if k != "format"})
    if fmt == "code":
        return generate_code_split(
            seed,
            spec["n"],
            spec["at"],
            spec["slope"],
            spec["intercept"],
            int(spec["tests"]),
            float(spec["time_limit_s"]),
            exclude,
            split=name,
        )
    if fmt == "choice":
        return generate_choice_split(
            seed,
            spec["n"],
            spec["n_ops"],
            spec["digits"],
            spec["options"],
            exclude,
            split=name,
            ops=tuple(task["ops"]),
            max_value=task["max_value"],
        )
    if fmt == "rule":
        return generate_rule_split(
            seed,
            spec["n"],
            spec["n_ops"],
            spec["digits"],
            float(spec["rule_frac"]),
            task["rules"],
            task["separators"],
            exclude,
            source=str(cfg["name"]),
            split=name,
            ops=tuple(task["ops"]),
            max_value=task["max_value"],
        )
    return generate_split(
        seed,
        spec["n"],
        spec["n_ops"],
        spec["digits"],
        exclude,
        source=str(cfg["name"]),
        split=name,
        ops=tuple(task["ops"]),
        max_value=task["max_value"],
    )


def _rl_prompt_counts(train: Records, spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """The RL prompts' count and letter mix (:func:`~creditlab.data.rule_arith.select_rl_prompts`): what the runs of
    this world will train on, refused here (ValueError) when the train split cannot give the shares."""
    chosen = select_rl_prompts(train, spec)
    letters = Counter(int((rec.get("meta") or {}).get("letters", 0)) for rec in chosen)
    by_letters = {str(k): n for k, n in sorted(letters.items())}  # str keys: the report equals its JSON reading
    return {"spec": dict(spec) if spec else None, "n": len(chosen), "by_letters": by_letters}


def _questions(splits: Iterable[Records]) -> set[str]:
    """Problem keys (:func:`~creditlab.data.transfer.problem_key`) of all records in ``splits``."""
    return {problem_key(rec) for records in splits for rec in records}


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
        "sources": dict(sorted(Counter(r["source"] for r in records).items())),
        "n_ops_counts": dict(sorted(Counter(str(r["meta"]["n_ops"]) for r in records if "n_ops" in r["meta"]).items())),
        "max_prompt_tokens": max(len(ids) for ids in prompt_ids),
        "max_response_tokens": max(len(ids) + 1 for ids in response_ids),
        "max_chars": max(len(p) + len(r) for p, r in zip(prompts, responses)),
    }


def _assert_no_overlap(overlap: dict[str, dict[str, int]]) -> None:
    """Raise if any recomputed overlap count is non-zero."""
    leaks = {f"{a} vs {b}": n for a, row in overlap.items() for b, n in row.items() if n}
    if leaks:
        raise RuntimeError(f"prepared splits overlap (problem key matches): {leaks}")


def warmup_records(data_dir: Path) -> Records:
    """The SFT warm-up's records of a prepared data directory: ``train`` (the RL task) and, when the data config
    has ``warmup_extra``, its SFT-only records of the transfer formats (files named in ``prep_report.json``)."""
    data_dir = Path(data_dir)
    files = json.loads((data_dir / "prep_report.json").read_text())["files"]
    return [rec for name in ("train", WARMUP_EXTRA) if name in files for rec in read_records(data_dir / files[name])]


def _write_splits(out_dir: Path, splits: dict[str, Records], suite_names: list[str]) -> dict[str, str]:
    """Write every split to parquet; return split name -> path relative to ``out_dir``."""
    files = {}
    for name, records in splits.items():
        rel = f"suites/{name}.parquet" if name in suite_names else f"{name}.parquet"
        write_records(records, out_dir / rel)
        files[name] = rel
    return files


def prepare_tiny(cfg: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    """Generate, write and check the tiny data set described by ``cfg`` (arithmetic, plus the transfer formats
    of its suites and ``warmup_extra``).

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
    train_spec = _split_spec(cfg["train"], "train", ["arith", "rule"])  # RL prompts: the math task only
    val_spec = _split_spec(cfg["val"], "val", ["arith", "rule"])
    extra_specs = {
        name: _split_spec(spec, f"{WARMUP_EXTRA}.{name}", ["code", "choice"])
        for name, spec in (cfg.get(WARMUP_EXTRA) or {}).items()
    }

    suites: dict[str, Records] = {}
    for name, spec in suite_specs.items():
        suites[name] = _generate(cfg, name, spec, _questions(suites.values()))
    train = _generate(cfg, "train", train_spec, _questions(suites.values()))
    val = _generate(cfg, "val", val_spec, _questions([*suites.values(), train]))
    extra: Records = []
    for name, spec in extra_specs.items():  # split "warmup_<part>": ids stay unique across parts
        extra += _generate(
            cfg,
            f"warmup_{name}",
            spec,
            _questions([*suites.values(), train, val, extra]),
            seed_name=f"{WARMUP_EXTRA}.{name}",
        )

    splits = {"train": train, "val": val, **({WARMUP_EXTRA: extra} if extra_specs else {}), **suites}
    files = _write_splits(out_dir, splits, list(suites))
    written = {name: read_records(out_dir / rel) for name, rel in files.items()}
    written_suites = {name: written[name] for name in suites}
    overlap = {
        "train": check_disjoint(written["train"], {**written_suites, "val": written["val"]}),
        "val": check_disjoint(written["val"], written_suites),
    }
    if extra_specs:
        overlap[WARMUP_EXTRA] = check_disjoint(written[WARMUP_EXTRA], {**written_suites, "val": written["val"]})
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
        "knobs": {"train": train_spec, "val": val_spec, "suites": suite_specs, WARMUP_EXTRA: extra_specs},
        "seeds": {
            **{name: derive_seed(int(cfg["seed"]), name) for name in files if name != WARMUP_EXTRA},
            **{f"{WARMUP_EXTRA}.{n}": derive_seed(int(cfg["seed"]), f"{WARMUP_EXTRA}.{n}") for n in extra_specs},
        },
        "counts": {name: len(records) for name, records in written.items()},
        "rl_prompts": _rl_prompt_counts(written["train"], cfg.get("rl_prompts")),
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
