"""The inspection jobs: print the plan's runs, or one run's resolved config."""

from __future__ import annotations

import yaml

from creditlab.plan import run_config


def show_plan(plan) -> None:
    """Print the planned runs, one line each (build the plan with validation to check every run config), a run the
    plan refuses to train marked ``REFUSED``; then what the plan leaves out and why (`Plan.notes`: the refused runs'
    keys and reasons with the tables, figures and analyses that read them; tables without a stand-in)."""
    for key, run in sorted(plan.runs.items()):
        refused = "REFUSED " if key in plan.refused_runs else ""
        print(f"{key:40s} {refused}method={run.method:10s} overrides={list(run.overrides)} tables={run.tables}")
    for note in plan.notes():
        print(note)


def show_config(plan, backbone: str, run_name: str, seed: int) -> None:
    """Print the resolved config of run (backbone, run_name, seed) of the plan as YAML."""
    print(yaml.safe_dump(run_config(plan.get(backbone, run_name, seed)), sort_keys=False))
