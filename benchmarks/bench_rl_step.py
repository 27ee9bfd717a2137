"""One RL step of the local engine broken into generate / reward / old-forward / update.

Runs a few DAPO steps of the tiny-s backbone (the warmed-up base model from results/tiny if it
exists, else a randomly initialised one, which produces longer, truncated responses) with the
tiny-scale trainer config, one torch thread, and writes benchmarks/results/rl_step.json.

    python benchmarks/bench_rl_step.py [--steps 6] [--results results]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import tiny_world  # noqa: E402  (benchmarks/ is the script's directory)

from creditlab.engines.local.trainer import Trainer
from creditlab.plan import compose
from creditlab.rewards.scorer import RewardScorer

PARTS = ("t_gen", "t_reward", "t_old_forward", "t_update")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--results", default="results")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "rl_step.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = compose("tiny", "tiny-s", "dapo")
    cfg["trainer"]["steps"] = a.steps
    with tempfile.TemporaryDirectory() as tmp:
        tok, model, source, records = tiny_world(a.results, "tiny-s", cfg, tmp)
        with RewardScorer(cfg["trainer"]["reward"]) as scorer:
            tr = Trainer(cfg, model, tok, records, scorer, Path(tmp) / "ckpt", progress=True)
            t0 = time.perf_counter()
            hist = [tr.train_step(s) for s in range(a.steps)]
            wall = time.perf_counter() - t0
    steady = hist[1:] if len(hist) > 1 else hist  # first step pays warm-up costs
    parts = {k: float(np.mean([h[k] for h in steady])) for k in PARTS + ("t_step",)}
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread",
        "model": f"tiny-s ({source}), {sum(p.numel() for p in model.parameters())} params",
        "rollouts_per_step": cfg["trainer"]["prompts_per_step"] * cfg["trainer"]["group_size"],
        "response_len_mean": float(np.mean([h["response_len_mean"] for h in steady])),
        "steps": a.steps,
        "wall_s": wall,
        "seconds_per_step_part": parts,
        "fraction_of_step": {k: parts[k] / parts["t_step"] for k in PARTS},
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
