# Shared by all the .smk files: the plan (unique runs of every table), path patterns, the CLI prefix.
import os
import sys

from snakemake.exceptions import WorkflowError

from creditlab import paths
from creditlab.plan import BASE_RUN, PlanError, build_plan

try:
    PLAN = build_plan(config)  # validates every run's Hydra config before any job starts
except (PlanError, ValueError) as err:
    raise WorkflowError(f"invalid pipeline/paper config: {err}")

ENV = "../../environment.yml"  # conda env of all jobs; cluster users pass --use-conda
RESULTS = config["results"]
SCALE = PLAN.scale
if config.get("mlflow_uri"):
    # exported (not read) for the jobs, which inherit the environment (sbatch too: --export=ALL);
    # deliberately not a rule param, so pointing at another server re-runs nothing
    os.environ.update(MLFLOW_TRACKING_URI=config["mlflow_uri"])
CLI = (
    f"{sys.executable} -m creditlab --results {RESULTS} --scale {SCALE} "
    f"--seeds {','.join(map(str, PLAN.seeds))} --papers {','.join(config['papers'])}"
)


def at_scale(pattern):
    """A path pattern with results and scale filled, other wildcards kept for Snakemake."""
    return pattern.replace("{results}", RESULTS).replace("{scale}", SCALE)


def log_for(name):
    return f"{RESULTS}/{SCALE}/logs/{name}.log"


def all_tables():
    out = []
    for paper, table in PLAN.tables:
        fill = dict(results=RESULTS, scale=SCALE, paper=paper, table=table)
        out += [str(paths.fmt(paths.TABLE_CSV, **fill)), str(paths.fmt(paths.CURVES_PNG, **fill))]
    return out + all_figures()


def figure_path(paper, name):
    """Where a paper figure lands: its own file, or the diagnostics of a (backbone, run, seed)."""
    spec = PLAN.papers[paper]
    fig = spec.figures[name]
    if fig.kind == "token_histograms":
        backbone = spec.backbone_for(fig.backbone, SCALE)
        return str(paths.fmt(paths.DIAG_PNG, results=RESULTS, scale=SCALE, backbone=backbone, run=fig.run,
                             seed=PLAN.seeds[0]))
    return str(paths.fmt(paths.FIGURE_PNG, results=RESULTS, scale=SCALE, paper=paper, figure=name))


def all_figures():
    return [figure_path(paper, name) for paper, spec in PLAN.papers.items() for name in spec.figures]


def figure_table(wildcards):
    fig = PLAN.papers[wildcards.paper].figures[wildcards.figure]
    return str(paths.fmt(paths.TABLE_CSV, results=RESULTS, scale=SCALE, paper=wildcards.paper, table=fig.table))


def model_of(wildcards):
    """A trained run's DONE marker, or the warmed-up base model for the reserved run `base`."""
    if wildcards.run == BASE_RUN:
        return at_scale(paths.BASE_DONE).format(backbone=wildcards.backbone)
    return at_scale(paths.RUN_DONE).format(**wildcards)


def decode_inputs(wildcards):
    """A decoding needs the backbone's base model and the run's trained RL model."""
    return {
        "base": at_scale(paths.BASE_DONE).format(backbone=wildcards.backbone),
        "rl": at_scale(paths.RUN_DONE).format(**wildcards),
    }


def table_inputs(wildcards):
    """Evaluation metrics of every row of a table, and training metrics of its trained runs."""
    out = {"evals": [], "curves": []}
    for run, decode in PLAN.table_evals(wildcards.paper, wildcards.table):
        fill = dict(results=RESULTS, scale=SCALE, backbone=run.backbone, run=run.run, seed=run.seed, decode=decode)
        pattern = paths.EVAL_METRICS if decode is None else paths.DECODE_EVAL_METRICS
        out["evals"].append(str(paths.fmt(pattern, **fill)))
        if run.trains and str(paths.fmt(paths.RUN_METRICS, **fill)) not in out["curves"]:
            out["curves"].append(str(paths.fmt(paths.RUN_METRICS, **fill)))
    return out
