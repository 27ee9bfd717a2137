"""The `diagnose` job: token diagnostics of a trained run against its base model (histograms, PNG + JSON)."""

from __future__ import annotations

from pathlib import Path

import torch

from creditlab import paths
from creditlab.data.io import read_records
from creditlab.decoding.diagnostics import collect_token_stats, summarize
from creditlab.jobs.common import setup, sources, write_json
from creditlab.lm.sampler import SamplingParams
from creditlab.plan import run_config
from creditlab.tables.figures import plot_token_histograms


def diagnose(
    results: str | Path, plan, backbone: str, run_name: str, seed: int, *, suites: list[str] | None = None
) -> None:
    """Token diagnostics of run (backbone, run_name, seed) of the plan vs its base model.

    One response per prompt of ``suites`` (default: tiny/micro easy, medium, hard; paper/smoke the suites the run's
    evaluation covers) is sampled from each model (eval.max_new_tokens, temperature, top_p) and scored by both. The
    models, tokenizer, prompt rendering and stop tokens are the run's at its scale (creditlab.models.sources): at
    paper / smoke the base model's hub snapshot and the run's merged final/, the chat template as verl renders
    prompts, on the GPU(s) when there are any (one model per GPU when there are two)."""
    run = plan.get(backbone, run_name, seed)
    if not run.trains:
        raise SystemExit(f"diagnose compares a trained run with its base model, not {run.key!r}")
    cfg = run_config(run)
    setup(cfg)
    fill = dict(results=results, scale=run.scale, backbone=run.backbone, run=run.run, seed=run.seed)
    src = sources(run, cfg, results)
    suites = suites or (plan.eval_suites(run) if src.hub else ["easy", "medium", "hard"])
    if not suites:
        raise SystemExit(f"{run.key}: no table evaluates this run at scale {run.scale!r}: name the suites (--suites)")
    missing = [str(src.suite(s)) for s in suites if not src.suite(s).is_file()]
    if missing:
        raise SystemExit(f"{run.key}: no suite file(s) {missing}: run the `prepare` job")
    tok = src.load_tokenizer()
    if src.hub and torch.cuda.is_available():  # the checkpoints' dtype (bf16) on the GPU(s)
        gpus = torch.cuda.device_count()
        models = [src.load_model(m, dtype="auto", device=f"cuda:{k % gpus}") for k, m in enumerate(("base", "trained"))]
    else:  # as saved, on the CPU (a tiny model's float32; the stand-ins' float32 / bf16 read as float32)
        models = [src.load_model(m, dtype=torch.float32 if src.hub else None) for m in ("base", "trained")]
    base, rl = (m.eval() for m in models)
    records = [r for s in suites for r in read_records(src.suite(s))]
    prompts = src.encode(tok, records)
    e = cfg["eval"]
    values = {
        s: collect_token_stats(
            base,
            rl,
            prompts,
            SamplingParams(
                max_new_tokens=e["max_new_tokens"],
                eos_id=src.stop_ids(tok),
                temperature=e["temperature"],
                top_p=e["top_p"],
                seed=run.seed,
            ),
            source=s,
            pad_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        )
        for s in ("base", "rl")
    }
    png = paths.fmt(paths.DIAG_PNG, **fill)
    plot_token_histograms(values, png, f"{run.key}: base vs RL outputs (suites {','.join(suites)})")
    write_json(
        {
            "run_key": run.key,
            "suites": suites,
            "stats": summarize(values),
            "base": str(src.base),
            "rl": str(src.trained),
            "n_prompts": len(prompts),
            "prompts": "chat template" if src.hub else "plain",
        },
        png.with_suffix(".json"),
    )
