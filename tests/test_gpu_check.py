"""The GPU acceptance check (tools/gpu_check) dry-run on the CPU as the device image would run it, without Ray,
verl, vLLM, Hydra, MLflow, Snakemake or math-verify: every case passes and every registered method is in it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_check"
BLOCKED = (
    "ray",
    "verl",
    "vllm",
    "hydra",
    "omegaconf",
    "mlflow",
    "snakemake",
    "math_verify",
    "transfer_queue",
    "tensordict",
)
"""Blocked in the dry run's process by this test itself (``sys.modules[name] = None``: an import raises, a
``find_spec`` probe answers None), whatever the script hides on its own."""


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    import gpu_check.configs
    import gpu_check.methods

    return gpu_check


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One dry run at the small sizes: (report dict, markdown text, completed process)."""
    out = tmp_path_factory.mktemp("gpu_check")
    args = ["--device", "cpu", "--size", "small", "--threads", "1", "--out", str(out)]
    boot = (
        "import runpy, sys\n"
        f"for name in {BLOCKED!r}:\n"
        "    sys.modules[name] = None\n"
        f"sys.argv = ['gpu_check', *{args!r}]\n"
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script finds src/ itself
    proc = subprocess.run(
        [sys.executable, "-c", boot], cwd=out, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    report = json.loads((out / "gpu_check.json").read_text()) if (out / "gpu_check.json").exists() else None
    md = (out / "gpu_check.md").read_text() if (out / "gpu_check.md").exists() else ""
    return report, md, proc


def test_dry_run_passes_every_check(dry_run):
    report, md, proc = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert report["ok"] and "**PASS**" in md
    failed = [(r["name"], r.get("error"), r.get("metrics")) for r in report["records"] if not r["ok"]]
    assert not failed, failed
    assert set(report["checks"]) == {"methods", "engine", "verl"}
    # a bf16-limited case is only ever the bf16 stress profile, with its reason; the engines' dtypes pass outright
    limited = [r for r in report["records"] if r.get("limited")]
    assert all(r["name"].startswith("bf16:") and len(r["limited"]) > 40 for r in limited)


def test_dry_run_covers_every_registered_method_and_method_config(dry_run, gpu_check):
    from creditlab.algos import registry

    report = dry_run[0]
    assert set(gpu_check.methods.KINDS) == set(registry._REGISTRIES), "a new registry kind: add it to KINDS"
    methods = report["checks"]["methods"]
    for kind in registry._REGISTRIES:
        names = registry.names(kind)
        assert methods["registered"][kind] == names
        assert methods["covered"][kind] == names, (
            f"{kind}: the dry run skipped {set(names) - set(methods['covered'][kind])}"
        )
        for profile in methods["profiles"]:
            ran = {r["method"] for r in report["records"] if r.get("kind") == kind and r.get("profile") == profile}
            assert ran == set(names), (kind, profile)
    configs = sorted(p.stem for p in (ROOT / "configs" / "method").glob("*.yaml"))
    names = {r["name"] for r in report["records"]}
    for m in configs:
        assert {f"bf16:method_config/{m}", f"engine:method_config/{m}", f"rl_steps/micro-s/{m}"} <= names, m
    for loss in registry.names("policy_loss"):
        assert f"engine:plugin_loss/{loss}[agg=token-mean]" in names
    for adv in registry.names("advantage"):
        assert f"bf16:plugin_advantage/{adv}" in names


def test_dry_run_imported_none_of_the_missing_packages_and_read_creditlab_from_src(dry_run):
    report = dry_run[0]
    iso = report["isolation"]
    assert set(BLOCKED) <= set(iso["hidden"]) and iso["imported"] == []
    assert Path(iso["creditlab"]) == ROOT / "src" / "creditlab"
    probe = report["checks"]["verl"]["imports"]
    engines = sorted(f"creditlab.engines.verl.{p.stem}" for p in (ROOT / "src/creditlab/engines/verl").glob("*.py"))
    assert sorted(probe) == [m for m in engines if not m.endswith("__init__")]
    assert probe["creditlab.engines.verl.main"].startswith("ModuleNotFoundError")  # verl's entry point: without them
    assert report["checks"]["verl"]["plugin_registries"].startswith("stand-in")


def test_dry_run_reports_its_numbers(dry_run):
    report, md = dry_run[0], dry_run[1]
    sampler = {r["name"]: r["metrics"] for r in report["records"] if r["name"].startswith("sampler/")}
    assert set(sampler) == {"sampler/micro-s", "sampler/micro-olmo"}
    for m in sampler.values():
        assert m["fp32_vs_transformers"]["token_agreement"] >= 0.99
        assert m["bf16_vs_fp32_teacher_forced"]["positions"] > 0
        assert 0.0 <= m["bf16_vs_fp32_free_running"]["token_agreement"] <= 1.0
    plugin = [r for r in report["records"] if r["name"].startswith("engine:plugin_loss/")]
    assert plugin and max(r["metrics"]["identity"]["rel_err"] for r in plugin) < 1e-9
    for section in ("## 1.", "## 2.", "## 3."):
        assert section in md


def test_composer_without_hydra_matches_hydra(gpu_check):
    """The device image has no Hydra: the check composes run configs itself, identically for every method config."""
    from creditlab.plan import compose

    for method in gpu_check.configs.method_names():
        for backbone in ("micro-s", "micro-olmo") if method == "dapo" else ("micro-s",):
            over = {"trainer.steps": 2, "trainer.batching": "sequential", "device": "cpu"}
            ours = gpu_check.configs.compose("micro", backbone, method, over)
            assert ours == compose("micro", backbone, method, [f"{k}={v}" for k, v in over.items()]), method
