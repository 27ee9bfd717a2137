"""The inspection jobs: print the plan's runs, or one run's resolved config."""

from __future__ import annotations

import yaml

from creditlab.plan import run_config


def show_plan(plan) -> None:
    """Print the planned runs, one line each (build the plan with validation to check every run config), a run the
    plan refuses to train marked ``REFUSED``; then what the plan leaves out and why (`Plan.notes`: the refused runs'
    keys and reasons with the tables, figures and analyses that read them; tables without a stand-in); at paper scale
    the resource table (`Plan.resource_lines`: memory, hours and disk of every run, and the totals)."""
    for key, run in sorted(plan.runs.items()):
        refused = "REFUSED " if key in plan.refused_runs else ""
        print(f"{key:40s} {refused}method={run.method:10s} overrides={list(run.overrides)} tables={run.tables}")
    for note in plan.notes():
        print(note)
    if plan.resources:  # paper scale: what each run costs (creditlab.resources; docs/cluster.md "Resources")
        from creditlab.models.hub_cache import hub_cache_bytes
        from creditlab.plan import composed_configs

        fetched = [r for k, r in plan.runs.items() if k not in plan.refused_runs]  # refused runs fetch nothing
        hub = sum(hub_cache_bytes(composed_configs(fetched).values()).values())
        print("\n".join(plan.resource_lines(hub)))


def show_config(plan, backbone: str, run_name: str, seed: int) -> None:
    """Print the resolved config of run (backbone, run_name, seed) of the plan as YAML."""
    print(yaml.safe_dump(run_config(plan.get(backbone, run_name, seed)), sort_keys=False))
