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
    """Analysis ``name`` of ``paper`` at the plan's scale, seed = the paper's first; returns the result.

    Every scale takes the same path: the run's files come from :func:`creditlab.models.sources.run_sources` (tiny:
    the warmed-up model, the data's tokenizer and train split; paper / smoke: the hub snapshot, its own tokenizer,
    the prepared training set, chat-template prompts and the checkpoint's stop tokens, as verl rolled out), the local
    engine's Trainer is built on the start weights in float32 (``device: auto``: the GPU when there is one) and, for
    ``start: trained``, put in the run's final training state (tiny: the local checkpoint; hub: verl's last FSDP
    checkpoint, master weights and AdamW moments: :meth:`RunSources.resume_trained`)."""
    import torch

    from creditlab.engines.local.trainer import Trainer
    from creditlab.models.sources import run_sources
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
    src = run_sources(run, cfg, results)
    tok = src.load_tokenizer()
    records = src.load_records()
    prompt_ids, stop_ids = src.encode(tok, records), src.stop_ids(tok)
    weights = src.weights(an.start)
    states: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with RewardScorer(cfg["trainer"]["reward"], timeout_s=cfg["trainer"]["reward_timeout_s"]) as scorer, \
            tempfile.TemporaryDirectory() as scratch:

        def make_trainer(overrides: list[str] = ()) -> Trainer:
            c = cfg if not overrides else compose(run.scale, run.backbone, run.method, [*run.overrides, *overrides],
                                                  run.seed) | {"run": cfg["run"]}
            model = src.load_model(an.start, dtype=torch.float32)  # the trainer's precision (a hub snapshot: bf16)
            trainer = Trainer(c, model, tok, records, scorer, Path(scratch) / "unused", progress=progress,
                              prompt_ids=prompt_ids, stop_ids=stop_ids)
            if an.start == "trained":  # the run's final optimizer state too (Adam's moments shape an update)
                states.append(src.resume_trained(trainer))
            return trainer

        ctx = AnalysisContext(trainer=make_trainer(), decode=lambda i: tok.decode([i]), seed=seed,
                              make_trainer=make_trainer)
        mod = kind_module(an.kind)
        result = mod.analyze(ctx, **an.kwargs)
    note = {"paper": "", "smoke": "random-init stand-in of the backbone on the hub fixtures (scale smoke): the numbers "
            "mean nothing"}.get(run.scale, "tiny-model numbers on synthetic suites, never the paper's")
    result["provenance"] = {"paper": paper, "analysis": name, "run_key": run.key, "start": an.start,
                            "weights": str(weights), "tokenizer": str(src.tokenizer_path),
                            "records": str(src.train_records), "prompts": "chat template" if src.hub else "plain",
                            "stop_ids": stop_ids, "start_state": states[0] if states else None,
                            "params": an.kwargs, "commit": git_commit(),
                            "seconds": time.perf_counter() - t0, "scale": run.scale, "note": note}
    out = dict(results=results, scale=run.scale, paper=paper, analysis=name)
    js, md, png = (paths.fmt(p, **out) for p in (paths.ANALYSIS_JSON, paths.ANALYSIS_MD, paths.ANALYSIS_PNG))
    for p in (js, md, png):
        p.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# {paper}/{name}: {an.caption}\n\nRun `{run.key}` ({an.start} weights), commit "
              f"`{result['provenance']['commit']}`, {result['provenance']['seconds']:.0f} s. "
              f"{result['provenance']['note']}{_start_line(states[0] if states else None)}\n\nParams: "
              f"`{yaml.safe_dump(an.kwargs, default_flow_style=True, width=10**6).strip()}`\n\n")
    mod.plot(result, png)
    md.write_text(header + mod.markdown(result))
    write_markdown_html(md, paths.fmt(paths.ANALYSIS_HTML, **out), title=f"{paper}/{name}")
    tmp = js.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=_jsonable) + "\n")
    os.replace(tmp, js)  # last: the JSON is the rule's completion marker
    return result


def _start_line(state: dict[str, Any] | None) -> str:
    """The Markdown sentence saying where a `start: trained` analysis took the run's final state from."""
    if state is None:
        return ""
    where = "its own checkpoint" if state["source"] == "local" else "verl's FSDP checkpoint"
    return (f"\n\nStart state: the run's step {state['step']} from {where} `{state['checkpoint']}`: "
            f"{state['weights']}, {state['optimizer']}.")


def _jsonable(x: Any) -> Any:
    try:
        return x.tolist()
    except AttributeError:
        return str(x)
