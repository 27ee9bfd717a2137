"""Credit structure of a tiny world (issue 29, item 2): per kind of response token, how uncertain the warmed-up policy
leaves it and how much of the true token advantage it carries.

Token kinds of a response ``a<op>b=c<sep>a<op>b=c ... \\boxed{c}`` (rule arithmetic, :mod:`creditlab.data.rule_arith`;
plain arithmetic has no decisive tokens and one separator):

* ``decisive`` -- the operator of a step whose question operator is a rule letter (``meta.decisive``);
* ``operator`` -- the operator of any other step (written in the question);
* ``separator`` -- the characters between two steps;
* ``answer`` -- the digits inside ``\\boxed{}``;
* ``other`` -- operands, results, ``=``, the box, EOS.

Two measurements of a policy pi:

1. **On gold responses** (teacher forcing, exact): per kind, the mean probability of the gold token and the mean
   entropy (nats) of pi's next-token distribution. Structure wanted: decisive p ~ 1/2 and entropy ~ log 2 (at
   chance), separator entropy ~ log |separators| (truly uncertain), operator / other p ~ 1.
2. **On the policy's own rollouts**, the Monte Carlo true advantages A*_{i,t} of
   :func:`creditlab.analysis.mc_truth.coupled_outcomes` (K coupled continuations per prefix): per kind, the
   share of sum |A*| it carries, its mean |A*| and the share of exactly-zero estimates. Structure wanted: the decisive
   tokens carry a large share of the credit, the separators ~none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

KINDS = ("decisive", "operator", "separator", "answer", "other")
_STEP = re.compile(r"(\d+)([+\-*])(\d+)=(\d+)")
_BOX = "\\boxed{"


def char_kinds(text: str, decisive: Sequence[int]) -> list[str]:
    """Kind of every character of a response text (module docstring); ``decisive``: step indices of rule letters."""
    kinds = ["other"] * len(text)
    box = text.rfind(_BOX)
    body_end = box if box >= 0 else len(text)
    steps = list(_STEP.finditer(text, 0, body_end))
    for k, m in enumerate(steps):
        kinds[m.start(2)] = "decisive" if k in set(decisive) else "operator"
        if k + 1 < len(steps):
            for c in range(m.end(), steps[k + 1].start()):
                kinds[c] = "separator"
    if box >= 0:
        close = text.find("}", box)
        for c in range(box + len(_BOX), close if close >= 0 else len(text)):
            kinds[c] = "answer"
    return kinds


def token_kinds(token_ids: Sequence[int], tokenizer, decisive: Sequence[int]) -> list[str]:
    """Kind of every response token: the kind of its first character in the decoded response (special tokens:
    ``other``). Token i covers the characters its own decoding adds (the tiny tokenizer: one character, or
    ``\\boxed{``)."""
    pieces = [tokenizer.decode([int(t)], skip_special_tokens=True) for t in token_ids]
    text = "".join(pieces)
    kinds = char_kinds(text, decisive)
    out, pos = [], 0
    for p in pieces:
        out.append(kinds[pos] if p and pos < len(kinds) else "other")
        pos += len(p)
    return out


def question_decisive_steps(question: str) -> list[int]:
    """Step indices of a question whose operator a rule letter hides, read from its text alone: the k-th operator
    symbol of the question, left to right (``+ - *`` or a lowercase rule letter), is step k's (rule_arith writes the
    chain in step order; templates such as ``Q: ... A:`` add only uppercase letters)."""
    symbols = [c for c in question if c in "+-*" or c.islower()]
    return [k for k, c in enumerate(symbols) if c.islower()]


def rollout_kinds(tokenizer, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> list | None:
    """:func:`token_kinds` of every rollout, the decisive steps read from its prompt's text
    (:func:`question_decisive_steps`); None when no prompt has a rule letter (a world without decisive tokens)."""
    decisive = [question_decisive_steps(tokenizer.decode(list(p), skip_special_tokens=True)) for p in prompts]
    if not any(decisive):
        return None
    return [token_kinds(r, tokenizer, d) for r, d in zip(responses, decisive)]


def gold_structure(model, prompts, responses, kinds: Sequence[Sequence[str]], pad_id: int, rows: int = 64) -> dict:
    """Measurement 1: per kind, mean p(gold token), mean entropy and the token count, on teacher-forced gold
    responses. prompts / responses: token ids; kinds: per response token (:func:`token_kinds`)."""
    from creditlab.lm.batch import pack, response_forward

    acc: dict[str, dict[str, list[float]]] = {k: {"p": [], "entropy": []} for k in KINDS}
    was = model.training
    model.eval()
    with torch.no_grad():
        for s in range(0, len(prompts), rows):
            batch = pack(list(prompts[s : s + rows]), list(responses[s : s + rows]), pad_id)
            out = response_forward(model, batch, with_entropy=True)
            p, ent = out.logp.double().exp().cpu(), out.entropy.double().cpu()
            for k, ks in enumerate(kinds[s : s + rows]):
                for t, kind in enumerate(ks):
                    acc[kind]["p"].append(float(p[k, t]))
                    acc[kind]["entropy"].append(float(ent[k, t]))
    model.train(was)
    return {k: {"n": len(v["p"]), "p_mean": _mean(v["p"]), "entropy_mean": _mean(v["entropy"])} for k, v in acc.items()}


def advantage_structure(adv: Sequence[np.ndarray], kinds: Sequence[Sequence[str]]) -> dict:
    """Measurement 2: per kind, the share of sum |A*|, mean |A*|, share of exact zeros, token count. adv: per rollout
    the Monte Carlo advantages of its tokens; kinds: per rollout token."""
    a = np.concatenate([np.asarray(x, dtype=np.float64) for x in adv]) if adv else np.zeros(0)
    k = np.concatenate([np.asarray(x, dtype=object) for x in kinds]) if kinds else np.zeros(0, dtype=object)
    total = float(np.abs(a).sum())
    out = {}
    for kind in KINDS:
        sel = k == kind
        out[kind] = {
            "n": int(sel.sum()),
            "abs_share": float(np.abs(a[sel]).sum()) / total if total > 0 else float("nan"),
            "abs_mean": float(np.abs(a[sel]).mean()) if sel.any() else float("nan"),
            "zero_frac": float((a[sel] == 0).mean()) if sel.any() else float("nan"),
        }
    return out


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else float("nan")


def markdown(result: Mapping[str, Any]) -> str:
    """Both measurements as Markdown tables."""
    g, a = result["gold"], result.get("advantage") or {}
    lines = [
        "| token kind | tokens (gold) | p(gold token) | entropy (nats) | tokens (rollouts) | share of Σ|A*| "
        "| mean |A*| | exact zeros |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k in KINDS:
        ak = a.get(k, {})
        lines.append(
            f"| {k} | {g[k]['n']} | {g[k]['p_mean']:.3f} | {g[k]['entropy_mean']:.3f} | {ak.get('n', 0)} | "
            f"{ak.get('abs_share', float('nan')):.3f} | {ak.get('abs_mean', float('nan')):.4f} | "
            f"{ak.get('zero_frac', float('nan')):.3f} |"
        )
    return "\n".join(lines) + "\n"


def boxed_reward(tokenizer) -> Any:
    """Reward of full responses: 1 iff the last ``\\boxed{...}`` holds exactly the gold answer string (the tiny
    tasks' answers are non-negative integers written canonically, where this equals math-verify's verdict)."""

    def fn(token_lists: list[list[int]], golds: list[Any]) -> list[float]:
        texts = tokenizer.batch_decode(token_lists, skip_special_tokens=True) if token_lists else []
        out = []
        for text, gold in zip(texts, golds):
            box = text.rfind(_BOX)
            close = text.find("}", box) if box >= 0 else -1
            out.append(float(box >= 0 and close >= 0 and text[box + len(_BOX) : close] == str(gold)))
        return out

    return fn


def measure(
    model_dir,
    data_dir,
    *,
    split: str = "val",
    n_gold: int = 100,
    n_prompts: int = 16,
    group: int = 8,
    K: int = 16,
    max_new_tokens: int = 64,
    seed: int = 0,
) -> dict[str, Any]:
    """Both measurements for the model in ``model_dir`` on split ``split`` of the prepared data in ``data_dir``: gold
    structure on its first ``n_gold`` records; the Monte Carlo truth on ``group`` rollouts (T = 1, top-p 1) of each of
    the first ``n_prompts`` records that have a decisive token (or of the first records, when none has)."""
    from pathlib import Path

    from creditlab.analysis.mc_truth import coupled_outcomes, token_truth
    from creditlab.data.io import read_records
    from creditlab.data.tokenizer import sft_examples
    from creditlab.lm.io import load_model, load_tokenizer
    from creditlab.lm.sampler import SamplingParams, generate

    tok = load_tokenizer(Path(data_dir))
    model = load_model(Path(model_dir)).eval()
    recs = read_records(Path(data_dir) / f"{split}.parquet")
    gold_recs = recs[:n_gold]
    prompts, responses = sft_examples(gold_recs, tok, "tiny", gold=True)
    kinds = [token_kinds(r, tok, (x.get("meta") or {}).get("decisive") or []) for r, x in zip(responses, gold_recs)]
    gold = gold_structure(model, prompts, responses, kinds, tok.pad_token_id)
    with_rule = [r for r in recs if (r.get("meta") or {}).get("decisive")]
    chosen = (with_rule or recs)[:n_prompts]
    p_ids, _ = sft_examples(chosen, tok, "tiny", gold=True)
    P = [p for p in p_ids for _ in range(group)]
    params = SamplingParams(
        max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, eos_id=tok.eos_token_id, seed=seed
    )
    with torch.no_grad():
        gen = generate(model, P, params)
    golds = [r["answer"] for r in chosen for _ in range(group)]
    reward_fn = boxed_reward(tok)
    rewards = reward_fn(gen.response_ids, golds)
    mc = coupled_outcomes(model, P, gen.response_ids, golds, reward_fn, params, K=K, pad_id=tok.pad_token_id)
    truth = token_truth(mc["C"])
    dec = [(r.get("meta") or {}).get("decisive") or [] for r in chosen for _ in range(group)]
    r_kinds = [token_kinds(resp, tok, d) for resp, d in zip(gen.response_ids, dec)]
    adv = [t.numpy() for t in truth["adv"]]
    return {
        "model": str(model_dir),
        "split": split,
        "gold": gold,
        "advantage": advantage_structure(adv, r_kinds),
        "rollouts": {
            "prompts": len(chosen),
            "group": group,
            "K": K,
            "reward_mean": float(np.mean(rewards)),
            "informative_groups": int(
                sum(0 < np.mean(rewards[g * group : (g + 1) * group]) < 1 for g in range(len(chosen)))
            ),
        },
    }


RANKERS = ("dlogp", "kl", "entropy", "random")
"""Token scores :func:`decisive_ranking` compares (Paper A's selection criteria, at the gold tokens)."""


def decisive_ranking(model_rl, model_base, prompts, responses, kinds, pad_id: int, seed: int = 0, rows: int = 64):
    """Paper A's mechanism on a world with decisive tokens: which token score puts the decisive tokens first.

    Over the tokens of the gold responses (teacher forcing, both models on the same states), each score ranks the
    tokens: ``dlogp`` = |log pi_RL(y_t) - log pi_base(y_t)| (Paper A's Δlog p at the token written), ``kl`` =
    KL(pi_RL || pi_base) of the next-token distributions, ``entropy`` = the base model's entropy, ``random`` = a
    seeded uniform draw. precision = the share of decisive tokens among the top k tokens of a score, with k = the
    number of decisive tokens (chance: k / N). Returns {score: precision} and ``n_decisive``, ``n_tokens``."""
    from creditlab.lm.batch import pack, response_logprobs

    scores: dict[str, list[float]] = {k: [] for k in RANKERS}
    is_dec: list[bool] = []
    for s in range(0, len(prompts), rows):
        batch = pack(list(prompts[s : s + rows]), list(responses[s : s + rows]), pad_id)
        with torch.no_grad():
            lp_rl = response_logprobs(model_rl.eval(), batch).double().cpu()
            lp_b = response_logprobs(model_base.eval(), batch).double().cpu()
        y = batch.responses.cpu()
        for k, ks in enumerate(kinds[s : s + rows]):
            n = len(ks)
            a = lp_rl[k, :n].gather(-1, y[k, :n, None])[:, 0]
            b = lp_b[k, :n].gather(-1, y[k, :n, None])[:, 0]
            scores["dlogp"] += (a - b).abs().tolist()
            scores["kl"] += (lp_rl[k, :n].exp() * (lp_rl[k, :n] - lp_b[k, :n])).sum(-1).tolist()
            scores["entropy"] += (-(lp_b[k, :n].exp() * lp_b[k, :n]).sum(-1)).tolist()
            is_dec += [kd == "decisive" for kd in ks]
    dec = np.array(is_dec)
    rng = np.random.default_rng(seed)
    scores["random"] = rng.random(dec.size).tolist()
    k = int(dec.sum())
    out: dict[str, Any] = {"n_decisive": k, "n_tokens": int(dec.size)}
    for name, v in scores.items():
        order = np.argsort(-np.asarray(v), kind="stable")[:k]
        out[name] = float(dec[order].mean()) if k else float("nan")
    return out
