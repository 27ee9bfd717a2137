"""Does reward-balanced batching bind in a world? Generation rounds per update, replayed from rollout groups.

RB (Paper C; ``algos.batching.RewardBalancedBuffer`` / ``rb_draw``) binds when a balanced batch is scarce: it then
generates more rounds of prompts per update. Whether it does is a property of the world and the policy (how many
groups are mixed, how scarce the positives are), measured so far only by training an ``rb`` run. This module predicts
it without training, from groups a policy really produced: ``group`` rollouts of a train prompt, sampled from a
checkpoint with the trainer's rollout settings and scored, are one group. A replay draws ``n_groups`` of them per
round (with replacement, optionally reweighted to another mix of rule-letter counts), counts positives and negatives
as the trainer does (``rb_sign_values`` with the registered advantage, ``sign_counts``), and runs the real
``rb_draw`` for ``steps`` updates.

What it leaves out: the policy moving during training (replay one checkpoint: the base model's groups stand for the
start, a trained checkpoint's for the end) and the trainer's overlong reward shaping. Checked against measured
``rb`` runs in docs/papers/mechanisms.md.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from creditlab.algos import registry
from creditlab.algos.batching import RewardBalancedBuffer, rb_draw, rb_sign_values, sign_counts


def rollout_groups(
    model_dir: str | Path,
    data_dir: str | Path,
    *,
    split: str = "train",
    n_prompts: int = 256,
    group: int = 8,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """``group`` rollouts of each of the first ``n_prompts`` records of ``split`` (train: the world's RL prompts, its
    ``rl_prompts`` mix as prepare recorded it), sampled from the model in
    ``model_dir`` as the trainer samples them (defaults: the tiny scale's rollout settings) and scored by the boxed
    answer: one ``{"rewards": float[group], "letters": number of rule letters}`` per prompt. The overlong shaping of
    the trainer's rewards is left out (tiny_rule's responses stay far below its buffer)."""
    from creditlab.analysis.structure import boxed_reward
    from creditlab.data.io import read_records
    from creditlab.data.rule_arith import select_rl_prompts
    from creditlab.data.tokenizer import sft_examples
    from creditlab.lm.io import load_model, load_tokenizer
    from creditlab.lm.sampler import SamplingParams, generate

    tok = load_tokenizer(Path(data_dir))
    model = load_model(Path(model_dir)).eval()
    recs = read_records(Path(data_dir) / f"{split}.parquet")
    report = Path(data_dir) / "prep_report.json"
    if split == "train" and report.is_file():  # the world's RL prompts (its rl_prompts mix), as the trainer reads them
        prepared = json.loads(report.read_text())
        if "rl_prompts" not in prepared:  # prepared before worlds had an RL prompt mix: the whole split, said aloud
            print(
                f"rb_binding: {report} records no rl_prompts (prepared before 2026-12-06): replaying every train "
                "record; a run of a world with a mix trains on fewer (prepare again)",
                file=sys.stderr,
            )
        recs = select_rl_prompts(recs, (prepared.get("rl_prompts") or {}).get("spec"))
    recs = recs[:n_prompts]
    p_ids, _ = sft_examples(recs, tok, "tiny", gold=True)
    params = SamplingParams(
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, eos_id=tok.eos_token_id, seed=seed
    )
    with torch.no_grad():
        gen = generate(model, [p for p in p_ids for _ in range(group)], params)
    rewards = np.asarray(boxed_reward(tok)(gen.response_ids, [r["answer"] for r in recs for _ in range(group)]))
    return [
        {"rewards": rewards[i * group : (i + 1) * group], "letters": len((r.get("meta") or {}).get("decisive") or [])}
        for i, r in enumerate(recs)
    ]


def mix_weights(groups: Sequence[Mapping[str, Any]], mix: Mapping[int, float] | None) -> np.ndarray:
    """Draw probabilities of the groups: uniform (``mix`` None), or the share ``mix[k]`` of all draws spread evenly over
    the groups with k rule letters (a mix naming a letter count no group has is refused)."""
    n = len(groups)
    if mix is None:
        return np.full(n, 1.0 / n)
    letters = np.array([g["letters"] for g in groups])
    w = np.zeros(n)
    total = float(sum(mix.values()))
    if total <= 0 or any(v < 0 for v in mix.values()):
        raise ValueError(f"letter mix {dict(mix)}: shares must be >= 0 and not all 0")
    for k, share in mix.items():
        sel = letters == int(k)
        if share > 0 and not sel.any():
            raise ValueError(f"letter mix: no group has {k} rule letters (have {sorted(set(letters))})")
        if sel.any():
            w[sel] = share / total / sel.sum()
    return w / w.sum()


def replay_rounds(
    groups: Sequence[Mapping[str, Any]],
    *,
    n_groups: int = 32,
    rho: float = 0.25,
    max_age: int = 2,
    max_rounds: int = 4,
    steps: int = 400,
    advantage: str = "grpo",
    mix: Mapping[int, float] | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """RB's statistics over ``steps`` updates when every generation round draws ``n_groups`` of ``groups`` (module
    docstring): mean generation rounds per update (``rb_rounds``; 1 = RB never waits), groups dropped per update, the
    share of updates that had to train unbalanced, the batches' positive / negative shares, and the draws' mean
    reward and share of mixed (informative) groups."""
    rng = np.random.default_rng(seed)
    w = mix_weights(groups, mix)
    adv_fn = registry.get("advantage", advantage)
    buf = RewardBalancedBuffer(n_groups, rho, max_age)
    pending: list[np.ndarray] = []
    drawn: list[np.ndarray] = []

    def refill() -> None:
        idx = rng.choice(len(groups), size=n_groups, p=w)
        pending.append(idx)
        drawn.append(idx)

    def admit(rnd: int) -> None:
        idx = pending.pop()
        rewards = torch.tensor(np.concatenate([groups[i]["rewards"] for i in idx]), dtype=torch.float32)
        gids = torch.repeat_interleave(torch.arange(len(idx)), torch.tensor([len(groups[i]["rewards"]) for i in idx]))
        values, thr = rb_sign_values("advantage", rewards, rewards, gids, adv_fn, 0.0)
        for g, (n_pos, n_neg, size) in sign_counts(values, gids, thr).items():
            buf.add(int(idx[g]), n_pos, n_neg, size, rnd)

    rnd, stats = 0, []
    for _ in range(steps):
        refill()
        _, st, rnd = rb_draw(buf, rnd, admit=admit, refill=refill, max_rounds=max_rounds)
        stats.append(st)
    all_idx = np.concatenate(drawn)
    r = [groups[i]["rewards"] for i in all_idx]
    mean = lambda k: float(np.mean([s.get(k, np.nan) for s in stats]))  # noqa: E731
    return {
        "rb_rounds": mean("rb_rounds"),
        "rb_dropped": mean("rb_dropped"),
        "rb_forced": mean("rb_forced"),
        "rb_pos_frac": mean("rb_pos_frac"),
        "rb_neg_frac": mean("rb_neg_frac"),
        "reward_mean": float(np.mean([x.mean() for x in r])),
        "mixed_frac": float(np.mean([0 < x.mean() < 1 for x in r])),
        "steps": steps,
    }


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m creditlab.analysis.rb_binding --data R/tiny/data --model R/tiny/models/tiny-s/base [--model ...]
    [--mix 1:0.3,2:0.7]``: RB's generation rounds per update replayed from each model's rollout groups (JSON on
    stdout)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--data", required=True, help="a prepared tiny-world data directory")
    ap.add_argument("--model", action="append", required=True, help="a model directory (repeatable)")
    ap.add_argument("--prompts", type=int, default=256, help="train prompts in the pool (8 rollouts each)")
    ap.add_argument(
        "--mix", default=None, help="draw shares by rule-letter count, e.g. 1:0.3,2:0.7 (counts the prompts have)"
    )
    ap.add_argument("--n-groups", type=int, default=32)
    ap.add_argument("--rho", type=float, default=0.25)
    ap.add_argument("--max-age", type=int, default=2)
    ap.add_argument("--steps", type=int, default=400)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    mix = {int(k): float(v) for k, v in (x.split(":") for x in a.mix.split(","))} if a.mix else None
    out = {}
    for d in a.model:
        groups = rollout_groups(d, a.data, n_prompts=a.prompts)
        out[d] = replay_rounds(groups, n_groups=a.n_groups, rho=a.rho, max_age=a.max_age, steps=a.steps, mix=mix)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
