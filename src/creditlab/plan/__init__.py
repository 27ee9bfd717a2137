"""From configs to the set of jobs: papers' tables -> unique runs, and one run -> a resolved config.

``build_plan`` expands ``configs/papers/*.yaml`` for the papers named in ``configs/pipeline.yaml``
into the unique runs (a run shared by several tables or papers is trained once) and validates every
run's Hydra composition before any job starts, so an unknown method or key fails early with a
message naming it and the valid choices.

Seeds: every paper uses the pipeline's ``seeds`` unless its config sets its own at the plan's scale
(``seeds: {tiny: [0, 1, 2]}``); its tables, figures and the runs they read then use those. A run key
shared by papers with different seeds is planned for the union of their seeds.

Overrides: a run's Hydra overrides are its paper's settings at the plan's scale (``scale_overrides``: at ``paper``
scale, the papers' own hyperparameters), then the run's own ``overrides``, then its own ``scale_overrides`` at that
scale (`creditlab.papers.spec.PaperSpec.run_overrides`); at tiny and micro scale a run's overrides are its
``overrides``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from creditlab.analysis import KINDS, analyze_params
from creditlab.config_compose import CONFIG_DIR, extra_config_dirs, run_args
from creditlab.papers.load import Checker, load_paper
from creditlab.papers.spec import DecodeSpec, PaperSpec
from creditlab.plan.core import BASE_RUN, Plan, PlanError, Run, RunRefused
from creditlab.plan.runs import (
    COMBINABLE_LOSS,
    _cluster,
    check_evals,
    check_registered,
    check_table_inputs,
    check_verl_model,
    check_verl_run,
    combination_overrides,
    compose,
    composed_configs,
    run_config,
    validate_runs,
)

__all__ = [
    "BASE_RUN",
    "CONFIG_DIR",
    "COMBINABLE_LOSS",
    "Plan",
    "PlanError",
    "Run",
    "RunRefused",
    "StartRefused",
    "all_papers",
    "build_plan",
    "check_analyses",
    "check_analysis_kinds",
    "check_registered",
    "check_verl_model",
    "check_verl_run",
    "combination_overrides",
    "compose",
    "composed_configs",
    "paper_config_path",
    "resolve_start",
    "run_args",
    "run_config",
    "select_tables",
    "validate_runs",
]


def all_papers(config_dir: Path = CONFIG_DIR) -> list[str]:
    """Every paper with a config (configs/papers/<name>.yaml, and papers/<name>.yaml of $CREDITLAB_CONFIG_PATH's
    directories: `creditlab.config_compose.extra_config_dirs`), sorted."""
    dirs = [Path(config_dir), *extra_config_dirs()]
    return sorted({p.stem for d in dirs for p in (d / "papers").glob("*.yaml")})


def paper_config_path(paper: str, config_dir: Path = CONFIG_DIR) -> Path:
    found = [d / "papers" / f"{paper}.yaml" for d in [Path(config_dir), *extra_config_dirs()]]
    path = next((p for p in found if p.exists()), found[0])
    if not path.exists():
        valid = all_papers(config_dir)
        raise PlanError(f"unknown paper {paper!r} in pipeline config 'papers'; valid choices: {valid}")
    return path


def build_plan(pipeline: dict[str, Any], config_dir: Path = CONFIG_DIR, validate: bool = True) -> Plan:
    """Expand the pipeline config into the unique runs of every table of the chosen papers.

    Each paper plans its own seeds at the scale (paper config ``seeds``) or the pipeline's. With
    ``pipeline["ignore_paper_seeds"]`` true (the one-run CLI verbs, ``--seed``), every paper plans the
    pipeline's seeds: a job of one run can be asked for any seed.
    """
    scale, seeds = pipeline["scale"], [int(s) for s in pipeline["seeds"]]
    world = check_world(pipeline.get("world"), scale, config_dir)
    world_overrides = world_run_overrides(world, scale, config_dir)
    papers = {p: load_paper(paper_config_path(p, config_dir)) for p in pipeline["papers"]}
    for spec in papers.values():
        check_analysis_kinds(spec)
    if pipeline.get("tables"):
        papers = select_tables(papers, pipeline["tables"])
    if pipeline.get("ignore_paper_seeds"):
        papers = {p: replace(spec, seeds={}) for p, spec in papers.items()}
    runs: dict[str, Run] = {}

    def add(pname: str, spec: PaperSpec, paper_backbone: str, name: str, seed: int, table: str | None) -> None:
        backbone = spec.backbone_for(paper_backbone, scale)
        # the paper's own settings at this scale (scale_overrides: none at tiny/micro), then the run's overrides
        method = BASE_RUN if name == BASE_RUN else spec.runs[name].method
        combine = () if name == BASE_RUN else spec.runs[name].combine
        try:
            combination = combination_overrides(scale, backbone, method, combine, config_dir) if combine else ()
        except PlanError as e:
            raise PlanError(f"{spec.source}: runs.{name}.combine: {e}") from None
        overrides = world_overrides + tuple(spec.run_overrides(name, paper_backbone, scale, combination))
        run = Run(scale, backbone, name, seed, method, overrides, spec.experiment)
        prev = runs.setdefault(run.key, run)
        if (prev.method, prev.overrides) != (method, overrides):
            raise PlanError(
                f"run name {name!r} means two different runs: {prev.method} {list(prev.overrides)} "
                f"(papers {prev.papers}) vs {method} {list(overrides)} (paper {pname!r}); rename one"
            )
        if pname not in prev.papers:
            prev.papers.append(pname)
        if table is not None and f"{pname}/{table}" not in prev.tables:
            prev.tables.append(f"{pname}/{table}")

    for pname, spec in papers.items():
        paper_seeds = spec.seeds_at(scale, seeds)  # its own seeds at this scale, else the pipeline's
        for tname in spec.tables_at(scale):  # a table with no column at this scale plans no run
            for row in spec.tables[tname].rows:
                for seed in paper_seeds:
                    add(pname, spec, row.backbone, row.run, seed, tname)
        for aname, an in spec.analyses.items():  # an analysis builds its run's trainer (first seed)
            add(pname, spec, an.backbone, an.run, paper_seeds[0], None)
        for fname in spec.figures_at(scale):  # a run-based figure draws the paper's first seed's run
            fig = spec.figures[fname]
            if fig.run is not None:
                add(pname, spec, fig.backbone, fig.run, paper_seeds[0], None)
    decodes: dict[str, DecodeSpec] = {}
    for pname, spec in papers.items():
        for name, dec in spec.decodes.items():
            if decodes.setdefault(name, dec) != dec:
                raise PlanError(
                    f"decoding name {name!r} means two different decodings ({decodes[name]} vs {dec} "
                    f"in paper {pname!r}); rename one"
                )
    plan = Plan(scale, seeds, papers, runs, decodes, world=world)
    if validate:
        plan.cluster = _cluster(pipeline) if scale == "paper" else None
        facts = validate_runs(plan.runs.values(), config_dir, plan.cluster)
        plan.refused_runs = {key: f["refused"] for key, f in facts.items() if f.get("refused")}
        plan.resources = {key: f["resources"] for key, f in facts.items() if f.get("resources")}
        if plan.cluster is not None:  # evaluations too long for one job: the tables reading them are refused
            plan.eval_resources, plan.refused_evals = check_evals(plan, {key: f["config"] for key, f in facts.items()})
        check_table_inputs(plan, facts)
        plan.skipped_analyses = check_analyses(plan, config_dir)
    return plan


DEFAULT_WORLD = "tiny_arith"
"""configs/run.yaml's ``data`` default: the runs' data config when no world override applies (paper and smoke scale,
whose runs read the papers' datasets from their own configs)."""
TINY_WORLD = "tiny_rule"
"""The tiny world of tiny and micro scale when the pipeline's ``world`` is null (its default): rule arithmetic, whose
decisive rule letters and ignorable separators give the papers' mechanisms something to act on (issue 29)."""
WORLD_SPLITS = ("train", "val", "suites")


def check_world(world: str | None, scale: str, config_dir: Path = CONFIG_DIR) -> str:
    """The pipeline's ``world``: a data config of configs/data/ with the tiny world's splits (train, val, suites), at
    tiny or micro scale (paper and smoke read the papers' datasets: only the default there). None (the pipeline's
    default) is :data:`TINY_WORLD` at tiny and micro scale, :data:`DEFAULT_WORLD` at the others. PlanError naming
    the key, the reason and the choices otherwise."""
    import yaml

    tiny_scale = scale in ("tiny", "micro")
    if world is None:
        world = TINY_WORLD if tiny_scale else DEFAULT_WORLD
    data_dir = Path(config_dir) / "data"
    tiny = sorted(
        p.stem for p in data_dir.glob("*.yaml") if set(WORLD_SPLITS) <= set(yaml.safe_load(p.read_text()) or {})
    )
    if world not in tiny:
        raise PlanError(f"world: {world!r} is no tiny-world data config; valid choices: {tiny}")
    if world != DEFAULT_WORLD and not tiny_scale:
        raise PlanError(
            f"world: {world!r} is a tiny world; at scale {scale!r} the runs read the papers' datasets "
            f"(leave world null, or {DEFAULT_WORLD!r})"
        )
    return world


def world_run_overrides(world: str, scale: str, config_dir: Path = CONFIG_DIR) -> tuple[str, ...]:
    """The overrides every run of a world starts from: ``data=<world>`` (none for the default world), then the world's
    own RL budget at this scale, its data config's ``rl_overrides.<scale>`` (a list of ``trainer.<key>=<value>``; a
    run's own overrides come after them and win). PlanError naming the key and the reason for any other entry, and for
    a malformed ``rl_prompts`` (the world's RL prompt mix, :func:`creditlab.data.rule_arith.check_rl_prompts`)."""
    import yaml

    if world == DEFAULT_WORLD:
        return ()
    from creditlab.data.rule_arith import check_rl_prompts

    path = Path(config_dir) / "data" / f"{world}.yaml"
    data = yaml.safe_load(path.read_text()) or {}
    try:  # which train records are RL prompts: refused here, before the prepare job that would refuse it
        check_rl_prompts(data.get("rl_prompts"))
    except ValueError as err:
        raise PlanError(f"{path}: {err}") from None
    budget = data.get("rl_overrides") or {}
    where = f"{path}: rl_overrides"
    if not isinstance(budget, dict) or not all(isinstance(v, list) for v in budget.values()):
        raise PlanError(f"{where}: must map a scale to a list of trainer overrides, got {budget!r}")
    unknown = sorted(set(budget) - {"tiny", "micro"})
    if unknown:
        raise PlanError(f"{where}: {unknown[0]!r} is no tiny-world scale; valid choices: ['micro', 'tiny']")
    items = [str(x) for x in budget.get(scale, [])]
    for x in items:
        if not x.startswith("trainer.") or "=" not in x or x.startswith("trainer.="):
            raise PlanError(
                f"{where}.{scale}: {x!r} is no trainer.<key>=<value> override (a world sets its RL budget only)"
            )
    return (f"data={world}", *items)


def check_analysis_kinds(spec: PaperSpec) -> None:
    """Every analysis of a paper names a kind of creditlab.analysis (KINDS) and only keywords of that kind's
    ``analyze`` (read from its source, without importing torch): ValueError naming the file, the key and the choices.
    The paper config's own checks (creditlab.papers.load) cannot make these: the kinds are code of a higher layer."""
    chk = Checker(spec.source)
    for name, an in spec.analyses.items():
        where = f"analyses.{name}"
        chk.choice(an.kind, f"{where}.kind", KINDS)
        allowed = analyze_params(an.kind)
        for key, _ in an.params:
            chk.choice(key, f"{where}.params.{key}", allowed)


class StartRefused(PlanError):
    """An analysis start the run cannot provide at this scale (a step past its end, a checkpoint verl deletes)."""


def resolve_start(start: str, cfg: dict[str, Any]) -> tuple[str, int | None]:
    """An analysis' ``start`` against its run's resolved config: ("base" | "trained", step), step None for the base
    model and for the run's final state. ``trained@N`` is the run's state after N steps, ``trained@P%`` after
    floor(P% of trainer.steps) steps (verl runs: rounded down to a checkpoint, every ``trainer.checkpoint_every``
    steps); N = the last step is the final state. The local engine replays the run from the base model to step N
    (every draw is a function of (seed, step): the run's own state, `creditlab.jobs.analyze`); verl runs read
    ``global_step_N``, which must be one of the ``trainer.keep_checkpoints`` checkpoints verl keeps. StartRefused
    (with the reason) when the run cannot provide it."""
    import re

    if start in ("base", "trained"):
        return start, None
    m = re.fullmatch(r"trained@(\d+)(%?)", str(start))
    if m is None:
        raise PlanError(f"unknown analysis start {start!r}; valid: base, trained, trained@<step>, trained@<percent>%")
    t = cfg["trainer"]
    steps, every = int(t["steps"]), max(1, int(t["checkpoint_every"]))
    verl = t.get("engine", "local") == "verl"
    n = int(m.group(1)) * steps // 100 if m.group(2) else int(m.group(1))
    if m.group(2) and verl:
        n = n // every * every
    if n < 1:
        raise StartRefused(
            f"start {start!r} is step {n} of a run of {steps} steps"
            + (f" (verl saves every {every} steps)" if verl else "")
            + ": no mid-training state"
        )
    if n > steps:
        raise StartRefused(f"start {start!r}: the run trains {steps} steps only")
    if n == steps:
        return "trained", None
    if verl:
        saved = sorted(set(range(every, steps + 1, every)) | {steps})
        kept = saved[-max(1, int(t.get("keep_checkpoints") or len(saved))) :]
        if n not in kept:
            raise StartRefused(
                f"start {start!r}: verl saves the run every {every} steps and keeps the last "
                f"{len(kept)} checkpoints ({kept}): step {n} is gone when the run ends (raise "
                f"trainer.keep_checkpoints for the run, or start at one of those steps)"
            )
    return "trained", n


def check_analyses(plan: Plan, config_dir: Path = CONFIG_DIR) -> dict[tuple[str, str], str]:
    """Every analysis against its run's resolved config at this scale: its start (`resolve_start`) and what its kind
    checks (`creditlab.analysis.plan_refusal`: e.g. its cost at this scale). Returns (paper, analysis) -> the reason
    for those that cannot run here (the DAG leaves them out and says why); PlanError for a config error."""
    from creditlab.analysis import plan_refusal

    wanted = {}
    for p, spec in plan.papers.items():
        for a, an in spec.analyses.items():
            wanted[(p, a)] = plan.get(spec.backbone_for(an.backbone, plan.scale), an.run, plan.paper_seeds(p)[0])
    cfgs = composed_configs({r.key: r for r in wanted.values()}.values(), config_dir)
    skipped: dict[tuple[str, str], str] = {}
    plan.skipped_analyses = skipped  # filled as we go: an analysis reading others' results (fidelity_gains) comes last
    for (p, a), run in sorted(
        wanted.items(), key=lambda kv: plan.papers[kv[0][0]].analyses[kv[0][1]].kind == "fidelity_gains"
    ):
        an = plan.papers[p].analyses[a]
        if run.key in plan.refused_runs:  # a refused run (`RunRefused`): never trained, so nothing to analyse
            skipped[(p, a)] = f"{run.key}: run refused at plan time: {plan.refused_runs[run.key]}"
            continue
        try:
            resolve_start(an.start, cfgs[run.key])
            reason = plan_refusal(an.kind, an.kwargs, cfgs[run.key], plan, p, a)
        except StartRefused as e:
            reason = str(e)
        except ValueError as e:
            raise PlanError(f"paper {p!r} analysis {a!r}: {e}") from None
        if reason:
            skipped[(p, a)] = f"{run.key}: {reason}"
    return skipped


def select_tables(papers: dict[str, PaperSpec], tables: Iterable[str]) -> dict[str, PaperSpec]:
    """The papers with only the tables ``tables`` (``paper/table``, the pipeline config's ``tables``) built
    (`PaperSpec.built`; a paper with none of them builds no table). PlanError for a name that is no table of a
    chosen paper."""
    chosen: dict[str, set[str]] = {p: set() for p in papers}
    for name in tables:
        paper, _, table = str(name).partition("/")
        if paper not in papers or table not in papers[paper].tables:
            choices = sorted(f"{p}/{t}" for p, spec in papers.items() for t in spec.tables)
            raise PlanError(f"tables: {name!r} is no table of the chosen papers; choices: {choices}")
        chosen[paper].add(table)
    return {p: replace(spec, built=frozenset(chosen[p])) for p, spec in papers.items()}
