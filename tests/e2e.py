"""The micro end-to-end DAG shared by test modules (session-scoped fixtures, imported by conftest.py).

One DAG run (a few minutes on 2 cores) feeds the e2e checks (tests/test_pipeline_e2e.py) and the
browser tests of the MLflow UI and the HTML report (tests/test_browser.py); later fixtures add papers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def _snakemake(*args: str, results: Path, timeout: int = 2400, papers: str = "dlogp") -> subprocess.CompletedProcess:
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    # own working directory: no lock shared with a user's run in the repository
    # targets and flags before --config, which takes every following word as a key=value pair
    cmd = [
        SNAKEMAKE,
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(results.parent),
        "--cores",
        "2",
        *args,
        "--config",
        "scale=micro",
        f"results={results}",
        f"papers=[{papers}]",
    ]
    return subprocess.run(cmd, cwd=results.parent, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def micro_results(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("e2e") / "results"
    proc = _snakemake(results=results)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    (results.parent / "snakemake.log").write_text(proc.stdout + proc.stderr)  # the jobs as Snakemake started them
    return results


@pytest.fixture(scope="session")
def delta_results(micro_results) -> Path:
    """Paper B's transfer table and both figures on top of Paper A's results (its diagnostics rows are
    one trainer step each in tests/test_credit_delta.py; the whole DAG is `make run`)."""
    targets = [
        str(micro_results / f"micro/{t}")
        for t in (
            "tables/delta/transfer.csv",
            "figures/delta/figure_token_selection.png",
            "figures/delta/figure_token_clouds.png",
            "tables/dfpo/compute.csv",
        )
    ]
    proc = _snakemake(*targets, results=micro_results, papers="dlogp,delta,dfpo")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    # Paper E's compute table reads training metrics only: no evaluation job ran for it (checked here, before
    # dfpo_main_results evaluates the same runs for Paper E's main table)
    assert not (micro_results / "micro/evals/micro-s/dfpo").exists()
    return micro_results


@pytest.fixture(scope="session")
def dfpo_main_results(delta_results) -> Path:
    """Paper E's main table on top of Paper B's results: its LiveCodeBench v6 column is the tiny code suite, judged
    by executing the generated programs (code_exec), next to the math suites."""
    proc = _snakemake(
        str(delta_results / "micro/tables/dfpo/main.csv"), results=delta_results, papers="dlogp,delta,dfpo"
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return delta_results


@pytest.fixture(scope="session")
def cancellation_results(delta_results) -> Path:
    """Paper C on top: the broken-cancellation table (the baseline run is Paper B's `dapo`, reused), a
    QB+RB run, and every analysis (the whole Table 2 is `make run`)."""
    micro = delta_results / "micro"
    targets = [str(micro / "tables/cancellation/broken.csv"), str(micro / "runs/micro-s/qb-rb/s0/DONE")]
    targets += [
        str(micro / f"analyses/cancellation/{a}.json")
        for a in ("flipping", "flipping_trained", "value", "value_budget", "coupling")
    ]
    baseline = micro / "runs/micro-s/dapo/s0/DONE"
    trained_at = baseline.stat().st_mtime_ns
    proc = _snakemake(*targets, results=delta_results, papers="dlogp,delta,dfpo,cancellation")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    assert baseline.stat().st_mtime_ns == trained_at  # Paper B's baseline run reused, not retrained
    return delta_results


@pytest.fixture(scope="session")
def report_html(micro_results) -> Path:
    """`snakemake --report` of the micro DAG (Paper A) as one self-contained HTML file."""
    out = micro_results / "report.html"
    proc = _snakemake("--report", str(out), results=micro_results, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out
