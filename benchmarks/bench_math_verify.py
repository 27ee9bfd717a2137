"""False-positive and false-negative rates of the math-verify reward on a labelled set, before and after.

    .venv/bin/python benchmarks/bench_math_verify.py                # before = math-verify's defaults, after = ours
    .venv/bin/python benchmarks/bench_math_verify.py --before-ref cfa0478 --show-errors   # before = a commit's judge

The labelled set is ``tests/fixtures/math_verify_labelled.jsonl``: one ``{"category", "gold", "answer", "label"}``
per line, ``answer`` being the content of the response's last ``\\boxed{}``. "Before" is the judge as it
was before issue 21: math-verify 0.9.0's ``parse`` of both sides wrapped in ``\\boxed{}``, then ``verify``
with its default tolerance (:func:`math_verify_defaults`); or, with ``--before-ref``, ``judge_math_verify``
as committed at that git ref (loaded from ``git show``, its reward registration stubbed out). "After" is
``judge_math_verify`` of the working tree. Each pair is judged in this process, with math-verify's
own 5 s timeout. Rates: false positive = wrong answers (label 0) scored 1 / all wrong answers; false
negative = right answers (label 1) scored 0 / all right answers. Writes ``benchmarks/results/math_verify.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
import types
from collections import defaultdict
from pathlib import Path
from typing import Callable
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "math_verify_labelled.jsonl"
MODULE = "src/creditlab/rewards/math_verify_reward.py"

Judge = Callable[[str, str], float]


def load_pairs(path: Path = FIXTURE) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def math_verify_defaults(answer: str, gold: str) -> float:
    """The judge before issue 21 (creditlab at cfa0478): math-verify's defaults, no exact numbers."""
    from math_verify import parse, verify

    gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=5)
    pred_parsed = parse("\\boxed{" + answer + "}", parsing_timeout=5)
    if not gold_parsed or not pred_parsed:
        return 0.0
    return 1.0 if verify(gold_parsed, pred_parsed, timeout_seconds=5) else 0.0


def judge_at_ref(ref: str) -> Judge:
    """``judge_math_verify`` of ``MODULE`` as committed at git ``ref``."""
    from creditlab.algos import registry

    source = subprocess.run(
        ["git", "show", f"{ref}:{MODULE}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType(f"math_verify_reward_at_{ref.replace('/', '_')}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    with mock.patch.object(registry, "register", lambda kind, name: lambda fn: fn):
        exec(compile(source, f"{ref}:{MODULE}", "exec"), module.__dict__)  # noqa: S102 - our own committed file
    return lambda answer, gold: module.judge_math_verify(answer, gold, internal_timeout=5)


def current_judge() -> Judge:
    from creditlab.rewards.math_verify_reward import judge_math_verify

    return lambda answer, gold: judge_math_verify(answer, gold, internal_timeout=5)


def rates(pairs: list[dict], scores: list[float]) -> dict:
    """Overall and per-category false-positive / false-negative counts and rates."""

    def summary(items: list[tuple[dict, float]]) -> dict:
        neg = [s for p, s in items if p["label"] == 0]
        pos = [s for p, s in items if p["label"] == 1]
        fp, fn = sum(s == 1.0 for s in neg), sum(s != 1.0 for s in pos)
        return {
            "n": len(items),
            "n_wrong": len(neg),
            "n_right": len(pos),
            "false_positives": fp,
            "false_negatives": fn,
            "fp_rate": fp / len(neg) if neg else 0.0,
            "fn_rate": fn / len(pos) if pos else 0.0,
        }

    by_cat: dict[str, list[tuple[dict, float]]] = defaultdict(list)
    for p, s in zip(pairs, scores):
        by_cat[p["category"]].append((p, s))
    return {
        "overall": summary(list(zip(pairs, scores))),
        "by_category": {c: summary(items) for c, items in sorted(by_cat.items())},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--before-ref",
        default=None,
        help="git ref whose judge_math_verify is 'before' (default: math-verify's defaults)",
    )
    ap.add_argument("--fixture", type=Path, default=FIXTURE)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "math_verify.json")
    ap.add_argument("--show-errors", action="store_true", help="list every misjudged pair")
    args = ap.parse_args(argv)
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    pairs = load_pairs(args.fixture)
    before = judge_at_ref(args.before_ref) if args.before_ref else math_verify_defaults
    before_name = f"judge_math_verify at {args.before_ref}" if args.before_ref else "math-verify 0.9.0 defaults"
    judges = {"before": before, "after": current_judge()}
    report: dict = {"fixture": args.fixture.name, "n_pairs": len(pairs), "before_judge": before_name}
    errors: dict[str, list[dict]] = {}
    for name, judge in judges.items():
        judge("1", "1")  # imports and parser set-up outside the timing
        t0 = time.perf_counter()
        scores = [float(judge(p["answer"], p["gold"])) for p in pairs]
        seconds = time.perf_counter() - t0
        report[name] = rates(pairs, scores)
        report[name]["ms_per_pair"] = 1000 * seconds / len(pairs)
        errors[name] = [{**p, "score": s} for p, s in zip(pairs, scores) if (s == 1.0) != (p["label"] == 1)]
        report[name]["errors"] = errors[name]

    print(f"{len(pairs)} labelled pairs ({args.fixture.name}); before = {before_name}, after = working tree")
    print(
        f"{'':18} {'n':>4} {'wrong':>5} {'right':>5} | {'FP before':>10} {'FP after':>9} | "
        f"{'FN before':>10} {'FN after':>9}"
    )
    rows = [("overall", report["before"]["overall"], report["after"]["overall"])]
    rows += [(c, report["before"]["by_category"][c], s) for c, s in report["after"]["by_category"].items()]
    for name, b, a in rows:
        print(
            f"{name:18} {a['n']:>4} {a['n_wrong']:>5} {a['n_right']:>5} | "
            f"{b['false_positives']:>3} {b['fp_rate']:6.1%} {a['false_positives']:>3} {a['fp_rate']:5.1%} | "
            f"{b['false_negatives']:>3} {b['fn_rate']:6.1%} {a['false_negatives']:>3} {a['fn_rate']:5.1%}"
        )
    print(
        f"mean judge time per pair: before {report['before']['ms_per_pair']:.1f} ms, "
        f"after {report['after']['ms_per_pair']:.1f} ms (one process, this machine's load)"
    )
    if args.show_errors:
        for name in judges:
            print(f"\nmisjudged {name}:")
            for e in errors[name]:
                print(
                    f"  [{e['category']}] gold {e['gold']!r} answer {e['answer']!r} label {e['label']} "
                    f"score {e['score']:g}"
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
