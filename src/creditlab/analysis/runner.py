"""Run one declared analysis of a paper config: build the context (the run's trainer, in its start state,
with the real reward scorer), call the kind's ``analyze``, write JSON + Markdown + PNG with provenance."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from creditlab import paths
from creditlab.analysis import AnalysisContext, kind_module


def run_analysis(results: str | Path, plan, paper: str, name: str, progress: bool = False) -> dict[str, Any]:
    """Analysis ``name`` of ``paper`` at the plan's scale, seed = the paper's first; returns the result."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from creditlab.data.io import read_records
    from creditlab.engines.local.trainer import Trainer
    from creditlab.plan import compose, run_config
    from creditlab.rewards.scorer import RewardScorer
    from creditlab.tables.html import write_markdown_html
    from creditlab.tracking.provenance import git_commit

    spec = plan.papers[paper]
    an = spec.analyses[name]
    seed = plan.paper_seeds(paper)[0]
    run = plan.get(spec.backbone_for(an.backbone, plan.scale), an.run, seed)
    cfg = run_config(run)
    torch.set_num_threads(int(cfg.get("threads", 1)))
    fill = dict(results=results, scale=run.scale, backbone=run.backbone, run=run.run, seed=run.seed)
    data_dir = paths.fmt(paths.DATA_DIR, **fill)
    tok = AutoTokenizer.from_pretrained(str(data_dir / "tokenizer"))
    records = read_records(data_dir / "train.parquet")
    weights = paths.fmt(paths.BASE_DIR, **fill) if an.start == "base" else paths.fmt(paths.RUN_DIR, **fill) / "final"
    t0 = time.perf_counter()
    with RewardScorer(cfg["trainer"]["reward"], timeout_s=cfg["trainer"]["reward_timeout_s"]) as scorer, \
            tempfile.TemporaryDirectory() as scratch:

        def make_trainer(overrides: list[str] = ()) -> Trainer:
            c = cfg if not overrides else compose(run.scale, run.backbone, run.method, [*run.overrides, *overrides],
                                                  run.seed) | {"run": cfg["run"]}
            model = AutoModelForCausalLM.from_pretrained(str(weights))
            trainer = Trainer(c, model, tok, records, scorer, Path(scratch) / "unused", progress=progress)
            if an.start == "trained":  # the run's final optimizer state too (Adam's moments shape an update)
                trainer.ckpt_dir = paths.fmt(paths.CKPT_DIR, **fill)
                if not trainer.maybe_resume():
                    raise FileNotFoundError(f"{run.key}: no checkpoint under {trainer.ckpt_dir} to start from")
                trainer.ckpt_dir = Path(scratch) / "unused"  # never written: the run's checkpoint stays as it is
            return trainer

        ctx = AnalysisContext(trainer=make_trainer(), decode=lambda i: tok.decode([i]), seed=seed,
                              make_trainer=make_trainer)
        mod = kind_module(an.kind)
        result = mod.analyze(ctx, **an.kwargs)
    result["provenance"] = {"paper": paper, "analysis": name, "run_key": run.key, "start": an.start,
                            "weights": str(weights), "params": an.kwargs, "commit": git_commit(),
                            "seconds": time.perf_counter() - t0, "scale": run.scale,
                            "note": "tiny-model numbers on synthetic suites, never the paper's" if run.scale != "paper"
                            else ""}
    out = dict(results=results, scale=run.scale, paper=paper, analysis=name)
    js, md, png = (paths.fmt(p, **out) for p in (paths.ANALYSIS_JSON, paths.ANALYSIS_MD, paths.ANALYSIS_PNG))
    for p in (js, md, png):
        p.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# {paper}/{name}: {an.caption}\n\nRun `{run.key}` ({an.start} weights), commit "
              f"`{result['provenance']['commit']}`, {result['provenance']['seconds']:.0f} s. "
              f"{result['provenance']['note']}\n\nParams: `{yaml.safe_dump(an.kwargs, default_flow_style=True, width=10**6).strip()}`"
              "\n\n")
    mod.plot(result, png)
    md.write_text(header + mod.markdown(result))
    write_markdown_html(md, paths.fmt(paths.ANALYSIS_HTML, **out), title=f"{paper}/{name}")
    tmp = js.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=_jsonable) + "\n")
    os.replace(tmp, js)  # last: the JSON is the rule's completion marker
    return result


def _jsonable(x: Any) -> Any:
    try:
        return x.tolist()
    except AttributeError:
        return str(x)
