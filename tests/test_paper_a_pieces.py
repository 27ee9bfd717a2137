"""Paper A plumbing: decodings and figures in paper configs, token diagnostics, replacement curves."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from creditlab.decoding.diagnostics import token_stats
from creditlab.papers.load import load_paper, parse_paper
from creditlab.plan import CONFIG_DIR, build_plan
from creditlab.tables.figures import plot_replacement_curves

PIPE = {"scale": "micro", "papers": ["dlogp"], "seeds": [0], "results": "results"}


def _dlogp_data() -> dict:
    return yaml.safe_load((CONFIG_DIR / "papers" / "dlogp.yaml").read_text())


def test_decodings_resolve_per_scale_and_reach_the_plan():
    plan = build_plan(PIPE, validate=False)
    extrap = plan.decode("extrap")
    assert extrap.settings("micro") == {
        "criterion": "dlogp",
        "threshold": -0.02,
        "gamma": 0.05,
        "decode_with": "base",
        "top_k_support": None,
    }
    assert extrap.threshold("paper") == -0.3  # the paper's DAPO-32B setting
    # the view: the official script's top-50 log-probs where paper entries are read, the full vocabulary at tiny
    assert extrap.settings("paper")["top_k_support"] == extrap.settings("smoke")["top_k_support"] == 50
    assert extrap.settings("tiny")["top_k_support"] is None
    assert plan.decode("rep-random-2").threshold("anything") == 0.05  # one value for every scale
    evals = plan.table_evals("dlogp", "replacement")
    assert {d for _, d in evals} >= {None, "rep-kl-1", "rep-entropy-3"}
    with pytest.raises(ValueError, match="planned decodings"):
        plan.decode("nope")


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda d: d["decodes"]["extrap"].update(criterion="kll"), "kll"),
        (lambda d: d["decodes"]["extrap"].update(decode_with="both"), "both"),
        (lambda d: d["decodes"]["extrap"].update(threshold="low"), "threshold"),
        (lambda d: d["tables"]["extrapolation"]["rows"][2].update(decode="missing"), "missing"),
        (lambda d: d["tables"]["extrapolation"]["rows"][0].update(decode="extrap"), "trained RL run"),
        (lambda d: d["figures"]["replacement_curves"].update(x="Nope"), "Nope"),
        (lambda d: d["figures"]["token_histograms"].update(kind="violin"), "violin"),
    ],
)
def test_bad_decodings_and_figures_fail_with_the_key(edit, needle):
    data = _dlogp_data()
    edit(data)
    with pytest.raises(ValueError, match=needle):
        parse_paper(data, "dlogp.yaml")


def test_token_stats_direct_reading():
    g = torch.Generator().manual_seed(0)
    lr, lb = (
        torch.log_softmax(torch.randn(5, 7, generator=g), -1),
        torch.log_softmax(torch.randn(5, 7, generator=g), -1),
    )
    y = torch.tensor([0, 3, 6, 2, 2])
    st = token_stats(lr, lb, y)
    for n in range(5):
        pr, pb = lr[n].exp(), lb[n].exp()
        assert st["dlogp"][n].item() == pytest.approx((lr[n, y[n]] - lb[n, y[n]]).item(), abs=1e-6)
        assert st["kl_rl_base"][n].item() == pytest.approx(
            sum(pr[v].item() * (lr[n, v] - lb[n, v]).item() for v in range(7)), abs=1e-6
        )
        assert st["entropy_base"][n].item() == pytest.approx(
            -sum(pb[v].item() * math.log(pb[v].item()) for v in range(7)), abs=1e-6
        )


def test_replacement_curves_plot(tmp_path: Path):
    paper = load_paper(CONFIG_DIR / "papers" / "dlogp.yaml")
    table = paper.table("replacement")
    rng = np.random.default_rng(0)
    lines = []
    for row in table.rows:
        for col in ("AIME24", "Replaced"):
            m = float("nan") if (col == "Replaced" and row.decode is None) else float(rng.uniform(5, 60))
            lines.append({"row": row.label, "column": col, "ours_mean": m, "ours_lo": m - 2, "ours_hi": m + 2})
    out = plot_replacement_curves(pd.DataFrame(lines), paper, paper.figures["replacement_curves"], tmp_path / "fig.png")
    assert out.read_bytes()[:4] == b"\x89PNG" and out.stat().st_size > 10_000
