"""The table jobs: a paper's tables, its reproduction ledger and its figures, from built evaluations and runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from creditlab import paths
from creditlab.plan import BASE_RUN, compose, run_config
from creditlab.tables.build import build_table, write_table
from creditlab.tables.figures import (
    plot_bars,
    plot_replacement_curves,
    plot_scatter,
    plot_token_credit,
    plot_training_curves,
)
from creditlab.tables.frame import row_run_ids
from creditlab.tables.html import write_markdown_html
from creditlab.tables.ledger import build_ledger, verdict_summary, write_ledger
from creditlab.tables.token_credit import load_token_credit, overall_mean, rank_tokens, write_token_credit
from creditlab.tracking.mlflow_tracker import tracking_uri
from creditlab.tracking.table_runs import publish_table


def eval_k(plan, paper: str) -> int:
    """The evaluation's k (samples per question) of a paper's runs at the plan's scale: the eval.k of its first planned
    run (every run of a paper shares its evaluation settings; at tiny/micro scale, the scale's k)."""
    run = next((r for r in plan.runs.values() if paper in r.papers), None)
    if run is None:
        return compose(plan.scale, plan.backbones[0])["eval"]["k"]
    return int(run_config(run)["eval"]["k"])


def table(results: str | Path, plan, paper: str, name: str) -> None:
    """Build table ``name`` of ``paper`` (CSV + Markdown + HTML, ours ± CI beside the paper) and its training curves
    over the paper's seeds at the plan's scale; publish it as the table's MLflow run."""
    spec = plan.papers[paper]
    tab = spec.table(name)
    k = eval_k(plan, paper)
    fill = dict(results=results, scale=plan.scale, paper=paper, table=name)
    seeds = plan.paper_seeds(paper)
    df = build_table(
        spec,
        name,
        plan.scale,
        seeds,
        Path(results) / plan.scale / "evals",
        k,
        runs_dir=Path(results) / plan.scale / "runs",
    )
    csv, md = paths.fmt(paths.TABLE_CSV, **fill), paths.fmt(paths.TABLE_MD, **fill)
    write_table(df, tab, spec, csv, md)
    html = write_markdown_html(md, paths.fmt(paths.TABLE_HTML, **fill), title=f"{paper}: table {name}")
    series = {}
    for row in tab.rows:
        if row.run == BASE_RUN:
            continue
        backbone = spec.backbone_for(row.backbone, plan.scale)
        for seed in seeds:
            series[f"{row.label} · {backbone} · s{seed}"] = paths.fmt(
                paths.RUN_METRICS, results=results, scale=plan.scale, backbone=backbone, run=row.run, seed=seed
            )
    curves = paths.fmt(paths.CURVES_PNG, **fill)
    plot_training_curves(series, curves, keys=tab.curves, title=f"{spec.title}: {name}")
    link = publish_table(
        Path(results),
        spec.experiment,
        plan.scale,
        paper,
        name,
        df,
        md.read_text(),
        [csv, md, html, curves],
        local_dir=csv.parent / f".{name}_mlflow",
        run_ids=row_run_ids(df),
    )
    if link:
        print(f"MLflow: table run {paper}/{name}, compare its rows at <mlflow ui>/{link}", file=sys.stderr)


def ledger(results: str | Path, plan, paper: str) -> None:
    """Build a paper's reproduction ledger (Markdown + CSV + HTML): every cell of its tables built at the scale with
    provenance, and its claims tested by a paired bootstrap (creditlab.tables.ledger). Reads the table CSVs."""
    spec = plan.papers[paper]
    k = eval_k(plan, paper)
    tables = {
        name: pd.read_csv(
            paths.fmt(paths.TABLE_CSV, results=results, scale=plan.scale, paper=paper, table=name),
            keep_default_na=False,
            na_values=[""],
        )
        for name in spec.built_at(plan.scale)
    }
    root = Path(results) / plan.scale
    df, verdicts = build_ledger(
        spec, plan.scale, plan.paper_seeds(paper), tables, root / "evals", k, root / "runs", tracking_uri(Path(results))
    )
    fill = dict(results=results, scale=plan.scale, paper=paper)
    md = paths.fmt(paths.LEDGER_MD, **fill)
    write_ledger(spec, plan.scale, df, verdicts, paths.fmt(paths.LEDGER_CSV, **fill), md)
    write_markdown_html(md, paths.fmt(paths.LEDGER_HTML, **fill), title=f"{paper}: reproduction ledger")
    print(verdict_summary(verdicts))


def figure(results: str | Path, plan, paper: str, name: str) -> None:
    """Draw figure ``name`` of ``paper`` (configs/papers/<paper>.yaml `figures`): replacement_curves, bars and
    scatter from a table's CSV; token_credit from a run's token_credit.json (PNG + Markdown/CSV table)."""
    spec = plan.papers[paper]
    if name not in spec.figures:
        raise SystemExit(f"paper {paper!r} has no figure {name!r}; choices: {sorted(spec.figures)}")
    fig = spec.figures[name]
    if fig.kind == "token_histograms":
        raise SystemExit(f"figure {name!r} ({fig.kind}) is drawn by `diagnose`, not `figure`")
    if name not in spec.figures_at(plan.scale):
        raise SystemExit(
            f"figure {name!r} cannot be drawn at scale {plan.scale!r}: its table or column has "
            f"no benchmark with a stand-in there; drawable: {spec.figures_at(plan.scale)}"
        )
    fill = dict(results=results, scale=plan.scale, paper=paper, table=fig.table, figure=name)
    png = paths.fmt(paths.FIGURE_PNG, **fill)
    if fig.kind == "token_credit":
        token_credit_figure(results, plan, paper, fig, png, fill)
        return
    df = pd.read_csv(paths.fmt(paths.TABLE_CSV, **fill))
    plot = {"replacement_curves": plot_replacement_curves, "bars": plot_bars, "scatter": plot_scatter}[fig.kind]
    plot(df, spec, fig, png)


def token_credit_figure(results: str | Path, plan, paper: str, fig, png: Path, fill: dict[str, Any]) -> None:
    """DelTA's token clouds: top / bottom tokens by mean credit weight of the run of the paper's first seed."""
    spec = plan.papers[paper]
    run = plan.get(spec.backbone_for(fig.backbone, plan.scale), fig.run, plan.paper_seeds(paper)[0])
    rfill = dict(results=results, scale=run.scale, backbone=run.backbone, run=run.run, seed=run.seed)
    data = load_token_credit(paths.fmt(paths.RUN_TOKEN_CREDIT, **rfill))
    done_path = paths.fmt(paths.RUN_DONE, **rfill)
    done = json.loads(done_path.read_text()) if done_path.is_file() else {}
    ranking = rank_tokens(data, fig.top, fig.min_count)
    reference = overall_mean(data)
    title = f"{spec.title.split(':')[0]}: {fig.name} — {run.key}" + (
        "" if run.scale == "paper" else f" (scale {run.scale}: not the paper's tokens)"
    )
    plot_token_credit(ranking, png, title, weight=data["weight"], reference=reference)
    meta = {
        "paper_title": spec.title,
        "figure": fig.name,
        "caption": fig.caption,
        "scale": run.scale,
        "paper_backbone": fig.backbone,
        "backbone": run.backbone,
        "run": run.run,
        "seed": run.seed,
        "top": fig.top,
        "min_count": fig.min_count,
        "run_key": run.key,
        "mlflow_run_id": done.get("mlflow_run_id") or "",
        "commit": done.get("commit") or "",
    }
    write_token_credit(ranking, data, meta, paths.fmt(paths.FIGURE_MD, **fill), paths.fmt(paths.FIGURE_CSV, **fill))
