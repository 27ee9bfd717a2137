"""``python -m creditlab <verb>``: the steps Snakemake runs (each also runs by hand).

Verbs: prepare, init-tracking, warmup, train, evaluate, table, plan, show-config, mlflow-ui, mlflow-server.
Every verb takes ``--results`` (output root) and ``--scale``; run-level verbs identify a run by
(backbone, run name, seed) and resolve everything else from ``configs/`` through the plan.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import yaml

from creditlab.models.hub_cache import hub_cache_env
from creditlab.plan import CONFIG_DIR, all_papers, build_plan
from creditlab.scales import is_hub


# ----------------------------------------------------------------------------------------- arguments
def _pipeline(a: argparse.Namespace) -> dict[str, Any]:
    """The pipeline config (configs/pipeline.yaml), with command-line overrides of scale/seeds.

    ``--seeds`` replaces the pipeline's seeds (a paper with its own `seeds` at the scale keeps them: that is
    what its tables and figures use). A job of one run (``--seed``) plans that seed for every paper, ``--seeds`` or
    not (a paper's own seeds never hide it; ``warmup``'s default seed 0 is not refused beside ``--seeds``).
    """
    with open(a.pipeline_config) as f:
        cfg = yaml.safe_load(f)
    if a.scale:
        cfg["scale"] = a.scale
    seeds = [int(s) for s in a.seeds.split(",")] if getattr(a, "seeds", None) else None
    if getattr(a, "seed", None) is not None:  # a job of one run: plan that seed (seeds need not be listed,
        cfg["seeds"] = [a.seed]  # not even in a paper's own seeds)
        cfg["ignore_paper_seeds"] = True
    elif seeds is not None:
        cfg["seeds"] = seeds
    if getattr(a, "tables", None):
        cfg["tables"] = a.tables.split(",")
    if getattr(a, "world", None):
        cfg["world"] = a.world
    if getattr(a, "papers", None) == "all":
        # the pipeline config's order first: a run shared by papers is tracked under the first one's
        # experiment, so adding a paper config (appended to that list) never moves an existing run
        listed = [p for p in cfg.get("papers", []) if p in all_papers()]
        cfg["papers"] = listed + [p for p in all_papers() if p not in listed]
    elif getattr(a, "papers", None):
        cfg["papers"] = a.papers.split(",")
    return cfg


def _plan(a: argparse.Namespace, validate: bool = False):
    """The plan of the pipeline config with the command line's overrides (validate: check every run config)."""
    return build_plan(_pipeline(a), validate=validate)


# ----------------------------------------------------------------------------------------- verbs
# Each verb calls its job (creditlab.jobs.<family>); the job module is imported when its verb runs, not at startup,
# so that `plan`, `show-config` and Snakemake's many short jobs do not pay for torch, transformers or verl.
# The docstrings are the verbs' --help.
def cmd_prepare(a: argparse.Namespace) -> None:
    """Generate the tiny world: train/val splits, held-out suites (overlap 0), tokenizer. At paper scale: fetch the
    hub datasets of the planned runs and tables into $CREDITLAB_HUB_RAW (default results/paper/raw; nothing is
    downloaded with HF_HUB_OFFLINE=1) and prepare them: results/paper/data/verl/<dataset>/{train,val}.parquet,
    suites/<suite>.parquet, the contamination report, prep_report.json (creditlab.data.prepare_paper).
    ``--download-only``: fetch, prepare nothing (a login node with network, before a job with HF_HUB_OFFLINE=1)."""
    from creditlab.jobs import prepare

    if is_hub(a.scale):  # paper (the hub downloads) and smoke (the hub fixtures)
        prepare.prepare_hub(a.results, _plan(a), download_only=a.download_only)
    else:
        prepare.prepare_tiny(a.results, a.scale, a.backbone, download_only=a.download_only, world=a.world)


def cmd_init_tracking(a: argparse.Namespace) -> None:
    """Create the MLflow store, every experiment and every table's parent run once, before parallel jobs
    use it; nest runs tracked before their table had a parent run (idempotent: safe to run again)."""
    from creditlab.jobs.tracking import init_tracking

    init_tracking(a.results, _plan(a))


def cmd_warmup(a: argparse.Namespace) -> None:
    """SFT warm-up of one tiny backbone (the shared base model of every method) on the train split and the data
    config's SFT-only ``warmup_extra`` records (the transfer formats); at paper scale: fetch the hub model."""
    from creditlab.jobs.warmup import warmup

    warmup(a.results, a.scale, a.backbone, a.seed, quiet=a.quiet, world=a.world)


def cmd_train(a: argparse.Namespace) -> None:
    """Train one run (resuming from its checkpoint if a previous attempt was killed)."""
    from creditlab.jobs.train import train

    train(a.results, _plan(a), a.backbone, a.run, a.seed, quiet=a.quiet)


def cmd_evaluate(a: argparse.Namespace) -> None:
    """Evaluate a trained run (or the base model) on the suites of its tables: greedy, avg@k, pass@k, per-sample jsonl.

    With ``--decode NAME`` the suites are decoded by that test-time decoding (paper config ``decodes``)
    mixing the backbone's base model and the run's RL model; results land under ``decode/NAME/``. The suites are
    those of the tables (of every paper) that read this evaluation (:meth:`Plan.eval_suites`).
    """
    from creditlab.jobs.evaluate import evaluate

    evaluate(a.results, _plan(a), a.backbone, a.run, a.seed, decode=a.decode, quiet=a.quiet)


def cmd_table(a: argparse.Namespace) -> None:
    """Build one paper table (CSV + Markdown, ours ± CI beside the paper) and its training curves, over the
    paper's seeds (its own `seeds` at the scale, else the pipeline's)."""
    from creditlab.jobs.tables import table

    table(a.results, _plan(a), a.paper, a.table)


def cmd_ledger(a: argparse.Namespace) -> None:
    """Build a paper's reproduction ledger (Markdown + CSV): every cell of its tables built at the scale with
    provenance, and its claims tested by a paired bootstrap (creditlab.tables.ledger). Reads the table CSVs."""
    from creditlab.jobs.tables import ledger

    ledger(a.results, _plan(a), a.paper)


def cmd_diagnose(a: argparse.Namespace) -> None:
    """Token diagnostics of a trained run vs its base model: Δlog p / entropy / KL histograms (PNG + JSON).

    One response per prompt of the suites (``--suites``; default: tiny/micro easy,medium,hard, paper/smoke the suites
    the run's evaluation covers) is sampled from each model (eval.max_new_tokens, temperature, top_p) and scored by
    both. The models, tokenizer, prompt rendering and stop tokens are the run's at its scale
    (creditlab.models.sources): at paper / smoke the base model's hub snapshot and the run's merged final/, the chat
    template as verl renders prompts, on the GPU(s) when there are any (one model per GPU when there are two)."""
    from creditlab.jobs.diagnose import diagnose

    diagnose(a.results, _plan(a), a.backbone, a.run, a.seed, suites=a.suites.split(",") if a.suites else None)


def cmd_analyze(a: argparse.Namespace) -> None:
    """Run one analysis of a paper config (token flipping, coupling masking, token values): JSON + Markdown + PNG."""
    from creditlab.jobs.analyze import analyze

    analyze(a.results, _plan(a), a.paper, a.name, quiet=a.quiet)


def cmd_figure(a: argparse.Namespace) -> None:
    """Draw one paper figure (configs/papers/<paper>.yaml `figures`): replacement_curves and bars from a
    table's CSV; token_credit from a run's token_credit.json (PNG + Markdown/CSV table)."""
    from creditlab.jobs.tables import figure

    figure(a.results, _plan(a), a.paper, a.name)


def cmd_plan(a: argparse.Namespace) -> None:
    """Print the planned runs (validating every run config)."""
    from creditlab.jobs.show import show_plan

    show_plan(_plan(a, validate=True))


def cmd_show_config(a: argparse.Namespace) -> None:
    """Print the resolved config of one run."""
    from creditlab.jobs.show import show_config

    show_config(_plan(a), a.backbone, a.run, a.seed)


def cmd_mlflow_ui(a: argparse.Namespace) -> None:
    """Start the MLflow UI on 127.0.0.1 against the project's store (one worker: a local SQLite store)."""
    from creditlab.jobs.tracking import mlflow_ui

    mlflow_ui(a.results, a.port, a.workers)


def cmd_mlflow_server(a: argparse.Namespace) -> None:
    """Start an MLflow tracking server for a cluster: a SQL backend, artifacts on shared storage (docs/cluster.md)."""
    from creditlab.jobs.tracking import mlflow_server

    mlflow_server(
        a.results,
        backend_store_uri=a.backend_store_uri,
        artifacts_destination=a.artifacts_destination,
        host=a.host,
        port=a.port,
        workers=a.workers,
        allowed_hosts=a.allowed_hosts,
        accept_sqlite_on_network_fs=a.accept_sqlite_on_network_fs,
    )


# ----------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="creditlab", description=__doc__)
    p.add_argument("--results", default="results", help="output root (default: results)")
    p.add_argument("--pipeline-config", default=str(CONFIG_DIR / "pipeline.yaml"))
    p.add_argument("--scale", default=None, help="tiny | micro | paper (default: the pipeline config's)")
    p.add_argument(
        "--seeds",
        default=None,
        help="comma-separated seeds (default: the pipeline config's); a paper "
        "with its own `seeds` at the scale keeps them",
    )
    p.add_argument(
        "--papers",
        default=None,
        help="comma-separated papers, or `all` (every configs/papers/*.yaml; what Snakemake jobs use, so "
        "that choosing papers re-runs nothing); default: the pipeline config's",
    )
    p.add_argument(
        "--tables",
        default=None,
        help="comma-separated paper/table names: only those are built (a ledger tests their claims only); "
        "default: the pipeline config's `tables` (null: all)",
    )
    p.add_argument(
        "--world",
        default=None,
        help="tiny / micro scale: the tiny world's data config (configs/data/<world>.yaml; default: the pipeline "
        "config's `world`)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    sub = p.add_subparsers(dest="verb", required=True)

    def run_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--backbone", required=True)
        sp.add_argument("--run", required=True)
        sp.add_argument("--seed", type=int, default=0)

    sp = sub.add_parser("prepare", help=cmd_prepare.__doc__)
    sp.add_argument("--backbone", default="tiny-s", help="any backbone (data do not depend on it)")
    sp.add_argument(
        "--download-only",
        action="store_true",
        help="scale paper: only fetch the hub datasets into $CREDITLAB_HUB_RAW (default "
        "results/paper/raw), e.g. on a login node with network; prepare nothing",
    )
    sp.set_defaults(fn=cmd_prepare)
    sub.add_parser("init-tracking", help=cmd_init_tracking.__doc__).set_defaults(fn=cmd_init_tracking)
    sp = sub.add_parser("warmup", help=cmd_warmup.__doc__)
    sp.add_argument("--backbone", required=True)
    sp.add_argument("--seed", type=int, default=0)
    sp.set_defaults(fn=cmd_warmup)
    for name, fn in [("train", cmd_train), ("evaluate", cmd_evaluate), ("show-config", cmd_show_config)]:
        sp = sub.add_parser(name, help=fn.__doc__)
        run_args(sp)
        sp.set_defaults(fn=fn)
        if name == "evaluate":
            sp.add_argument("--decode", default=None, help="a test-time decoding of the paper configs")
    sp = sub.add_parser("table", help=cmd_table.__doc__)
    sp.add_argument("--paper", required=True)
    sp.add_argument("--table", required=True)
    sp.set_defaults(fn=cmd_table)
    sp = sub.add_parser("ledger", help=cmd_ledger.__doc__)
    sp.add_argument("--paper", required=True)
    sp.set_defaults(fn=cmd_ledger)
    sp = sub.add_parser("diagnose", help=cmd_diagnose.__doc__)
    run_args(sp)
    sp.add_argument(
        "--suites",
        default=None,
        help="comma-separated suites whose prompts are used (default: "
        "easy,medium,hard; paper/smoke: the suites of the run's evaluation)",
    )
    sp.set_defaults(fn=cmd_diagnose)
    sp = sub.add_parser("figure", help=cmd_figure.__doc__)
    sp.add_argument("--paper", required=True)
    sp.add_argument("--name", required=True)
    sp.set_defaults(fn=cmd_figure)
    sp = sub.add_parser("analyze", help=cmd_analyze.__doc__)
    sp.add_argument("--paper", required=True)
    sp.add_argument("--name", required=True)
    sp.set_defaults(fn=cmd_analyze)
    sub.add_parser("plan", help=cmd_plan.__doc__).set_defaults(fn=cmd_plan)
    sp = sub.add_parser("mlflow-ui", help=cmd_mlflow_ui.__doc__)
    sp.add_argument("--port", type=int, default=5000)
    sp.add_argument("--workers", type=int, default=1, help="server worker processes (default 1)")
    sp.set_defaults(fn=cmd_mlflow_ui)
    sp = sub.add_parser("mlflow-server", help=cmd_mlflow_server.__doc__)
    sp.add_argument(
        "--backend-store-uri",
        help="runs and metrics: postgresql://user:pw@host/db on a cluster (default: SQLite <results>/mlflow-server/"
        "mlflow.db, written by this server only; refused on a network filesystem)",
    )
    sp.add_argument("--artifacts-destination", help="artifact root on shared storage (default <results>/mlartifacts)")
    sp.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0: reachable from the nodes)")
    sp.add_argument("--port", type=int, default=5000)
    sp.add_argument("--workers", type=int, default=4, help="server worker processes (default 4)")
    sp.add_argument("--allowed-hosts", help="Host headers answered (default: this host, localhost, private IPs)")
    sp.add_argument("--accept-sqlite-on-network-fs", action="store_true", help="serve a SQLite file on NFS/Lustre/...")
    sp.set_defaults(fn=cmd_mlflow_server)
    return p


def main(argv: list[str] | None = None) -> None:
    a = build_parser().parse_args(argv)
    if a.scale is None and a.verb in ("prepare", "warmup"):
        a.scale = _pipeline(a)["scale"]
    if a.verb in ("prepare", "warmup"):  # the plan-free verbs: the world checked as the plan checks it
        from creditlab.plan import check_world

        a.world = check_world(a.world or _pipeline(a).get("world"), a.scale)
    if a.scale == "paper":  # by hand as under Snakemake: hub snapshots and datasets under the pipeline's hub_cache
        os.environ.update(hub_cache_env(_pipeline(a).get("hub_cache"))[0])  # (a variable already set wins)
    a.fn(a)


if __name__ == "__main__":
    main()
