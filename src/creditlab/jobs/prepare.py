"""The `prepare` job: the data of a scale (the tiny world; the hub datasets at paper and smoke scale)."""

from __future__ import annotations

import json
from pathlib import Path

from creditlab import paths
from creditlab.data import prepare_paper
from creditlab.plan import check_world, compose


def prepare_hub(results: str | Path, plan, *, download_only: bool = False) -> None:
    """Paper and smoke scale: fetch the hub datasets of the planned runs and tables into $CREDITLAB_HUB_RAW (default
    results/paper/raw; nothing is downloaded with HF_HUB_OFFLINE=1) and prepare them:
    results/paper/data/verl/<dataset>/{train,val}.parquet, suites/<suite>.parquet, the contamination report,
    prep_report.json (creditlab.data.prepare_paper). ``download_only``: fetch, prepare nothing."""
    try:
        report = prepare_paper.run(plan, results, download_only=download_only)
    except prepare_paper.PaperDataError as err:
        raise SystemExit(f"prepare at scale {plan.scale!r}: {err}") from None
    summary = {"raw_dir": report["raw_dir"], "downloads": {h: r["status"] for h, r in report["downloads"].items()}}
    if not download_only:
        summary |= {
            "suites": {s: r["count"] for s, r in report["suites"].items()},
            "training_sets": {d: r["counts"] for d, r in report["training_sets"].items()},
        }
    print(json.dumps(summary, indent=1))


def prepare_tiny(
    results: str | Path, scale: str, backbone: str, *, download_only: bool = False, world: str | None = None
) -> None:
    """Tiny and micro scale: generate the tiny world (train/val splits, held-out suites with overlap 0, tokenizer)
    under results/<scale>/data from the data config ``world`` (configs/data/<world>.yaml; the pipeline's ``world``;
    None: the scale's default, ``check_world``) as ``backbone``'s runs compose it (any backbone: the data do not
    depend on it)."""
    if download_only:
        raise SystemExit(
            f"prepare --download-only is for scale 'paper' (hub datasets); scale {scale!r} downloads nothing"
        )
    from creditlab.data.prepare import prepare_tiny as generate  # torch and transformers: the tiny world only

    cfg = compose(scale, backbone, overrides=[f"data={check_world(world, scale)}"])
    out = paths.fmt(paths.DATA_DIR, results=results, scale=scale)
    report = generate(cfg["data"], out)
    print(json.dumps({k: report[k] for k in ("counts", "overlap") if k in report}, indent=1))
