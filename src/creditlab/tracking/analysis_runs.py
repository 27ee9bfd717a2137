"""A built analysis in MLflow: one run per (scale, paper, analysis) in its paper's experiment.

The run (key ``{scale}/analysis/{paper}/{name}``, tags kind=analysis, paper, analysis, analysis_kind, scale) holds
the analysis' Markdown as its description, its scalar results as metrics (step 0; the kind module's optional
``metrics(result) -> {name: float}``), its parameters and start (params) and its files (Markdown, figure, JSON) as
artifacts; its start, run, commit and params are tags (they change between builds). Re-running an analysis resumes
its run (tracking offline: the local jsonl beside the outputs records
everything, as for training runs)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from creditlab.tracking.mlflow_tracker import (
    MAX_TAG_VAL_LENGTH,
    NOTE_TAG,
    Tracker,
    mlflow_key,
)


def analysis_run_key(scale: str, paper: str, name: str) -> str:
    return f"{scale}/analysis/{paper}/{name}"


def publish_analysis(
    results_dir: str | Path,
    experiment: str,
    scale: str,
    paper: str,
    name: str,
    kind: str,
    result: Mapping[str, Any],
    metrics: Mapping[str, float],
    markdown: str,
    files: Sequence[Path],
    local_dir: str | Path,
) -> str | None:
    """Log one analysis (module docstring); returns its MLflow run id (None offline)."""
    prov = result.get("provenance") or {}
    key = analysis_run_key(scale, paper, name)
    # what may change between builds of one analysis (its commit, its params) are tags: MLflow params are immutable
    tags = {
        "kind": "analysis",
        "paper": paper,
        "analysis": name,
        "analysis_kind": kind,
        "scale": scale,
        "start": prov.get("start"),
        "analysis_run_key": prov.get("run_key"),
        "analysis_commit": prov.get("commit"),
        "analysis_params": json.dumps(prov.get("params") or {}, default=str, ensure_ascii=False),
    }
    tracker = Tracker.start(
        results_dir, experiment, key, f"analysis {paper}/{name}", tags=tags, params={}, local_dir=local_dir
    )
    with tracker:
        tracker.set_tags({k: v for k, v in tags.items() if k.startswith("analysis_") or k == "start"})
        note = (
            markdown
            if len(markdown) <= MAX_TAG_VAL_LENGTH
            else (markdown[: MAX_TAG_VAL_LENGTH - 80] + "\n\n… cut here; the whole analysis is in the artifacts")
        )
        tracker.set_tags({NOTE_TAG: note})
        clean = {mlflow_key(k): float(v) for k, v in metrics.items()}
        if clean:
            tracker.log_metrics(clean, step=0)
        for path in files:
            if Path(path).is_file():
                tracker.log_artifact(path)
        run_id = tracker.run_id
    return run_id
