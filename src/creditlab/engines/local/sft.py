"""SFT warm-up of a tiny base model: next-token loss on ``" " + solution + EOS`` given the prompt.

Run once per backbone; every method starts from the result (the papers' "base" model).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from creditlab.data.tokenizer import sft_examples
from creditlab.engines.local.trainer import _autocast, _device, lr_lambda
from creditlab.lm.batch import chunked_response_forward, pack
from creditlab.progress import progress as progress_bar


def warmup(
    model,
    tokenizer,
    records: list[dict],
    cfg: dict[str, Any],
    seed: int,
    log_fn: Callable[[dict, int], None] | None = None,
    progress: bool = True,
) -> list[dict[str, float]]:
    """Supervised warm-up (AdamW, linear warm-up then cosine to 10%); returns per-step metrics."""
    w = cfg["warmup"]
    device = _device(cfg.get("device", "auto"))
    model.to(device).train()
    prompts, responses = sft_examples(records, tokenizer, cfg["data"].get("template", "tiny"))
    opt = torch.optim.AdamW(model.parameters(), lr=w["lr"], weight_decay=w["weight_decay"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, w["lr_warmup_steps"], w["steps"], "cosine"))
    rng = np.random.default_rng([seed, 7])
    order = rng.permutation(len(records))
    history, pos, t0 = [], 0, time.perf_counter()
    bar = progress_bar(w["steps"], "sft warm-up", enabled=progress)
    for step in range(w["steps"]):
        if pos + w["batch_size"] > len(order):
            order, pos = rng.permutation(len(records)), 0
        idx = order[pos : pos + w["batch_size"]]
        pos += w["batch_size"]
        batch = pack([prompts[i] for i in idx], [responses[i] for i in idx], tokenizer.pad_token_id)
        with _autocast(device):  # length-sorted chunks, one loss over the reassembled batch (lm/batch.py)
            out = chunked_response_forward(model, batch, int(w.get("forward_chunk_tokens", 0)))
        mask = batch.response_mask.to(device)
        loss = -(out.logp * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        m = {
            "step": step,
            "sft_loss": loss.item(),
            "grad_norm": float(gn),
            "lr": sched.get_last_lr()[0],
            "token_ppl": math.exp(min(20.0, loss.item())),
            "elapsed_s": time.perf_counter() - t0,
        }
        history.append(m)
        if log_fn is not None:
            log_fn(m, step)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        bar.update(1)
    bar.close()
    return history


def save_model(model, tokenizer, out_dir: Path) -> None:
    """save_pretrained model + tokenizer (safetensors) so AutoModelForCausalLM can load it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
