"""Bring your own method (issue 32, docs/add-a-method.md), as the page says: the example package examples/rank-credit
installed with pip (a real wheel with its ``creditlab.methods`` entry point) into a directory of its own, its configs
found through ``$CREDITLAB_CONFIG_PATH``; its method trained at micro scale by the local engine and at smoke scale by
verl's own loop, its row built into a head-to-head table beside DAPO, its credit fidelity computed, all by the real
Snakemake targets, and nothing of it under src/creditlab/ or configs/. A method module that cannot be imported (a
broken entry point, a missing ``method.modules`` entry) is refused by name before any job starts."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from creditlab import paths

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "rank-credit"
NAME = "rankcredit"  # the example's method, credit function and package: nowhere in creditlab
PAPER = "rankcredit_h2h"
BACKBONE = {"micro": "micro-s", "smoke": "qwen3-8b-base"}


def _snakemake(env: dict, workdir: Path, targets: list[str], config: list[str], limit: int = 900) -> list[str]:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    return ["timeout", "-k", "30", str(limit), *cmd, "--cores", "2", *targets, "--config", *config]


def _check(proc, what: str, results: Path | None = None) -> None:
    if proc.returncode != 0:
        logs = sorted(results.rglob("logs/**/*.log"), key=lambda p: p.stat().st_mtime) if results else []
        tails = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in logs[-2:])
        pytest.fail(f"{what} exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}\n{tails}")


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The example package copied out of the repository and pip-installed (no dependencies: torch and creditlab are
    this environment's) into its own directory, put on PYTHONPATH as a second site directory."""
    root = tmp_path_factory.mktemp("byom")
    pkg = root / "rank-credit"
    shutil.copytree(EXAMPLE, pkg, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = root / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site)]
    _check(subprocess.run([*pip, str(pkg)], capture_output=True, text=True, timeout=300), "pip install")
    shutil.rmtree(pkg / "build", ignore_errors=True)  # pip's build tree: not part of what the user wrote
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p),
        "CREDITLAB_CONFIG_PATH": str(pkg / "configs"),
        "HF_HUB_OFFLINE": "1",
    }
    return SimpleNamespace(root=root, pkg=pkg, site=site, env=env)


@pytest.fixture(scope="module")
def built(user):
    """results/ of the example's paper at micro scale (the default target: its table, ledger and credit-fidelity
    analysis) and of its method's smoke run (verl, 2 steps). The smoke job mostly waits on Ray and verl starting, so
    the two DAGs run at once."""
    out = {}
    procs = {}
    for scale, targets in (("smoke", True), ("micro", False)):
        work = user.root / scale
        work.mkdir()
        out[scale] = work / "results"
        done = paths.fmt(paths.RUN_DONE, results=out[scale], scale=scale, backbone=BACKBONE[scale], run=NAME, seed=0)
        config = [f"scale={scale}", f"papers=[{PAPER}]", f"results={out[scale]}"]
        procs[scale] = subprocess.Popen(
            _snakemake(user.env, work, [str(done)] if targets else [], config),
            cwd=work,
            env=user.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for scale, proc in procs.items():
        stdout, stderr = proc.communicate()
        _check(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), f"the {scale} DAG", out[scale])
    return out


@pytest.fixture(scope="module")
def micro(built):
    return built["micro"]


def test_nothing_of_the_method_is_in_creditlab(user):
    """The method's name is in no file of src/, configs/ or workflow/; the install put only the example's package and
    its metadata (with the entry point) in its directory."""
    hits = [
        str(p.relative_to(REPO))
        for top in ("src", "configs", "workflow")
        for p in (REPO / top).rglob("*")
        if p.is_file() and p.suffix in (".py", ".yaml", ".yml", ".smk", ".json", ".md") and NAME in p.read_text()
    ]
    assert hits == []
    assert sorted(p.name for p in user.site.iterdir()) == ["creditlab_rankcredit-0.1.0.dist-info", NAME]
    eps = (user.site / "creditlab_rankcredit-0.1.0.dist-info" / "entry_points.txt").read_text()
    assert "[creditlab.methods]" in eps and "rankcredit = rankcredit.methods" in eps


def test_the_packages_own_test_of_its_equation_passes(user):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(user.pkg / "tests")],
        cwd=user.pkg,
        env=user.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout


def _run(results: Path, scale: str, run: str) -> tuple[dict, list[dict]]:
    where = dict(results=results, scale=scale, backbone=BACKBONE[scale], run=run, seed=0)
    cfg = yaml.safe_load((paths.fmt(paths.RUN_DIR, **where) / "config.yaml").read_text())
    lines = (paths.fmt(paths.RUN_DIR, **where) / "metrics.jsonl").read_text().splitlines()
    return cfg, [json.loads(x) for x in lines if x.strip()]


def test_local_engine_trains_the_method_with_its_weights(micro):
    """Micro scale: the run's resolved config names the package's credit function, and its weights vary over tokens
    (Gini > 0 every step) where DAPO's are uniform (0)."""
    cfg, steps = _run(micro, "micro", NAME)
    assert cfg["method"]["name"] == NAME and [c["name"] for c in cfg["method"]["credit"]] == [NAME]
    assert [s["step"] for s in steps] == list(range(int(cfg["trainer"]["steps"])))
    assert all(s["weight_gini"] > 0 for s in steps)
    assert all(s["weight_gini"] == 0 for s in _run(micro, "micro", "rc-dapo")[1])


def test_its_row_is_in_the_built_head_to_head_table_beside_dapo(micro):
    path = paths.fmt(paths.TABLE_CSV, results=micro, scale="micro", paper=PAPER, table="main")
    rows = list(csv.DictReader(path.open()))
    avg = {r["row"]: r for r in rows if r["column"] == "Avg"}
    assert sorted(avg) == ["DAPO", NAME]
    assert all(0 <= float(r["ours_mean"]) <= 100 and r["mlflow_run_ids"] for r in avg.values())
    claim = {r["row"]: r["verdict"] for r in rows if r["column"] == "Claim vs DAPO"}
    assert claim["DAPO"] == "reference" and claim[NAME] in ("beats rc-dapo", "worse than rc-dapo", "noise")


def test_its_credit_fidelity_is_scored_like_any_method(micro):
    path = paths.fmt(paths.ANALYSIS_JSON, results=micro, scale="micro", paper=PAPER, analysis="credit_fidelity")
    out = json.loads(path.read_text())
    by_label = {m["label"]: m for m in out["methods"]}
    assert sorted(by_label) == ["DAPO (uniform)", NAME]
    ours = by_label[NAME]
    assert math.isfinite(ours["spearman"]) and ours["delta_spearman"] != 0  # its credit differs from uniform credit


def test_verl_trains_the_method_at_smoke_scale(built):
    """Smoke scale: verl's own loop on this CPU (2 steps), the package's credit function loaded in verl's driver and
    Ray workers through the entry point: its weights vary over tokens in every step."""
    results = built["smoke"]
    done = paths.fmt(paths.RUN_DONE, results=results, scale="smoke", backbone=BACKBONE["smoke"], run=NAME, seed=0)
    record = json.loads(done.read_text())
    assert record["steps_done"] == record["steps_requested"] == 2
    cfg, steps = _run(results, "smoke", NAME)
    assert [c["name"] for c in cfg["method"]["credit"]] == [NAME] and cfg["trainer"]["engine"] == "verl"
    assert len(steps) == 2 and all(s["creditlab/weight_gini"] > 0 for s in steps)


def test_a_missing_method_module_is_refused_before_any_job(user, tmp_path):
    """A method config naming a module that is not installed (``modules:``): `snakemake -n` refuses, naming the
    module and the key."""
    conf = tmp_path / "configs"
    shutil.copytree(user.pkg / "configs", conf)
    method = yaml.safe_load((conf / "method" / f"{NAME}.yaml").read_text())
    (conf / "method" / f"{NAME}.yaml").write_text(yaml.safe_dump({**method, "modules": ["no_such_pkg.methods"]}))
    config = ["scale=micro", f"papers=[{PAPER}]", f"results={tmp_path / 'results'}"]
    proc = subprocess.run(
        _snakemake(user.env, tmp_path, ["-n"], config, limit=300),
        cwd=tmp_path,
        env={**user.env, "CREDITLAB_CONFIG_PATH": str(conf)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "method.modules" in err and "'no_such_pkg.methods'" in err and "ModuleNotFoundError" in err


def test_a_broken_entry_point_is_named_where_methods_are_loaded(tmp_path):
    """An installed package whose entry point names a module that does not import: importing creditlab's methods fails
    with the entry point, its package and the cause."""
    dist = tmp_path / "broken_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[creditlab.methods]\nbroken = broken_pkg.gone\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", "import creditlab.algos"], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    assert "MethodPluginError" in proc.stderr
    assert "entry point 'broken' = 'broken_pkg.gone' of package 'broken-pkg'" in proc.stderr
    assert "No module named 'broken_pkg'" in proc.stderr


def test_a_config_shadowing_creditlabs_own_is_refused(tmp_path):
    from creditlab.config_compose import extra_config_dirs

    (tmp_path / "method").mkdir()
    (tmp_path / "method" / "dapo.yaml").write_text("name: dapo\n")
    with pytest.raises(ValueError, match=r"method/dapo\.yaml has the name of creditlab's configs/method/dapo\.yaml"):
        extra_config_dirs(str(tmp_path))
    with pytest.raises(ValueError, match="is not a directory"):
        extra_config_dirs(str(tmp_path / "nope"))


def test_method_modules_named_in_the_config_reach_every_verl_process(user, monkeypatch, tmp_path):
    """A method config's ``modules`` are imported by the plan, and the verl launcher passes them (after any already in
    ``$CREDITLAB_METHOD_MODULES``) to verl's entry point, which forwards the variable to every Ray process."""
    from creditlab.algos.plugins import ENV_MODULES
    from creditlab.engines.verl import launch

    # verl's entry point sets VERL_USE_EXTERNAL_MODULES when imported: restored after the test
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", os.environ.get("VERL_USE_EXTERNAL_MODULES", ""))
    from creditlab.engines.verl.main import FORWARDED_ENV
    from creditlab.plan import PlanError, check_registered, compose

    cfg = compose("smoke", "qwen3-8b-base", "dapo")
    cfg["run"] = {"name": "dapo", "key": "smoke/qwen3-8b-base/dapo/s0", "experiment": "x"}
    cfg["method"]["modules"] = ["json", "email.utils"]  # importable, register nothing: this process stays as it is
    check_registered(cfg, "here")
    monkeypatch.setenv(ENV_MODULES, "csv")
    rp = launch.RunPaths.of(cfg, tmp_path / "results", model_path="/models/x")
    _, env = launch.verl_command(cfg, rp, python="/env/bin/python", plugin_overrides=lambda cfg: [])
    assert env[ENV_MODULES] == "csv,json,email.utils" and ENV_MODULES in FORWARDED_ENV
    cfg["method"]["modules"] = ["no_such_pkg_for_creditlab"]
    with pytest.raises(PlanError, match=r"here: method\.modules\) cannot be imported: ModuleNotFoundError"):
        check_registered(cfg, "here")
