"""The plan's data: a run (its key and tables), the plan of runs, tables, figures and analyses, and its refusals.

Built by :func:`creditlab.plan.build_plan`; the run configs it holds come from :mod:`creditlab.plan.runs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from creditlab.papers.spec import DecodeSpec, PaperSpec
from creditlab.paths import run_key

BASE_RUN = "base"


class PlanError(ValueError):
    """A pipeline/paper config that cannot be planned (message names the key and the choices)."""


class RunRefused(PlanError):
    """A run whose config is valid but which the plan refuses to train at its scale: a backbone verl cannot train
    right with the launcher's settings (`check_verl_model`), or a run that does not fit the cluster
    (`check_resources`). Not a config error: validation (`validate_runs`,
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
    world: str = "tiny_arith"
    """The tiny world's data config (tiny / micro scale; pipeline key ``world``): each run composes ``data=<world>``."""
    skipped_analyses: dict[tuple[str, str], str] = field(default_factory=dict)
    """(paper, analysis) -> why it cannot run at this scale (`check_analyses`; filled when the plan is validated)."""
    refused_runs: dict[str, str] = field(default_factory=dict)
    """Run key -> why the plan refuses to train it at this scale (a `RunRefused` of `validate_runs`: a backbone verl
    cannot train right); filled when the plan is validated. The run stays in `runs` (its config is valid), but no
    target reads it: the tables that read it (`refused_tables`), the figures drawn from them or from it
    (`refused_figures`) and the analyses of it or of those tables (`skipped_analyses`) are left out."""
    resources: dict[str, Any] = field(default_factory=dict)
    """Run key -> `creditlab.resources.RunResources` of every verl run at paper scale (filled when the plan is
    validated); a run that does not fit is refused (`refused_runs`). `resource_lines` renders the table."""
    cluster: Any = None
    """The `creditlab.resources.Cluster` the resources were estimated on (paper scale, validated plans)."""
    eval_resources: dict[str, Any] = field(default_factory=dict)
    """Evaluation job key (`creditlab.resources.eval_time.eval_job_key`: the run key, or ``<run key>/decode-<name>``)
    -> its `EvalResources`, for every evaluation a buildable table reads at paper scale (validated plans); a run whose
    evaluation cannot finish within the site's job limit is refused (`refused_evals`)."""
    refused_evals: dict[str, str] = field(default_factory=dict)
    """Evaluation job key -> why it cannot finish within the site's job limit (`check_evals`: the numbers and what to
    change); the tables that read it are refused like those reading a refused run (`refused_tables`)."""

    def resource_lines(self, hub_bytes: float | None = None) -> list[str]:
        """The resource table of the planned runs and its totals, with the hub cache's size when given
        (`creditlab.models.hub_cache.hub_cache_bytes`); empty when none was estimated."""
        if not self.resources:
            return []
        from creditlab.resources.table import eval_lines, resource_lines

        return resource_lines(self.resources, self.cluster, self.refused_runs, hub_bytes) + eval_lines(
            self.eval_resources, self.cluster, self.refused_evals
        )

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
        """(paper, table) -> the refused runs (keys, `refused_runs`) and evaluations (job keys, `refused_evals`) it
        reads, for every table with a column at this scale that reads one: not built, nor a target."""
        if not self.refused_runs and not self.refused_evals:
            return {}
        from creditlab.resources.eval_time import eval_job_key

        out: dict[tuple[str, str], list[str]] = {}
        for p, t in self.tables_at_scale:
            keys = list(dict.fromkeys(r.key for r in self.table_runs(p, t) if r.key in self.refused_runs))
            evals = (eval_job_key(r.key, d) for r, d in self.table_evals(p, t) if self.refused_evals)
            keys += list(dict.fromkeys(k for k in evals if k in self.refused_evals))
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
                by_reason.setdefault(self.refused_runs.get(key) or self.refused_evals[key], []).append(key)
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
