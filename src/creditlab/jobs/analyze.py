"""The `analyze` job: one declared analysis of a paper config (JSON + Markdown + PNG with provenance)."""

from __future__ import annotations

from pathlib import Path

from creditlab.analysis.runner import run_analysis
from creditlab.jobs.common import setup


def analyze(results: str | Path, plan, paper: str, name: str, *, quiet: bool = False) -> None:
    """Run analysis ``name`` of ``paper`` at the plan's scale (:func:`run_analysis`); an unknown paper or analysis,
    or a missing input (base snapshot, training set, checkpoint), stops the job saying which."""
    if paper not in plan.papers or name not in plan.papers[paper].analyses:
        choices = sorted(plan.papers[paper].analyses) if paper in plan.papers else sorted(plan.papers)
        raise SystemExit(f"unknown paper/analysis {paper}/{name}; choices: {choices}")
    setup()
    try:
        run_analysis(results, plan, paper, name, progress=not quiet)
    except FileNotFoundError as err:  # a missing base snapshot, training set or checkpoint: say which
        raise SystemExit(f"analyze {paper}/{name}: {err}") from None
