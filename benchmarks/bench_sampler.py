"""Throughput of the local KV-cache sampler vs ``transformers`` ``model.generate`` (run on demand).

    PYTHONPATH=src .venv/bin/python benchmarks/bench_sampler.py [--batch 256] [--repeats 3] [--sweep]

Tiny random Qwen3 (hidden 128, 2 layers, 4 heads / 2 KV heads, vocab 40), prompts of 15-25 tokens,
one CPU thread. Scenarios (ours and HF on the same prompts, runs interleaved, best of ``--repeats``):

* ``greedy_fixed`` / ``sample_fixed``: EOS disabled for both, exactly ``--max-new-tokens`` per row;
* ``greedy_eos`` / ``sample_eos``: real EOS (each row stops at its own length, up to
  ``--max-new-tokens-eos``); HF keeps computing finished rows, ours drops them.

tokens/s counts response tokens (up to and including EOS) per second of wall time, so padding HF
computes after a row's EOS is not counted as output. ``--sweep`` also measures our sampler over batch
sizes and over the compaction threshold. Results: table on stdout, JSON in ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import GenerationConfig  # noqa: E402

from creditlab.lm import sampler  # noqa: E402
from creditlab.models.tiny import build_model  # noqa: E402

ARCH = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=384,
)
VOCAB, PAD, BOS, EOS = 40, 0, 1, 2
NO_EOS = -1


def make_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """n prompts of 15-25 tokens: BOS then random ids in [3, VOCAB)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(15, 26, (n,), generator=g).tolist()
    return [[BOS] + torch.randint(3, VOCAB, (k - 1,), generator=g).tolist() for k in lengths]


def response_tokens(rows: list[list[int]], eos: int) -> int:
    """Number of real response tokens: up to and including the first ``eos`` of each row."""
    return sum(r.index(eos) + 1 if eos in r else len(r) for r in rows)


def run_ours(model, prompts, *, greedy: bool, eos: int, max_new: int, batch_size: int | None = None):
    """Our sampler -> (seconds, response rows)."""
    start = time.perf_counter()
    params = sampler.SamplingParams(max_new_tokens=max_new, eos_id=eos, greedy=greedy, temperature=1.0, seed=0)
    gen = sampler.generate(model, prompts, params, batch_size=batch_size)
    return time.perf_counter() - start, gen.response_ids


def run_hf(model, prompts, *, greedy: bool, eos: int, max_new: int):
    """``model.generate`` on the same left-padded batch -> (seconds, response rows incl. padding)."""
    ids, mask = sampler.left_pad(prompts, PAD)
    model.generation_config.eos_token_id = None if eos == NO_EOS else eos
    sampling = {} if greedy else dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)  # top_k=0: off
    cfg = GenerationConfig(
        max_new_tokens=max_new, eos_token_id=None if eos == NO_EOS else eos, pad_token_id=PAD, **sampling
    )
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
    return time.perf_counter() - start, out[:, ids.shape[1] :].tolist()


def interleaved(fns: dict[str, Callable[[], tuple[float, list]]], repeats: int) -> dict[str, dict]:
    """Run every fn once to warm up, then ``repeats`` rounds in turn; best and median seconds, last rows."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    rows: dict[str, list] = {}
    for k, fn in fns.items():
        fn()
    for _ in range(repeats):
        for k, fn in fns.items():
            seconds, rows[k] = fn()
            times[k].append(seconds)
    return {k: {"best_s": min(v), "median_s": statistics.median(v), "rows": rows[k]} for k, v in times.items()}


def scenario(model, prompts, name: str, *, greedy: bool, eos: int, max_new: int, repeats: int) -> dict:
    """One ours-vs-HF comparison -> result record (tokens/s from the best time of each)."""
    kw = dict(greedy=greedy, eos=eos, max_new=max_new)
    res = interleaved(
        {"ours": lambda: run_ours(model, prompts, **kw), "hf": lambda: run_hf(model, prompts, **kw)}, repeats
    )
    count_eos = EOS if eos != NO_EOS else NO_EOS
    rec = {"scenario": name, "greedy": greedy, "eos": eos != NO_EOS, "max_new_tokens": max_new}
    for k in ("ours", "hf"):
        n_tok = response_tokens(res[k]["rows"], count_eos)
        rec[f"{k}_tokens"] = n_tok
        rec[f"{k}_best_s"] = round(res[k]["best_s"], 4)
        rec[f"{k}_median_s"] = round(res[k]["median_s"], 4)
        rec[f"{k}_tok_per_s"] = round(n_tok / res[k]["best_s"], 1)
    rec["ratio_ours_over_hf"] = round(rec["ours_tok_per_s"] / rec["hf_tok_per_s"], 3)
    if greedy:
        hf_rows = [r[: r.index(EOS) + 1] if eos != NO_EOS and EOS in r else r for r in res["hf"]["rows"]]
        rec["greedy_outputs_identical"] = hf_rows == res["ours"]["rows"]
    return rec


def sweep(model, prompts, *, max_new: int, repeats: int) -> dict:
    """Our sampler only, sampling with real EOS: tokens/s over batch sizes and compaction thresholds."""
    out: dict[str, dict[str, float]] = {"batch_size": {}, "compact_fraction": {}}
    kw = dict(greedy=False, eos=EOS, max_new=max_new)
    fns = {str(bs): (lambda bs=bs: run_ours(model, prompts, batch_size=bs, **kw)) for bs in (32, 64, 128, 256, 512)}
    for k, r in interleaved(fns, repeats).items():
        out["batch_size"][k] = round(response_tokens(r["rows"], EOS) / r["best_s"], 1)
    default = sampler.COMPACT_FRACTION
    fractions = {"always": 1e-9, "0.1": 0.1, "0.25": 0.25, "0.5": 0.5, "never": 2.0}

    def with_fraction(f: float):
        sampler.COMPACT_FRACTION = f
        try:
            return run_ours(model, prompts, **kw)
        finally:
            sampler.COMPACT_FRACTION = default

    fns = {k: (lambda f=f: with_fraction(f)) for k, f in fractions.items()}
    for k, r in interleaved(fns, repeats).items():
        out["compact_fraction"][k] = round(response_tokens(r["rows"], EOS) / r["best_s"], 1)
    return out


def print_table(results: list[dict]) -> None:
    print(f"{'scenario':14s} {'ours tok/s':>11s} {'HF tok/s':>10s} {'ours/HF':>8s} {'tokens':>8s}")
    for r in results:
        print(
            f"{r['scenario']:14s} {r['ours_tok_per_s']:11.0f} {r['hf_tok_per_s']:10.0f} "
            f"{r['ratio_ours_over_hf']:8.2f} {r['ours_tokens']:8d}"
            + ("" if "greedy_outputs_identical" not in r else f"  identical={r['greedy_outputs_identical']}")
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256, help="number of prompts (decoded as one batch)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="response length, EOS disabled")
    ap.add_argument("--max-new-tokens-eos", type=int, default=64, help="max response length, real EOS")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sweep", action="store_true", help="also sweep batch size and compaction threshold")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sampler.json")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    model = build_model(ARCH, VOCAB, PAD, BOS, EOS, seed=0).eval()
    prompts = make_prompts(args.batch)
    results = [
        scenario(
            model, prompts, "greedy_fixed", greedy=True, eos=NO_EOS, max_new=args.max_new_tokens, repeats=args.repeats
        ),
        scenario(
            model, prompts, "sample_fixed", greedy=False, eos=NO_EOS, max_new=args.max_new_tokens, repeats=args.repeats
        ),
        scenario(
            model, prompts, "greedy_eos", greedy=True, eos=EOS, max_new=args.max_new_tokens_eos, repeats=args.repeats
        ),
        scenario(
            model, prompts, "sample_eos", greedy=False, eos=EOS, max_new=args.max_new_tokens_eos, repeats=args.repeats
        ),
    ]
    print_table(results)
    record = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": args.threads,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "setup": {
            "arch": ARCH,
            "vocab": VOCAB,
            "prompts": args.batch,
            "prompt_len": "15-25",
            "repeats": args.repeats,
            "timing": "best of repeats, runs interleaved",
        },
        "results": results,
    }
    if args.sweep:
        record["sweep"] = sweep(model, prompts, max_new=args.max_new_tokens_eos, repeats=args.repeats)
        print(json.dumps(record["sweep"], indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
