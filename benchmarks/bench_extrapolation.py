"""Cost of selective extrapolation decoding (two models) vs plain decoding of the base model (run on demand).

    PYTHONPATH=src .venv/bin/python benchmarks/bench_extrapolation.py [--batch 256] [--repeats 5]

Two random tiny-s Qwen3 models (hidden 128, 2 layers, 4 heads / 2 KV heads, head_dim 32,
intermediate 384, vocab 27) play pi_base and pi_RL; 256 prompts of 15-25 tokens decoded as one
batch, one CPU thread. Methods, on the same prompts, runs interleaved, best of ``--repeats``:

* ``plain``: :func:`creditlab.lm.sampler.generate` of the base model;
* ``selective``: :func:`creditlab.decoding.extrapolation.selective_generate` (criterion dlogp,
  ``--tau``, ``--gamma``), base decoding;
* ``always``: the same with tau = +inf (every position resampled: the decoder's worst case).

Scenarios: ``fixed`` (EOS disabled, exactly ``--max-new-tokens`` per row) and ``eos`` (real EOS, at
most ``--max-new-tokens-eos``). tokens/s = response tokens (up to and including EOS) per second;
``cost`` = plain tok/s / method tok/s (the goal is <= ~2.2 for two models). Results: table on
stdout, JSON in ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_sampler import interleaved, response_tokens  # noqa: E402

from creditlab.decoding.extrapolation import selective_generate  # noqa: E402
from creditlab.lm.sampler import SamplingParams, generate  # noqa: E402
from creditlab.models.tiny import build_model  # noqa: E402

ARCH = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=384,
)
VOCAB, PAD, BOS, EOS = 27, 0, 1, 2
NO_EOS = -1


def make_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """n prompts of 15-25 tokens: BOS then random ids in [3, VOCAB)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(15, 26, (n,), generator=g).tolist()
    return [[BOS] + torch.randint(3, VOCAB, (k - 1,), generator=g).tolist() for k in lengths]


def timed(fn: Callable[[], tuple[list[list[int]], dict]]) -> Callable[[], tuple[float, tuple]]:
    """Wrap a decode call -> (seconds, (response rows, stats)) as :func:`bench_sampler.interleaved` wants."""

    def run() -> tuple[float, tuple]:
        start = time.perf_counter()
        out = fn()
        return time.perf_counter() - start, out

    return run


def scenario(
    base, rl, prompts, name: str, *, eos: int, max_new: int, tau: float, gamma: float, top_p: float, repeats: int
) -> dict:
    """plain / selective / always on the same prompts -> result record (tokens/s from the best times)."""
    params = SamplingParams(max_new_tokens=max_new, eos_id=eos, seed=0, top_p=top_p)

    def plain():
        return generate(base, prompts, params).response_ids, {}

    def selective(threshold: float):
        gen, stats = selective_generate(base, rl, prompts, params, threshold=threshold, gamma=gamma)
        return gen.response_ids, stats

    fns = {
        "plain": timed(plain),
        "selective": timed(lambda: selective(tau)),
        "always": timed(lambda: selective(math.inf)),
    }
    res = interleaved(fns, repeats)
    rec: dict = {"scenario": name, "eos": eos != NO_EOS, "max_new_tokens": max_new, "top_p": top_p}
    for k, r in res.items():
        rows, stats = r["rows"]
        n_tok = response_tokens(rows, eos)
        rec[k] = {
            "tokens": n_tok,
            "best_s": round(r["best_s"], 4),
            "median_s": round(r["median_s"], 4),
            "tok_per_s": round(n_tok / r["best_s"], 1),
        }
        if stats:
            rec[k]["resample_rate"] = round(sum(stats["resampled"]) / sum(stats["n_tokens"]), 4)
    for k in ("selective", "always"):
        rec[k]["cost_vs_plain"] = round(rec["plain"]["tok_per_s"] / rec[k]["tok_per_s"], 3)
    return rec


def print_table(results: list[dict]) -> None:
    print(f"{'scenario':9s} {'method':10s} {'tok/s':>8s} {'cost':>6s} {'resample':>9s} {'tokens':>7s}")
    for r in results:
        for k in ("plain", "selective", "always"):
            m = r[k]
            print(
                f"{r['scenario']:9s} {k:10s} {m['tok_per_s']:8.0f} {m.get('cost_vs_plain', 1.0):6.2f} "
                f"{m.get('resample_rate', 0.0):9.3f} {m['tokens']:7d}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256, help="number of prompts (decoded as one batch)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="response length, EOS disabled")
    ap.add_argument("--max-new-tokens-eos", type=int, default=64, help="max response length, real EOS")
    ap.add_argument(
        "--tau",
        type=float,
        default=-0.45,
        help="dlogp threshold of the selective method (~10%% resampled with these models)",
    )
    ap.add_argument("--gamma", type=float, default=0.1)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "extrapolation.json")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    base = build_model(ARCH, VOCAB, PAD, BOS, EOS, seed=0).eval()
    rl = build_model(ARCH, VOCAB, PAD, BOS, EOS, seed=1).eval()
    prompts = make_prompts(args.batch)
    common = dict(tau=args.tau, gamma=args.gamma, top_p=args.top_p, repeats=args.repeats)
    results = [
        scenario(base, rl, prompts, "fixed", eos=NO_EOS, max_new=args.max_new_tokens, **common),
        scenario(base, rl, prompts, "eos", eos=EOS, max_new=args.max_new_tokens_eos, **common),
    ]
    print_table(results)
    for r in results:
        print(
            f"{r['scenario']}: selective costs {r['selective']['cost_vs_plain']:.2f}x plain decoding "
            f"(always-resample {r['always']['cost_vs_plain']:.2f}x)"
        )
    record = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": args.threads,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "load_avg": os.getloadavg(),
        },
        "setup": {
            "arch": ARCH,
            "vocab": VOCAB,
            "prompts": args.batch,
            "prompt_len": "15-25",
            "criterion": "dlogp",
            "tau": args.tau,
            "gamma": args.gamma,
            "top_p": args.top_p,
            "repeats": args.repeats,
            "timing": "best of repeats, runs interleaved",
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
