"""One planned run -> its resolved config, composed with Hydra and checked before any job starts.

Composition (`compose`, `run_config`, `composed_configs`), combinations of methods, the checks a worker would make at
its first step (schema ranges, verl's and the model's constraints, registered methods), and the resource model's
refusals (`check_resources`, `check_evals`): each refusal names the run key, the config key and the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from creditlab.config_compose import CONFIG_DIR, hydra_value, run_args, search_path_overrides
from creditlab.plan.core import BASE_RUN, Plan, PlanError, Run, RunRefused
from creditlab.scales import smoke_job

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


def _cluster(pipeline: dict[str, Any]):
    """The cluster constants of the resource model: configs/pipeline.yaml ``cluster:`` with the pipeline's own."""
    from creditlab.resources import load_cluster

    try:
        return load_cluster(pipeline.get("cluster"))
    except ValueError as e:
        raise PlanError(f"pipeline config: {e}") from None


def check_evals(plan: Plan, configs: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """The estimates of the evaluation jobs every buildable table reads (`creditlab.resources.eval_time.plan_evals`
    on the plan's cluster: its suites, `eval_suites`, and a decoding's view at this scale), and run key -> why for
    the evaluations (job keys) that cannot finish within the site's job limit (the numbers and what to change)."""
    from creditlab.resources.eval_time import plan_evals

    jobs: dict[tuple[str, str | None], tuple] = {}
    for paper, table in plan.buildable_tables:
        for run, decode in plan.table_evals(paper, table):
            if run.key not in plan.refused_runs and (run.key, decode) not in jobs:
                top_k = plan.decode(decode).top_k_support(plan.scale) if decode else None
                jobs[(run.key, decode)] = (run.key, decode, plan.eval_suites(run, decode), top_k)
    return plan_evals(list(jobs.values()), configs, plan.cluster)


def check_resources(cfg: dict[str, Any], key: str, cluster) -> tuple[Any, RunRefused | None]:
    """The resources of a verl run (`creditlab.resources.estimate` on `cluster`), and the `RunRefused` (numbers and
    what to change, `RunResources.why`) when its peak does not fit its GPUs or its nodes, else None."""
    from creditlab.resources import estimate

    try:
        res = estimate(cfg, cluster)
    except KeyError as e:  # a backbone without a published shape (creditlab.resources.shapes.HUB_SHAPES)
        raise PlanError(f"{key}: cannot size the run: {e.args[0]}") from None
    return res, None if res.fits else RunRefused(key, f"does not fit the cluster (pipeline `cluster:`): {res.why}")


def validate_runs(runs: Iterable[Run], config_dir: Path = CONFIG_DIR, cluster=None) -> dict[str, dict[str, Any]]:
    """Compose every run's config and check its registered names (PlanError naming the key / the choices).

    The same composition as `run_config` (`creditlab.config_compose.CachedComposer`: Hydra's defaults tree merged
    once per distinct group choice, each run's value overrides applied by Hydra's own routine), so that the whole
    DAG (70-110 runs) is checked in seconds before any job starts. Returns, per run key, ``suites``: its evaluation
    suites from its data config (``data.suites``: the tiny world's suites, or at paper scale the catalogue
    configs/suites/paper.yaml; None where a data config has none), ``eval_k``: its samples per question, and
    ``refused``: why the plan refuses to train it (a `RunRefused`: a backbone verl cannot train right, or with a
    `cluster` (`creditlab.resources.Cluster`) a verl run that does not fit it), else None, with a `cluster`
    ``resources``: its `RunResources`, and ``config``: its composed config. A refusal does not stop the validation
    (`build_plan` leaves out what reads the run); every other check raises.
    """
    from creditlab.config_compose import CachedComposer

    facts: dict[str, dict[str, Any]] = {}
    with CachedComposer(config_dir, "run") as composer:
        for run in runs:
            cfg = _compose_with(
                composer, run_args(run.scale, run.backbone, _method_config(run), run.overrides, run.seed, config_dir)
            )
            check_ranges(cfg, run.key)
            refused = res = None
            if run.method != BASE_RUN:
                check_registered(cfg, run.key)
                try:
                    check_verl_run(cfg, run.key)
                    if cluster is not None and (cfg.get("trainer") or {}).get("engine") == "verl":
                        res, refusal = check_resources(cfg, run.key, cluster)
                        if refusal:
                            raise refusal
                except RunRefused as e:
                    refused = e.reason
            data_suites = (cfg.get("data") or {}).get("suites")
            facts[run.key] = {
                "suites": list(data_suites) if data_suites is not None else None,
                "eval_k": int((cfg.get("eval") or {}).get("k", 1)),
                "refused": refused,
                "resources": res,
                "config": cfg,
            }
    return facts


RUN_SCHEMA = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "run.schema.yaml"
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
            cfg = hydra_compose(config_name="run", overrides=args + search_path_overrides())
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
    batching, reward; the modules its ``method.modules`` names imported first: `creditlab.algos.plugins`), and its
    methods must compose (`creditlab.algos.compat.check_method`)."""
    from creditlab.algos import registry
    from creditlab.algos.plugins import MethodPluginError, load_modules
    from creditlab.rewards import registry as rewards

    m, t = cfg["method"], cfg["trainer"]
    try:  # method modules named in the config (entry points are imported with creditlab.algos)
        load_modules(m.get("modules") or [], f"{where}: method.modules")
    except MethodPluginError as e:
        raise PlanError(str(e)) from None
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
