"""The `analyze` job: one declared analysis of a paper config (JSON + Markdown + PNG with provenance).

:func:`run_analysis` builds the analysis context (the run's trainer, in its start state, with the real reward
scorer), calls the kind's ``analyze`` (:mod:`creditlab.analysis`) and writes the result.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import yaml

from creditlab import paths
from creditlab.analysis import AnalysisContext, kind_module
from creditlab.jobs.common import setup
from creditlab.models.sources import load_verl_train_state, run_sources
from creditlab.plan import check_registered, combination_overrides, compose, resolve_start, run_config
from creditlab.rewards.scorer import RewardScorer
from creditlab.tables.html import write_markdown_html
from creditlab.tracking.analysis_runs import publish_analysis
from creditlab.tracking.provenance import git_commit


def analyze(results: str | Path, plan, paper: str, name: str, *, quiet: bool = False) -> None:
    """Run analysis ``name`` of ``paper`` at the plan's scale (:func:`run_analysis`); an unknown paper or analysis,
    or a missing input (base snapshot, training set, checkpoint), stops the job saying which."""
    if paper not in plan.papers or name not in plan.papers[paper].analyses:
        choices = sorted(plan.papers[paper].analyses) if paper in plan.papers else sorted(plan.papers)
        raise SystemExit(f"unknown paper/analysis {paper}/{name}; choices: {choices}")
    setup()
    try:
        run_analysis(results, plan, paper, name, progress=not quiet)
    except FileNotFoundError as err:  # a missing base snapshot, training set or checkpoint: say which
        raise SystemExit(f"analyze {paper}/{name}: {err}") from None


def run_analysis(results: str | Path, plan, paper: str, name: str, progress: bool = False) -> dict[str, Any]:
    """Analysis ``name`` of ``paper`` at the plan's scale, seed = the paper's first; returns the result.

    Every scale takes the same path: the run's files come from :func:`creditlab.models.sources.run_sources` (tiny:
    the warmed-up model, the data's tokenizer and train split; paper / smoke: the hub snapshot, its own tokenizer,
    the prepared training set, chat-template prompts and the checkpoint's stop tokens, as verl rolled out), the local
    engine's Trainer is built on the start weights in float32 (``device: auto``: the GPU when there is one) and, for
    ``start: trained``, put in the run's final training state (tiny: the local checkpoint; hub: verl's last FSDP
    checkpoint, master weights and AdamW moments: :meth:`RunSources.resume_trained`), for ``start: trained@N`` in its
    state after N steps (`creditlab.plan.resolve_start`; tiny: the run replayed from the base model by its own
    trainer, :func:`mid_training_state`; hub: verl's ``global_step_N``). A kind whose module sets ``NEEDS_MODEL =
    False`` reads built results only: no model is loaded. Every analysis is logged to MLflow
    (:func:`creditlab.tracking.analysis_runs.publish_analysis`)."""
    from creditlab.engines.local.trainer import Trainer  # transformers: after setup()

    spec = plan.papers[paper]
    an = spec.analyses[name]
    seed = plan.paper_seeds(paper)[0]
    run = plan.get(spec.backbone_for(an.backbone, plan.scale), an.run, seed)
    cfg = run_config(run)
    mod = kind_module(an.kind)
    states: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    if not getattr(mod, "NEEDS_MODEL", True):
        weights = None
        src = None
        result = mod.analyze(
            AnalysisContext(trainer=None, decode=None, seed=seed, results=results, scale=run.scale, paper=paper),
            **an.kwargs,
        )
    else:
        torch.set_num_threads(int(cfg.get("threads", 1)))
        src = run_sources(run, cfg, results)
        start, at_step = resolve_start(an.start, cfg)
        load_from = "base" if at_step is not None and not src.hub else start  # tiny: replayed from the base model
        tok = src.load_tokenizer()
        records = src.load_records()
        prompt_ids, stop_ids = src.encode(tok, records), src.stop_ids(tok)
        weights = src.weights(load_from)
        with (
            RewardScorer(cfg["trainer"]["reward"], timeout_s=cfg["trainer"]["reward_timeout_s"]) as scorer,
            tempfile.TemporaryDirectory() as scratch,
        ):

            def make_trainer(overrides: list[str] = ()) -> Trainer:
                c = (
                    cfg
                    if not overrides
                    else compose(run.scale, run.backbone, run.method, [*run.overrides, *overrides], run.seed)
                    | {"run": cfg["run"]}
                )
                model = src.load_model(load_from, dtype=torch.float32)  # the trainer's precision (hub: bf16 snapshot)
                trainer = Trainer(
                    c,
                    model,
                    tok,
                    records,
                    scorer,
                    Path(scratch) / "unused",
                    progress=progress,
                    prompt_ids=prompt_ids,
                    stop_ids=stop_ids,
                )
                if at_step is not None:  # the run's state after step N, optimizer included
                    states.append(mid_training_state(trainer, src, at_step, Path(scratch) / "replayed"))
                elif start == "trained":  # the run's final optimizer state too (Adam's moments shape an update)
                    states.append(src.resume_trained(trainer))
                return trainer

            ctx = AnalysisContext(
                trainer=make_trainer(),
                decode=lambda i: tok.decode([i]),
                seed=seed,
                make_trainer=make_trainer,
                method_config=_method_configs(plan, paper, an, run),
                reference=((lambda: src.load_model("base", dtype=torch.float32)) if start == "trained" else None),
                results=results,
                scale=run.scale,
                paper=paper,
            )
            result = mod.analyze(ctx, **an.kwargs)
    note = {
        "paper": "",
        "smoke": "random-init stand-in of the backbone on the hub fixtures (scale smoke): the numbers mean nothing",
    }.get(run.scale, "tiny-model numbers on synthetic suites, never the paper's")
    result["provenance"] = {
        "paper": paper,
        "analysis": name,
        "run_key": run.key,
        "start": an.start,
        "weights": str(weights) if src else "none (reads built results)",
        "tokenizer": str(src.tokenizer_path) if src else None,
        "records": str(src.train_records) if src else None,
        "prompts": ("chat template" if src.hub else "plain") if src else None,
        "stop_ids": stop_ids if src else None,
        "start_state": states[0] if states else None,
        "params": an.kwargs,
        "commit": git_commit(),
        "seconds": time.perf_counter() - t0,
        "scale": run.scale,
        "note": note,
    }
    out = dict(results=results, scale=run.scale, paper=paper, analysis=name)
    js, md, png = (paths.fmt(p, **out) for p in (paths.ANALYSIS_JSON, paths.ANALYSIS_MD, paths.ANALYSIS_PNG))
    for p in (js, md, png):
        p.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# {paper}/{name}: {an.caption}\n\nRun `{run.key}` "
        f"({f'{an.start} weights' if src else 'no model: reads built results'}), commit "
        f"`{result['provenance']['commit']}`, {result['provenance']['seconds']:.0f} s. "
        f"{result['provenance']['note']}{_start_line(states[0] if states else None)}\n\nParams: "
        f"`{yaml.safe_dump(an.kwargs, default_flow_style=True, width=10**6).strip()}`\n\n"
    )
    mod.plot(result, png)
    md.write_text(header + mod.markdown(result))
    write_markdown_html(md, paths.fmt(paths.ANALYSIS_HTML, **out), title=f"{paper}/{name}")
    publish_analysis(
        results,
        spec.experiment,
        run.scale,
        paper,
        name,
        an.kind,
        result,
        getattr(mod, "metrics", lambda r: {})(result),
        md.read_text(),
        [md, png],
        local_dir=js.parent / f".{name}_mlflow",
    )
    tmp = js.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=_jsonable) + "\n")
    os.replace(tmp, js)  # last: the JSON is the rule's completion marker
    return result


def _method_configs(plan, paper: str, an, run):
    """(kind, name, overrides) -> the composed, checked ``method`` block of a method config (kind "method") or of a
    run of the paper (kind "run": its method, combinations and overrides at the plan's scale), cached."""
    spec = plan.papers[paper]

    @lru_cache(maxsize=None)
    def get(kind: str, name: str, overrides: tuple[str, ...]) -> dict[str, Any]:
        if kind == "run":
            if name not in spec.runs:
                raise ValueError(f"{name!r} is no run of paper {paper!r}; runs: {sorted(spec.runs)}")
            r = spec.runs[name]
            combo = combination_overrides(run.scale, run.backbone, r.method, r.combine) if r.combine else ()
            method, ov = r.method, [*spec.run_overrides(name, an.backbone, run.scale, combo), *overrides]
        elif kind == "method":
            method, ov = name, list(overrides)
        else:
            raise ValueError(f"unknown method entry kind {kind!r}: method | run")
        cfg = compose(run.scale, run.backbone, method, ov, run.seed)
        check_registered(cfg, f"{paper}/{an.name}: {kind} {name}")
        return cfg["method"]

    return lambda kind, name, overrides=(): get(kind, name, tuple(overrides))


def mid_training_state(trainer, src, step: int, replayed: Path) -> dict[str, Any]:
    """Put ``trainer`` (built on the start weights) in the run's state after ``step`` steps: model, AdamW moments,
    scheduler. Hub (verl): the run's checkpoint ``global_step_<step>`` (plan-checked to be kept). Local: the run
    replayed from the base model by its own trainer (``Trainer.fit(until=step)``: every draw is a function of
    (seed, step), so this is the run's state, up to floating-point nondeterminism across machines), once per job:
    later trainers load it from ``replayed``. The replayed steps' reward_mean is compared with the run's
    metrics.jsonl when the run has one here (provenance ``replay_check``)."""
    if src.hub:
        return load_verl_train_state(trainer, src.ckpt_dir / f"global_step_{step}") | {"step": step}
    unused, trainer.ckpt_dir = trainer.ckpt_dir, replayed
    try:
        if trainer.maybe_resume():
            return {
                "source": "replay",
                "step": trainer.step,
                "checkpoint": None,
                "weights": "its weights",
                "optimizer": "its AdamW moments, scheduler and RNG states",
                "replay_check": "same job",
            }
    finally:
        trainer.ckpt_dir = unused
    trainer.fit(until=step)
    trainer.ckpt_dir = replayed
    try:
        trainer.save_checkpoint()
    finally:
        trainer.ckpt_dir = unused
    check: dict[str, Any] | str = "not checked: the run has no metrics.jsonl here"
    metrics = src.run_dir / "metrics.jsonl"
    if metrics.is_file():
        logged = {}
        for line in metrics.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                if "step" in rec and "reward_mean" in rec:
                    logged[int(rec["step"])] = float(rec["reward_mean"])
        pairs = [(logged[k], h["reward_mean"]) for k, h in enumerate(trainer.history) if k in logged]
        check = {
            "steps_compared": len(pairs),
            "max_abs_reward_mean_diff": max((abs(a - b) for a, b in pairs), default=float("nan")),
        }
    return {
        "source": "replay",
        "step": trainer.step,
        "checkpoint": None,
        "weights": f"the base model trained {trainer.step} steps by the run's own trainer (replayed)",
        "optimizer": "its AdamW moments, scheduler and RNG states after those steps",
        "replay_check": check,
    }


def _start_line(state: dict[str, Any] | None) -> str:
    """The Markdown sentence saying where a `start: trained` analysis took the run's final state from."""
    if state is None:
        return ""
    if state.get("source") == "replay":
        return (
            f"\n\nStart state: the run's step {state['step']}, replayed from the base model by the run's own "
            f"trainer ({state['optimizer']}); replay check against the run's log: {state['replay_check']}."
        )
    where = "its own checkpoint" if state["source"] == "local" else "verl's FSDP checkpoint"
    return (
        f"\n\nStart state: the run's step {state['step']} from {where} `{state['checkpoint']}`: "
        f"{state['weights']}, {state['optimizer']}."
    )


def _jsonable(x: Any) -> Any:
    try:
        return x.tolist()
    except AttributeError:
        return str(x)
