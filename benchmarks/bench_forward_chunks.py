"""Length-sorted forward chunks (``trainer.forward_chunk_tokens``) against one padded forward, on the same batches.

The local engine's old-policy forward and its update forwards pad every row to the batch's longest; with
``forward_chunk_tokens = N`` the rows are sorted by length and run in chunks of at most N padded positions
(``creditlab.lm.batch.chunked_response_forward``), and the loss and its backward see the reassembled batch.
Per step: one rollout batch is generated and scored once, then both arms learn from it starting from the
same state (the chunked arm is reset to the one-forward arm's model and optimizer first), in alternating
order. Reports the old-forward and update times of each arm with a bootstrap 95% CI of their ratio over
steps, the share of the padded positions that are real tokens in the old forward, and how far the two updates
differ (max |theta_N - theta_0| over max |theta_0 - theta_before|). Writes benchmarks/results/forward_chunks.json.

    python benchmarks/bench_forward_chunks.py [--steps 10] [--tokens 1024] [--backbone tiny-s] [--results results]
        [--overrides trainer.mini_batches=4]
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
from _common import mean_ci, tiny_world, write_result  # noqa: E402  (benchmarks/ is the script's directory)

from creditlab.engines.local.trainer import Trainer
from creditlab.lm.batch import length_chunks, pack
from creditlab.plan import TINY_WORLD, compose, world_run_overrides
from creditlab.rewards.scorer import RewardScorer


def _real_share(ro, pad_id: int, max_tokens: int) -> float:
    """Real tokens / padded positions (prompt + response) of the old forward over the batch (0: one forward)."""
    batch = pack(ro.prompts, ro.responses, pad_id)
    if max_tokens <= 0:
        return float(batch.attention_mask.float().mean())
    padded = sum(int(batch.select(idx).attention_mask.numel()) for idx in length_chunks(batch.row_lengths, max_tokens))
    return float(batch.attention_mask.sum()) / padded


def _params(tr: Trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in tr.model.parameters()])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--backbone", default="tiny-s")
    ap.add_argument("--world", default=TINY_WORLD)
    ap.add_argument("--results", default="results")
    ap.add_argument("--overrides", nargs="*", default=[], help="more trainer overrides, e.g. trainer.mini_batches=4")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "forward_chunks.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    base = list(world_run_overrides(a.world, "tiny")) + a.overrides
    arms = {k: compose("tiny", a.backbone, "dapo", base + [f"trainer.forward_chunk_tokens={k}"]) for k in (0, a.tokens)}

    with tempfile.TemporaryDirectory() as tmp:
        tok, model, source, records = tiny_world(a.results, a.backbone, arms[0], tmp)
        rows = []
        with RewardScorer(arms[0]["trainer"]["reward"]) as scorer:
            tr = {
                k: Trainer(c, copy.deepcopy(model), tok, records, scorer, Path(tmp) / str(k), progress=False)
                for k, c in arms.items()
            }
            one, many = tr[0], tr[a.tokens]
            for step in range(a.steps):
                ro, _ = one.collect(step)
                many.restore(one.snapshot())
                before = _params(one)
                row = {
                    "step": step,
                    "rollouts": len(ro.responses),
                    "real_share_0": _real_share(ro, tok.pad_token_id, 0),
                    f"real_share_{a.tokens}": _real_share(ro, tok.pad_token_id, a.tokens),
                }
                for k in (0, a.tokens) if step % 2 == 0 else (a.tokens, 0):
                    out = tr[k].learn(step, ro)
                    row[f"t_old_forward_{k}"], row[f"t_update_{k}"] = out["t_old_forward"], out["t_update"]
                    row[f"loss_{k}"] = out["loss"]
                moved = (_params(one) - before).abs().max().item()
                row["update_rel_diff"] = (_params(many) - _params(one)).abs().max().item() / max(moved, 1e-30)
                rows.append(row)
                print(json.dumps(row))
    steady = rows[1:] if len(rows) > 1 else rows  # the first step pays one-off costs
    col = {k: np.array([r[k] for r in steady], dtype=float) for k in steady[0]}
    K = a.tokens
    learn1, learnK = col["t_old_forward_0"] + col["t_update_0"], col[f"t_old_forward_{K}"] + col[f"t_update_{K}"]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread",
        "model": f"{a.backbone} ({source}), {sum(p.numel() for p in model.parameters())} params",
        "world": a.world,
        "forward_chunk_tokens": [0, K],
        "overrides": a.overrides,
        "rollouts_per_step": int(col["rollouts"].mean()),
        "steps_measured": len(steady),
        "real_token_share": {"0": float(col["real_share_0"].mean()), str(K): float(col[f"real_share_{K}"].mean())},
        "seconds": {
            "old forward, 0": float(col["t_old_forward_0"].mean()),
            f"old forward, {K}": float(col[f"t_old_forward_{K}"].mean()),
            "update, 0": float(col["t_update_0"].mean()),
            f"update, {K}": float(col[f"t_update_{K}"].mean()),
        },
        "learn_time_ratio": float(learnK.mean() / learn1.mean()),
        "learn_time_ratio_ci95": [1 + x for x in mean_ci((learnK - learn1) / learn1.mean())],
        "update_rel_diff_max": float(col["update_rel_diff"].max()),
        "rows": rows,
    }
    write_result(result, a.out)


if __name__ == "__main__":
    main()
