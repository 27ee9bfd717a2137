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
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from creditlab.analysis import KINDS, analyze_params
from creditlab.config_compose import CONFIG_DIR, hydra_value, run_args
from creditlab.papers.load import Checker, load_paper
from creditlab.papers.spec import DecodeSpec, PaperSpec
from creditlab.paths import run_key
from creditlab.scales import smoke_job

BASE_RUN = "base"


class PlanError(ValueError):
    """A pipeline/paper config that cannot be planned (message names the key and the choices)."""


class RunRefused(PlanError):
    """A run whose config is valid but which the plan refuses to train at its scale: a backbone verl cannot train
    right with the launcher's settings (`check_verl_model`). Not a config error: validation (`validate_runs`,
    `build_plan`) collects it into `Plan.refused_runs` and leaves out what reads the run, instead of failing the plan;
    `check_verl_run` called alone raises it."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: refused at plan time: {reason}")
        self.key, self.reason = key, reason


@dataclass
class Run:
    """One training run (or ``run == "base"``: the untrained base model, evaluated only)."""

    scale: str
    backbone: str
    run: str
    seed: int
    method: str
    overrides: tuple[str, ...]
    experiment: str
    papers: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return run_key(self.scale, self.backbone, self.run, self.seed)

    @property
    def trains(self) -> bool:
        return self.run != BASE_RUN

    @property
    def parent_table(self) -> tuple[str, str] | None:
        """(paper, table) whose MLflow parent run this run is nested under: its first table in its own
        experiment's paper (MLflow nests runs within one experiment); None if it has none there."""
        for entry in self.tables:
            paper, table = entry.split("/", 1)
            if paper == self.experiment:
                return paper, table
        return None


@dataclass
class Plan:
    scale: str
    seeds: list[int]
    """The pipeline's seeds: those of every paper without its own `seeds` at this scale (see paper_seeds)."""
    papers: dict[str, PaperSpec]
    runs: dict[str, Run]
    decodes: dict[str, DecodeSpec] = field(default_factory=dict)
    skipped_analyses: dict[tuple[str, str], str] = field(default_factory=dict)
    """(paper, analysis) -> why it cannot run at this scale (`check_analyses`; filled when the plan is validated)."""
    refused_runs: dict[str, str] = field(default_factory=dict)
    """Run key -> why the plan refuses to train it at this scale (a `RunRefused` of `validate_runs`: a backbone verl
    cannot train right); filled when the plan is validated. The run stays in `runs` (its config is valid), but no
    target reads it: the tables that read it (`refused_tables`), the figures drawn from them or from it
    (`refused_figures`) and the analyses of it or of those tables (`skipped_analyses`) are left out."""

    @property
    def backbones(self) -> list[str]:
        return sorted({r.backbone for r in self.runs.values()})

    @property
    def tables(self) -> list[tuple[str, str]]:
        """(paper, table) of every table built at this scale: buildable there (see `skipped_tables`), reading no
        refused run (see `refused_tables`) and chosen by the pipeline's `tables` (`PaperSpec.built_at`)."""
        refused = self.refused_tables
        return [(p, t) for p, spec in self.papers.items() for t in spec.built_at(self.scale) if (p, t) not in refused]

    @property
    def buildable_tables(self) -> list[tuple[str, str]]:
        """(paper, table) of every table buildable at this scale, chosen by the pipeline's `tables` or not (their runs
        are planned and their evaluations cover their suites, so any of them can be built as a target), but those
        reading a refused run (`refused_tables`)."""
        refused = self.refused_tables
        return [(p, t) for p, spec in self.papers.items() for t in spec.tables_at(self.scale) if (p, t) not in refused]

    @property
    def tables_at_scale(self) -> list[tuple[str, str]]:
        """(paper, table) of every table with a column at this scale, reading refused runs or not: what the config
        checks (`check_table_inputs`) and the evaluations' suites (`eval_suites`) cover, neither depending on a
        refusal."""
        return [(p, t) for p, spec in self.papers.items() for t in spec.tables_at(self.scale)]

    @property
    def refused_tables(self) -> dict[tuple[str, str], list[str]]:
        """(paper, table) -> the refused runs (keys, `refused_runs`) it reads, for every table with a column at this
        scale that reads one: not built, nor a target."""
        if not self.refused_runs:
            return {}
        out: dict[tuple[str, str], list[str]] = {}
        for p, t in self.tables_at_scale:
            keys = list(dict.fromkeys(r.key for r in self.table_runs(p, t) if r.key in self.refused_runs))
            if keys:
                out[(p, t)] = keys
        return out

    @property
    def skipped_tables(self) -> list[tuple[str, str]]:
        """Tables with no column at this scale: none of their benchmarks has a stand-in here."""
        return [(p, t) for p, spec in self.papers.items() for t in spec.tables if t not in spec.tables_at(self.scale)]

    @property
    def figures(self) -> list[tuple[str, str]]:
        """(paper, figure) of every figure drawable at this scale (its table and columns are shown), but those drawn
        from a refused table or run (`refused_figures`)."""
        refused = self.refused_figures
        return [(p, f) for p, spec in self.papers.items() for f in spec.figures_at(self.scale) if (p, f) not in refused]

    @property
    def refused_figures(self) -> dict[tuple[str, str], str]:
        """(paper, figure) -> why it is not drawn, for every figure drawable at this scale but drawn from a table
        that reads a refused run (`refused_tables`) or from a refused run (a run-based figure: the paper's first
        seed's run)."""
        if not self.refused_runs:
            return {}
        tables, out = self.refused_tables, {}
        for p, spec in self.papers.items():
            for f in spec.figures_at(self.scale):
                fig = spec.figures[f]
                if fig.table is not None and (p, fig.table) in tables:
                    out[(p, f)] = f"its table {p}/{fig.table} reads refused runs"
                elif fig.run is not None:
                    key = run_key(
                        self.scale, spec.backbone_for(fig.backbone, self.scale), fig.run, self.paper_seeds(p)[0]
                    )
                    if key in self.refused_runs:
                        out[(p, f)] = f"its run {key} is refused: {self.refused_runs[key]}"
        return out

    def notes(self) -> list[str]:
        """What the plan leaves out at this scale and why, one line each (the DAG prints them, as does
        ``python -m creditlab plan``): tables with no benchmark stand-in, tables reading refused runs (the run keys
        and the reasons), figures drawn from those, refused analyses."""
        out = []
        if self.skipped_tables:
            out.append(
                f"tables with no benchmark stand-in at scale {self.scale!r}, not built: "
                f"{', '.join(f'{p}/{t}' for p, t in self.skipped_tables)}"
            )
        for (p, t), keys in self.refused_tables.items():
            by_reason: dict[str, list[str]] = {}
            for key in keys:
                by_reason.setdefault(self.refused_runs[key], []).append(key)
            why = "; ".join(f"{', '.join(ks)}: {reason}" for reason, ks in by_reason.items())
            out.append(f"table {p}/{t} reads runs refused at scale {self.scale!r}, not built: {why}")
        for (p, f), why in self.refused_figures.items():
            out.append(f"figure {p}/{f} refused at scale {self.scale!r}, not drawn: {why}")
        for (p, a), why in self.skipped_analyses.items():
            out.append(f"analysis {p}/{a} refused at scale {self.scale!r}, not built: {why}")
        return out

    @property
    def analyses(self) -> list[tuple[str, str]]:
        """(paper, analysis) of every post-hoc analysis of the chosen papers, but those refused at this scale
        (`skipped_analyses`)."""
        return [(p, a) for p, spec in self.papers.items() for a in spec.analyses if (p, a) not in self.skipped_analyses]

    @property
    def experiments(self) -> list[str]:
        return sorted({r.experiment for r in self.runs.values()})

    def paper_seeds(self, paper: str) -> list[int]:
        """The seeds `paper`'s tables and figures use: its own `seeds` at this scale, else the pipeline's."""
        if paper not in self.papers:
            raise PlanError(f"unknown paper {paper!r}; planned papers: {sorted(self.papers)}")
        return self.papers[paper].seeds_at(self.scale, self.seeds)

    def get(self, backbone: str, run: str, seed: int) -> Run:
        key = run_key(self.scale, backbone, run, int(seed))
        if key not in self.runs:
            raise PlanError(f"run {key!r} is not in the plan; planned runs: {sorted(self.runs)}")
        return self.runs[key]

    def table_runs(self, paper: str, table: str) -> list[Run]:
        """The run of every row of a table, all the paper's seeds (a run of several rows repeats)."""
        spec = self.papers[paper]
        return [
            self.get(spec.backbone_for(row.backbone, self.scale), row.run, seed)
            for row in spec.table(table).rows
            for seed in self.paper_seeds(paper)
        ]

    def table_evals(self, paper: str, table: str) -> list[tuple[Run, str | None]]:
        """(run, decoding or None) of every evaluation a table reads, all the paper's seeds.

        Empty when no column of the table at this scale reads an evaluation (only step_time columns
        and benchmarks without a stand-in here).
        """
        spec = self.papers[paper]
        if not spec.needs_evals(table, self.scale):
            return []
        return [
            (self.get(spec.backbone_for(row.backbone, self.scale), row.run, seed), row.decode)
            for row in spec.table(table).rows
            for seed in self.paper_seeds(paper)
        ]

    def table_suites(self, paper: str, table: str) -> list[str]:
        """The evaluation suites a table reads at this scale (benchmarks without a stand-in skipped)."""
        spec = self.papers[paper]
        return list(
            dict.fromkeys(
                spec.suite_for(bench, self.scale)
                for col in spec.columns_at(table, self.scale)
                for bench, _ in spec.leaves_at(table, col, self.scale)[0]
            )
        )

    def eval_suites(self, run: Run, decode: str | None = None) -> list[str]:
        """The suites of every table that reads the evaluation of ``run`` (decoded with ``decode``, None: plain),
        in table order: what that evaluation must cover at this scale (paper scale evaluates only these)."""
        return list(
            dict.fromkeys(
                suite
                for paper, table in self.tables_at_scale
                if any(r.key == run.key and d == decode for r, d in self.table_evals(paper, table))
                for suite in self.table_suites(paper, table)
            )
        )

    def decode(self, name: str) -> DecodeSpec:
        if name not in self.decodes:
            raise PlanError(f"unknown decoding {name!r}; planned decodings: {sorted(self.decodes)}")
        return self.decodes[name]


def all_papers(config_dir: Path = CONFIG_DIR) -> list[str]:
    """Every paper with a config (configs/papers/<name>.yaml), sorted."""
    return sorted(p.stem for p in (Path(config_dir) / "papers").glob("*.yaml"))


def paper_config_path(paper: str, config_dir: Path = CONFIG_DIR) -> Path:
    path = Path(config_dir) / "papers" / f"{paper}.yaml"
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
        overrides = spec.run_overrides(name, paper_backbone, scale, combination)
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
    plan = Plan(scale, seeds, papers, runs, decodes)
    if validate:
        facts = validate_runs(plan.runs.values(), config_dir)
        plan.refused_runs = {key: f["refused"] for key, f in facts.items() if f.get("refused")}
        check_table_inputs(plan, facts)
        plan.skipped_analyses = check_analyses(plan, config_dir)
    return plan


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


COMBINABLE_LOSS = "dapo"
"""The policy loss a method must have for its credit functions / token filters to be added to another run's method:
the plain clipped surrogate every credit method is defined on (a method whose mechanism is its loss, e.g. SAPO, GSPO,
DFPO, is a run's `method`, never combined in: a run has one policy loss)."""


_METHODS: dict[tuple[str, str, str, str], dict[str, Any]] = {}


def _method_of(scale: str, backbone: str, method: str, config_dir: Path) -> dict[str, Any]:
    key = (scale, backbone, method, str(config_dir))
    if key not in _METHODS:
        _METHODS[key] = compose(scale, backbone, method, (), 0, config_dir)["method"]
    return _METHODS[key]


def combination_overrides(
    scale: str, backbone: str, method: str, combine: Iterable[str], config_dir: Path = CONFIG_DIR
) -> tuple[str, ...]:
    """The Hydra overrides that add the credit functions and token filters of the `combine` method configs to
    `method`'s (lists concatenated in that order; weights multiply, masks multiply: `algos.credit.base.compose_credit`)
    and name the run's method ``<method>+<m1>+...``.

    A combined method must contribute credit functions or token filters, and its policy loss must be the plain
    clipped surrogate (`COMBINABLE_LOSS`): its other settings (loss, advantage) are not taken, so a method whose
    mechanism is its loss or advantage cannot be combined in (PlanError with the reason). What the combination then
    means for the run's loss and batching is checked with every run (`check_registered` -> `algos.compat`).
    """
    base = _method_of(scale, backbone, method, config_dir)
    credit, filters = list(base.get("credit") or []), list(base.get("token_filter") or [])
    for m in combine:
        other = _method_of(scale, backbone, m, config_dir)
        adds_c, adds_f = list(other.get("credit") or []), list(other.get("token_filter") or [])
        if not adds_c and not adds_f:
            raise PlanError(
                f"method {m!r} has no credit function or token filter to add to {method!r}: its mechanism "
                f"is its loss/advantage ({other['policy_loss']}/{other['advantage']}); make it the run's "
                f"method instead"
            )
        if other["policy_loss"] != COMBINABLE_LOSS:
            raise PlanError(
                f"method {m!r} is defined with policy loss {other['policy_loss']!r}, not the plain clipped "
                f"surrogate {COMBINABLE_LOSS!r}: a run has one policy loss ({method!r}'s "
                f"{base['policy_loss']!r}); make {m!r} the run's method instead"
            )
        clash = sorted({e["name"] for e in adds_c + adds_f} & {e["name"] for e in credit + filters})
        if clash:
            raise PlanError(f"method {m!r} adds {clash}, which the run already has")
        credit, filters = credit + adds_c, filters + adds_f
    return (
        f"method.name={hydra_value('+'.join([method, *combine]))}",
        f"method.credit={hydra_value(credit)}",
        f"method.token_filter={hydra_value(filters)}",
    )


def validate_runs(runs: Iterable[Run], config_dir: Path = CONFIG_DIR) -> dict[str, dict[str, Any]]:
    """Compose every run's config and check its registered names (PlanError naming the key / the choices).

    The same composition as `run_config` (`creditlab.config_compose.CachedComposer`: Hydra's defaults tree merged
    once per distinct group choice, each run's value overrides applied by Hydra's own routine), so that the whole
    DAG (70-110 runs) is checked in seconds before any job starts. Returns, per run key, ``suites``: its evaluation
    suites from its data config (``data.suites``: the tiny world's suites, or at paper scale the catalogue
    configs/suites/paper.yaml; None where a data config has none), ``eval_k``: its samples per question, and
    ``refused``: why the plan refuses to train it (a `RunRefused`: a backbone verl cannot train right), else None.
    A refusal does not stop the validation (`build_plan` leaves out what reads the run); every other check raises.
    """
    from creditlab.config_compose import CachedComposer

    facts: dict[str, dict[str, Any]] = {}
    with CachedComposer(config_dir, "run") as composer:
        for run in runs:
            cfg = _compose_with(
                composer, run_args(run.scale, run.backbone, _method_config(run), run.overrides, run.seed, config_dir)
            )
            check_ranges(cfg, run.key)
            refused = None
            if run.method != BASE_RUN:
                check_registered(cfg, run.key)
                try:
                    check_verl_run(cfg, run.key)
                except RunRefused as e:
                    refused = e.reason
            data_suites = (cfg.get("data") or {}).get("suites")
            facts[run.key] = {
                "suites": list(data_suites) if data_suites is not None else None,
                "eval_k": int((cfg.get("eval") or {}).get("k", 1)),
                "refused": refused,
            }
    return facts


RUN_SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "run.schema.yaml"
"""The ranges of a resolved run config's numeric fields (JSON schema)."""


@lru_cache(maxsize=1)
def _run_validator():
    from jsonschema import Draft202012Validator

    with open(RUN_SCHEMA) as f:
        return Draft202012Validator(yaml.safe_load(f))


def check_ranges(cfg: dict[str, Any], key: str) -> None:
    """Every numeric field of a resolved run config is in its range (workflow/schemas/run.schema.yaml) and
    ``eval.ks`` are at most ``eval.k``: else PlanError naming the run, the key and the allowed range."""
    errors = sorted(_run_validator().iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = ".".join(str(p) for p in err.absolute_path) or "(root)"
        raise PlanError(f"{key}: {where}: {err.message}")
    e = cfg.get("eval") or {}
    if e.get("ks") and e.get("k") and max(e["ks"]) > int(e["k"]):
        raise PlanError(f"{key}: eval.ks={list(e['ks'])}: pass@j needs j <= eval.k={e['k']}")


def check_verl_run(cfg: dict[str, Any], key: str) -> None:
    """A verl-engine run (paper, smoke) is one the verl job would start: the launcher's preflight (batches over ranks,
    context lengths) and the plug-in's overrides (method x batching x parallelism combinations, credit inputs the
    workers provide, RB with dynamic sampling) pass, else PlanError with the key and the reason; then its backbone is
    one verl trains right (`check_verl_model`), else `RunRefused`."""
    if (cfg.get("trainer") or {}).get("engine", "local") != "verl":
        return
    from creditlab.engines.verl.launch import LaunchError, preflight
    from creditlab.engines.verl.plugin import plugin_overrides

    cfg = {**cfg, "run": {**(cfg.get("run") or {}), "key": key}}
    try:
        preflight(cfg)
        plugin = plugin_overrides(cfg)
    except (LaunchError, ValueError, KeyError) as e:
        raise PlanError(f"{key}: the verl engine would refuse this run at its first step: {e}") from None
    check_verl_model(cfg, key, plugin)


def check_verl_model(cfg: dict[str, Any], key: str, plugin: list[str] | None = None) -> None:
    """A paper-scale verl run trains a backbone that verl 0.9.1 computes right with the launcher's settings:
    `RunRefused` (a PlanError that validation collects into `Plan.refused_runs`) naming the run, the family and why
    otherwise (`creditlab.engines.verl.sizing.linear_attention_refusal`: Qwen3-Next's Gated DeltaNet layers under
    remove-padding or Ulysses, issue 28). The launcher's own values are read from the overrides it would pass (the
    plug-in's win), so a launcher that changes them lifts the refusal. Smoke runs pass: they prove that the paper
    path executes, and their numbers mean nothing."""
    from creditlab.engines.verl.sizing import LINEAR_ATTENTION_FAMILIES, linear_attention_refusal

    family = ((cfg.get("model") or {}).get("arch") or {}).get("family")
    if cfg.get("scale") == "smoke" or family not in LINEAR_ATTENTION_FAMILIES:
        return
    from creditlab.engines.verl.launch import RunPaths, merge_overrides, override_key, verl_overrides

    if plugin is None:
        from creditlab.engines.verl.plugin import plugin_overrides

        plugin = plugin_overrides(cfg)
    run = cfg.get("run") or {}  # validate_runs composes without the run block: what verl_overrides reads of it
    cfg = {**cfg, "run": {**run, "key": key, "experiment": run.get("experiment", key.split("/")[0])}}
    args = merge_overrides(verl_overrides(cfg, RunPaths.of(cfg, "results"), mlflow=False), plugin)
    given = {override_key(o): o.split("=", 1)[1] for o in args if "=" in o}
    # absent: verl's default, true (workers/config/model.py:120)
    remove_padding = given.get("actor_rollout_ref.model.use_remove_padding", "true").lower() == "true"
    sp = int(given.get("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "1"))
    reason = linear_attention_refusal(cfg, remove_padding=remove_padding, ulysses_sp=sp)
    if reason:
        raise RunRefused(key, reason)


def check_table_inputs(plan: Plan, run_facts: dict[str, dict[str, Any]]) -> None:
    """Every suite a table reads (its benchmarks' stand-ins at this scale) is one its runs' data config prepares
    (``data.suites``; runs whose data config has none are not checked here), and every metric with a fixed sample
    count a table reads (``pass@4``) fits its runs' ``eval.k``: PlanError naming the paper, the table, the suite or
    metric and the valid choices, before any job starts (every table with a column at the scale, chosen by `tables`
    or not, refused runs or not: each can be built as a target, or once the refusal is lifted)."""
    import re

    for paper, table in plan.tables_at_scale:
        spec = plan.papers[paper]
        fixed = [
            (m, int(n.group(1)))
            for col in spec.columns_at(table, plan.scale)
            for _, m in spec.leaves_at(table, col, plan.scale)[0]
            if (n := re.fullmatch(r"\w+@(\d+)", m))
        ]
        for run, _ in plan.table_evals(paper, table):
            k = run_facts.get(run.key, {}).get("eval_k")
            for metric, n in fixed:
                if k is not None and n > k:
                    raise PlanError(
                        f"paper {paper!r} table {table!r} reads {metric} of run {run.key!r}, whose "
                        f"evaluation draws eval.k={k} samples per question (a {metric} needs {n})"
                    )
        wanted = plan.table_suites(paper, table)
        for run, _ in plan.table_evals(paper, table):
            have = (run_facts.get(run.key) or {}).get("suites")
            missing = [s for s in wanted if have is not None and s not in have]
            if missing:
                raise PlanError(
                    f"paper {paper!r} table {table!r} reads suite(s) {missing} at scale {plan.scale!r}, "
                    f"which run {run.key!r}'s data config does not prepare; valid: {have}"
                )


def _sized(cfg: dict[str, Any]) -> dict[str, Any]:
    """A composed run config with its verl job sized for the scale (smoke: creditlab.scales.smoke_job)."""
    if cfg.get("scale") == "smoke" and (cfg.get("model") or {}).get("verl"):
        cfg["model"]["verl"] = smoke_job(cfg["model"]["verl"])
    return cfg


def _method_config(run: Run) -> str:
    """The method config a run composes (the base model: dapo's, only for the keys every config has)."""
    return "dapo" if run.method == BASE_RUN else run.method


def _compose_with(composer, args: list[str]) -> dict[str, Any]:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return _sized(OmegaConf.to_container(composer.compose(args), resolve=True))
    except (HydraException, OmegaConfBaseException) as e:
        raise PlanError(f"cannot compose run config {args}: {e}") from None


def compose(
    scale: str,
    backbone: str,
    method: str = "dapo",
    overrides: tuple[str, ...] | list[str] = (),
    seed: int = 0,
    config_dir: Path = CONFIG_DIR,
) -> dict[str, Any]:
    """Compose configs/run.yaml with Hydra for (scale, backbone, method) + overrides; resolved dict."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = run_args(scale, backbone, method, overrides, seed, config_dir)
    try:
        with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
            cfg = hydra_compose(config_name="run", overrides=args)
    except (HydraException, OmegaConfBaseException) as e:
        raise PlanError(f"cannot compose run config {args}: {e}") from None
    return _sized(OmegaConf.to_container(cfg, resolve=True))


def composed_configs(runs: Iterable[Run], config_dir: Path = CONFIG_DIR) -> dict[str, dict[str, Any]]:
    """Every run's resolved Hydra config (run key -> config), composed with the cached composer of
    `validate_runs` (the same composition as `run_config`, without its `run` block and name checks): what the
    workflow reads for job resources (GPUs, nodes) of a whole DAG in seconds."""
    from creditlab.config_compose import CachedComposer

    with CachedComposer(config_dir, "run") as composer:
        return {
            run.key: _compose_with(
                composer, run_args(run.scale, run.backbone, _method_config(run), run.overrides, run.seed, config_dir)
            )
            for run in runs
        }


def run_config(run: Run, config_dir: Path = CONFIG_DIR) -> dict[str, Any]:
    """The fully resolved config of ``run``, with its method's registered names checked."""
    cfg = compose(run.scale, run.backbone, _method_config(run), run.overrides, run.seed, config_dir)
    if run.method == BASE_RUN:
        cfg["method"] = {"name": BASE_RUN}
    else:
        check_registered(cfg, run.key)
    cfg["run"] = {
        "name": run.run,
        "key": run.key,
        "experiment": run.experiment,
        "papers": list(run.papers),
        "tables": list(run.tables),
    }
    return cfg


def check_registered(cfg: dict[str, Any], where: str) -> None:
    """Every name a run config selects must be registered (advantage, loss, credit, token filter,
    batching, reward), and its methods must compose (`creditlab.algos.compat.check_method`)."""
    from creditlab.algos import registry
    from creditlab.rewards import registry as rewards

    m, t = cfg["method"], cfg["trainer"]
    wanted = (
        [
            ("advantage", m["advantage"]),
            ("policy_loss", m["policy_loss"]),
            ("batching", t["batching"]),
            ("reward", t["reward"]),
        ]
        + [("credit", c["name"]) for c in m.get("credit") or []]
        + [("token_filter", f["name"]) for f in m.get("token_filter") or []]
    )
    for kind, name in wanted:
        valid = rewards.names() if kind == "reward" else registry.names(kind)
        if name not in valid:
            raise PlanError(f"{where}: unknown {kind} {name!r}; valid choices: {valid}")
    from creditlab.algos.compat import IllDefinedComposition, check_method

    try:  # the methods and the trainer settings compose (algos/compat.py: the rules and their reasons)
        check_method(m, t)
    except IllDefinedComposition as e:
        raise PlanError(f"{where}: ill-defined composition: {e}") from None
