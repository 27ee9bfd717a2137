# Shared by all the .smk files: the plan (unique runs of every table), path patterns, the CLI prefix.
import os
import re
import sys

from snakemake.exceptions import WorkflowError

from creditlab import paths
import functools

from creditlab.paths import run_key
from creditlab.plan import BASE_RUN, PlanError, build_plan, composed_configs
from creditlab.models.hub_cache import hub_cache_bytes, hub_cache_env
from creditlab.rewards.code.policy import ACCEPT_ENV
from creditlab.tracking.mlflow_tracker import tracking_uri
from creditlab.tracking.store_safety import store_refusal

# Cluster settings (docs/cluster.md, "Cluster settings"), checked before the plan. None is a param of any job, so
# changing one re-runs nothing. A SQLite MLflow store on a network filesystem is refused at paper scale unless accepted.
_store = config.get("mlflow_uri") or tracking_uri(config["results"])
_refusal = store_refusal(_store, config["scale"], bool(config.get("accept_sqlite_on_network_fs")))
if _refusal:
    raise WorkflowError(f"invalid pipeline config: mlflow_uri: {_refusal}")
if config.get("code_sandbox_accept"):  # a weaker code sandbox accepted in words, for the evaluation jobs
    os.environ[ACCEPT_ENV] = config["code_sandbox_accept"]
try:  # paper scale: where hub snapshots and datasets go, exported for the jobs (HF_HOME, CREDITLAB_HUB_RAW)
    _hub_env, _hub_note = hub_cache_env(config.get("hub_cache")) if config["scale"] == "paper" else ({}, "")
    os.environ.update(_hub_env)
except ValueError as err:
    raise WorkflowError(f"invalid pipeline config: hub_cache: {err}")

try:
    PLAN = build_plan(config)  # validates every run's Hydra config before any job starts
except (PlanError, ValueError) as err:
    raise WorkflowError(f"invalid pipeline/paper config: {err}")
# what the DAG leaves out and why (Plan.notes): tables with no benchmark stand-in; tables reading runs the plan refuses
# (Plan.refused_runs: a backbone verl cannot train right), with the run keys and the reason, and the figures drawn
# from them; refused analyses. No target depends on a refused run (targeting its outputs fails: _run_cfg).
for _note in PLAN.notes():
    print(f"creditlab: {_note}", file=sys.stderr)

ENV = "../../environment.yml"  # conda env of all jobs; cluster users pass --use-conda
RESULTS = config["results"]
SCALE = PLAN.scale
if config.get("mlflow_uri"):
    # exported (not read) for the jobs, which inherit the environment (sbatch too: --export=ALL);
    # deliberately not a rule param, so pointing at another server re-runs nothing
    os.environ.update(MLFLOW_TRACKING_URI=config["mlflow_uri"])
# Jobs plan with every paper config (`--papers all`) and the seed of their own run, so that choosing
# papers or adding seeds re-runs no finished job (the command is a param, and params trigger re-runs);
# only tables and figures, which average over seeds, get a seed list: their paper's (`paper_seeds`).
# The interpreter is neither in the param nor in the rule's text: shell lines start with "$CREDITLAB_PYTHON", this
# Snakemake's interpreter, exported for the jobs (sbatch --export=ALL; a job's own Snakemake sets it again), so
# another interpreter path or conda prefix re-runs nothing (docs/cluster.md, "Cluster settings", 3).
os.environ.update(CREDITLAB_PYTHON=sys.executable)
WORLD = PLAN.world  # the tiny world's data config: in the CLI prefix, so a job of another world re-runs
CLI = f"-m creditlab --results {RESULTS} --scale {SCALE} --world {WORLD} --papers all"


def paper_seeds(wildcards):
    """The seeds of a paper's tables and figures, comma-joined: its own `seeds` at this scale, else the
    pipeline's. A param (re-run trigger) that is a function of the paper: changing one paper's seeds
    re-runs only that paper's tables and figures; changing the pipeline's, only the papers using them.
    """
    return ",".join(map(str, PLAN.paper_seeds(wildcards.paper)))


def at_scale(pattern):
    """A path pattern with results and scale filled, other wildcards kept for Snakemake."""
    return pattern.replace("{results}", RESULTS).replace("{scale}", SCALE)


@functools.lru_cache(maxsize=None)
def _run_cfgs():
    """Every planned run's resolved config, composed once per DAG build (train and evaluation resources)."""
    return composed_configs(PLAN.runs.values())


def _run_cfg(backbone, run, seed):
    """A planned run's resolved config; WorkflowError naming the run and why for one the plan refuses
    (Plan.refused_runs: no target reads it, so only a direct target of its outputs gets here) or does not plan."""
    key = run_key(SCALE, backbone, run, int(seed))
    if key in PLAN.refused_runs:
        raise WorkflowError(f"run {key} is refused at plan time, not trained or evaluated: {PLAN.refused_runs[key]}")
    if key not in PLAN.runs:
        raise WorkflowError(f"run {key} is not in the plan of scale {SCALE!r} (no table, figure or analysis reads it)")
    return _run_cfgs()[key]


def run_config_digest(wildcards):
    """A digest of a planned run's fully resolved config: the train rule's param, so that any change of what a run
    is (its method, hyperparameters, data, model, evaluation settings) re-runs it, whatever changed upstream."""
    import hashlib
    import json

    cfg = _run_cfg(wildcards.backbone, wildcards.run, wildcards.seed)
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def train_priority(wildcards):
    """Snakemake priority of a `train` job: the run's compute, the larger first (creditlab.resources.order)."""
    from creditlab.resources.order import train_priority as priority

    return priority(_run_cfg(wildcards.backbone, wildcards.run, wildcards.seed))


def warmup_priority(wildcards):
    """Snakemake priority of a `warmup` job: above every run, the larger backbone first (creditlab.resources.order)."""
    from creditlab.resources.order import warmup_priority as priority

    prefix = f"{SCALE}/{wildcards.backbone}/"
    cfgs = _run_cfgs()
    return priority(next((cfgs[k] for k in cfgs if k.startswith(prefix)), None))


if SCALE == "paper":  # where the hub cache is, and its size: the snapshots of the planned backbones (each once)
    _snapshots = hub_cache_bytes(c for k, c in _run_cfgs().items() if k not in PLAN.refused_runs)
    print(
        f"creditlab: {_hub_note}; {len(_snapshots)} backbone snapshots, ~{sum(_snapshots.values()) / 1e9:.0f} GB",
        file=sys.stderr,
    )
# paper scale: what each planned run costs (creditlab.resources: peak GPU memory per rank, host memory per node,
# hours, checkpoint disk; a run that does not fit is in PLAN.refused_runs, with the numbers, in the notes above), and
# each evaluation job's hours (an evaluation longer than the site's job limit is in PLAN.refused_evals)
for _line in PLAN.resource_lines(sum(_snapshots.values()) if SCALE == "paper" else None):
    print(f"creditlab resources: {_line}", file=sys.stderr)


@functools.lru_cache(maxsize=None)
def _train_size(backbone, run, seed):
    """(nodes, GPUs) of one training job: at paper scale the run's `model.verl` (nnodes x n_gpus_per_node, the
    backbone's size or the run's override, e.g. ARCA's single GPU); at tiny/micro one GPU if the node has one.
    """
    if SCALE != "paper":
        return 1, 1
    v = _run_cfg(backbone, run, seed)["model"]["verl"]
    return int(v["nnodes"]), int(v["nnodes"]) * int(v["n_gpus_per_node"])


def train_nodes(wildcards):
    return _train_size(wildcards.backbone, wildcards.run, wildcards.seed)[0]


def train_gpus(wildcards):
    """GPUs of the whole job (sbatch --gpus, the executor plugin's `gpu`): nodes x GPUs per node."""
    return _train_size(wildcards.backbone, wildcards.run, wildcards.seed)[1]


def train_step_gpus(wildcards):
    """GPUs of the job's step (the jobstep plugin's `srun -n1 ... --gpus=<gpus>`): one node's, the first. The
    plugin (0.6.1) runs a rule as one task, which cannot span nodes (srun then places it on one node), and reads
    `gpus` before `gpu`: without this it asks one node for every GPU of the job and the step is refused. A
    multi-node run reaches the other nodes with a step of its own (creditlab.engines.verl.ray_slurm).
    """
    nodes, gpus = _train_size(wildcards.backbone, wildcards.run, wildcards.seed)
    return gpus // nodes


def train_runtime(wildcards):
    """Wall time of one training job (sbatch -t, minutes): at paper scale from the run's resource estimate, within the
    site's longest job (creditlab.resources.train_job_minutes; a longer run requeues itself); 60 below paper scale."""
    from creditlab.resources import train_job_minutes

    res = PLAN.resources.get(run_key(SCALE, wildcards.backbone, wildcards.run, int(wildcards.seed)))
    return train_job_minutes(res, PLAN.cluster) if res is not None else 60


@functools.lru_cache(maxsize=None)
def _eval_gpus(backbone, run, seed):
    """GPUs of one evaluation job: at paper scale the run's eval.vllm.extra.tensor_parallel_size (vLLM shards the
    model over them; configs/scale/paper.yaml sets it to the backbone's rollout_tp); at tiny/micro one.
    """
    if SCALE != "paper":
        return 1
    extra = _run_cfg(backbone, run, seed)["eval"]["vllm"].get("extra") or {}
    return int(extra.get("tensor_parallel_size", 1))


def eval_gpus(wildcards):
    return _eval_gpus(wildcards.backbone, wildcards.run, wildcards.seed)


def _eval_minutes(wildcards, decode, below_paper):
    """Wall time of one evaluation job (sbatch -t, minutes): at paper scale from its estimate (creditlab.resources
    eval_job_minutes: 1.5 x its hours + 20 min, within the site's longest job; a longer one is refused at plan time,
    Plan.refused_evals); `below_paper` at tiny/micro (and for a job the plan did not estimate)."""
    from creditlab.resources import eval_job_key, eval_job_minutes

    key = eval_job_key(run_key(SCALE, wildcards.backbone, wildcards.run, int(wildcards.seed)), decode)
    res = PLAN.eval_resources.get(key)
    return eval_job_minutes(res, PLAN.cluster) if res is not None else below_paper


def eval_runtime(wildcards):
    return _eval_minutes(wildcards, None, 240)


def decode_runtime(wildcards):
    return _eval_minutes(wildcards, wildcards.decode, 480)


def log_for(name):
    return f"{RESULTS}/{SCALE}/logs/{name}.log"


def all_tables():
    out = []
    for paper, table in PLAN.tables:  # the tables buildable at this scale
        fill = dict(results=RESULTS, scale=SCALE, paper=paper, table=table)
        out += [str(paths.fmt(p, **fill)) for p in (paths.TABLE_CSV, paths.TABLE_HTML, paths.CURVES_PNG)]
    return out + all_figures() + all_analyses() + all_ledgers()


def ledger_papers():
    """The papers with at least one table buildable at this scale (each gets a reproduction ledger)."""
    return list(dict.fromkeys(paper for paper, _ in PLAN.tables))


def all_ledgers():
    return [
        str(paths.fmt(p, results=RESULTS, scale=SCALE, paper=paper))
        for paper in ledger_papers()
        for p in (paths.LEDGER_CSV, paths.LEDGER_MD, paths.LEDGER_HTML)
    ]


def ledger_inputs(wildcards):
    """A ledger reads its paper's table CSVs (the cells) and the evaluation / training files those tables read
    (the claims' bootstraps read the per-question and per-step data)."""
    out = {"tables": [], "evals": [], "curves": []}
    for paper, table in PLAN.tables:
        if paper != wildcards.paper:
            continue
        out["tables"].append(
            str(
                paths.fmt(
                    paths.TABLE_CSV,
                    results=RESULTS,
                    scale=SCALE,
                    paper=paper,
                    table=table,
                )
            )
        )
        ins = table_inputs(type("W", (), {"paper": paper, "table": table})())
        out["evals"] += [p for p in ins["evals"] if p not in out["evals"]]
        out["curves"] += [p for p in ins["curves"] if p not in out["curves"]]
    return out


def ledger_tables(wildcards):
    """The paper's tables this pipeline builds, comma-joined (`tables`; a ledger tests those tables' claims only)."""
    return ",".join(f"{wildcards.paper}/{t}" for p, t in PLAN.tables if p == wildcards.paper)


def ledger_params(wildcards):
    """What defines a ledger's claims (a re-run trigger): the paper's claims."""
    return [repr(c) for c in PLAN.papers[wildcards.paper].claims]


def figure_paths(paper, name):
    """Where a paper figure lands: its own PNG (token_credit: and its .md/.csv table), or the
    diagnostics of a (backbone, run, the paper's first seed)."""
    spec = PLAN.papers[paper]
    fig = spec.figures[name]
    if fig.kind == "token_histograms":
        backbone = spec.backbone_for(fig.backbone, SCALE)
        return [
            str(
                paths.fmt(
                    paths.DIAG_PNG,
                    results=RESULTS,
                    scale=SCALE,
                    backbone=backbone,
                    run=fig.run,
                    seed=PLAN.paper_seeds(paper)[0],
                )
            )
        ]
    fill = dict(results=RESULTS, scale=SCALE, paper=paper, figure=name)
    patterns = [paths.FIGURE_PNG] + ([paths.FIGURE_MD, paths.FIGURE_CSV] if fig.kind == "token_credit" else [])
    return [str(paths.fmt(p, **fill)) for p in patterns]


def all_analyses():
    out = []
    for paper, name in PLAN.analyses:
        fill = dict(results=RESULTS, scale=SCALE, paper=paper, analysis=name)
        out += [
            str(paths.fmt(p, **fill))
            for p in (
                paths.ANALYSIS_JSON,
                paths.ANALYSIS_MD,
                paths.ANALYSIS_HTML,
                paths.ANALYSIS_PNG,
            )
        ]
    return out


def analysis_inputs(wildcards):
    """An analysis needs the data and its start weights: the backbone's base model or its run's DONE (a mid-training
    start `trained@N`: the base model at tiny / micro, where the job replays the run to step N; the run at paper /
    smoke, whose verl checkpoint it reads). A fidelity_gains analysis reads the credit_fidelity analyses it names
    (those planned at this scale) and its table's CSV."""
    spec = PLAN.papers[wildcards.paper]
    an = spec.analyses[wildcards.analysis]
    backbone = spec.backbone_for(an.backbone, SCALE)
    seed = PLAN.paper_seeds(wildcards.paper)[0]
    fill = dict(results=RESULTS, scale=SCALE, backbone=backbone, run=an.run, seed=seed)
    hub = _run_cfg(backbone, an.run, seed)["model"].get("kind") == "hub"
    model = paths.BASE_DONE if an.start == "base" or (an.start.startswith("trained@") and not hub) else paths.RUN_DONE
    out = {
        "data": str(paths.fmt(paths.DATA_DONE, **fill)),
        "model": str(paths.fmt(model, **fill)),
    }
    if an.kind == "fidelity_gains":
        from creditlab.analysis.plan_checks import analyze_defaults

        kw = analyze_defaults("fidelity_gains") | an.kwargs
        planned = set(PLAN.analyses)
        out["fidelity"] = [
            str(
                paths.fmt(
                    paths.ANALYSIS_JSON,
                    results=RESULTS,
                    scale=SCALE,
                    paper=wildcards.paper,
                    analysis=n,
                )
            )
            for n in kw["fidelity"]
            if (wildcards.paper, n) in planned
        ]
        out["table"] = str(
            paths.fmt(
                paths.TABLE_CSV,
                results=RESULTS,
                scale=SCALE,
                paper=wildcards.paper,
                table=kw["table"],
            )
        )
    return out


def analysis_params(wildcards):
    """What defines an analysis (a re-run trigger): kind, run, start, params, caption."""
    an = PLAN.papers[wildcards.paper].analyses[wildcards.analysis]
    return {
        "kind": an.kind,
        "backbone": an.backbone,
        "run": an.run,
        "start": an.start,
        "params": an.kwargs,
        "caption": an.caption,
    }


def all_figures():
    """Every figure drawable at this scale (a table-based one needs its table and columns here)."""
    return [path for paper, name in PLAN.figures for path in figure_paths(paper, name)]


def _names_regex(names):
    """A wildcard regex matching exactly `names` (never matching anything when there are none)."""
    return "|".join(re.escape(n) for n in sorted(names)) or "(?!)"


# token_credit figures share FIGURE_PNG with the table-based kinds but have their own rule (three
# outputs); the two rules' `figure` wildcards are constrained to disjoint sets of names.
_KINDS_BY_NAME = {}
for _p, _spec in PLAN.papers.items():
    for _name, _fig in _spec.figures.items():
        _KINDS_BY_NAME.setdefault(_name, set()).add("token_credit" if _fig.kind == "token_credit" else "other")
_clash = sorted(n for n, kinds in _KINDS_BY_NAME.items() if len(kinds) > 1)
if _clash:
    raise WorkflowError(
        f"figure name(s) {_clash} are token_credit figures in one paper and another kind in "
        f"another; rename one (figure names share one output pattern)"
    )
TOKEN_CREDIT_FIGURES = _names_regex(n for n, kinds in _KINDS_BY_NAME.items() if "token_credit" in kinds)
TABLE_FIGURES = f"(?!(?:{TOKEN_CREDIT_FIGURES})\\.png$)[^/]+"  # any name but a token_credit figure's


def figure_table(wildcards):
    fig = PLAN.papers[wildcards.paper].figures[wildcards.figure]
    return str(
        paths.fmt(
            paths.TABLE_CSV,
            results=RESULTS,
            scale=SCALE,
            paper=wildcards.paper,
            table=fig.table,
        )
    )


def figure_params(wildcards):
    """Kind and caption of a figure (for the report caption)."""
    fig = PLAN.papers[wildcards.paper].figures[wildcards.figure]
    return {"kind": fig.kind, "caption": fig.caption}


def token_credit_run(wildcards):
    """A token_credit figure reads the token_credit.json of its run with the paper's first seed: that run's
    DONE marker."""
    spec = PLAN.papers[wildcards.paper]
    fig = spec.figures[wildcards.figure]
    return str(
        paths.fmt(
            paths.RUN_DONE,
            results=RESULTS,
            scale=SCALE,
            backbone=spec.backbone_for(fig.backbone, SCALE),
            run=fig.run,
            seed=PLAN.paper_seeds(wildcards.paper)[0],
        )
    )


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
    """Evaluation metrics the table reads (none for benchmarks without a stand-in at this scale), and the
    training metrics of its trained runs (training curves, step_time columns)."""
    out = {"evals": [], "curves": []}
    for run, decode in PLAN.table_evals(wildcards.paper, wildcards.table):
        fill = dict(
            results=RESULTS,
            scale=SCALE,
            backbone=run.backbone,
            run=run.run,
            seed=run.seed,
            decode=decode,
        )
        pattern = paths.EVAL_METRICS if decode is None else paths.DECODE_EVAL_METRICS
        out["evals"].append(str(paths.fmt(pattern, **fill)))
    for run in PLAN.table_runs(wildcards.paper, wildcards.table):
        fill = dict(
            results=RESULTS,
            scale=SCALE,
            backbone=run.backbone,
            run=run.run,
            seed=run.seed,
        )
        if run.trains and str(paths.fmt(paths.RUN_METRICS, **fill)) not in out["curves"]:
            out["curves"].append(str(paths.fmt(paths.RUN_METRICS, **fill)))
    return out
