"""Token credit ("token clouds", DelTA Figure 4): which generated tokens get the highest and lowest
mean credit weight, from a run's ``token_credit.json`` (paths.RUN_TOKEN_CREDIT).

The trainer writes, over all valid generated tokens of all steps::

    {"tokens": [{"token": "<decoded string>", "id": 17, "count": 1234, "mean": 1.03}, ...],
     "n_tokens": <total>, "steps": <n>, "weight": "credit"}

``mean`` is the mean credit weight (DelTA's lambda) of that token id. Ids that decode to the same
string are merged (count-weighted mean), so the ranking is per token string as in the paper. Only
strings generated at least ``min_count`` times are ranked. This module validates the file, ranks the
tokens and writes the figure's Markdown + CSV; tables.figures.plot_token_credit draws the PNG.
"""

from __future__ import annotations

import json
import math
import unicodedata
from pathlib import Path
from typing import Any

import pandas as pd

from creditlab.tables.frame import missing
from creditlab.tables.render import md_table

RANK_COLUMNS = ("side", "rank", "token", "shown", "ids", "count", "mean")
"""Columns of the ranking frame: side is "top" (highest mean weight) or "bottom" (lowest)."""

_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


def visible(token: str) -> str:
    """The token with whitespace made visible (space ␣, newline ↵, tab ⇥, CR ␍), other control
    characters as \\xNN escapes, and the empty string as ∅."""
    if token == "":
        return "∅"
    out = []
    for ch in token:
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") or (ch.isspace() and ch != " "):
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def load_token_credit(path: Path) -> dict[str, Any]:
    """Read and validate a token_credit.json; ValueError naming the file and the offending key."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no token credit table: {path} is missing (the trainer writes it next to "
            f"metrics.jsonl; a run trained before it did must be re-trained)"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON: {err}") from err

    def fail(where: str, problem: str) -> None:
        raise ValueError(
            f"{path}: {where}: {problem}; expected {{'tokens': [{{'token': str, 'id': int, "
            f"'count': int, 'mean': number}}, ...], 'n_tokens': int, 'steps': int, 'weight': str}}"
        )

    if not isinstance(data, dict):
        fail("top level", f"expected an object, got {type(data).__name__}")
    for key, kind in (("tokens", list), ("n_tokens", int), ("steps", int), ("weight", str)):
        if key not in data:
            fail(key, "missing key")
        if not isinstance(data[key], kind) or isinstance(data[key], bool):
            fail(key, f"expected {kind.__name__}, got {data[key]!r:.60}")
    for i, tok in enumerate(data["tokens"]):
        if not isinstance(tok, dict):
            fail(f"tokens[{i}]", f"expected an object, got {tok!r:.60}")
        for key, ok in (
            ("token", lambda v: isinstance(v, str)),
            ("id", lambda v: isinstance(v, int) and not isinstance(v, bool)),
            ("count", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
            ("mean", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)),
        ):
            if key not in tok:
                fail(f"tokens[{i}].{key}", "missing key")
            if not ok(tok[key]):
                fail(f"tokens[{i}].{key}", f"invalid value {tok[key]!r:.60}")
    data["_path"] = str(path)
    return data


def by_string(data: dict[str, Any]) -> pd.DataFrame:
    """One line per token string: ids (";"-joined), total count, count-weighted mean weight."""
    merged: dict[str, dict[str, Any]] = {}
    for tok in data["tokens"]:
        if tok["count"] == 0:
            continue
        m = merged.setdefault(tok["token"], {"ids": [], "count": 0, "sum": 0.0})
        m["ids"].append(str(tok["id"]))
        m["count"] += tok["count"]
        m["sum"] += tok["count"] * float(tok["mean"])
    return pd.DataFrame(
        [
            {
                "token": t,
                "shown": visible(t),
                "ids": ";".join(m["ids"]),
                "count": m["count"],
                "mean": m["sum"] / m["count"],
            }
            for t, m in merged.items()
        ],
        columns=["token", "shown", "ids", "count", "mean"],
    )


def overall_mean(data: dict[str, Any]) -> float:
    """The count-weighted mean weight over every generated token (nan if none)."""
    total = sum(t["count"] for t in data["tokens"])
    return sum(t["count"] * float(t["mean"]) for t in data["tokens"]) / total if total else float("nan")


def rank_tokens(data: dict[str, Any], top: int, min_count: int) -> pd.DataFrame:
    """The `top` strings with the highest and the `top` with the lowest mean weight among those
    generated at least `min_count` times (ties: more frequent first, then by string). With fewer than
    2 * top such strings the two lists overlap."""
    if top < 1 or min_count < 1:
        raise ValueError(f"top and min_count must be positive, got top={top}, min_count={min_count}")
    eligible = by_string(data)
    eligible = eligible[eligible["count"] >= min_count]
    high = eligible.sort_values(["mean", "count", "token"], ascending=[False, False, True]).head(top)
    low = eligible.sort_values(["mean", "count", "token"], ascending=[True, False, True]).head(top)
    parts = [part.assign(side=side, rank=range(1, len(part) + 1)) for side, part in (("top", high), ("bottom", low))]
    return pd.concat(parts, ignore_index=True)[list(RANK_COLUMNS)]


def _code(text: str) -> str:
    """Inline Markdown code that survives backticks in the token."""
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def write_token_credit(
    ranking: pd.DataFrame, data: dict[str, Any], meta: dict[str, Any], out_md: Path, out_csv: Path
) -> None:
    """The figure's table: CSV (ranking + context columns) and a Markdown page.

    `meta`: paper_title, figure, caption, scale, paper_backbone, backbone, run, seed, top, min_count,
    run_key, mlflow_run_id, commit (empty when unknown).
    """
    out_md, out_csv = Path(out_md), Path(out_csv)
    strings = by_string(data)
    n_eligible = int((strings["count"] >= meta["min_count"]).sum())
    context = {
        k: meta.get(k, "")
        for k in (
            "figure",
            "scale",
            "paper_backbone",
            "backbone",
            "run",
            "seed",
            "min_count",
            "run_key",
            "mlflow_run_id",
            "commit",
        )
    }
    context |= {
        "n_tokens": data["n_tokens"],
        "steps": data["steps"],
        "weight": data["weight"],
        "source": data.get("_path", ""),
    }
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    ranking.assign(**context).to_csv(out_csv, index=False)

    scale = meta["scale"]
    lines = [f"# {meta['paper_title']}: figure `{meta['figure']}` (token credit)", ""]
    if scale != "paper":
        lines += [
            f"**Scale `{scale}`: NOT the paper's tokens.** These are the tokens of a tiny model's "
            f"tokenizer on the synthetic {scale} task, standing in for the paper's backbone; compare "
            f"the kind of pattern (which token types get high or low credit), not the tokens.",
            "",
        ]
    if meta.get("caption"):
        lines += [f"Paper caption: {meta['caption']}", ""]
    lines += [
        f"Run `{meta['run']}` on {meta['paper_backbone']} (`{meta['backbone']}`), seed {meta['seed']}: mean "
        f"{data['weight']} weight per generated token string over {data['steps']} steps and "
        f"{data['n_tokens']} valid generated tokens (all tokens: mean "
        f"{_fmt3(overall_mean(data))}). Ranked: the {n_eligible} of {len(strings)} strings generated at "
        f"least {meta['min_count']} times. Whitespace is shown as ␣ (space), ↵ (newline), ⇥ (tab).",
        "",
    ]
    if n_eligible < 2 * meta["top"]:
        lines += [f"Only {n_eligible} strings qualify (< 2 x {meta['top']}): the two lists overlap.", ""]
    for side, title in (("top", "Highest"), ("bottom", "Lowest")):
        part = ranking[ranking["side"] == side]
        lines += [f"## {title} mean weight (top {meta['top']})", ""]
        if part.empty:
            lines += [f"No token string was generated {meta['min_count']} times or more.", ""]
            continue
        lines += md_table(
            ["Rank", "Token", "Ids", "Count", "Mean weight"],
            [[str(r.rank), _code(r.shown), str(r.ids), str(r.count), _fmt3(r.mean)] for r in part.itertuples()],
        ) + [""]
    lines += [
        "## Provenance",
        "",
        f"Source `{data.get('_path', '')}`; run key `{meta.get('run_key') or '?'}`; MLflow run id "
        f"{meta.get('mlflow_run_id') or 'none (offline or unknown)'}; commit `{meta.get('commit') or '?'}`.",
    ]
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(lines) + "\n")


def _fmt3(value: float) -> str:
    return "—" if missing(value) else f"{value:.3f}"
