"""Seed-to-seed noise of a run's scores, and the smallest effect a table can detect with it (issue 29, item 1).

Two kinds of score of a trained policy pi:

* **sampled**: the evaluation's accuracies (greedy and avg@k per suite, ``metrics.json``): they carry the
  sampling noise of the evaluation and the seed-to-seed noise of training;
* **exact probe scores** (no sampling at all; per token kind too: :func:`creditlab.analysis.structure.gold_structure`,
  e.g. the probability of the true operator at rule letters, the entropy at separators): on a fixed probe set of
  prompts q with a unique gold response y*
  (the tiny task's step-by-step solution + EOS, exactly what the warm-up taught), by teacher forcing

      gold_logp(q)   = sum_t log pi(y*_t | q, y*_<t)          the log-probability of the gold response
      gold_p(q)      = exp(gold_logp(q))                        the exact chance that a T = 1 sample is y*
      answer_logp(q) = sum_{t in answer} log pi(y*_t | q, y*_<t) the gold answer given the gold working

  averaged over the probe set. Their only noise across seeds is training's.

**Minimum detectable effect** of a two-arm comparison with n seeds per arm (seeds unpaired: two methods share no
training randomness beyond the base model), two-sided level alpha and power 1 - beta, by Welch's two-sample t test
with the per-arm seed standard deviation sd (:func:`power_two_sample`: exact, the noncentral t)::

    MDE(n) = the smallest d with power(d, sd, n) >= 1 - beta     (~ (z_{1-alpha/2} + z_{1-beta}) sd sqrt(2 / n))

Shapes: per-seed scores are plain floats; :func:`gold_scores` returns ``Tensor[N]`` per probe prompt.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

ALPHA = 0.05
POWER = 0.8


def power_two_sample(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided two-sample t test (equal n per arm, equal sd) to detect a true difference
    ``effect``: P(|T| > t_{1-alpha/2, 2n-2}) with T ~ noncentral t(2n - 2, delta = effect / (sd sqrt(2/n)))."""
    from scipy import stats

    if n < 2:
        return float("nan")
    if sd <= 0:
        return 1.0 if effect != 0 else alpha
    df = 2 * n - 2
    delta = abs(effect) / (sd * math.sqrt(2.0 / n))
    crit = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(crit, df, delta) + stats.nct.cdf(-crit, df, delta))


def power_one_sample(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided one-sample t test (n values of sd ``sd``) to detect a true mean ``effect`` != 0:
    P(|T| > t_{1-alpha/2, n-1}) with T ~ noncentral t(n - 1, delta = effect / (sd / sqrt(n)))."""
    from scipy import stats

    if n < 2:
        return float("nan")
    if sd <= 0:
        return 1.0 if effect != 0 else alpha
    df, delta = n - 1, abs(effect) / (sd / math.sqrt(n))
    crit = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(crit, df, delta) + stats.nct.cdf(-crit, df, delta))


def mde_two_sample(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest true difference the two-sided two-sample t test with ``n`` seeds per arm detects with
    probability ``power`` (bisection on :func:`power_two_sample`); nan for n < 2."""
    if n < 2:
        return float("nan")
    if sd <= 0:
        return 0.0
    lo, hi = 0.0, 12.0 * sd * math.sqrt(2.0 / n)  # delta = 12: power ~1 for every n >= 2 (df >= 2)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if power_two_sample(mid, sd, n, alpha) >= power else (mid, hi)
    return hi


def seeds_needed(effect: float, sd: float, alpha: float = ALPHA, power: float = POWER, max_n: int = 10_000) -> int:
    """Seeds per arm the two-sample t test needs to detect ``effect`` with ``power`` (max_n + 1 if never)."""
    for n in range(2, max_n + 1):
        if power_two_sample(effect, sd, n, alpha) >= power:
            return n
    return max_n + 1


def gold_scores(
    model, prompts: Sequence[list[int]], responses: Sequence[list[int]], answer_spans, pad_id: int, rows: int = 64
) -> dict[str, Tensor]:
    """Exact probe scores of one policy (module docstring) by teacher forcing.

    prompts / responses: token ids per probe prompt (the response = the gold response, EOS included);
    answer_spans: per prompt, ``(start, end)`` response positions of the gold answer's tokens. Returns
    ``{"gold_logp", "gold_p", "answer_logp"}``, each ``Tensor[N]`` float64 on the CPU."""
    from creditlab.lm.batch import pack, response_forward

    device = next(model.parameters()).device
    was = model.training
    model.eval()
    out: dict[str, list[Tensor]] = {"gold_logp": [], "answer_logp": []}
    with torch.no_grad():
        for s in range(0, len(prompts), rows):
            p, r = list(prompts[s : s + rows]), list(responses[s : s + rows])
            batch = pack(p, r, pad_id)
            logp = (response_forward(model, batch).logp.double() * batch.response_mask.to(device)).cpu()
            for k, (a, b) in enumerate(answer_spans[s : s + rows]):
                out["gold_logp"].append(logp[k].sum())
                out["answer_logp"].append(logp[k, a:b].sum())
    model.train(was)
    gold = torch.stack(out["gold_logp"])
    return {"gold_logp": gold, "gold_p": gold.exp(), "answer_logp": torch.stack(out["answer_logp"])}


def probe_set(records: Sequence[Mapping[str, Any]], tokenizer, template: str) -> tuple[list, list, list]:
    """(prompt ids, gold response ids, answer spans) of records with a ``solution`` ending in ``\\boxed{answer}``:
    the warm-up's own SFT pairs (:func:`creditlab.data.tokenizer.sft_examples`); the answer span covers the
    tokens of the boxed answer (found by encoding the solution up to the answer)."""
    from creditlab.data.tokenizer import sft_examples

    prompts, responses = sft_examples(list(records), tokenizer, template, gold=True)
    spans = []
    for r, resp in zip(records, responses):
        sol = r["solution"]
        cut = sol.rindex(r["answer"] + "}")
        head = tokenizer(" " + sol[:cut], add_special_tokens=False)["input_ids"]
        body = tokenizer(" " + sol[: cut + len(r["answer"])], add_special_tokens=False)["input_ids"]
        if resp[: len(body)] != body:
            raise ValueError(f"the tokenizer does not split the solution at its answer: {sol!r}")
        spans.append((len(head), len(body)))
    return prompts, responses, spans


def summarize(per_seed: Mapping[int, Mapping[str, float]], ns: Sequence[int] = (1, 3, 5, 10)) -> dict[str, Any]:
    """Across seeds, per metric: mean, sd (ddof 1), the MDE at each n of ``ns`` seeds per arm (n = 1: none; the
    pipeline's default tables have one seed, where a seed difference cannot be told from a method effect) and
    MDE / sd. ``per_seed``: seed -> metric -> value (metrics missing in a seed are skipped for that seed)."""
    metrics = sorted({k for v in per_seed.values() for k in v})
    out: dict[str, Any] = {}
    for m in metrics:
        xs = np.array([float(v[m]) for v in per_seed.values() if m in v and np.isfinite(v[m])])
        if xs.size < 2:
            continue
        sd = float(xs.std(ddof=1))
        out[m] = {
            "n_seeds": int(xs.size),
            "mean": float(xs.mean()),
            "sd": sd,
            "min": float(xs.min()),
            "max": float(xs.max()),
            "mde": {str(n): mde_two_sample(sd, n) for n in ns},
        }
    return out


SUITES = ("easy", "medium", "hard", "ood")
"""The tiny world's arithmetic suites (configs/data/tiny_arith.yaml); the cancellation table's Avg averages the
suites its six benchmarks map to, all of them these."""


def _sampled_scores(result: Mapping[str, Any], suites: Sequence[str]) -> dict[str, float]:
    """Per-suite greedy and avg@k of one evaluation, and their plain averages over ``suites`` (``avg_greedy``,
    ``avg_sampled``), in percent."""
    from creditlab.tables.load import question_values

    out: dict[str, float] = {}
    k = int(result["suites"][suites[0]]["per_question"]["n"])
    for s in suites:
        suite = result["suites"][s]
        out[f"{s}/greedy"] = 100.0 * float(question_values(suite, "greedy").mean())
        out[f"{s}/avg@{k}"] = 100.0 * float(question_values(suite, f"avg@{k}").mean())
    out["avg_greedy"] = float(np.mean([out[f"{s}/greedy"] for s in suites]))
    out["avg_sampled"] = float(np.mean([out[f"{s}/avg@{k}"] for s in suites]))
    return out


def seed_pair_false_positives(results: Sequence[Mapping[str, Any]], suites: Sequence[str]) -> dict[str, Any]:
    """The ledger's one-seed test applied to two seeds of the *same* run: for every pair of seeds, the paired
    bootstrap over questions (:func:`creditlab.tables.stats.paired_bootstrap_diff_suites`, the avg@k Avg of
    ``suites``) and whether it calls the difference significant (two-sided, 5%). Every such call is a false
    positive: the two arms differ only by their training seed. Returns the pairs' differences (pp), p-values and
    the share called significant."""
    from creditlab.tables.load import question_values
    from creditlab.tables.stats import paired_bootstrap_diff_suites

    k = int(results[0]["suites"][suites[0]]["per_question"]["n"])
    per = [[100.0 * question_values(r["suites"][s], f"avg@{k}") for s in suites] for r in results]
    pairs = []
    for i in range(len(per)):
        for j in range(i + 1, len(per)):
            diff, lo, hi, p, p_rev = paired_bootstrap_diff_suites(per[i], per[j], "plain")
            two_sided = min(1.0, 2 * min(p, p_rev))
            se = (hi - lo) / (2 * 1.6449)  # lo / hi: the one-sided 95% bounds
            pairs.append({"pair": [i, j], "diff_pp": diff, "p_two_sided": two_sided, "se_pp": se})
    called = [x["p_two_sided"] < ALPHA for x in pairs]
    se = float(np.mean([x["se_pp"] for x in pairs])) if pairs else float("nan")
    return {
        "pairs": pairs,
        "significant_frac": float(np.mean(called)) if pairs else float("nan"),
        "se_pp": se,
        "ledger_mde_pp": (1.95996 + 0.84162) * se,  # the one-seed test's MDE (normal approx., 80% power)
        "seed_sd_of_diff_pp": float(np.std([x["diff_pp"] for x in pairs], ddof=1)) if len(pairs) > 1 else float("nan"),
    }


def measure(
    results: str,
    scale: str,
    backbone: str,
    run: str,
    seeds: Sequence[int],
    *,
    probe: str = "val",
    probe_n: int = 100,
    suites: Sequence[str] = SUITES,
) -> dict[str, Any]:
    """Item 1 of issue 29 on built results: per seed of run (backbone, run) its evaluation's sampled scores and its
    final model's exact probe scores (the first ``probe_n`` records of split ``probe``), the base model's probe
    scores, :func:`summarize` across seeds and :func:`seed_pair_false_positives`."""
    from pathlib import Path

    from creditlab import paths
    from creditlab.data.io import read_records
    from creditlab.lm.io import load_model, load_tokenizer
    from creditlab.tables.load import load_eval

    data_dir = Path(paths.fmt(paths.DATA_DIR, results=results, scale=scale))
    tok = load_tokenizer(data_dir)
    recs = read_records(data_dir / f"{probe}.parquet")[:probe_n]
    prompts, responses, spans = probe_set(recs, tok, "tiny")

    from creditlab.analysis.structure import decisive_ranking, gold_structure, token_kinds

    kinds = [token_kinds(r, tok, (x.get("meta") or {}).get("decisive") or []) for r, x in zip(responses, recs)]
    base_model = load_model(Path(paths.fmt(paths.BASE_DIR, results=results, scale=scale, backbone=backbone)))

    def probe_scores(model_dir: Path, rank: bool = True) -> dict[str, float]:
        model = load_model(model_dir)
        g = gold_scores(model, prompts, responses, spans, tok.pad_token_id)
        out = {f"probe/{k}": float(v.mean()) for k, v in g.items()}
        for kind, v in gold_structure(model, prompts, responses, kinds, tok.pad_token_id).items():
            if v["n"]:  # per token kind on the same fixed states (analysis/structure.py): p(gold token), entropy
                out[f"probe/{kind}_p"], out[f"probe/{kind}_entropy"] = v["p_mean"], v["entropy_mean"]
        if rank and any("decisive" in k for k in kinds):  # Paper A's ranking of a trained model, against the base
            rank = decisive_ranking(model, base_model, prompts, responses, kinds, tok.pad_token_id)
            out |= {f"rank/{k}": float(v) for k, v in rank.items() if k not in ("n_decisive", "n_tokens")}
            out["rank/dlogp_minus_entropy"] = rank["dlogp"] - rank["entropy"]
        return out

    evals_dir = Path(paths.fmt(paths.EVAL_DIR, results=results, scale=scale, backbone="x", run="x", seed=0)).parents[2]
    per_seed: dict[int, dict[str, float]] = {}
    evals = [load_eval(evals_dir, backbone, run, s) for s in seeds]
    suites = [x for x in suites if all(x in ev["suites"] for ev in evals)]  # those the run's tables evaluated
    if not suites:
        raise ValueError(f"no suite of {list(SUITES)} in every seed's evaluation of {backbone}/{run}")
    for s, ev in zip(seeds, evals):
        run_dir = Path(paths.fmt(paths.RUN_DIR, results=results, scale=scale, backbone=backbone, run=run, seed=s))
        scores = probe_scores(run_dir / "final")
        scores.update(_sampled_scores(ev, suites))
        per_seed[int(s)] = scores
    base = probe_scores(Path(paths.fmt(paths.BASE_DIR, results=results, scale=scale, backbone=backbone)), rank=False)
    return {
        "backbone": backbone,
        "run": run,
        "scale": scale,
        "seeds": [int(s) for s in seeds],
        "probe": {"split": probe, "n": len(prompts)},
        "base": base,
        "per_seed": per_seed,
        "summary": summarize(per_seed),
        "suites": suites,
        "seed_pairs": seed_pair_false_positives(evals, suites),
        "alpha": ALPHA,
        "power": POWER,
    }


def markdown(result: Mapping[str, Any]) -> str:
    """The noise floor as a Markdown table: per metric mean, sd across seeds, range and MDE at n seeds per arm."""
    s = result["summary"]
    ns = list(next(iter(s.values()))["mde"]) if s else []
    lines = [
        f"Seed-to-seed noise of `{result['backbone']}/{result['run']}` at {result['scale']} scale, "
        f"{len(result['seeds'])} seeds; probe: first {result['probe']['n']} `{result['probe']['split']}` prompts "
        f"(exact, teacher-forced). MDE: two-sided two-sample t test, alpha {result['alpha']}, power "
        f"{result['power']}, n seeds per arm.",
        "",
        "| metric | base | mean | sd | min | max | " + " | ".join(f"MDE n={n}" for n in ns) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(ns),
    ]
    for m, v in s.items():
        base = result["base"].get(m)
        lines.append(
            f"| {m} | {'' if base is None else f'{base:.4g}'} | {v['mean']:.4g} | {v['sd']:.3g} | {v['min']:.4g} | "
            f"{v['max']:.4g} | "
            + " | ".join("-" if not np.isfinite(x) else f"{x:.3g}" for x in v["mde"].values())
            + " |"
        )
    sp = result["seed_pairs"]
    lines += [
        "",
        f"The ledger's one-seed test (paired bootstrap over questions, avg@k Avg) on two seeds of the same run: "
        f"{sum(p['p_two_sided'] < result['alpha'] for p in sp['pairs'])} of {len(sp['pairs'])} seed pairs called "
        f"significant at two-sided {result['alpha']} (false-positive share {sp['significant_frac']:.2f}; "
        f"|diff| up to {max((abs(p['diff_pp']) for p in sp['pairs']), default=float('nan')):.2f} pp). Its standard "
        f"error from the question bootstrap: {sp['se_pp']:.2f} pp, so its MDE (80% power) is "
        f"{sp['ledger_mde_pp']:.2f} pp, and what it tests is the questions' noise, not the seeds'.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m creditlab.analysis.noise --backbone tiny-s --run dapo --seeds 0,1,2,3,4,5``: JSON + Markdown."""
    import argparse
    import json
    from pathlib import Path

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--results", default="results")
    ap.add_argument("--scale", default="tiny")
    ap.add_argument("--backbone", default="tiny-s")
    ap.add_argument("--run", default="dapo")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--probe-n", type=int, default=100)
    ap.add_argument("--suites", default=",".join(SUITES), help="suites of the sampled scores (those every seed has)")
    ap.add_argument("--out", default=None, help="JSON path (default results/<scale>/analyses/noise_<backbone>_<run>)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    seeds = [int(x) for x in a.seeds.split(",")]
    res = measure(a.results, a.scale, a.backbone, a.run, seeds, probe_n=a.probe_n, suites=a.suites.split(","))
    out = Path(a.out or f"{a.results}/{a.scale}/analyses/noise_{a.backbone}_{a.run}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
