"""DelTA's step overhead over DAPO, measured in the same run on the same rollout batches.

Paper B reports +37 s (~10.2%) on the first step with 3 extra forward passes; our DelTA reuses the
hidden states of the old-log-prob forward, so the only extra work is the coefficient computation.
Per step: one rollout batch is generated and scored once (timed: the part both methods share), then
each method learns from it on its own copy of the model (advantages, old forward, credit, PPO update),
the order of the two alternating from step to step so that drift in machine speed cancels. Reports the
overhead on the whole step and on the learning part, with a bootstrap 95% CI over steps, and the number
of forward passes of each arm. Writes benchmarks/results/delta_overhead.json.

    python benchmarks/bench_delta_overhead.py [--steps 12] [--backbone tiny-s] [--results results]
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
from _common import count_forwards, mean_ci, tiny_world, write_result  # noqa: E402  (benchmarks/ is the script's directory)

from creditlab.engines.local.trainer import Trainer
from creditlab.plan import compose
from creditlab.rewards.scorer import RewardScorer

OVERRIDES = [
    "trainer.dynamic_sampling=false",
    "trainer.mini_batches=4",
]  # Paper B's setting (configs/papers/delta.yaml)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--backbone", default="tiny-s")
    ap.add_argument("--results", default="results")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "delta_overhead.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfgs = {m: compose("tiny", a.backbone, m, OVERRIDES) for m in ("dapo", "delta")}

    with tempfile.TemporaryDirectory() as tmp:
        tok, model, source, records = tiny_world(a.results, a.backbone, cfgs["dapo"], tmp)
        rows = []
        with RewardScorer(cfgs["dapo"]["trainer"]["reward"]) as scorer:
            arms = {
                m: Trainer(cfg, copy.deepcopy(model), tok, records, scorer, Path(tmp) / m, progress=False)
                for m, cfg in cfgs.items()
            }
            forwards = {m: count_forwards(tr.model) for m, tr in arms.items()}
            for step in range(a.steps):
                t0 = time.perf_counter()
                ro, _ = arms["dapo"].collect(step)  # the shared part: generation + reward
                row = {"step": step, "t_collect": time.perf_counter() - t0, "rollouts": len(ro.responses)}
                order = ("dapo", "delta") if step % 2 == 0 else ("delta", "dapo")
                for m in order:
                    n0 = len(forwards[m])
                    t1 = time.perf_counter()
                    out = arms[m].learn(step, ro)
                    row[f"t_learn_{m}"] = time.perf_counter() - t1
                    row[f"t_credit_{m}"] = out["t_credit"]
                    row[f"forwards_{m}"] = len(forwards[m]) - n0
                rows.append(row)
                print(json.dumps(row))
    steady = rows[1:] if len(rows) > 1 else rows  # the first step pays one-off costs
    col = {k: np.array([r[k] for r in steady], dtype=float) for k in steady[0]}
    step_dapo, step_delta = col["t_collect"] + col["t_learn_dapo"], col["t_collect"] + col["t_learn_delta"]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread",
        "model": f"{a.backbone} ({source}), {sum(p.numel() for p in model.parameters())} params",
        "trainer_overrides": OVERRIDES,
        "rollouts_per_step": int(col["rollouts"].mean()),
        "steps_measured": len(steady),
        "seconds": {
            "collect (shared)": float(col["t_collect"].mean()),
            "learn dapo": float(col["t_learn_dapo"].mean()),
            "learn delta": float(col["t_learn_delta"].mean()),
            "delta coefficients": float(col["t_credit_delta"].mean()),
        },
        "forward_passes_per_step": {
            "dapo": int(col["forwards_dapo"].mean()),
            "delta": int(col["forwards_delta"].mean()),
        },
        "overhead_step_pct": float(100 * (step_delta.mean() / step_dapo.mean() - 1)),
        "overhead_step_pct_ci95": [100 * x for x in mean_ci((step_delta - step_dapo) / step_dapo.mean())],
        "overhead_learn_pct": float(100 * (col["t_learn_delta"].mean() / col["t_learn_dapo"].mean() - 1)),
        "coefficients_pct_of_step": float(100 * col["t_credit_delta"].mean() / step_dapo.mean()),
        "paper": "+37 s, ~10.2% of the first step on 8xB200 with 3 extra forward passes",
        "rows": rows,
    }
    write_result(result, a.out)


if __name__ == "__main__":
    main()
