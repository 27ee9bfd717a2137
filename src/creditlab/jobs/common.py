"""What the jobs share: setup, atomic JSON, model loading (lm/io.py), a run's MLflow parent and tags, its sources.

Imports of transformers (and of modules that import it) stay inside the functions that need them, after
:func:`setup`: huggingface_hub reads ``HF_HUB_OFFLINE`` when it is first imported.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from creditlab.lm.io import load_model, load_tokenizer  # noqa: F401  (re-exported: the jobs' loaders)
from creditlab.models.sources import run_sources
from creditlab.tracking.mlflow_tracker import ParentRun, Tracker
from creditlab.tracking.provenance import git_commit


def setup(cfg: dict[str, Any] | None = None) -> None:
    """Torch threads (``cfg["threads"]``, default 1) and ``HF_HUB_OFFLINE=1`` unless set."""
    torch.set_num_threads(int((cfg or {}).get("threads", 1)))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def judging_workers(env: dict[str, str] | None = None) -> int:
    """Reward worker processes of an evaluation job: the cores it was granted but one (the sampler's client). SLURM's
    ``SLURM_CPUS_PER_TASK`` (the profile's cpus_per_task of the evaluate rules), else the cores this process may run
    on (``os.sched_getaffinity``: a Snakemake job on a workstation, a container's CPU set); at least one."""
    env = os.environ if env is None else env
    raw = env.get("SLURM_CPUS_PER_TASK", "")
    cores = int(raw) if raw.isdigit() else len(os.sched_getaffinity(0))
    return max(1, cores - 1)


def write_json(obj: Any, path: Path) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def parent_run(run):
    """The MLflow parent run (its first table) of a planned run, or None."""
    where = run.parent_table
    return ParentRun.of_table(run.scale, *where) if where else None


def start_run_tracker(results: str | Path, run, cfg: dict[str, Any], local_dir: Path) -> Tracker:
    """Create or resume the MLflow run of a planned run (named and keyed by ``run.key``, its tags, the resolved config
    as params, under its table's parent run); ``local_dir`` holds the offline fallback. Training and evaluation log
    into this same run."""
    return Tracker.start(
        Path(results),
        run.experiment,
        run.key,
        run.key,
        tags=run_tags(run, cfg),
        params=cfg,
        local_dir=local_dir,
        parent=parent_run(run),
    )


def run_tags(run, cfg: dict[str, Any]) -> dict[str, str]:
    """The MLflow tags of a planned run."""
    return {
        "paper": run.papers[0] if run.papers else "",
        "papers": ",".join(run.papers),
        "table": ",".join(run.tables),
        "method": run.method,
        "run": run.run,
        "backbone": run.backbone,
        "seed": str(run.seed),
        "scale": run.scale,
        "git_commit": git_commit(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
    }


def sources(run, cfg: dict[str, Any], results: str | Path):
    """The run's models, tokenizer, records and prompt rendering at its scale (creditlab.models.sources); a missing
    base model (the `warmup` job has not run) stops the job with that message."""
    try:
        return run_sources(run, cfg, results)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None
