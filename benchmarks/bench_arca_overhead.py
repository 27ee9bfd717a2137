"""ARCA's step overhead over uniform token weighting, both LoRA RL, in the same run on the same rollout batches.

Paper D computes ARCA's h^base "once per minibatch via an extra no-grad forward pass with the adapter
disabled", the same call a KL regulariser or divergence weighting already needs. In our engine the
uniform, surprisal and entropy-reduction weightings run no reference pass, ARCA and divergence run one
(shared: ref log-probs and h^base from the same forward). So ARCA over uniform = one no-grad forward +
the residual norms + the normalisation; this measures it.

Per step: one rollout batch is generated (LoRA merged into the weights) and scored once by the uniform
arm (timed: the part both methods share), then each method learns from it on its own copy of the model
and adapter (old forward, reference forward, credit, PPO update), the order of the two alternating from
step to step so that drift in machine speed cancels. Reports the overhead on the whole step and on the
learning part with a bootstrap 95% CI over steps (paired), the reference forward's and ARCA's weight
computation's shares of the uniform step, and the forward passes of each arm. Writes
benchmarks/results/arca_overhead.json.

    python benchmarks/bench_arca_overhead.py [--steps 30] [--backbone tiny-s] [--rank 8] [--results results]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from creditlab import paths
from creditlab.data.io import read_records
from creditlab.data.prepare import prepare_tiny
from creditlab.engines.local.trainer import Trainer
from creditlab.models.tiny import build_model
from creditlab.plan import compose
from creditlab.rewards.scorer import RewardScorer

ARMS = ("arca_uniform", "arca")  # configs/method/: GRPO + LoRA, weights w = 1/T vs ARCA's residual weights


def _count_forwards(model) -> list[int]:
    calls: list[int] = []
    inner = model.model
    original = inner.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    inner.forward = counted
    return calls


def _ci(x: np.ndarray, n_boot: int = 2000) -> list[float]:
    rng = np.random.default_rng(0)
    means = [x[rng.integers(0, len(x), len(x))].mean() for _ in range(n_boot)]
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--backbone", default="tiny-s")
    ap.add_argument("--rank", type=int, default=None, help="LoRA rank (default: the scale's trainer.lora.rank)")
    ap.add_argument("--results", default="results")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "arca_overhead.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    overrides = [f"trainer.lora.rank={a.rank}", f"trainer.lora.alpha={2 * a.rank}"] if a.rank else []
    cfgs = {m: compose("tiny", a.backbone, m, overrides) for m in ARMS}
    lcfg = cfgs["arca"]["trainer"]["lora"]
    data_dir = paths.fmt(paths.DATA_DIR, results=a.results, scale="tiny")
    base_dir = paths.fmt(paths.BASE_DIR, results=a.results, scale="tiny", backbone=a.backbone)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        if not (data_dir / "train.parquet").exists():
            data_dir = Path(tmp) / "data"
            prepare_tiny(cfgs["arca"]["data"], data_dir)
        tok = AutoTokenizer.from_pretrained(str(data_dir / "tokenizer"))
        if (base_dir / "DONE").exists():
            model, source = AutoModelForCausalLM.from_pretrained(str(base_dir)), "warmed-up base"
        else:
            arch = cfgs["arca"]["model"]["arch"]
            model = build_model(arch, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
            source = "random init"
        n_base = sum(p.numel() for p in model.parameters())
        records = read_records(data_dir / "train.parquet")
        rows = []
        with RewardScorer(cfgs["arca"]["trainer"]["reward"]) as scorer:
            arms = {m: Trainer(cfg, copy.deepcopy(model), tok, records, scorer, Path(tmp) / m, progress=False)
                    for m, cfg in cfgs.items()}
            n_adapter = sum(p.numel() for p in arms["arca"].params)
            forwards = {m: _count_forwards(tr.model) for m, tr in arms.items()}
            for step in range(a.steps):
                t0 = time.perf_counter()
                ro, _ = arms["arca_uniform"].collect(step)  # the shared part: generation + reward
                row = {"step": step, "t_collect": time.perf_counter() - t0, "rollouts": len(ro.responses),
                       "response_len_mean": float(np.mean([len(r) for r in ro.responses]))}
                order = ARMS if step % 2 == 0 else ARMS[::-1]
                for m in order:
                    n0 = len(forwards[m])
                    t1 = time.perf_counter()
                    out = arms[m].learn(step, ro)
                    row[f"t_learn_{m}"] = time.perf_counter() - t1
                    for k in ("t_old_forward", "t_ref_forward", "t_credit", "t_diagnostics", "t_update", "weight_gini",
                              "eff_token_ratio"):
                        row[f"{k}_{m}"] = out[k]
                    row[f"forwards_{m}"] = len(forwards[m]) - n0
                rows.append(row)
                print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}))
    steady = rows[1:] if len(rows) > 1 else rows  # the first step pays one-off costs
    col = {k: np.array([r[k] for r in steady], dtype=float) for k in steady[0]}
    step_u, step_a = col["t_collect"] + col["t_learn_arca_uniform"], col["t_collect"] + col["t_learn_arca"]
    weights_extra = col["t_credit_arca"] - col["t_credit_arca_uniform"]  # residual norms + normalisation
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread",
        "model": f"{a.backbone} ({source}), {n_base} params; LoRA rank {lcfg['rank']} alpha {lcfg['alpha']} on "
                 f"{','.join(lcfg['target_modules'])}: {n_adapter} trainable",
        "merge_for_sampling": lcfg["merge_for_sampling"],
        "rollouts_per_step": int(col["rollouts"].mean()),
        "response_len_mean": float(col["response_len_mean"].mean()),
        "steps_measured": len(steady),
        "seconds": {"collect (shared)": float(col["t_collect"].mean()),
                    "learn uniform": float(col["t_learn_arca_uniform"].mean()),
                    "learn arca": float(col["t_learn_arca"].mean()),
                    "old forward (arca)": float(col["t_old_forward_arca"].mean()),
                    "reference forward (arca)": float(col["t_ref_forward_arca"].mean()),
                    "arca weights minus uniform weights": float(weights_extra.mean()),
                    "diagnostics (arca: + residual norms)": float(col["t_diagnostics_arca"].mean()),
                    "update uniform": float(col["t_update_arca_uniform"].mean()),
                    "update arca": float(col["t_update_arca"].mean())},
        "forward_passes_per_step": {m: int(col[f"forwards_{m}"].mean()) for m in ARMS},
        "overhead_step_pct": float(100 * (step_a.mean() / step_u.mean() - 1)),
        "overhead_step_pct_ci95": [100 * x for x in _ci((step_a - step_u) / step_u.mean())],
        "overhead_learn_pct": float(100 * (col["t_learn_arca"].mean() / col["t_learn_arca_uniform"].mean() - 1)),
        "ref_forward_pct_of_step": float(100 * col["t_ref_forward_arca"].mean() / step_u.mean()),
        "arca_weights_pct_of_step": float(100 * weights_extra.mean() / step_u.mean()),
        "weight_gini_mean": {m: float(col[f"weight_gini_{m}"].mean()) for m in ARMS},
        "eff_token_ratio_mean": {m: float(col[f"eff_token_ratio_{m}"].mean()) for m in ARMS},
        "goal": "<= 2% step overhead",
        "rows": rows,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
