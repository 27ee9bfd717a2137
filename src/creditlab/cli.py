"""``python -m creditlab <verb>``: the steps Snakemake runs (each also runs by hand).

Verbs: prepare, init-tracking, warmup, train, evaluate, table, plan, show-config, mlflow-ui.
Every verb takes ``--results`` (output root) and ``--scale``; run-level verbs identify a run by
(backbone, run name, seed) and resolve everything else from ``configs/`` through the plan.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from creditlab import paths
from creditlab.plan import BASE_RUN, CONFIG_DIR, all_papers, build_plan, compose, run_config
from creditlab.scales import is_hub


# ----------------------------------------------------------------------------------------- helpers
def _setup(cfg: dict[str, Any] | None = None) -> None:
    import torch

    torch.set_num_threads(int((cfg or {}).get("threads", 1)))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _pipeline(a: argparse.Namespace) -> dict[str, Any]:
    """The pipeline config (configs/pipeline.yaml), with command-line overrides of scale/seeds.

    ``--seeds`` replaces the pipeline's seeds (a paper with its own `seeds` at the scale keeps them: that is
    what its tables and figures use). A job of one run (``--seed``) plans that seed for every paper.
    """
    with open(a.pipeline_config) as f:
        cfg = yaml.safe_load(f)
    if a.scale:
        cfg["scale"] = a.scale
    if getattr(a, "seeds", None):
        cfg["seeds"] = [int(s) for s in a.seeds.split(",")]
    elif getattr(a, "seed", None) is not None:  # a job of one run: plan that seed (seeds need not be listed,
        cfg["seeds"] = [a.seed]                  # not even in a paper's own seeds)
        cfg["ignore_paper_seeds"] = True
    if getattr(a, "tables", None):
        cfg["tables"] = a.tables.split(",")
    if getattr(a, "papers", None) == "all":
        # the pipeline config's order first: a run shared by papers is tracked under the first one's
        # experiment, so adding a paper config (appended to that list) never moves an existing run
        listed = [p for p in cfg.get("papers", []) if p in all_papers()]
        cfg["papers"] = listed + [p for p in all_papers() if p not in listed]
    elif getattr(a, "papers", None):
        cfg["papers"] = a.papers.split(",")
    return cfg


def _write_json(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _load_tokenizer(data_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(data_dir / "tokenizer"))


def _load_model(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir))


def _parent(run):
    """The MLflow parent run (its first table) of a planned run, or None."""
    from creditlab.tracking.mlflow_tracker import ParentRun

    where = run.parent_table
    return ParentRun.of_table(run.scale, *where) if where else None


def _tags(run, cfg: dict[str, Any]) -> dict[str, str]:
    from creditlab.tracking.provenance import git_commit

    return {
        "paper": run.papers[0] if run.papers else "", "papers": ",".join(run.papers),
        "table": ",".join(run.tables), "method": run.method, "run": run.run, "backbone": run.backbone,
        "seed": str(run.seed), "scale": run.scale, "git_commit": git_commit(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
    }


def _eval_k(plan, paper: str) -> int:
    """The evaluation's k (samples per question) of a paper's runs at the plan's scale: the eval.k of its first planned
    run (every run of a paper shares its evaluation settings; at tiny/micro scale, the scale's k)."""
    run = next((r for r in plan.runs.values() if paper in r.papers), None)
    if run is None:
        return compose(plan.scale, plan.backbones[0])["eval"]["k"]
    return int(run_config(run)["eval"]["k"])


# ----------------------------------------------------------------------------------------- verbs
def cmd_prepare(a: argparse.Namespace) -> None:
    """Generate the tiny world: train/val splits, held-out suites (overlap 0), tokenizer. At paper scale: fetch the
    hub datasets of the planned runs and tables into $CREDITLAB_HUB_RAW (default results/paper/raw; nothing is
    downloaded with HF_HUB_OFFLINE=1) and prepare them: results/paper/data/verl/<dataset>/{train,val}.parquet,
    suites/<suite>.parquet, the contamination report, prep_report.json (creditlab.data.prepare_paper).
    ``--download-only``: fetch, prepare nothing (a login node with network, before a job with HF_HUB_OFFLINE=1)."""
    if is_hub(a.scale):  # paper (the hub downloads) and smoke (the hub fixtures)
        from creditlab.data import prepare_paper

        plan = build_plan(_pipeline(a), validate=False)
        try:
            report = prepare_paper.run(plan, a.results, download_only=a.download_only)
        except prepare_paper.PaperDataError as err:
            raise SystemExit(f"prepare at scale {a.scale!r}: {err}") from None
        summary = {"raw_dir": report["raw_dir"],
                   "downloads": {h: r["status"] for h, r in report["downloads"].items()}}
        if not a.download_only:
            summary |= {"suites": {s: r["count"] for s, r in report["suites"].items()},
                        "training_sets": {d: r["counts"] for d, r in report["training_sets"].items()}}
        print(json.dumps(summary, indent=1))
        return
    if a.download_only:
        raise SystemExit(f"prepare --download-only is for scale 'paper' (hub datasets); scale {a.scale!r} downloads "
                         f"nothing")
    from creditlab.data.prepare import prepare_tiny

    cfg = compose(a.scale, a.backbone)
    out = paths.fmt(paths.DATA_DIR, results=a.results, scale=a.scale)
    report = prepare_tiny(cfg["data"], out)
    print(json.dumps({k: report[k] for k in ("counts", "overlap") if k in report}, indent=1))


def cmd_init_tracking(a: argparse.Namespace) -> None:
    """Create the MLflow store, every experiment and every table's parent run once, before parallel jobs
    use it; nest runs tracked before their table had a parent run (idempotent: safe to run again)."""
    from creditlab.tracking.mlflow_tracker import ParentRun, init_store, tracking_uri

    plan = build_plan(_pipeline(a), validate=False)
    parents = [(plan.papers[p].experiment, ParentRun.of_table(plan.scale, p, t)) for p, t in plan.tables]
    children = [(r.experiment, r.key, ParentRun.of_table(r.scale, *r.parent_table).key)
                for r in plan.runs.values() if r.parent_table]  # nests runs tracked before parents existed
    init_store(Path(a.results), plan.experiments + ["base-models"], parents, children)
    marker = paths.fmt(paths.TRACKING_READY, results=a.results)
    text = tracking_uri(Path(a.results)) + "\n"
    if not marker.is_file() or marker.read_text() != text:  # unchanged: keep its mtime (jobs depend on it)
        marker.write_text(text)


def cmd_warmup(a: argparse.Namespace) -> None:
    """SFT warm-up of one tiny backbone (the shared base model of every method) on the train split and the data
    config's SFT-only ``warmup_extra`` records (the transfer formats); at paper scale: fetch the hub model."""
    if a.scale == "paper":
        _fetch_hub_model(a)
        return
    if a.scale == "smoke":
        _write_standin_model(a)
        return
    from creditlab.data.io import read_records
    from creditlab.data.prepare import warmup_records
    from creditlab.engines.local.sft import save_model, warmup
    from creditlab.models.tiny import build_model, n_params
    from creditlab.tracking.mlflow_tracker import Tracker
    from creditlab.tracking.provenance import git_commit

    cfg = compose(a.scale, a.backbone, seed=a.seed)
    _setup(cfg)
    data_dir = paths.fmt(paths.DATA_DIR, results=a.results, scale=a.scale)
    out = paths.fmt(paths.BASE_DIR, results=a.results, scale=a.scale, backbone=a.backbone)
    tok = _load_tokenizer(data_dir)
    model = build_model(cfg["model"]["arch"], len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, a.seed)
    key = f"{a.scale}/{a.backbone}/warmup"
    tracker = Tracker.start(Path(a.results), "base-models", key, key,
                            tags={"scale": a.scale, "backbone": a.backbone, "method": "sft-warmup",
                                  "git_commit": git_commit()},
                            params=cfg, local_dir=out)
    t0 = time.perf_counter()
    history = warmup(model, tok, warmup_records(data_dir), cfg, a.seed, tracker.log_metrics, progress=not a.quiet)
    val = {"val": read_records(data_dir / "val.parquet")[: cfg["warmup"]["eval_n"]]}
    acc = _evaluate(model, tok, val, cfg, a.seed, out / "val_eval", a.quiet)["suites"]["val"]["metrics"]["greedy"]["mean"]
    tracker.log_metrics({"val_greedy_acc": acc}, cfg["warmup"]["steps"])
    save_model(model, tok, out)
    tracker.end()
    done = {"steps_done": len(history), "steps_requested": cfg["warmup"]["steps"], "params": n_params(model),
            "final_loss": history[-1]["sft_loss"], "val_greedy_acc": acc, "seconds": time.perf_counter() - t0,
            "mlflow_run_id": tracker.run_id, "commit": git_commit()}
    _write_json(done, out / "DONE")
    print(json.dumps(done, indent=1))


def _write_standin_model(a: argparse.Namespace) -> None:
    """Scale smoke: the base model of a paper backbone is a random-init stand-in of its architecture class, written
    as a hub snapshot in the base model's directory (creditlab.models.standin; its tokenizer covers the prepared
    data), and DONE records it as `warmup` records a fetched snapshot at paper scale."""
    from creditlab.data.smoke import data_texts
    from creditlab.models.standin import write_standin
    from creditlab.tracking.provenance import git_commit

    cfg = compose(a.scale, a.backbone, seed=a.seed)
    m = cfg["model"]
    out = paths.fmt(paths.BASE_DIR, results=a.results, scale=a.scale, backbone=a.backbone)
    data_dir = paths.fmt(paths.DATA_DIR, results=a.results, scale=a.scale)
    t0 = time.perf_counter()
    write_standin(m["arch"]["family"], data_texts(data_dir), out, seed=a.seed)
    done = {"hf_id": m["hf_id"], "standin": True, "family": m["arch"]["family"], "path": str(out.resolve()),
            "seconds": time.perf_counter() - t0, "commit": git_commit()}
    _write_json(done, out / "DONE")
    print(json.dumps(done, indent=1))


def _fetch_hub_model(a: argparse.Namespace) -> None:
    """Paper scale: the base model of a backbone is its hub checkpoint (no SFT warm-up: every paper starts RL from the
    released model). Download the snapshot once (huggingface_hub; the HF_HOME cache, so a pre-filled cache on an
    offline cluster works with HF_HUB_OFFLINE=1), check its config.json against configs/model/<backbone>.yaml (model
    type and context window), and write DONE with the hub id, the resolved commit and the local path (the verl
    launcher trains from that path)."""
    from huggingface_hub import snapshot_download

    from creditlab.tracking.provenance import git_commit

    cfg = compose(a.scale, a.backbone, seed=a.seed)
    m = cfg["model"]
    if m.get("kind") != "hub":
        raise SystemExit(f"model {a.backbone!r} is not a hub model (kind={m.get('kind')!r}): nothing to fetch")
    out = paths.fmt(paths.BASE_DIR, results=a.results, scale=a.scale, backbone=a.backbone)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    local = Path(snapshot_download(repo_id=m["hf_id"], revision=m.get("revision")))
    hf_config = json.loads((local / "config.json").read_text())
    found = {"family": hf_config.get("model_type"), "max_position_embeddings": hf_config.get("max_position_embeddings")}
    wanted = {"family": m["arch"]["family"], "max_position_embeddings": m["arch"]["max_position_embeddings"]}
    if found != wanted:
        raise SystemExit(f"{m['hf_id']}: config.json says {found}, configs/model/{a.backbone}.yaml says {wanted} "
                         f"(arch.family / arch.max_position_embeddings): fix the model config")
    done = {"hf_id": m["hf_id"], "revision": m.get("revision"), "commit": local.name, "path": str(local),
            "seconds": time.perf_counter() - t0, "creditlab_commit": git_commit()}
    _write_json(done, out / "DONE")
    print(json.dumps(done, indent=1))


def _evaluate(model, tok, suites: dict[str, list[dict]], cfg: dict[str, Any], seed: int, out: Path,
              quiet: bool, generate_fn=None, eos_id: int | list[int] | None = None) -> dict[str, Any]:
    """The one evaluation path (eval settings of ``cfg``): per-sample jsonl + metrics.json under ``out``.

    Each suite is judged by the reward of its verifier kind (:mod:`creditlab.rewards.routing`: the run's
    ``trainer.reward`` for math, ``multiple_choice``, ``code_exec``), one scorer per reward; a code suite's
    per-sample timeout covers its largest test list (code_exec's own limits). Prompts go through the
    tokenizer's chat template when ``eval.chat_template`` (hub models, as verl trains them).
    """
    from creditlab.eval.evaluate import evaluate_model
    from creditlab.rewards.routing import records_kind, reward_of_kind
    from creditlab.rewards.scorer import RewardScorer

    e, t = cfg["eval"], cfg["trainer"]
    rewards = {name: reward_of_kind(records_kind(recs, f"suite {name}"), t["reward"]) for name, recs in suites.items()}
    with ExitStack() as stack:
        scorers = {reward: stack.enter_context(RewardScorer(reward, timeout_s=_reward_timeout(
                       reward, [r for n, recs in suites.items() if rewards[n] == reward for r in recs],
                       t["reward_timeout_s"])))
                   for reward in dict.fromkeys(rewards.values())}  # fmt: skip
        return evaluate_model(model, tok, suites, k=e["k"], ks=list(e["ks"]), max_new_tokens=e["max_new_tokens"],
                              temperature=e["temperature"], top_p=e["top_p"],
                              template=cfg["data"].get("template", "tiny"), seed=seed,
                              scorer={name: scorers[rewards[name]] for name in suites}, out_dir=out,
                              batch_size=e.get("batch_size"), generate_fn=generate_fn, progress=not quiet,
                              chat=bool(e.get("chat_template", False)), chat_kwargs=e.get("chat_template_kwargs"),
                              eos_id=eos_id)  # fmt: skip


def _reward_timeout(reward: str, records: list[dict], timeout_s: float) -> float:
    """Per-sample timeout of a scorer: ``timeout_s``; for ``code_exec``, at least what running the largest test
    list of ``records`` may take under code_exec's own per-test limits (plus a margin), so that the sandbox's
    verdict (timeout / memory) is reached before the scorer's hard kill."""
    if reward != "code_exec" or not records:
        return float(timeout_s)
    from creditlab.rewards.code.cases import parse_tests
    from creditlab.rewards.code.runner import max_run_seconds

    return max(float(timeout_s), max_run_seconds(max(len(parse_tests(r["answer"])[0]) for r in records)) + 5.0)


def cmd_train(a: argparse.Namespace) -> None:
    """Train one run (resuming from its checkpoint if a previous attempt was killed)."""
    from creditlab.data.io import read_records
    from creditlab.engines.local.sft import save_model
    from creditlab.engines.local.trainer import Trainer, write_history
    from creditlab.rewards.scorer import RewardScorer
    from creditlab.tracking.mlflow_tracker import Tracker
    from creditlab.tracking.provenance import git_commit

    plan = build_plan(_pipeline(a), validate=False)
    run = plan.get(a.backbone, a.run, a.seed)
    if not run.trains:
        raise SystemExit(f"run {run.key!r} is the base model: nothing to train")
    cfg = run_config(run)
    if cfg["trainer"].get("engine", "local") == "verl":
        _train_verl(a, run, cfg)
        return
    _setup(cfg)
    fill = dict(results=a.results, scale=run.scale, backbone=run.backbone, run=run.run, seed=run.seed)
    run_dir, ckpt_dir = paths.fmt(paths.RUN_DIR, **fill), paths.fmt(paths.CKPT_DIR, **fill)
    data_dir = paths.fmt(paths.DATA_DIR, **fill)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    tok = _load_tokenizer(data_dir)
    model = _load_model(paths.fmt(paths.BASE_DIR, **fill))
    tracker = Tracker.start(Path(a.results), run.experiment, run.key, run.key, tags=_tags(run, cfg), params=cfg,
                            local_dir=run_dir, parent=_parent(run))
    with tracker:  # ends the MLflow run FAILED if anything below raises
        t0 = time.perf_counter()
        with RewardScorer(cfg["trainer"]["reward"], timeout_s=cfg["trainer"]["reward_timeout_s"]) as scorer:
            trainer = Trainer(cfg, model, tok, read_records(data_dir / "train.parquet"), scorer, ckpt_dir,
                              log_fn=tracker.log_metrics, progress=not a.quiet)
            resumed_at = trainer.step if trainer.maybe_resume() else None
            if resumed_at is not None:
                print(f"resuming {run.key} from step {resumed_at}", file=sys.stderr)
            history = trainer.fit()
            reward_stats = scorer.stats
        write_history(history, run_dir / "metrics.jsonl")
        _write_json(trainer.token_credit_table(lambda i: tok.decode([i])), run_dir / "token_credit.json")
        save_model(trainer.export_model(), tok, run_dir / "final")  # LoRA: merged, the format of every run
        trainer.save_adapter(run_dir / "adapter")  # LoRA: the adapter alone too (peft), beside final/
        tracker.log_metrics({f"reward_worker/{k}": float(v) for k, v in reward_stats.items()}, trainer.step)
        tracker.log_artifact(run_dir / "config.yaml")
        tracker.log_artifact(run_dir / "token_credit.json")
    steps = cfg["trainer"]["steps"]
    if trainer.step != steps:
        raise SystemExit(f"{run.key}: trained {trainer.step} steps of {steps}; not marking DONE")
    done = {"run_key": run.key, "steps_done": trainer.step, "steps_requested": steps, "resumed_at": resumed_at,
            "seconds_this_attempt": time.perf_counter() - t0, "mlflow_run_id": tracker.run_id, "commit": git_commit()}
    _write_json(done, run_dir / "DONE")


def _train_verl(a: argparse.Namespace, run, cfg: dict[str, Any], launcher=None) -> None:
    """Paper scale: train one run with verl (engines/verl/launch.py), resuming from its checkpoints.

    Writes the resolved config.yaml, creates or resumes the run's MLflow run (Tracker.start, as at tiny scale) and
    hands its id to verl (MLFLOW_RUN_ID), runs ``python -m creditlab.engines.verl.main <overrides>`` with its output
    streamed to this job's log, then checks that verl checkpointed the last step, converts that checkpoint to a
    Hugging Face model in final/ (verl's model merger) and writes DONE. A killed job leaves its checkpoints in
    results/paper/checkpoints/... (outside the declared outputs): the re-run resumes (trainer.resume_mode=auto).
    The verl plug-in writes metrics.jsonl (and token_credit.json) into the run directory (the directory of
    +creditlab.config_path). `launcher` (tests) replaces creditlab.engines.verl.launch.
    """
    import shlex

    from creditlab.engines.verl import launch as default_launcher
    from creditlab.tracking.mlflow_tracker import Tracker, tracking_uri
    from creditlab.tracking.provenance import git_commit

    launch = launcher or default_launcher
    fill = dict(results=a.results, scale=run.scale, backbone=run.backbone, run=run.run, seed=run.seed)
    run_dir, ckpt_dir = paths.fmt(paths.RUN_DIR, **fill), paths.fmt(paths.CKPT_DIR, **fill)
    base_done = paths.fmt(paths.BASE_DONE, **fill)
    model_path = json.loads(base_done.read_text()).get("path") if base_done.is_file() else None
    run_paths = launch.RunPaths.of(cfg, a.results, model_path=model_path)
    launch.preflight(cfg)  # fail before creating anything on a run verl would reject on the GPUs
    run_dir.mkdir(parents=True, exist_ok=True)
    run_paths.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    steps = int(cfg["trainer"]["steps"])
    resumed_at = launch.steps_done(ckpt_dir) or None
    tracker = Tracker.start(Path(a.results), run.experiment, run.key, run.key, tags=_tags(run, cfg), params=cfg,
                            local_dir=run_dir, parent=_parent(run))
    with tracker:  # ends the MLflow run FAILED if anything below raises (SystemExit included)
        t0 = time.perf_counter()
        argv, env = launch.verl_command(cfg, run_paths, mlflow_run_id=tracker.run_id,
                                        tracking_uri=tracking_uri(Path(a.results)), num_cpus=_slurm_cpus())
        print(f"{run.key}: {'resuming from step ' + str(resumed_at) if resumed_at else 'starting'}; "
              f"{' '.join(f'{k}={v}' for k, v in env.items())} {shlex.join(argv)}", file=sys.stderr, flush=True)
        rc = launch.run_streaming(argv, env, cwd=run_dir)  # verl's Hydra writes its outputs/ under the run dir
        if rc != 0:
            raise SystemExit(f"{run.key}: verl exited with status {rc}; its checkpoints stay in {ckpt_dir} and a "
                             f"re-run resumes from the last one")
        done_steps = launch.steps_done(ckpt_dir)
        if done_steps != steps:
            raise SystemExit(f"{run.key}: verl checkpointed step {done_steps} of {steps}; not marking DONE")
        rc = launch.run_streaming(launch.merge_command(ckpt_dir, done_steps, run_dir / "final"), launch.merge_env(cfg))
        if rc != 0:
            raise SystemExit(f"{run.key}: verl's model merger exited with status {rc} (step {done_steps} -> final/)")
        launch.finish_merged(run_dir / "final", cfg)
        if not paths.fmt(paths.RUN_METRICS, **fill).is_file():
            raise SystemExit(f"{run.key}: no metrics.jsonl in {run_dir}: the verl plug-in writes one line per step")
        tracker.log_artifact(run_paths.config_path)
        if (run_dir / "token_credit.json").is_file():  # written by the plug-in for runs with credit or filters
            tracker.log_artifact(run_dir / "token_credit.json")
    done = {"run_key": run.key, "engine": "verl", "steps_done": done_steps, "steps_requested": steps,
            "resumed_at": resumed_at, "seconds_this_attempt": time.perf_counter() - t0,
            "model_path": run_paths.model_path, "checkpoint": str(ckpt_dir / f"global_step_{done_steps}"),
            "mlflow_run_id": tracker.run_id, "commit": git_commit()}
    _write_json(done, run_dir / "DONE")


def _slurm_cpus() -> int | None:
    """CPUs Ray may use in this job: SLURM's allocation (verl: 'use a fixed number when using SLURM'), else None."""
    for var in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def cmd_evaluate(a: argparse.Namespace) -> None:
    """Evaluate a trained run (or the base model) on the suites of its tables: greedy, avg@k, pass@k, per-sample jsonl.

    With ``--decode NAME`` the suites are decoded by that test-time decoding (paper config ``decodes``)
    mixing the backbone's base model and the run's RL model; results land under ``decode/NAME/``. The suites are
    those of the tables (of every paper) that read this evaluation (:meth:`Plan.eval_suites`).
    """
    plan = build_plan(_pipeline(a), validate=False)
    run = plan.get(a.backbone, a.run, a.seed)
    decode = plan.decode(a.decode) if a.decode else None
    if decode is not None and not run.trains:
        raise SystemExit(f"--decode needs a trained RL run, not {run.key!r}")
    suites = plan.eval_suites(run, a.decode)  # the suites of the tables that read this evaluation (every paper)
    evaluate_run(run, run_config(run), Path(a.results), decode=decode, suites=suites, quiet=a.quiet)


def _sources(run, cfg: dict[str, Any], results: str | Path):
    """The run's models, tokenizer, records and prompt rendering at its scale (creditlab.models.sources); a missing
    base model (the `warmup` job has not run) stops the job with that message."""
    from creditlab.models.sources import run_sources

    try:
        return run_sources(run, cfg, results)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None


def evaluate_run(run, cfg: dict[str, Any], results: Path, *, decode=None, suites: list[str] | None = None,
                 quiet: bool = False) -> dict[str, Any]:  # fmt: skip
    """Evaluate one planned run (resolved config ``cfg``) under ``results``: what ``creditlab evaluate`` does.

    suites: suite names (results/<scale>/data/suites/<name>.parquet), None = every suite there. Tiny models:
    the local sampler or vLLM (``eval.backend``), prompts as trained. Hub models (paper scale): vLLM only, the
    backbone's tokenizer and its chat template (``eval.chat_template``, as verl's rollout renders prompts), stop
    tokens = the tokenizer's EOS and the checkpoint's generation_config.json ``eos_token_id``, engines sized by
    :func:`creditlab.engines.vllm.client.hub_engine_settings`. Writes metrics.json + one jsonl per suite and
    logs the metrics to the run's MLflow run (a trained run's own; the base model gets one). Returns metrics.
    """
    from creditlab.data.io import read_records
    from creditlab.tracking.mlflow_tracker import Tracker
    from creditlab.tracking.provenance import git_commit

    _setup(cfg)
    hub = cfg["model"].get("kind") == "hub"
    backend = cfg["eval"].get("backend", "local")
    if backend not in ("local", "vllm"):
        raise SystemExit(f"{run.key}: eval.backend must be 'local' or 'vllm', got {backend!r}")
    if hub and backend != "vllm":
        raise SystemExit(f"{run.key}: {cfg['model']['hf_id']} is a hub model, evaluated with vLLM: set "
                         f"eval.backend=vllm (the local sampler is for the tiny models)")
    fill = dict(results=results, scale=run.scale, backbone=run.backbone, run=run.run, seed=run.seed,
                decode=decode.name if decode else None)
    data_dir = paths.fmt(paths.DATA_DIR, **fill)
    out = paths.fmt(paths.EVAL_DIR if decode is None else paths.DECODE_EVAL_DIR, **fill)
    run_dir = paths.fmt(paths.RUN_DIR, **fill)
    src = _sources(run, cfg, results)
    base_model = src.base
    files = (sorted((data_dir / "suites").glob("*.parquet")) if suites is None
             else [data_dir / "suites" / f"{name}.parquet" for name in suites])  # fmt: skip
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        raise SystemExit(f"{run.key}: no suite file(s) {missing or str(data_dir / 'suites')}: run the `prepare` job")
    suite_records = {f.stem: read_records(f) for f in files}
    if run.trains:
        config_path = run_dir / "config.yaml"
        tracker = Tracker.attach(results, run.experiment, run.key, local_dir=out)
    else:
        config_path = out / "config.yaml"
        out.mkdir(parents=True, exist_ok=True)
        config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        tracker = Tracker.start(results, run.experiment, run.key, run.key, tags=_tags(run, cfg), params=cfg,
                                local_dir=out, parent=_parent(run))
    settings = decode.settings(run.scale) if decode else None
    with tracker, ExitStack() as stack:  # tracker: ends the MLflow run it opened FAILED if anything below raises
        tok = src.load_tokenizer()  # tiny: the data's tokenizer; hub: model.tokenizer or the snapshot's own
        eos_id = src.stop_ids(tok) if hub else None  # hub: EOS + generation_config stops (verl's rollout)
        generate_fn, prefix = None, "eval" if decode is None else f"decode/{decode.name}/eval"
        if backend == "vllm":  # vLLM in its own environment (.venv-vllm), one worker process for the evaluation
            from creditlab.engines.vllm.client import eval_generate_fn, hub_engine_settings

            model = None
            eval_cfg = hub_engine_settings(cfg) if hub else cfg["eval"]
            generate_fn = stack.enter_context(eval_generate_fn(
                eval_cfg, base_dir=base_model, run_dir=run_dir if run.trains else None, decode=settings))  # fmt: skip
        elif decode is None:
            model = _load_model(run_dir / "final" if run.trains else base_model)
        else:
            from creditlab.decoding.extrapolation import make_selective_generate_fn

            model, rl_model = _load_model(base_model), _load_model(run_dir / "final")
            generate_fn = make_selective_generate_fn(model, rl_model, **settings)
        result = _evaluate(model, tok, suite_records, cfg, run.seed, out, quiet, generate_fn, eos_id)
        result["provenance"] = {"run_key": run.key, "mlflow_run_id": tracker.run_id, "commit": git_commit(),
                                "config": str(config_path), "scale": run.scale, "model": str(
                                    run_dir / "final" if run.trains else base_model),
                                "decode": settings | {"name": decode.name} if decode else None}  # fmt: skip
        _write_json(result, out / "metrics.json")
        flat = {f"{prefix}/{s}/{m}": v["mean"] for s, r in result["suites"].items() for m, v in r["metrics"].items()}
        flat |= {f"{prefix}/{s}/replacement_rate": r["replacement_rate"] for s, r in result["suites"].items()
                 if r.get("replacement_rate") is not None}
        tracker.log_metrics(flat, cfg["trainer"]["steps"] if run.trains else 0)
        tracker.log_artifact(out / "metrics.json")
    return result


def cmd_table(a: argparse.Namespace) -> None:
    """Build one paper table (CSV + Markdown, ours ± CI beside the paper) and its training curves, over the
    paper's seeds (its own `seeds` at the scale, else the pipeline's)."""
    from creditlab.tables.build import build_table, write_table
    from creditlab.tables.figures import plot_training_curves
    from creditlab.tables.html import write_markdown_html

    plan = build_plan(_pipeline(a), validate=False)
    spec = plan.papers[a.paper]
    table = spec.table(a.table)
    k = _eval_k(plan, a.paper)
    fill = dict(results=a.results, scale=plan.scale, paper=a.paper, table=a.table)
    seeds = plan.paper_seeds(a.paper)
    df = build_table(spec, a.table, plan.scale, seeds, Path(a.results) / plan.scale / "evals", k,
                     runs_dir=Path(a.results) / plan.scale / "runs")
    csv, md = paths.fmt(paths.TABLE_CSV, **fill), paths.fmt(paths.TABLE_MD, **fill)
    write_table(df, table, spec, csv, md)
    html = write_markdown_html(md, paths.fmt(paths.TABLE_HTML, **fill), title=f"{a.paper}: table {a.table}")
    series = {}
    for row in table.rows:
        if row.run == BASE_RUN:
            continue
        backbone = spec.backbone_for(row.backbone, plan.scale)
        for seed in seeds:
            series[f"{row.label} · {backbone} · s{seed}"] = paths.fmt(
                paths.RUN_METRICS, results=a.results, scale=plan.scale, backbone=backbone, run=row.run, seed=seed)
    curves = paths.fmt(paths.CURVES_PNG, **fill)
    plot_training_curves(series, curves, keys=table.curves, title=f"{spec.title}: {a.table}")
    from creditlab.tracking.table_runs import publish_table

    link = publish_table(Path(a.results), spec.experiment, plan.scale, a.paper, a.table, df, md.read_text(),
                         [csv, md, html, curves], local_dir=csv.parent / f".{a.table}_mlflow")
    if link:
        print(f"MLflow: table run {a.paper}/{a.table}, compare its rows at <mlflow ui>/{link}", file=sys.stderr)


def cmd_ledger(a: argparse.Namespace) -> None:
    """Build a paper's reproduction ledger (Markdown + CSV): every cell of its tables built at the scale with
    provenance, and its claims tested by a paired bootstrap (creditlab.tables.ledger). Reads the table CSVs."""
    import pandas as pd

    from creditlab.tables.html import write_markdown_html
    from creditlab.tables.ledger import build_ledger, verdict_summary, write_ledger
    from creditlab.tracking.mlflow_tracker import tracking_uri

    plan = build_plan(_pipeline(a), validate=False)
    spec = plan.papers[a.paper]
    k = _eval_k(plan, a.paper)
    tables = {name: pd.read_csv(paths.fmt(paths.TABLE_CSV, results=a.results, scale=plan.scale, paper=a.paper,
                                          table=name), keep_default_na=False, na_values=[""])
              for name in spec.built_at(plan.scale)}
    root = Path(a.results) / plan.scale
    df, results = build_ledger(spec, plan.scale, plan.paper_seeds(a.paper), tables, root / "evals", k,
                               root / "runs", tracking_uri(Path(a.results)))
    fill = dict(results=a.results, scale=plan.scale, paper=a.paper)
    md = paths.fmt(paths.LEDGER_MD, **fill)
    write_ledger(spec, plan.scale, df, results, paths.fmt(paths.LEDGER_CSV, **fill), md)
    write_markdown_html(md, paths.fmt(paths.LEDGER_HTML, **fill), title=f"{a.paper}: reproduction ledger")
    print(verdict_summary(results))


def cmd_diagnose(a: argparse.Namespace) -> None:
    """Token diagnostics of a trained run vs its base model: Δlog p / entropy / KL histograms (PNG + JSON).

    One response per prompt of the suites (``--suites``; default: tiny/micro easy,medium,hard, paper/smoke the suites
    the run's evaluation covers) is sampled from each model (eval.max_new_tokens, temperature, top_p) and scored by
    both. The models, tokenizer, prompt rendering and stop tokens are the run's at its scale
    (creditlab.models.sources): at paper / smoke the base model's hub snapshot and the run's merged final/, the chat
    template as verl renders prompts, on the GPU(s) when there are any (one model per GPU when there are two)."""
    import torch

    from creditlab.data.io import read_records
    from creditlab.decoding.diagnostics import collect_token_stats, summarize
    from creditlab.tables.figures import plot_token_histograms

    plan = build_plan(_pipeline(a), validate=False)
    run = plan.get(a.backbone, a.run, a.seed)
    if not run.trains:
        raise SystemExit(f"diagnose compares a trained run with its base model, not {run.key!r}")
    cfg = run_config(run)
    _setup(cfg)
    fill = dict(results=a.results, scale=run.scale, backbone=run.backbone, run=run.run, seed=run.seed)
    src = _sources(run, cfg, a.results)
    suites = (a.suites.split(",") if a.suites else plan.eval_suites(run) if src.hub else ["easy", "medium", "hard"])
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
    values = {s: collect_token_stats(base, rl, prompts, source=s, max_new_tokens=e["max_new_tokens"],
                                     eos_id=src.stop_ids(tok), pad_id=tok.pad_token_id if tok.pad_token_id is not None
                                     else tok.eos_token_id, temperature=e["temperature"], top_p=e["top_p"],
                                     seed=run.seed)
              for s in ("base", "rl")}
    png = paths.fmt(paths.DIAG_PNG, **fill)
    plot_token_histograms(values, png, f"{run.key}: base vs RL outputs (suites {','.join(suites)})")
    _write_json({"run_key": run.key, "suites": suites, "stats": summarize(values),
                 "base": str(src.base), "rl": str(src.trained), "n_prompts": len(prompts),
                 "prompts": "chat template" if src.hub else "plain"}, png.with_suffix(".json"))


def cmd_analyze(a: argparse.Namespace) -> None:
    """Run one analysis of a paper config (token flipping, coupling masking, token values): JSON + Markdown + PNG."""
    from creditlab.analysis.runner import run_analysis

    plan = build_plan(_pipeline(a), validate=False)
    if a.paper not in plan.papers or a.name not in plan.papers[a.paper].analyses:
        choices = sorted(plan.papers[a.paper].analyses) if a.paper in plan.papers else sorted(plan.papers)
        raise SystemExit(f"unknown paper/analysis {a.paper}/{a.name}; choices: {choices}")
    _setup()
    try:
        run_analysis(a.results, plan, a.paper, a.name, progress=not a.quiet)
    except FileNotFoundError as err:  # a missing base snapshot, training set or checkpoint: say which
        raise SystemExit(f"analyze {a.paper}/{a.name}: {err}") from None


def cmd_figure(a: argparse.Namespace) -> None:
    """Draw one paper figure (configs/papers/<paper>.yaml `figures`): replacement_curves and bars from a
    table's CSV; token_credit from a run's token_credit.json (PNG + Markdown/CSV table)."""
    plan = build_plan(_pipeline(a), validate=False)
    spec = plan.papers[a.paper]
    if a.name not in spec.figures:
        raise SystemExit(f"paper {a.paper!r} has no figure {a.name!r}; choices: {sorted(spec.figures)}")
    fig = spec.figures[a.name]
    if fig.kind == "token_histograms":
        raise SystemExit(f"figure {a.name!r} ({fig.kind}) is drawn by `diagnose`, not `figure`")
    if a.name not in spec.figures_at(plan.scale):
        raise SystemExit(f"figure {a.name!r} cannot be drawn at scale {plan.scale!r}: its table or column has "
                         f"no benchmark with a stand-in there; drawable: {spec.figures_at(plan.scale)}")
    fill = dict(results=a.results, scale=plan.scale, paper=a.paper, table=fig.table, figure=a.name)
    png = paths.fmt(paths.FIGURE_PNG, **fill)
    if fig.kind == "token_credit":
        _token_credit_figure(a, plan, spec, fig, png, fill)
        return
    import pandas as pd

    from creditlab.tables.figures import plot_bars, plot_replacement_curves, plot_scatter

    df = pd.read_csv(paths.fmt(paths.TABLE_CSV, **fill))
    plot = {"replacement_curves": plot_replacement_curves, "bars": plot_bars, "scatter": plot_scatter}[fig.kind]
    plot(df, spec, fig, png)


def _token_credit_figure(a: argparse.Namespace, plan, spec, fig, png: Path, fill: dict[str, Any]) -> None:
    """DelTA's token clouds: top / bottom tokens by mean credit weight of the run of the paper's first seed."""
    from creditlab.tables.figures import plot_token_credit
    from creditlab.tables.token_credit import load_token_credit, overall_mean, rank_tokens, write_token_credit

    run = plan.get(spec.backbone_for(fig.backbone, plan.scale), fig.run, plan.paper_seeds(a.paper)[0])
    rfill = dict(results=a.results, scale=run.scale, backbone=run.backbone, run=run.run, seed=run.seed)
    data = load_token_credit(paths.fmt(paths.RUN_TOKEN_CREDIT, **rfill))
    done_path = paths.fmt(paths.RUN_DONE, **rfill)
    done = json.loads(done_path.read_text()) if done_path.is_file() else {}
    ranking = rank_tokens(data, fig.top, fig.min_count)
    reference = overall_mean(data)
    title = (f"{spec.title.split(':')[0]}: {fig.name} — {run.key}"
             + ("" if run.scale == "paper" else f" (scale {run.scale}: not the paper's tokens)"))
    plot_token_credit(ranking, png, title, weight=data["weight"], reference=reference)
    meta = {"paper_title": spec.title, "figure": fig.name, "caption": fig.caption, "scale": run.scale,
            "paper_backbone": fig.backbone, "backbone": run.backbone, "run": run.run, "seed": run.seed,
            "top": fig.top, "min_count": fig.min_count, "run_key": run.key,
            "mlflow_run_id": done.get("mlflow_run_id") or "", "commit": done.get("commit") or ""}
    write_token_credit(ranking, data, meta, paths.fmt(paths.FIGURE_MD, **fill), paths.fmt(paths.FIGURE_CSV, **fill))


def cmd_plan(a: argparse.Namespace) -> None:
    """Print the planned runs (validating every run config)."""
    plan = build_plan(_pipeline(a))
    for key, run in sorted(plan.runs.items()):
        print(f"{key:40s} method={run.method:10s} overrides={list(run.overrides)} tables={run.tables}")


def cmd_show_config(a: argparse.Namespace) -> None:
    """Print the resolved config of one run."""
    plan = build_plan(_pipeline(a), validate=False)
    print(yaml.safe_dump(run_config(plan.get(a.backbone, a.run, a.seed)), sort_keys=False))


def cmd_mlflow_ui(a: argparse.Namespace) -> None:
    """Start the MLflow UI on 127.0.0.1 against the project's store (one worker: a local SQLite store)."""
    from creditlab.tracking.mlflow_tracker import tracking_uri

    uri = tracking_uri(Path(a.results))
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
            "--port", str(a.port), "--workers", str(a.workers)]
    # the server's background job runner (GenAI judges, ~9 huey processes) is not used by this project
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    base = f"http://127.0.0.1:{a.port}"
    print(f"MLflow UI: {base}  (store: {uri})\n"
          f"  experiments = papers; each table is a parent run `table <paper>/<table>` with its rows nested under it,\n"
          f"  and its tag `compare_url` opens the compare view of exactly its rows: {base}/<compare_url>\n"
          f"  training runs view: {base}/#/experiments/<id>/runs?workflowType=machine_learning", file=sys.stderr)
    os.execv(sys.executable, argv)


# ----------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="creditlab", description=__doc__)
    p.add_argument("--results", default="results", help="output root (default: results)")
    p.add_argument("--pipeline-config", default=str(CONFIG_DIR / "pipeline.yaml"))
    p.add_argument("--scale", default=None, help="tiny | micro | paper (default: the pipeline config's)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default: the pipeline config's); a paper "
                                                  "with its own `seeds` at the scale keeps them")
    p.add_argument("--papers", default=None,
                   help="comma-separated papers, or `all` (every configs/papers/*.yaml; what Snakemake jobs use, so "
                        "that choosing papers re-runs nothing); default: the pipeline config's")
    p.add_argument("--tables", default=None,
                   help="comma-separated paper/table names: only those are built (a ledger tests their claims only); "
                        "default: the pipeline config's `tables` (null: all)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    sub = p.add_subparsers(dest="verb", required=True)

    def run_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--backbone", required=True)
        sp.add_argument("--run", required=True)
        sp.add_argument("--seed", type=int, default=0)

    sp = sub.add_parser("prepare", help=cmd_prepare.__doc__)
    sp.add_argument("--backbone", default="tiny-s", help="any backbone (data do not depend on it)")
    sp.add_argument("--download-only", action="store_true",
                    help="scale paper: only fetch the hub datasets into $CREDITLAB_HUB_RAW (default "
                         "results/paper/raw), e.g. on a login node with network; prepare nothing")
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
    sp.add_argument("--suites", default=None, help="comma-separated suites whose prompts are used (default: "
                                                   "easy,medium,hard; paper/smoke: the suites of the run's evaluation)")
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
    return p


def main(argv: list[str] | None = None) -> None:
    a = build_parser().parse_args(argv)
    if a.scale is None and a.verb in ("prepare", "warmup"):
        a.scale = _pipeline(a)["scale"]
    a.fn(a)


if __name__ == "__main__":
    main()
