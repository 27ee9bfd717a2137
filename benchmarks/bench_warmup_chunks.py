"""SFT warm-up steps with length-sorted forward chunks (``warmup.forward_chunk_tokens``) against one padded forward.

The warm-up's batches mix short problems with the long transfer-format records (5-95-100th percentile 25 / 93 /
128 tokens on tiny_rule), so one padded forward is mostly padding. Per step the same batch of sft examples goes
to two copies of the same freshly initialised backbone, one padded forward each vs chunks of at most N padded
positions, in alternating order; both take the same AdamW step (lr and warm-up of the scale's warm-up config).
Reports each arm's step time, the share of padded positions that are real tokens, the ratio's 95% bootstrap CI
over steps, and both arms' SFT loss at the end (they train the same model up to float rounding). Writes
benchmarks/results/warmup_chunks.json.

    python benchmarks/bench_warmup_chunks.py [--steps 40] [--tokens 512] [--backbone tiny-s] [--results results]
"""

from __future__ import annotations

import argparse
import copy
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import mean_ci, tiny_world, write_result  # noqa: E402  (benchmarks/ is the script's directory)

from creditlab import paths
from creditlab.data.io import read_records
from creditlab.data.tokenizer import sft_examples
from creditlab.lm.batch import chunked_response_forward, length_chunks, pack
from creditlab.models.tiny import build_model
from creditlab.plan import TINY_WORLD, compose


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--backbone", default="tiny-s")
    ap.add_argument("--world", default=TINY_WORLD)
    ap.add_argument("--results", default="results")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "warmup_chunks.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = compose("tiny", a.backbone, overrides=[f"data={a.world}"])
    w = cfg["warmup"]
    with tempfile.TemporaryDirectory() as tmp:
        tok, _, _, records = tiny_world(a.results, a.backbone, cfg, tmp)
        extra = paths.fmt(paths.DATA_DIR, results=a.results, scale="tiny") / "warmup_extra.parquet"
        if extra.exists():
            records = records + read_records(extra)
    prompts, responses = sft_examples(records, tok, cfg["data"].get("template", "tiny"))
    model = build_model(cfg["model"]["arch"], len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, 0)
    arms = {k: copy.deepcopy(model).train() for k in (0, a.tokens)}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=w["lr"], weight_decay=w["weight_decay"]) for k, m in arms.items()}
    rng = np.random.default_rng(0)
    rows = []
    for step in range(a.steps):
        idx = rng.choice(len(prompts), w["batch_size"], replace=False)
        batch = pack([prompts[i] for i in idx], [responses[i] for i in idx], tok.pad_token_id)
        mask = batch.response_mask
        padded = sum(batch.select(c).attention_mask.numel() for c in length_chunks(batch.row_lengths, a.tokens))
        row = {
            "step": step,
            "real_share_0": float(batch.attention_mask.float().mean()),
            f"real_share_{a.tokens}": float(batch.attention_mask.sum()) / padded,
        }
        for k in (0, a.tokens) if step % 2 == 0 else (a.tokens, 0):
            t0 = time.perf_counter()
            out = chunked_response_forward(arms[k], batch, k)
            loss = -(out.logp * mask).sum() / mask.sum()
            opts[k].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(arms[k].parameters(), 1.0)
            opts[k].step()
            row[f"t_step_{k}"], row[f"loss_{k}"] = time.perf_counter() - t0, loss.item()
        rows.append(row)
    steady = rows[1:]
    col = {key: np.array([r[key] for r in steady], dtype=float) for key in steady[0]}
    K = a.tokens
    t0, tK = col["t_step_0"], col[f"t_step_{K}"]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread",
        "model": f"{a.backbone} (fresh init, seed 0), {sum(p.numel() for p in model.parameters())} params",
        "world": a.world,
        "batch_size": w["batch_size"],
        "forward_chunk_tokens": [0, K],
        "steps_measured": len(steady),
        "real_token_share": {"0": float(col["real_share_0"].mean()), str(K): float(col[f"real_share_{K}"].mean())},
        "seconds_per_step": {"0": float(t0.mean()), str(K): float(tK.mean())},
        "step_time_ratio": float(tK.mean() / t0.mean()),
        "step_time_ratio_ci95": [1 + x for x in mean_ci((tK - t0) / t0.mean())],
        "loss_at_end": {"0": rows[-1]["loss_0"], str(K): rows[-1][f"loss_{K}"]},
        "rows": rows,
    }
    write_result(result, a.out)


if __name__ == "__main__":
    main()
