"""Where the hub's snapshots and datasets go at paper scale (one setting, `hub_cache`), and the hub cache's size from
the backbones' configs (creditlab.models.hub_cache)."""

from __future__ import annotations

import pytest
import yaml

from creditlab import cli
from creditlab.config_compose import CONFIG_DIR
from creditlab.models.hub_cache import hub_cache_bytes, hub_cache_env, snapshot_bytes


def _models() -> list[dict]:
    return [yaml.safe_load(p.read_text()) for p in sorted((CONFIG_DIR / "model").glob("*.yaml"))]


def test_hub_cache_size_from_the_backbones_configs():
    hub = [m for m in _models() if m["kind"] == "hub"]
    assert len(hub) == 9 and all(snapshot_bytes(m) == 0 for m in _models() if m["kind"] != "hub")
    qwen8b = next(m for m in hub if m["name"] == "qwen3-8b-base")
    assert snapshot_bytes(qwen8b) == pytest.approx(8.2e9 * 2 * 1.02)  # bf16 weights + 2%
    sizes = hub_cache_bytes({"model": m} for m in hub + hub)  # runs sharing a backbone share its snapshot
    assert len(sizes) == 9 and 0.35e12 < sum(sizes.values()) < 0.45e12  # the issue's ~0.4 TB
    with pytest.raises(ValueError, match="params_b"):
        snapshot_bytes({"name": "x", "kind": "hub", "arch": {}})


def test_hub_cache_setting_exports_both_caches():
    env, note = hub_cache_env("$SCRATCH/creditlab/hub", {"SCRATCH": "/lustre/u"})
    assert env == {
        "HF_HOME": "/lustre/u/creditlab/hub/huggingface",
        "CREDITLAB_HUB_RAW": "/lustre/u/creditlab/hub/datasets",
    }
    assert "HF_HOME=/lustre/u/creditlab/hub/huggingface" in note
    # a variable already set wins (a site's own HF_HOME keeps its snapshots), and the note says so
    env, note = hub_cache_env("${SCRATCH}/hub", {"SCRATCH": "/lustre/u", "HF_HOME": "/site/hf"})
    assert env == {"CREDITLAB_HUB_RAW": "/lustre/u/hub/datasets"} and "HF_HOME=/site/hf (from the environment)" in note
    # no setting, or an unset variable: nothing exported, and the note says where snapshots go
    for setting in (None, "$SCRATCH/creditlab/hub"):
        env, note = hub_cache_env(setting, {})
        assert env == {} and "~/.cache/huggingface" in note
    with pytest.raises(ValueError, match="not an absolute path"):
        hub_cache_env("scratch/hub", {})


def test_the_cli_uses_the_setting_at_paper_scale(tmp_path, monkeypatch):
    """`python -m creditlab --scale paper <verb>` by hand (e.g. `prepare --download-only` on a login node) caches
    where the pipeline's jobs do."""
    pipeline = yaml.safe_load((CONFIG_DIR / "pipeline.yaml").read_text()) | {"hub_cache": str(tmp_path / "hub")}
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(pipeline))
    for var in ("HF_HOME", "CREDITLAB_HUB_RAW"):
        monkeypatch.delenv(var, raising=False)
    seen = {}
    monkeypatch.setattr(
        cli, "cmd_plan", lambda a: seen.update({v: cli.os.environ.get(v) for v in ("HF_HOME", "CREDITLAB_HUB_RAW")})
    )
    build = cli.build_parser

    def parser():
        p = build()
        p._subparsers._group_actions[0].choices["plan"].set_defaults(fn=cli.cmd_plan)  # the stub above
        return p

    monkeypatch.setattr(cli, "build_parser", parser)
    cli.main(["--pipeline-config", str(tmp_path / "pipeline.yaml"), "--scale", "paper", "plan"])
    assert seen == {"HF_HOME": str(tmp_path / "hub/huggingface"), "CREDITLAB_HUB_RAW": str(tmp_path / "hub/datasets")}
