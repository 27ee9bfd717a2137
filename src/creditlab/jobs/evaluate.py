"""The `evaluate` job: a run (or a base model) on its tables' suites, plainly or with a test-time decoding.

Writes metrics.json and one jsonl per suite, logged to MLflow. :func:`evaluate_suites` is the one evaluation path
(the warm-up's validation uses it too).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from creditlab import paths
from creditlab.data.io import read_records
from creditlab.jobs.common import judging_workers, load_model, setup, sources, start_run_tracker, write_json
from creditlab.plan import run_config
from creditlab.rewards.code.cases import parse_tests
from creditlab.rewards.code.policy import SandboxRefused, code_sandbox
from creditlab.rewards.code.runner import max_run_seconds
from creditlab.rewards.routing import records_kind, reward_of_kind
from creditlab.rewards.scorer import RewardScorer
from creditlab.tracking.mlflow_tracker import Tracker
from creditlab.tracking.provenance import git_commit


def evaluate(
    results: str | Path,
    plan,
    backbone: str,
    run_name: str,
    seed: int,
    *,
    decode: str | None = None,
    quiet: bool = False,
) -> None:
    """Evaluate run (backbone, run_name, seed) of the plan on the suites of the tables (of every paper) that read
    this evaluation (:meth:`Plan.eval_suites`); with ``decode`` (a paper config's ``decodes`` name) by that test-time
    decoding, mixing the backbone's base model and the run's RL model, under ``decode/NAME/``."""
    run = plan.get(backbone, run_name, seed)
    decoding = plan.decode(decode) if decode else None
    if decoding is not None and not run.trains:
        raise SystemExit(f"--decode needs a trained RL run, not {run.key!r}")
    suites = plan.eval_suites(run, decode)  # the suites of the tables that read this evaluation (every paper)
    evaluate_run(run, run_config(run), Path(results), decode=decoding, suites=suites, quiet=quiet)


def evaluate_run(
    run, cfg: dict[str, Any], results: Path, *, decode=None, suites: list[str] | None = None, quiet: bool = False
) -> dict[str, Any]:
    """Evaluate one planned run (resolved config ``cfg``) under ``results``: what ``creditlab evaluate`` does.

    suites: suite names (results/<scale>/data/suites/<name>.parquet), None = every suite there. Tiny models:
    the local sampler or vLLM (``eval.backend``), prompts as trained. Hub models (paper scale): vLLM only, the
    backbone's tokenizer and its chat template (``eval.chat_template``, as verl's rollout renders prompts), stop
    tokens = the tokenizer's EOS and the checkpoint's generation_config.json ``eos_token_id``, engines sized by
    :func:`creditlab.engines.vllm.client.hub_engine_settings`. A LoRA run through vLLM: the base model + the run's
    adapter (:func:`creditlab.engines.vllm.client.run_adapter`, checked against ``trainer.lora``; none: refused).
    Writes metrics.json + one jsonl per suite and logs the metrics to the run's MLflow run (a trained run's own; the
    base model gets one). Returns metrics.
    """
    setup(cfg)
    hub = cfg["model"].get("kind") == "hub"
    backend = cfg["eval"].get("backend", "local")
    if backend not in ("local", "vllm"):
        raise SystemExit(f"{run.key}: eval.backend must be 'local' or 'vllm', got {backend!r}")
    if hub and backend != "vllm":
        raise SystemExit(
            f"{run.key}: {cfg['model']['hf_id']} is a hub model, evaluated with vLLM: set "
            f"eval.backend=vllm (the local sampler is for the tiny models)"
        )
    fill = dict(
        results=results,
        scale=run.scale,
        backbone=run.backbone,
        run=run.run,
        seed=run.seed,
        decode=decode.name if decode else None,
    )
    data_dir = paths.fmt(paths.DATA_DIR, **fill)
    out = paths.fmt(paths.EVAL_DIR if decode is None else paths.DECODE_EVAL_DIR, **fill)
    run_dir = paths.fmt(paths.RUN_DIR, **fill)
    src = sources(run, cfg, results)
    base_model = src.base
    files = (
        sorted((data_dir / "suites").glob("*.parquet"))
        if suites is None
        else [data_dir / "suites" / f"{name}.parquet" for name in suites]
    )
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
        tracker = start_run_tracker(results, run, cfg, out)
    settings = decode.settings(run.scale) if decode else None
    with tracker, ExitStack() as stack:  # tracker: ends the MLflow run it opened FAILED if anything below raises
        tok = src.load_tokenizer()  # tiny: the data's tokenizer; hub: model.tokenizer or the snapshot's own
        eos_id = src.stop_ids(tok) if hub else None  # hub: EOS + generation_config stops (verl's rollout)
        generate_fn, prefix = None, "eval" if decode is None else f"decode/{decode.name}/eval"
        adapter = None
        if backend == "vllm":  # one vLLM worker process for the evaluation (client.vllm_python: this environment's
            #   vLLM when importable, else .venv-vllm); a LoRA run is served as base model + its adapter
            from creditlab.engines.vllm import client  # after setup()

            model = None
            eval_cfg = client.hub_engine_settings(cfg) if hub else cfg["eval"]
            lora = dict(cfg["trainer"].get("lora") or {}) if run.trains else None
            adapter = client.run_adapter(run_dir if run.trains else None, lora)  # raises for a LoRA run without one
            generate_fn = stack.enter_context(
                client.eval_generate_fn(
                    eval_cfg,
                    base_dir=base_model,
                    run_dir=run_dir if run.trains else None,
                    decode=settings,
                    lora=lora,
                )
            )
        elif decode is None:
            model = load_model(run_dir / "final" if run.trains else base_model)
        else:
            from creditlab.decoding.extrapolation import make_selective_generate_fn  # after setup()

            model, rl_model = load_model(base_model), load_model(run_dir / "final")
            generate_fn = make_selective_generate_fn(model, rl_model, **settings)
        result = evaluate_suites(model, tok, suite_records, cfg, run.seed, out, quiet, generate_fn, eos_id)
        result["provenance"] = {
            "run_key": run.key,
            "mlflow_run_id": tracker.run_id,
            "commit": git_commit(),
            "config": str(config_path),
            "scale": run.scale,
            "model": str(base_model if adapter is not None or not run.trains else run_dir / "final"),
            "adapter": str(adapter) if adapter is not None else None,
            "decode": settings | {"name": decode.name} if decode else None,
        }
        write_json(result, out / "metrics.json")
        tiers = sorted({r["sandbox"]["tier"] for r in result["suites"].values() if r.get("sandbox")})
        if tiers:  # the sandbox tier the code suites were scored under, also on the MLflow run
            tracker.set_tags({f"{prefix}/code_sandbox": ",".join(tiers)})
        flat = {f"{prefix}/{s}/{m}": v["mean"] for s, r in result["suites"].items() for m, v in r["metrics"].items()}
        flat |= {
            f"{prefix}/{s}/replacement_rate": r["replacement_rate"]
            for s, r in result["suites"].items()
            if r.get("replacement_rate") is not None
        }
        tracker.log_metrics(flat, cfg["trainer"]["steps"] if run.trains else 0)
        tracker.log_artifact(out / "metrics.json")
    return result


def evaluate_suites(
    model,
    tok,
    suites: dict[str, list[dict]],
    cfg: dict[str, Any],
    seed: int,
    out: Path,
    quiet: bool,
    generate_fn=None,
    eos_id: int | list[int] | None = None,
) -> dict[str, Any]:
    """The one evaluation path (eval settings of ``cfg``): per-sample jsonl + metrics.json under ``out``.

    Each suite is judged by the reward of its verifier kind (:mod:`creditlab.rewards.routing`: the run's
    ``trainer.reward`` for math, ``multiple_choice``, ``code_exec``), one scorer per reward; a code suite's
    per-sample timeout covers its largest test list (code_exec's own limits). Prompts go through the
    tokenizer's chat template when ``eval.chat_template`` (hub models, as verl trains them).
    """
    from creditlab.eval.evaluate import evaluate_model  # transformers: after setup()
    from creditlab.lm.sampler import SamplingParams

    e, t = cfg["eval"], cfg["trainer"]
    rewards = {name: reward_of_kind(records_kind(recs, f"suite {name}"), t["reward"]) for name, recs in suites.items()}
    sandbox = code_sandbox_record(rewards, cfg.get("scale"))
    with ExitStack() as stack:
        scorers = {
            reward: stack.enter_context(
                RewardScorer(
                    reward,
                    n_workers=judging_workers(),  # the job's granted cores (8 per evaluate job in the SLURM profile)
                    timeout_s=reward_timeout(
                        reward,
                        [r for n, recs in suites.items() if rewards[n] == reward for r in recs],
                        t["reward_timeout_s"],
                    ),
                )
            )
            for reward in dict.fromkeys(rewards.values())
        }
        params = SamplingParams(
            max_new_tokens=e["max_new_tokens"], temperature=e["temperature"], top_p=e["top_p"], eos_id=eos_id, seed=seed
        )
        result = evaluate_model(
            model,
            tok,
            suites,
            params,
            k=e["k"],
            ks=list(e["ks"]),
            template=cfg["data"].get("template", "tiny"),
            scorer={name: scorers[rewards[name]] for name in suites},
            out_dir=out,
            batch_size=e.get("batch_size"),
            generate_fn=generate_fn,
            progress=not quiet,
            chat=bool(e.get("chat_template", False)),
            chat_kwargs=e.get("chat_template_kwargs"),
        )
    for name, reward in rewards.items():  # the sandbox tier goes with every code result (tables, ledger read it)
        if reward == "code_exec" and name in result.get("suites", {}):
            result["suites"][name]["sandbox"] = sandbox
    return result


def code_sandbox_record(rewards: dict[str, str], scale: str | None) -> dict[str, Any] | None:
    """The sandbox record of an evaluation that scores code (suite -> reward ``rewards``; None when no suite is
    code): the tier probed here, where the job runs, before any answer is scored. SystemExit with the reason and
    what to install when it cannot score code (:func:`creditlab.rewards.code.policy.code_sandbox`: tier ``none``
    at any scale; at paper scale a tier weaker than bwrap that ``code_sandbox_accept`` does not accept)."""
    if "code_exec" not in rewards.values():
        return None
    try:
        return code_sandbox(scale)
    except (SandboxRefused, ValueError) as e:
        code = sorted(n for n, r in rewards.items() if r == "code_exec")
        raise SystemExit(f"cannot score the code suite(s) {code}: {e}") from None


def reward_timeout(reward: str, records: list[dict], timeout_s: float) -> float:
    """Per-sample timeout of a scorer: ``timeout_s``; for ``code_exec``, at least what running the largest test
    list of ``records`` may take under code_exec's own per-test limits (plus a margin), so that the sandbox's
    verdict (timeout / memory) is reached before the scorer's hard kill."""
    if reward != "code_exec" or not records:
        return float(timeout_s)
    return max(float(timeout_s), max_run_seconds(max(len(parse_tests(r["answer"])[0]) for r in records)) + 5.0)
