"""train_mean columns: the mean over RL steps of any logged training metric (ARCA's weight Gini, EffN/T,
mean train reward), with a bootstrap CI over steps, relative_to, validation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from creditlab.papers.load import parse_paper
from creditlab.tables.build import build_table
from creditlab.tables.load import run_metrics_path
from creditlab.tables.render import table_markdown

PAPER = {
    "paper": "td",
    "title": "toy",
    "backbones": {"S": {"tiny": "tiny-s"}},
    "benchmarks": {"A": {"tiny": "sa"}},
    "runs": {"uni": {"method": "dapo"}, "arca": {"method": "dapo"}},
    "tables": {
        "conc": {
            "columns": [
                {"name": "Gini", "metric": "train_mean", "key": "weight_gini"},
                {"name": "EffN/T", "metric": "train_mean", "key": "eff_token_ratio"},
                {
                    "name": "Gini vs uniform",
                    "metric": "train_mean",
                    "key": "weight_gini",
                    "relative_to": "uni",
                    "relative": "ratio",
                },
            ],
            "rows": [
                {"label": "Uniform", "backbone": "S", "run": "uni"},
                {"label": "ARCA", "backbone": "S", "run": "arca"},
            ],
        }
    },
}
SERIES = {
    "uni": {"weight_gini": [0.1, 0.1, 0.1], "eff_token_ratio": [1.0, 1.0, 1.0]},
    "arca": {"weight_gini": [0.2, 0.3, float("nan"), 0.4], "eff_token_ratio": [0.5, 0.6, 0.7, 0.8]},
}


def _write(runs: Path, run: str) -> None:
    path = run_metrics_path(runs, "tiny-s", run, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    s = SERIES[run]
    n = len(s["weight_gini"])
    path.write_text(
        "".join(
            json.dumps({"step": i, "t_step": 1.0, **{k: v[i] for k, v in s.items()}}) + "\n" for i in range(n)
        ).replace("NaN", "NaN")
    )
    (path.parent / "DONE").write_text(
        json.dumps({"run_key": f"tiny/tiny-s/{run}/s0", "mlflow_run_id": run, "commit": "c"})
    )


def test_train_mean_cells(tmp_path):
    runs = tmp_path / "runs"
    for r in SERIES:
        _write(runs, r)
    paper = parse_paper(PAPER, "td.yaml")
    df = build_table(paper, "conc", "tiny", [0], tmp_path / "evals", k=8, runs_dir=runs)
    cell = lambda row, col: df[(df["row"] == row) & (df["column"] == col)].iloc[0]  # noqa: E731
    assert cell("ARCA", "Gini").ours_mean == pytest.approx(0.3)  # NaN step skipped: mean of 0.2, 0.3, 0.4
    assert cell("ARCA", "EffN/T").ours_mean == pytest.approx(np.mean([0.5, 0.6, 0.7, 0.8]))
    assert cell("ARCA", "Gini").unit == "weight_gini" and cell("ARCA", "Gini").n_steps == 3
    assert cell("ARCA", "Gini").ours_lo <= 0.3 <= cell("ARCA", "Gini").ours_hi
    assert cell("ARCA", "Gini vs uniform").ours_mean == pytest.approx(3.0)
    md = table_markdown(df, paper.table("conc"), paper)
    assert "`weight_gini`" in md and "0.3 [" in md
    assert "**Gini**: mean over RL steps of `weight_gini`" in md and "wall time" not in md.split("## Columns")[1]


@pytest.mark.parametrize(
    "column, match",
    [
        ({"name": "G", "metric": "train_mean"}, "needs a key"),
        ({"name": "G", "metric": "step_time", "key": "x"}, "key"),
        ({"name": "G", "benchmark": "A", "metric": "greedy", "key": "x"}, "key applies to a train_mean column"),
    ],
)
def test_train_mean_validation(column, match):
    bad = json.loads(json.dumps(PAPER))
    bad["tables"]["conc"]["columns"] = [column]
    with pytest.raises(ValueError, match=match):
        parse_paper(bad, "td.yaml")
