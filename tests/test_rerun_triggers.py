"""What re-runs a finished training job under the SLURM profile's re-run triggers, shown by `snakemake -n`.

A finished job is made cheaply: its outputs (and those upstream) are written, then `snakemake --touch --forceall`
records Snakemake's metadata for them, as a real run would (rule text, params, input, software environment). Then the
pipeline moves: a copy of the checkout (Snakefile, workflow/, configs/, src/: its package on PYTHONPATH) run by
another interpreter (a second virtual environment on .venv's packages), with every shell line re-worded. Under the
profile's triggers that plans nothing; under Snakemake's defaults it re-plans the training. A changed run config
(trainer.steps of the micro scale) re-plans the training under the profile too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = "micro/runs/micro-m/dapo-ds/s0"  # a training run of Paper A's tables at micro scale
OUTPUTS = [  # upstream first: the DAG's order of modification times
    "micro/data/prep_report.json",
    ".mlflow_ready",
    "micro/models/micro-m/base/DONE",
    f"{RUN}/DONE",
    f"{RUN}/metrics.jsonl",
]


def _snakemake(python: str, checkout: Path, work: Path, *args: str, pythonpath: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PYTHONPATH"))}
    env["HF_HUB_OFFLINE"] = "1"
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    results = work / "results"
    cmd = [python, "-m", "snakemake", "--snakefile", str(checkout / "Snakefile"), "--directory", str(work)]
    cmd += ["--cores", "1", *args, str(results / RUN / "DONE")]
    cmd += ["--config", "scale=micro", f"results={results}", "papers=[dlogp]"]
    proc = subprocess.run(
        ["timeout", "-k", "5", "200", *cmd], cwd=work, env=env, capture_output=True, text=True, timeout=220
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def _planned(out: str) -> dict[str, int]:
    """Jobs a dry run plans, by rule (its `Job stats` table); {} for nothing to be done."""
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1]
    return {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", table, re.M) if rule != "total"}


def _other_interpreter(tmp: Path) -> str:
    """A Python at another path (a venv of the same base interpreter) that imports .venv's packages."""
    venv = tmp / "other-env"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    site = next((venv / "lib").glob("python3*/site-packages"))
    ours = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
    (site / "creditlab_venv.pth").write_text(f"import site; site.addsitedir({str(ours)!r})\n")
    return str(venv / "bin" / "python")


def test_moved_checkout_other_interpreter_and_reworded_rules_rerun_nothing_but_a_changed_config_does(tmp_path):
    work = tmp_path / "work"
    for name in OUTPUTS:  # a finished training job and what it read
        path = work / "results" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n")
    _snakemake(str(Path(sys.executable).with_name("python")), REPO, work, "--touch", "--forceall")

    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(REPO / "Snakefile", moved / "Snakefile")
    for name in ("workflow", "configs", "src"):
        shutil.copytree(REPO / name, moved / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for smk in (moved / "workflow/rules").glob("*.smk"):  # re-word every shell line, same commands
        text = smk.read_text().replace(" > {log} 2>&1", " >{log} 2>&1")
        smk.write_text(text.replace("train --backbone {wildcards.backbone} --run {wildcards.run}", "train --run "
                                    "{wildcards.run} --backbone {wildcards.backbone}"))  # fmt: skip
    python = _other_interpreter(tmp_path)
    profile = ("--profile", str(moved / "workflow/profiles/slurm"), "-n")

    out = _snakemake(python, moved, work, *profile, pythonpath=moved / "src")
    assert _planned(out) == {}, out[-3000:]
    # the same move under Snakemake's default triggers (code, software-env too): the training is planned again
    out = _snakemake(python, moved, work, "-n", pythonpath=moved / "src")
    assert _planned(out).get("train") == 1, out[-3000:]

    scale = moved / "configs/scale/micro.yaml"
    text = scale.read_text()
    assert text.count("  steps: 4\n") == 1
    scale.write_text(text.replace("  steps: 4\n", "  steps: 5\n"))  # the run's trainer.steps: another run
    out = _snakemake(python, moved, work, *profile, pythonpath=moved / "src")
    assert _planned(out) == {"train": 1}, out[-3000:]
    assert re.search(r"reason: Params have changed since last execution", out), out[-3000:]
