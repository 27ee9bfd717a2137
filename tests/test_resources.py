"""The resource model of paper-scale runs (creditlab.resources): its terms checked where a CPU can check them
(stand-in parameter counts, checkpoint bytes, the logits' entropy temporaries, verl's token budgets), its anchors
(each paper's published configuration fits the hardware the paper names; the in-memory DelTA credit pass at Paper
B's sizes does not), and the plan's refusal of a run that does not fit."""

from __future__ import annotations

import dataclasses
import io
from functools import lru_cache

import pytest
import torch
import yaml

from creditlab.config_compose import CONFIG_DIR
from creditlab.plan import build_plan, run_config
from creditlab.resources import estimate, load_cluster
from creditlab.resources.estimate import CKPT_BYTES_PER_PARAM, LOGIT_BYTES_INFER
from creditlab.resources.shapes import HUB_SHAPES, shape_of, standin_shape
from verl_cpu import peak_bytes

PIPELINE = {"papers": ["dlogp", "delta", "cancellation", "arca", "dfpo"], "seeds": [0], "results": "results"}


@lru_cache(maxsize=None)
def _plan(scale: str):
    return build_plan({**PIPELINE, "scale": scale}, validate=False)


def _cfg(scale: str, backbone: str, run: str) -> dict:
    plan = _plan(scale)
    key = next(k for k, r in plan.runs.items() if r.backbone == backbone and r.run == run)
    return run_config(plan.runs[key])


def _standin(family: str):
    """A random-init stand-in of ``family`` as scale smoke writes it (creditlab.models.standin's shapes)."""
    import transformers as tf

    from creditlab.models.standin import BASE, SHAPES, standin_tokenizer

    names = {"qwen3": "Qwen3", "qwen2": "Qwen2", "olmo3": "Olmo3"}[family]
    extra = dict(SHAPES[family])
    if family == "olmo3":
        extra |= {"layer_types": ["full_attention"] * BASE["num_hidden_layers"], "sliding_window": 4096}
    conf = getattr(tf, f"{names}Config")(**BASE, **extra, vocab_size=len(standin_tokenizer()))
    torch.manual_seed(0)
    return getattr(tf, f"{names}ForCausalLM")(conf).float()


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "olmo3"])
def test_parameter_count_is_the_standins(family):
    """Shape.params() (the count every memory and disk term scales with) is the stand-in's own tensor count."""
    model = _standin(family)
    assert standin_shape(family).params() == sum(p.numel() for p in model.parameters())


def test_checkpoint_bytes_are_a_saved_standins(tmp_path):
    """The disk term against a stand-in saved as verl saves an actor (the FSDP model and AdamW state dicts after a step,
    torch.save) and as final/ (save_pretrained's safetensors, float32 at smoke scale): the estimate of a smoke run is
    keep_checkpoints x the first plus the second, within 2%."""
    model = _standin("qwen3")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss.backward()
    opt.step()
    ckpt = 0
    for state in (model.state_dict(), opt.state_dict()):
        buf = io.BytesIO()
        torch.save(state, buf)
        ckpt += buf.getbuffer().nbytes
    model.save_pretrained(tmp_path / "final")
    final = (tmp_path / "final" / "model.safetensors").stat().st_size
    P = standin_shape("qwen3").params()
    assert ckpt == pytest.approx(CKPT_BYTES_PER_PARAM * P, rel=0.02)
    cfg = _cfg("smoke", "qwen3-8b-base", "dapo")
    res = estimate(cfg)
    keep = int(cfg["trainer"]["keep_checkpoints"])
    assert res.checkpoint_tb * 1e12 == pytest.approx(keep * ckpt + final, rel=0.02)
    assert res.kept_tb * 1e12 == pytest.approx(ckpt + final, rel=0.02)


def test_logits_term_is_verls_entropy_pass():
    """The log-prob phase's vocabulary term: beside the bf16 logits [B, V] (2 bytes each), verl's entropy_from_logits
    holds two more [B, V] bf16 tensors at its peak: LOGIT_BYTES_INFER - 2 bytes per entry, measured on a CPU."""
    from verl.utils.torch_functional import entropy_from_logits

    B, V = 256, 4096
    logits = torch.randn(B, V, dtype=torch.bfloat16)
    assert peak_bytes(lambda: entropy_from_logits(logits)) == pytest.approx((LOGIT_BYTES_INFER - 2) * B * V, rel=0.01)


@pytest.mark.parametrize("backbone,run", [("qwen3-8b-base", "delta"), ("qwen3-32b", "dfpo-g16")])
def test_token_budgets_are_the_launchers(backbone, run):
    """The micro-batch tokens the estimate sizes are the ones verl gets: the launcher's overrides merged with the
    plug-in's (which raises the update's budget for a group-coupled loss: DFPO at G = 16)."""
    from creditlab.engines.verl.launch import RunPaths, merge_overrides, override_key, verl_overrides
    from creditlab.engines.verl.plugin import plugin_overrides

    cfg = _cfg("paper", backbone, run)
    args = merge_overrides(verl_overrides(cfg, RunPaths.of(cfg, "results"), mlflow=False), plugin_overrides(cfg))
    given = {override_key(o): int(o.split("=", 1)[1]) for o in args if "max_token_len_per_gpu" in o}
    res = estimate(cfg)
    assert res.tokens_per_gpu == (
        given["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"],
        given["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"],
    )


def test_hub_shapes_give_the_configs_parameter_counts():
    """Every paper backbone has a published shape, and its count is the model config's params_b within 3% (Qwen3-1.7B:
    the hub's 2.0B counts its tied LM head twice; the model card says 1.7B)."""
    for path in sorted((CONFIG_DIR / "model").glob("*.yaml")):
        m = yaml.safe_load(path.read_text())
        if m.get("kind") != "hub":
            continue
        shape = shape_of({"scale": "paper", "model": m})
        want = float(m["arch"]["params_b"]) * 1e9
        if m["hf_id"] == "Qwen/Qwen3-1.7B-Base":
            want -= shape.vocab_size * shape.hidden_size
        assert shape.params() == pytest.approx(want, rel=0.03), m["hf_id"]
    assert set(HUB_SHAPES) >= {yaml.safe_load(p.read_text()).get("hf_id") for p in (CONFIG_DIR / "model").glob("q*")}


H100 = load_cluster()
B200 = dataclasses.replace(H100, gpu_mem_gb=180.0, peak_tflops=2250.0)
"""Paper B's 8 x B200 (180 GB HBM3e per GPU in an HGX B200: 1440 GB / 8; 2.25 dense bf16 PFLOP/s)."""


@pytest.mark.parametrize(
    "backbone,run,cluster",
    [
        ("qwen2.5-math-7b", "dlogp-ds-a0.2", H100),  # Paper A: the paper names no GPUs; the pipeline's H100 default
        ("qwen3-8b-base", "dlogp-ds-a0.1", H100),
        ("qwen3-8b-base", "delta", B200),  # Paper B: 8 x B200 [paper]
        ("qwen3-14b-base", "delta", B200),
        ("qwen2.5-math-7b", "qb-rb", H100),  # Paper C: none named
        ("qwen3-1.7b-base", "arca-r64", H100),  # Paper D: "a single H100-class GPU" [paper]
        ("qwen3-32b", "dfpo", H100),  # Paper E: none named
    ],
)
def test_published_configurations_fit_their_hardware(backbone, run, cluster):
    res = estimate(_cfg("paper", backbone, run), cluster)
    assert res.fits, res.why
    assert res.gpu_mem_gb_per_rank <= cluster.gpu_budget_gb


def test_delta_in_memory_credit_pass_does_not_fit_paper_b():
    """Paper B's DelTA runs stream their credit pass (the registered function has a ``stream``) and fit; the
    in-memory pass (every rollout's hidden states: 2048 rollouts / 4 data-parallel ranks = 512 per rank, padded to
    20480 tokens, d = 4096, bf16: 85.9 GB) fits neither an H100 nor the paper's B200, and the refusal says to
    stream it."""
    cfg = _cfg("paper", "qwen3-8b-base", "delta")
    assert estimate(cfg, B200).credit_pass == "streamed"
    for cluster in (H100, B200):
        res = estimate(cfg, cluster, credit_pass="in_memory")
        assert not res.fits and res.peak_phase == "credit"
        assert res.phases["credit"]["credit delta: padded hidden states"] == pytest.approx(
            512 * 20480 * 4096 * 2 / 1e9, abs=0.01
        )
        assert "streamed credit pass" in res.why and "GB" in res.why
    streamed = estimate(cfg, H100)
    assert streamed.fits and streamed.gpu_mem_gb_per_rank < res.gpu_mem_gb_per_rank - 80


def test_plan_refuses_a_run_that_does_not_fit():
    """A validated paper plan on a cluster whose GPUs leave 20 GB to the model: every ARCA run (vLLM alone takes
    0.6 x 80 GB) is refused with the numbers and what to change, and the tables that read them are not built; the
    resource table marks them."""
    plan = build_plan(
        {**PIPELINE, "papers": ["arca"], "scale": "paper", "seeds": [1337], "cluster": {"gpu_reserved_gb": 60}}
    )
    trained = [k for k, r in plan.runs.items() if r.trains]
    assert trained and set(trained) <= set(plan.refused_runs)
    why = plan.refused_runs[trained[0]]
    assert "does not fit" in why and "20.0 GB usable" in why and "change:" in why
    assert any("arca/" in n and "does not fit" in n for n in plan.notes())
    lines = plan.resource_lines(hub_bytes=4e9)
    assert any(trained[0] in line and line.endswith("NO") for line in lines)
    ok = build_plan({**PIPELINE, "papers": ["arca"], "scale": "paper", "seeds": [1337]})
    assert not ok.refused_runs and set(ok.resources) == set(trained)


def test_cluster_constants_are_checked():
    """An unknown key names the valid ones; a value out of its range is refused; snakemake's --config strings are
    read as numbers."""
    with pytest.raises(ValueError, match="gpu_mem_gb"):
        load_cluster({"gpu_memory": 80})
    with pytest.raises(ValueError, match=r"cluster.train_mfu=1.5: must be in \(0, 1\]"):
        load_cluster({"train_mfu": 1.5})
    with pytest.raises(ValueError, match="leaves nothing"):
        load_cluster({"gpu_mem_gb": "40", "gpu_reserved_gb": 40})
    assert load_cluster({"gpu_mem_gb": "141"}).gpu_mem_gb == 141.0
