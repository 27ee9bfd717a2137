"""Write the GPU check's results: ``gpu_check.json`` (every record) and ``gpu_check.md`` (a short summary)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        if x == 0 or not math.isfinite(x):
            return str(x)
        return f"{x:.2e}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.3f}"
    return str(x)


def _worst(records: list[dict], *path: str) -> float:
    """The largest finite number at ``metrics.<path>`` over ``records`` (limited ones excluded); NaN if none."""
    vals = []
    for r in records:
        if r.get("limited"):
            continue
        m: Any = r.get("metrics") or {}
        for p in path:
            m = m.get(p) if isinstance(m, dict) else None
        if isinstance(m, (int, float)) and not isinstance(m, bool) and math.isfinite(m):
            vals.append(float(m))
    return max(vals) if vals else float("nan")


def _max(*xs: float) -> float:
    finite = [x for x in xs if math.isfinite(x)]
    return max(finite) if finite else float("nan")


def _status(r: dict[str, Any]) -> str:
    return "limited" if r.get("limited") else ("pass" if r["ok"] else "FAIL")


def markdown(result: dict[str, Any]) -> str:
    env, checks = result["environment"], result["checks"]
    records = result["records"]
    failed = [r for r in records if not r["ok"]]
    limited = [r for r in records if r.get("limited")]
    lines = [
        "# GPU acceptance check",
        "",
        f"**{'PASS' if result['ok'] else 'FAIL'}**: {len(records)} checks, {len(failed)} failed, "
        f"{len(limited)} limited by bf16's resolution (reported, not failed).",
        "",
        f"- device: {env['device']} ({env.get('device_name', '')}); size `{result['args']['size']}`",
        f"- python {env['python']}, torch {env['torch']} (CUDA {env.get('cuda')}), transformers "
        f"{env.get('transformers')}, peft {env.get('peft')}",
        f"- hidden packages (absent from the device image): {', '.join(result['isolation']['hidden']) or 'none'}; "
        f"imported anyway: {', '.join(result['isolation']['imported']) or 'none'}",
        f"- creditlab from `{result['isolation']['creditlab']}`; wall time {result['seconds']:.1f} s",
        "",
    ]
    if "methods" in checks:
        m = checks["methods"]
        lines += [
            "## 1. Registered methods on the device against CPU float64",
            "",
            f"Batch {m['sizes']['B']} rollouts x {m['sizes']['T']} tokens (d {m['sizes']['d']}, V {m['sizes']['V']});"
            f" tolerance per element {m['tolerance']['rtol']} relative + {m['tolerance']['atol_of_max']} of the max,"
            f" at most {m['tolerance']['max_mismatch_frac']} of the elements outside (discontinuities).",
            "",
            "Worst over the cases that are not limited: the relative 2-norm error of the values (a loss: of its terms'"
            " scale) and of d loss / d logp (not gated: a clip flip moves it), and the gated share of elements outside"
            " the tolerance. Batchings must give the identical partition.",
            "",
            "| profile | kind | cases | failed | limited | value rel. err | grad rel. err | elements outside |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        recs = [r for r in records if r["check"] == "methods"]
        for profile in m["profiles"]:
            for kind in [*m["registered"], "method_config"]:
                rs = [r for r in recs if r["profile"] == profile and r["kind"] == kind]
                if not rs:
                    continue
                val = _max(_worst(rs, "rel_err"), _worst(rs, "loss", "rel_err"))
                mm = _max(_worst(rs, "mismatch_frac"), _worst(rs, "grad", "mismatch_frac"))
                grad = _worst(rs, "grad", "rel_err")
                n_failed, n_limited = sum(not r["ok"] for r in rs), sum(bool(r.get("limited")) for r in rs)
                lines.append(
                    f"| {profile} | {kind} | {len(rs)} | {n_failed} | {n_limited} | {_fmt(val)} | {_fmt(grad)} | "
                    f"{_fmt(mm)} |"
                )
        missing = {k: sorted(set(v) - set(m["covered"][k])) for k, v in m["registered"].items()}
        lines += ["", f"Registered and not covered: {({k: v for k, v in missing.items() if v}) or 'none'}.", ""]
    if "engine" in checks:
        lines += ["## 2. Local engine in bf16 (micro stand-ins)", "", "| check | status | numbers |"]
        lines.append("| --- | --- | --- |")
        for r in (r for r in records if r["check"] == "engine"):
            lines.append(f"| {r['name']} | {_status(r)} | {_engine_numbers(r)} |")
        lines.append("")
    if "verl" in checks:
        v = checks["verl"]
        ok = [k.rsplit(".", 1)[1] for k, e in v["imports"].items() if e == "ok"]
        bad = {k.rsplit(".", 1)[1]: e for k, e in v["imports"].items() if e != "ok"}
        recs = [r for r in records if r["check"] == "verl"]
        lines += [
            "## 3. verl worker side without verl and Ray",
            "",
            f"Import: {', '.join(ok) or 'none'} import; "
            + ("; ".join(f"{k} does not ({e})" for k, e in bad.items()) or "all import")
            + ".",
            "",
            f"Plug-in registries: {v['plugin_registries']}. {len(recs)} plug-in cases, "
            f"{sum(not r['ok'] for r in recs)} failed; worst loss rel. err {_fmt(_worst(recs, 'loss', 'rel_err'))}, "
            f"worst grad mismatch {_fmt(_worst(recs, 'grad', 'mismatch_frac'))}, float64 identity with creditlab's "
            f"mini-batch loss within {_fmt(_worst(recs, 'identity', 'rel_err'))}.",
            "",
        ]
    if limited:
        lines += ["## Limited by bf16 (not failures)", ""]
        reasons: dict[str, list[str]] = {}
        for r in limited:
            reasons.setdefault(r["limited"], []).append(r["name"])
        for why, names in reasons.items():
            lines.append(f"- {len(names)} cases ({names[0]}, ...): {why}")
        lines.append("")
    cleared = sorted({r["name"] for r in records if r.get("limit_not_hit")})
    if cleared:
        lines += [
            f"Known bf16 limits not hit in this run: {', '.join(cleared)} (if that persists, the limit is gone: "
            "drop it from gpu_check.methods.KNOWN_LIMITS).",
            "",
        ]
    if failed:
        lines += ["## Failures", ""]
        for r in failed:
            lines.append(f"- `{r['name']}`: {r.get('error') or _brief(r)}")
        lines.append("")
    return "\n".join(lines)


def _brief(r: dict[str, Any]) -> str:
    return json.dumps(r.get("metrics"), default=str)[:400]


def _engine_numbers(r: dict[str, Any]) -> str:
    if r.get("error"):
        return r["error"][:200]
    m = r["metrics"]
    name = r["name"]
    if name.startswith("sft/"):
        return f"loss {_fmt(m['loss_first'])} -> {_fmt(m['loss_last'])} in {m['steps']} steps"
    if name.startswith("sampler/"):
        tf, fr = m["bf16_vs_fp32_teacher_forced"], m["bf16_vs_fp32_free_running"]
        return (
            f"fp32 vs transformers {_fmt(m['fp32_vs_transformers']['token_agreement'])}; bf16 vs fp32 greedy: "
            f"free-running tokens {_fmt(fr['token_agreement'])} (whole {_fmt(fr['exact_frac'])}), teacher-forced "
            f"argmax {_fmt(tf['argmax_agreement'])} of {tf['positions']}, logit err max {_fmt(tf['logit_err_max'])}"
            f" of max logit {_fmt(tf['logit_max'])}; same-seed sampling equal {m['sampling_same_seed_equal']}; "
            f"greedy answers right: fp32 {_fmt(m['fp32_correct_frac'])}, bf16 {_fmt(m['bf16_correct_frac'])}"
        )
    return (
        f"loss {', '.join(_fmt(x) for x in m['loss'])}; grad norm {', '.join(_fmt(x) for x in m['grad_norm'])}"
        f"{'; LoRA' if m.get('lora') else ''}; {m['rollouts_per_step']} rollouts/step"
    )


def write(result: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``gpu_check.json`` and ``gpu_check.md`` under ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "gpu_check.json", out / "gpu_check.md"
    js.write_text(json.dumps(result, indent=1, default=str, allow_nan=True) + "\n")
    md.write_text(markdown(result) + "\n")
    return js, md
