"""Columns whose meaning depends on k (issue 20, item 1): the Δlog p paper's Pass@16 is pass@16 at paper scale (the
evaluation draws 32 samples), not pass@{eval.k}; a pass@ column names its k, per scale where the scales' evaluations
draw fewer samples (tiny pass@8, micro / smoke pass@4), and shows the k it reads; avg@k is the paper's avg@N at paper
scale in every paper."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from creditlab.papers.load import load_paper, parse_paper
from creditlab.papers.spec import resolve_metric
from creditlab.tables import ledger as L
from creditlab.tables.build import build_table
from creditlab.tables.load import metrics_path
from creditlab.tables.render import table_markdown
from table_helpers import write_eval

ROOT = Path(__file__).resolve().parents[1]
PAPERS = ROOT / "configs" / "papers"
DLOGP = PAPERS / "dlogp.yaml"

# The k the papers report their sampled accuracy at (SPEC.md): Avg@32 / Pass@16 (Δlog p), avg@32 (cancellation,
# DFPO), avg@16 (DelTA, and the head-to-head on DelTA's protocol), pass@4 from 4 samples (ARCA).
PAPER_K = {"dlogp": 32, "cancellation": 32, "dfpo": 32, "delta": 16, "headtohead": 16, "arca": 4}


def _eval_k(scale: str, paper: str) -> int:
    """eval.k of a paper's runs at a scale, read from the configs as the plan composes them: the scale's own k, the
    paper's `scale_overrides` at paper / smoke (smoke: then its `shrink` list)."""
    scale_cfg = yaml.safe_load(
        (ROOT / "configs" / "scale" / f"{'paper' if scale == 'smoke' else scale}.yaml").read_text()
    )
    k = int(scale_cfg["eval"]["k"])
    if scale in ("paper", "smoke"):
        data = yaml.safe_load((PAPERS / f"{paper}.yaml").read_text())
        per_scale = (data.get("scale_overrides") or {}).get("paper", {})
        for entries in per_scale.values():
            for entry in entries:
                if entry.startswith("eval.k="):
                    k = int(entry.split("=", 1)[1])
    if scale == "smoke":
        shrink = yaml.safe_load((ROOT / "configs" / "scale" / "smoke.yaml").read_text())["shrink"]
        k = next((int(e.split("=", 1)[1]) for e in reversed(shrink) if e.startswith("eval.k=")), k)
    return k


def test_the_dlogp_pass_column_is_pass16_at_paper_scale():
    """Main and ablation tables: the paper's "Average Pass@16" column reads pass@16 of the paper-scale evaluation
    (32 samples), under that name, with the paper's numbers; avg@k there is Avg@32."""
    paper = load_paper(DLOGP)
    assert _eval_k("paper", "dlogp") == 32
    for table in ("main", "ablation"):
        spec = paper.table(table)
        assert [c.name for c in spec.columns] == ["AIME24", "AIME25", "AMC", "Avg", "Pass@16"]
        leaves, _ = paper.leaves_at(table, "Pass@16", "paper")
        assert {resolve_metric(m, 32) for _, m in leaves} == {"pass@16"}
        assert {resolve_metric(m, 32) for _, m in paper.leaves_at(table, "Avg", "paper")[0]} == {"avg@32"}
        ours = next(r for r in spec.rows if r.label.startswith("Ours") or r.run == "dlogp-ds-a0.2")
        assert ours.paper["Pass@16"] == 62.33
    assert paper.table("main").rows[0].paper["Pass@16"] == 51.52  # Base, Qwen2.5-Math-7B


def test_no_column_means_a_different_k_at_another_scale_under_one_name():
    """Every paper config: no symbolic pass@k; a pass@N column's name shows N (the paper's); at each scale it reads a
    pass@ that the scale's evaluation can estimate (N <= eval.k), shown under that k; avg@k is avg@<paper's k> at
    paper scale."""
    for path in sorted(PAPERS.glob("*.yaml")):
        paper = load_paper(path)
        name = path.stem
        assert _eval_k("paper", name) == PAPER_K[name], name
        for table, spec in paper.tables.items():
            for col in spec.columns:
                if col.average_of is not None or col.is_training or col.is_comparison:
                    continue
                for scale in ("tiny", "micro", "paper", "smoke"):
                    metric = col.metric_for(scale)
                    assert metric != "pass@k", (name, table, col.name, scale)
                    fixed = re.fullmatch(r"pass@(\d+)", metric)
                    if fixed and fixed.group(1) != "1":  # pass@1 is the per-sample accuracy, as avg@k: any k
                        k = _eval_k(scale, name)
                        assert int(fixed.group(1)) <= k, (name, table, col.name, scale, k)
                        assert f"@{fixed.group(1)}" in col.label_at(scale), (col.label_at(scale), scale)
                fixed = re.fullmatch(r"pass@(\d+)", col.metric or "")
                if fixed and fixed.group(1) != "1":
                    assert re.search(rf"@{fixed.group(1)}(?![0-9])", col.name), (name, table, col.name)


def _write_dlogp(evals: Path, paper, scale: str, k: int) -> dict[tuple[str, str], dict[str, list[int]]]:
    """Evaluations of every row of the Δlog p main table at `scale` with `k` samples; returns the counts written."""
    rng = np.random.default_rng(5)
    suites = [paper.suite_for(b, scale) for b in ("AIME24", "AIME25", "AMC")]
    written = {}
    for row in paper.table("main").rows:
        backbone = paper.backbone_for(row.backbone, scale)
        counts = {s: [int(x) for x in rng.integers(0, 4, size=12)] for s in suites}  # few correct of k: pass@j differ
        write_eval(
            metrics_path(evals, backbone, row.run, 0),
            counts,
            k,
            f"{scale}/{backbone}/{row.run}/s0",
            "",
            "cfg.yaml",
            greedy_above=2,
        )
        written[(row.label, row.backbone)] = counts
    return written


def _pass(n: int, c: int, j: int) -> float:
    return 1.0 - math.comb(n - c, j) / math.comb(n, j)


@pytest.mark.parametrize("scale, k, j", [("paper", 32, 16), ("tiny", 8, 8), ("micro", 4, 4), ("smoke", 4, 4)])
def test_the_dlogp_main_table_reads_the_bound_pass_at_each_scale(tmp_path: Path, scale: str, k: int, j: int):
    """Built from evaluations of k samples: the Pass@16 cell is the mean over the three suites of the unbiased pass@j
    (paper: j = 16 of 32 samples, not pass@32; tiny 8, micro / smoke 4), its metric says so, and the page shows our
    cells under Pass@j beside the paper's Pass@16."""
    paper = load_paper(DLOGP)
    evals = tmp_path / scale / "evals"
    written = _write_dlogp(evals, paper, scale, k)
    df = build_table(paper, "main", scale, [0], evals, k)
    for row in paper.table("main").rows:
        line = df[(df["row"] == row.label) & (df["paper_backbone"] == row.backbone) & (df["column"] == "Pass@16")]
        assert len(line) == 1
        counts = written[(row.label, row.backbone)]
        expected = 100 * np.mean([np.mean([_pass(k, c, j) for c in cs]) for cs in counts.values()])
        assert line.iloc[0]["ours_mean"] == pytest.approx(expected)
        assert line.iloc[0]["metric"] == f"pass@{j}"
        if j != k:  # paper: pass@32 would be another number
            wrong = 100 * np.mean([np.mean([_pass(k, c, k) for c in cs]) for cs in counts.values()])
            assert abs(line.iloc[0]["ours_mean"] - wrong) > 1
    md = table_markdown(df, paper.table("main"), paper)
    ours = "ours" if scale == "paper" else f"ours ({scale})"
    assert f"| Pass@{j} {ours} | Pass@16 paper |" in md
    if scale != "paper":
        assert "Pass@16 ours" not in md and f"**pass@{j} at this scale, the paper's pass@16**" in md
        assert "Pass@k" not in md


def test_the_ledger_names_our_k_beside_the_papers(tmp_path: Path):
    paper = load_paper(DLOGP)
    paper = type(paper)(**{**paper.__dict__, "claims": ()})
    evals = tmp_path / "tiny" / "evals"
    _write_dlogp(evals, paper, "tiny", 8)
    tables = {"main": build_table(paper, "main", "tiny", [0], evals, 8)}
    df, results = L.build_ledger(paper, "tiny", [0], tables, evals, 8, tmp_path / "runs", "file:///none")
    md = L.ledger_markdown(paper, "tiny", df, results)
    assert "| Pass@8 (paper: Pass@16) | 51.52 |" in md


# ---------------------------------------------------------------------------------------- the per-scale metric

TOY = {
    "paper": "tk",
    "backbones": {"M": {"tiny": "tiny-s", "micro": "micro-s", "paper": "m"}},
    "benchmarks": {"A": {"tiny": "sa", "micro": "sa", "paper": "a"}},
    "runs": {"r": {"method": "dapo"}},
    "tables": {
        "t": {
            "columns": [
                {
                    "name": "Pass@16",
                    "benchmark": "A",
                    "metric": {"paper": "pass@16", "tiny": "pass@8", "micro": "pass@4"},
                }
            ],
            "rows": [{"label": "R", "backbone": "M", "run": "r"}],
        }
    },
}


def _toy(metric) -> dict:
    data = copy.deepcopy(TOY)
    data["tables"]["t"]["columns"][0]["metric"] = metric
    return data


def test_a_per_scale_metric_resolves_per_scale_and_smoke_reads_papers_unless_bound():
    paper = parse_paper(copy.deepcopy(TOY), "tk.yaml")
    col = paper.table("t").column("Pass@16")
    assert col.metric == "pass@16"
    assert [col.metric_for(s) for s in ("paper", "tiny", "micro", "smoke")] == [
        "pass@16",
        "pass@8",
        "pass@4",
        "pass@16",
    ]
    assert [col.label_at(s) for s in ("paper", "tiny", "smoke")] == ["Pass@16", "Pass@8", "Pass@16"]
    bound = parse_paper(_toy({"paper": "pass@16", "tiny": "pass@8", "micro": "pass@4", "smoke": "pass@2"}), "tk.yaml")
    assert bound.leaves_at("t", "Pass@16", "smoke")[0] == [("A", "pass@2")]
    other = copy.deepcopy(TOY)
    other["tables"]["t"]["columns"][0]["name"] = "Best"
    assert parse_paper(other, "tk.yaml").table("t").column("Best").label_at("tiny") == "Best (pass@8)"


@pytest.mark.parametrize(
    "metric, message",
    [
        (
            {"paper": "pass@16", "tiny": "pass@8"},
            r"columns\[0\] \(Pass@16\)\.metric: a per-scale metric needs every "
            r"scale of the paper's backbones; missing \['micro'\]",
        ),
        ({"paper": "pass@16", "tiny": "pass@8", "micro": "pass@4", "huge": "pass@64"}, r"metric\.huge: unknown value"),
        ({"paper": "pass@16", "tiny": "avg@k", "micro": "pass@4"}, r"one metric at each scale's k, got several kinds"),
        (
            {"paper": "step_time", "tiny": "step_time", "micro": "step_time"},
            r"metric\.paper: a per-scale metric binds "
            r"an evaluation metric",
        ),
        ({"paper": "pass@16", "tiny": "pass@x", "micro": "pass@4"}, r"metric\.tiny: unknown metric 'pass@x'"),
    ],
)
def test_a_per_scale_metric_is_validated(metric, message):
    with pytest.raises(ValueError, match=message):
        parse_paper(_toy(metric), "tk.yaml")
