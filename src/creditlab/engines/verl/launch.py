"""Launch one planned run at paper scale with verl: its resolved config -> a verl command line with Hydra overrides.

`verl_command(run_cfg, paths, ...)` is a pure function: from the run's resolved creditlab config (``run_config``:
``configs/run.yaml`` + scale ``paper`` + the paper's ``scale_overrides`` + the run's overrides) it builds

    argv = [python, -m, creditlab.engines.verl.main, <verl overrides>...]
    env  = {VERL_USE_EXTERNAL_MODULES: creditlab.engines.verl.plugin, MLFLOW_RUN_ID: ..., MLFLOW_TRACKING_URI: ...}

``creditlab.engines.verl.main`` is verl's ``main_ppo`` entry with the plug-in's trainer/worker classes (written beside
this file); its Hydra config is verl's own ``ppo_trainer``, so every override below is a key of verl 0.9.1's config
(checked for every planned run against verl's config and dataclasses: tests/test_paper_scale.py). The method
(advantage, loss, credit weights, token filters, batching, RB) reaches verl through the plug-in's own overrides,
``creditlab.engines.verl.plugin.plugin_overrides(run_cfg)`` (the plug-in's key wins where both set one), and through
``+creditlab.config_path``: the plug-in reads the run's resolved config from there.

What a run gets (creditlab key -> verl key; the `verl:` block of configs/model/<backbone>.yaml sizes the job):

- data: the prepared verl parquet files of ``data.name`` (creditlab.paths.VERL_TRAIN / VERL_VAL) -> data.train_files /
  val_files; trainer.max_prompt_tokens / max_new_tokens -> data.max_prompt_length / max_response_length;
  prompts_per_step -> data.train_batch_size;
- model: the snapshot the ``warmup`` job fetched (or the hub id) -> actor_rollout_ref.model.path, model.override_config
  -> +actor_rollout_ref.model.override_config.* and the rollout's vLLM hf_overrides (e.g. Qwen2.5-Math-7B's window);
  trainer.lora -> model.lora_rank / lora_alpha / target_modules;
- PPO: group_size -> rollout.n; prompts_per_step / mini_batches -> actor.ppo_mini_batch_size; ppo_epochs, lr, warm-up,
  schedule, betas, weight decay, grad clip -> actor.optim.* / actor.grad_clip; the method's clip range, dual clip and
  loss aggregation -> actor.clip_ratio_* / loss_agg_mode (mirrors: verl's own loss uses them; the plug-in's loss reads
  the method from the config file); advantage -> algorithm.adv_estimator (grpo; dr_grpo = grpo without std);
- DAPO: dynamic_sampling -> algorithm.filter_groups (metric ``acc``, the DAPO reward manager's accuracy) and the
  plug-in's sampler, which enforces max_gen_batches (verl's replay buffer ignores it; a step that exhausts it raises,
  as verl's DAPO recipe does); overlong ->
  the ``dapo`` reward manager's overlong_buffer_cfg; reward: engines/verl/reward.py ``compute_score``;
- sampling: temperature / top_p -> rollout.*; eval.temperature / top_p -> rollout.val_kwargs.* (verl's validation on
  the held-out training slice; the tables' evaluations are separate vLLM jobs);
- bookkeeping: trainer.default_local_dir = the run's deterministic checkpoint dir (creditlab.paths.CKPT_DIR, outside the
  declared outputs), trainer.resume_mode=auto (a re-run resumes from the last checkpoint), save_freq = checkpoint_every
  (verl always saves the last step), trainer.logger=[console,mlflow] attached to the run's MLflow run (MLFLOW_RUN_ID:
  ``cmd_train`` creates or resumes it with ``Tracker.start`` first), project = the paper's experiment, name = run key.

`preflight(run_cfg)` checks what verl would only find on the GPUs (divisibility of batches over ranks, context
lengths); `steps_done(ckpt_dir)` and `merge_command(...)` finish a run (the last checkpoint -> an HF model in
``final/``). Nothing here needs a GPU; running the command does.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditlab import paths
from creditlab.config_compose import hydra_value
from creditlab.engines.verl import cpu
from creditlab.engines.verl.sizing import token_len_per_gpu

VERL_MAIN = "creditlab.engines.verl.main"
RAY_SLURM = "creditlab.engines.verl.ray_slurm"  # multi-node: Ray over the SLURM allocation first
"""Module run with ``python -m``: verl's PPO entry point with creditlab's plug-in (engines/verl/main.py)."""
PLUGIN_MODULE = "creditlab.engines.verl.plugin"
"""Loaded by verl at import time (VERL_USE_EXTERNAL_MODULES): registers creditlab's losses, advantages, samplers."""
REWARD_FILE = Path(__file__).resolve().with_name("reward.py")
"""verl's custom reward function file (``compute_score``: math-verify / multiple choice / code by data source)."""
REWARD_FN = "compute_score"
LOGGERS = ("console", "mlflow")
STRATEGY = "fsdp2"
"""verl's training strategy of actor and reference at every verl scale (design note 25)."""

ADVANTAGES = {"grpo": ("grpo", True), "dr_grpo": ("grpo", False), "rloo": ("rloo", True)}
"""creditlab advantage -> (verl algorithm.adv_estimator, algorithm.norm_adv_by_std_in_grpo)."""
LR_SCHEDULES = {"constant": "constant", "cosine": "cosine"}
"""creditlab trainer.lr_schedule -> verl actor.optim.lr_scheduler_type."""
VERL_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


class LaunchError(ValueError):
    """A run that cannot be launched as configured (message names the keys and values)."""


class PluginUnavailable(RuntimeError):
    """creditlab.engines.verl.plugin (or its plugin_overrides) cannot be imported."""


@dataclass(frozen=True)
class RunPaths:
    """Where a verl run reads and writes (absolute: Ray workers on other nodes see the same shared filesystem)."""

    run_dir: Path
    """results/paper/runs/<backbone>/<run>/s<seed>: config.yaml, metrics.jsonl, final/, DONE."""
    ckpt_dir: Path
    """results/paper/checkpoints/<backbone>/<run>/s<seed>: verl's default_local_dir (global_step_N/, resumable)."""
    config_path: Path
    """The run's resolved creditlab config (written by cmd_train before the launch): +creditlab.config_path."""
    train_files: tuple[Path, ...]
    val_files: tuple[Path, ...]
    model_path: str
    """The fetched snapshot directory of the backbone, or its hub id."""

    @classmethod
    def of(cls, run_cfg: Mapping[str, Any], results: str | Path, model_path: str | None = None) -> "RunPaths":
        """The deterministic paths of the run of `run_cfg` under `results` (creditlab.paths patterns)."""
        key = run_cfg["run"]["key"]
        scale, backbone, run, seed = _split_key(key)
        fill = dict(
            results=os.path.abspath(results),
            scale=scale,
            backbone=backbone,
            run=run,
            seed=seed,
            dataset=run_cfg["data"]["name"],
        )
        run_dir = paths.fmt(paths.RUN_DIR, **fill)
        return cls(
            run_dir=run_dir,
            ckpt_dir=paths.fmt(paths.CKPT_DIR, **fill),
            config_path=run_dir / "config.yaml",
            train_files=(paths.fmt(paths.VERL_TRAIN, **fill),),
            val_files=(paths.fmt(paths.VERL_VAL, **fill),),
            model_path=model_path or run_cfg["model"]["hf_id"],
        )


def _split_key(key: str) -> tuple[str, str, str, int]:
    m = re.fullmatch(r"([^/]+)/([^/]+)/([^/]+)/s(\d+)", key)
    if not m:
        raise LaunchError(f"not a run key (scale/backbone/run/s<seed>): {key!r}")
    return m.group(1), m.group(2), m.group(3), int(m.group(4))


# ----------------------------------------------------------------------------------------------- overrides


# hydra_value (a Python value in Hydra's override grammar) is creditlab.config_compose's, shared with the plan


def override_key(override: str) -> str:
    """The config key an override sets (``+a.b=1``, ``++a.b=1``, ``~a.b`` -> ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(ours: Iterable[str], plugin: Iterable[str]) -> list[str]:
    """Our overrides then the plug-in's; where both set a key, the plug-in's alone is kept (it owns the method)."""
    plugin = list(plugin)
    taken = {override_key(o) for o in plugin}
    return [o for o in ours if override_key(o) not in taken] + plugin


def _ppo_mini_batch(t: Mapping[str, Any]) -> int:
    prompts, mini = int(t["prompts_per_step"]), int(t["mini_batches"])
    if mini < 1 or prompts % mini:
        raise LaunchError(
            f"trainer.prompts_per_step={prompts} is not divisible by trainer.mini_batches={mini}: "
            "verl's ppo_mini_batch_size is a whole number of prompts"
        )
    return prompts // mini


def context_window(model: Mapping[str, Any]) -> int:
    """The context the run may use: the HF config's max_position_embeddings, or its override."""
    override = (model.get("override_config") or {}).get("max_position_embeddings")
    return int(override or model["arch"]["max_position_embeddings"])


def preflight(run_cfg: Mapping[str, Any]) -> None:
    """Check what verl / vLLM would only reject on the GPUs (LaunchError naming the keys) before the job creates
    anything (MLflow run, checkpoint dir).

    Batches: prompts_per_step is a multiple of mini_batches; a mini-batch's rollouts split evenly over the
    data-parallel ranks (GPUs / Ulysses sp), and the rollout batch over them; the GPUs split into vLLM tensor-parallel
    groups. Lengths: prompt + response (training) and prompt + eval.max_new_tokens fit the model's context window;
    the overlong buffer is shorter than the response budget.
    """
    t, m, e = run_cfg["trainer"], run_cfg["model"], run_cfg["eval"]
    v = m["verl"]
    gpus = int(v["nnodes"]) * int(v["n_gpus_per_node"])
    sp, tp = int(v["ulysses_sp"]), int(v["rollout_tp"])
    where = f"{run_cfg['run']['key']}: "
    if gpus % sp or gpus % tp:
        raise LaunchError(
            f"{where}{gpus} GPUs (model.verl.nnodes x n_gpus_per_node) are not a multiple of "
            f"model.verl.ulysses_sp={sp} and model.verl.rollout_tp={tp}"
        )
    dp = gpus // sp
    g = int(t["group_size"])
    mini = _ppo_mini_batch(t)
    if (mini * g) % dp or (int(t["prompts_per_step"]) * g) % dp:
        raise LaunchError(
            f"{where}a mini-batch of {mini} prompts x {g} rollouts (and the rollout batch of "
            f"{t['prompts_per_step']} prompts) does not split over {dp} data-parallel ranks "
            f"({gpus} GPUs / sp {sp})"
        )
    window, prompt, response = context_window(m), int(t["max_prompt_tokens"]), int(t["max_new_tokens"])
    if prompt + response > window:
        raise LaunchError(
            f"{where}trainer.max_prompt_tokens + max_new_tokens = {prompt + response} > the context "
            f"window {window} of {m['name']} (model.override_config.max_position_embeddings extends it)"
        )
    evaluation = prompt + int(e["max_new_tokens"])
    if evaluation > window:
        raise LaunchError(
            f"{where}trainer.max_prompt_tokens + eval.max_new_tokens = {evaluation} > the context window "
            f"{window} of {m['name']}"
        )
    ol = t["overlong"]
    if ol["enable"] and not 0 < int(ol["buffer"]) <= response:
        raise LaunchError(f"{where}trainer.overlong.buffer={ol['buffer']} must be in (0, max_new_tokens={response}]")
    if run_cfg["method"].get("advantage", "grpo") not in ADVANTAGES:
        raise LaunchError(
            f"{where}method.advantage={run_cfg['method'].get('advantage')!r} has no verl estimator; "
            f"choices: {sorted(ADVANTAGES)}"
        )
    if t["lr_schedule"] not in LR_SCHEDULES:
        raise LaunchError(f"{where}trainer.lr_schedule={t['lr_schedule']!r}; choices: {sorted(LR_SCHEDULES)}")


def verl_overrides(
    run_cfg: Mapping[str, Any], run_paths: RunPaths, *, mlflow: bool = True, num_cpus: int | None = None
) -> list[str]:
    """creditlab's own verl overrides of a run (without the plug-in's); see the module docstring for the mapping."""
    preflight(run_cfg)
    t, m, e, meth = run_cfg["trainer"], run_cfg["model"], run_cfg["eval"], run_cfg["method"]
    v = m["verl"]
    seed = int(run_cfg["seed"])
    prompt, response = int(t["max_prompt_tokens"]), int(t["max_new_tokens"])
    token_len = token_len_per_gpu(run_cfg)
    adv, std_norm = ADVANTAGES[meth.get("advantage", "grpo")]
    o: dict[str, Any] = {
        # data
        "data.train_files": [str(p) for p in run_paths.train_files],
        "data.val_files": [str(p) for p in run_paths.val_files],
        "data.prompt_key": "prompt",
        "data.max_prompt_length": prompt,
        "data.max_response_length": response,
        "data.train_batch_size": int(t["prompts_per_step"]),
        "data.filter_overlong_prompts": True,
        "data.truncation": "error",
        "data.shuffle": True,
        "data.seed": seed,
        # the chat template's arguments: the same for the rollout prompts as for the evaluation's (eval.*)
        "data.apply_chat_template_kwargs": dict(run_cfg["eval"].get("chat_template_kwargs") or {}),
        # model
        "actor_rollout_ref.model.path": run_paths.model_path,
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        # actor (PPO update)
        "actor_rollout_ref.actor.ppo_mini_batch_size": _ppo_mini_batch(t),
        "actor_rollout_ref.actor.ppo_epochs": int(t["ppo_epochs"]),
        "actor_rollout_ref.actor.use_dynamic_bsz": True,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": token_len,
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": int(v["ulysses_sp"]),
        "actor_rollout_ref.actor.optim.lr": float(t["lr"]),
        "actor_rollout_ref.actor.optim.lr_warmup_steps": int(t["lr_warmup_steps"]),
        "actor_rollout_ref.actor.optim.lr_scheduler_type": LR_SCHEDULES[t["lr_schedule"]],
        "actor_rollout_ref.actor.optim.weight_decay": float(t["weight_decay"]),
        "actor_rollout_ref.actor.optim.betas": [float(b) for b in t["betas"]],
        "actor_rollout_ref.actor.optim.clip_grad": float(t["grad_clip"]),
        "actor_rollout_ref.actor.grad_clip": float(t["grad_clip"]),
        "actor_rollout_ref.actor.use_kl_loss": False,
        "actor_rollout_ref.actor.entropy_coeff": 0,
        "actor_rollout_ref.actor.data_loader_seed": seed,
        # FSDP2 for actor and reference (design note 25): torch deprecates FSDP1, verl's engine workers implement
        # FSDP2 (its defaults still say fsdp), and it is the strategy smoke runs exercise on a CPU
        "actor_rollout_ref.actor.strategy": STRATEGY,
        "actor_rollout_ref.ref.strategy": STRATEGY,
        "actor_rollout_ref.actor.fsdp_config.param_offload": bool(v["param_offload"]),
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": bool(v["optimizer_offload"]),
        "actor_rollout_ref.ref.fsdp_config.param_offload": bool(v["param_offload"]),
        # rollout (vLLM)
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.n": int(t["group_size"]),
        "actor_rollout_ref.rollout.temperature": float(t["temperature"]),
        "actor_rollout_ref.rollout.top_p": float(t["top_p"]),
        "actor_rollout_ref.rollout.top_k": -1,
        "actor_rollout_ref.rollout.seed": seed,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": int(v["rollout_tp"]),
        "actor_rollout_ref.rollout.gpu_memory_utilization": float(v["gpu_memory_utilization"]),
        "actor_rollout_ref.rollout.max_num_batched_tokens": max(8192, prompt + response),
        "actor_rollout_ref.rollout.max_model_len": prompt + response,
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": token_len,
        "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
        "actor_rollout_ref.rollout.val_kwargs.n": 1,
        "actor_rollout_ref.rollout.val_kwargs.temperature": float(e["temperature"]),
        "actor_rollout_ref.rollout.val_kwargs.top_p": float(e["top_p"]),
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": token_len,
        # algorithm (critic-free, no KL)
        "algorithm.adv_estimator": adv,
        "algorithm.norm_adv_by_std_in_grpo": std_norm,
        "algorithm.use_kl_in_reward": False,
        "algorithm.filter_groups.enable": bool(t["dynamic_sampling"]),
        "algorithm.filter_groups.metric": str((run_cfg.get("verl") or {}).get("filter_metric", "acc")),
        # verl 0.9.1's V1 replay buffer ignores this key (trainer_base._resolve_filter_groups_metric says so); the
        # plug-in's sampler (samplers.CappedDapoSampler, same value in its sampler_kwargs) enforces it
        "algorithm.filter_groups.max_num_gen_batches": int(t["max_gen_batches"]),
        # reward: creditlab's verifiers through verl's DAPO reward manager (overlong shaping, `acc` for filtering)
        "reward.reward_manager.name": "dapo",
        "reward.custom_reward_function.path": str(REWARD_FILE),
        "reward.custom_reward_function.name": REWARD_FN,
        "+reward.reward_kwargs.max_resp_len": response,
        "+reward.reward_kwargs.overlong_buffer_cfg.enable": bool(t["overlong"]["enable"]),
        "+reward.reward_kwargs.overlong_buffer_cfg.len": int(t["overlong"]["buffer"]),
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": float(t["overlong"]["penalty"]),
        "+reward.reward_kwargs.overlong_buffer_cfg.log": False,
        # trainer: steps, resources, checkpoints, tracking
        "trainer.total_training_steps": int(t["steps"]),
        "trainer.total_epochs": int(t["epochs"]),
        "trainer.nnodes": int(v["nnodes"]),
        "trainer.n_gpus_per_node": int(v["n_gpus_per_node"]),
        "trainer.save_freq": int(t["checkpoint_every"]),
        "trainer.max_actor_ckpt_to_keep": int(t["keep_checkpoints"]),
        "trainer.test_freq": int(t["val_every"]),
        "trainer.val_before_train": False,
        "trainer.default_local_dir": str(run_paths.ckpt_dir),
        "trainer.resume_mode": "auto",
        "trainer.logger": list(LOGGERS if mlflow else ("console",)),
        "trainer.project_name": run_cfg["run"]["experiment"],
        "trainer.experiment_name": run_cfg["run"]["key"],
        "+creditlab.config_path": str(run_paths.config_path),
    }
    if m.get("tokenizer"):
        o["actor_rollout_ref.model.tokenizer_path"] = m["tokenizer"]
    for key, value in (m.get("override_config") or {}).items():  # the trainer's HF config, and vLLM's (hf_overrides:
        o[f"+actor_rollout_ref.model.override_config.{key}"] = value  # vLLM reads config.json itself)
        o[f"+actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides.{key}"] = value
    lk = meth.get("loss_kwargs") or {}
    if "eps_low" in lk and "eps_high" in lk:  # mirrors of the method's clip range (verl's own loss modes use them)
        o["actor_rollout_ref.actor.clip_ratio_low"] = float(lk["eps_low"])
        o["actor_rollout_ref.actor.clip_ratio_high"] = float(lk["eps_high"])
    if lk.get("dual_clip_c") is not None:
        o["actor_rollout_ref.actor.clip_ratio_c"] = float(lk["dual_clip_c"])
    if lk.get("agg") in VERL_AGG_MODES:
        o["actor_rollout_ref.actor.loss_agg_mode"] = lk["agg"]
    lora = t["lora"]
    if lora["enable"]:
        o["actor_rollout_ref.model.lora_rank"] = int(lora["rank"])
        o["actor_rollout_ref.model.lora_alpha"] = int(lora["alpha"])
        o["actor_rollout_ref.model.target_modules"] = list(lora["target_modules"])
        o["actor_rollout_ref.rollout.load_format"] = "safetensors"  # verl's LoRA: weights synced to vLLM as safetensors
    if int(v["nnodes"]) == 1:
        # one node: verl's ray.init starts a Ray instance of its own. Without an address Ray would join RAY_ADDRESS or
        # the last `ray start` recorded in /tmp/ray/ray_current_cluster (another job's, or a stale one on a shared
        # node: ray/_private/services.py:413-465) and then refuse num_cpus; "local" always starts a fresh one.
        # (Several nodes: the driver joins ray_slurm's cluster, and Ray refuses num_cpus from a driver that joins
        # one; each node's `ray start` gets them instead, see verl_command.)
        o["+ray_kwargs.ray_init.address"] = "local"
        if num_cpus is not None:
            o["ray_kwargs.ray_init.num_cpus"] = int(num_cpus)
    if cpu.device_of(run_cfg) == "cpu":  # scale smoke: verl's own loop on a CPU (engines/verl/cpu.py)
        o.update(cpu.cpu_overrides(run_cfg))
    return [f"{k}={hydra_value(val)}" for k, val in o.items()]


def load_plugin_overrides() -> Callable[[Mapping[str, Any]], list[str]]:
    """`creditlab.engines.verl.plugin.plugin_overrides`, imported on use (PluginUnavailable if it is not there)."""
    try:
        from importlib import import_module

        module = import_module(PLUGIN_MODULE)
        return module.plugin_overrides
    except (ImportError, AttributeError) as err:
        raise PluginUnavailable(
            f"the verl plug-in is not available ({err}): {PLUGIN_MODULE}.plugin_overrides(run_cfg) supplies the "
            f"method's verl overrides (loss, credit, batching); without it a paper-scale run cannot be launched"
        ) from err


def verl_command(
    run_cfg: Mapping[str, Any],
    run_paths: RunPaths,
    *,
    mlflow_run_id: str | None = None,
    tracking_uri: str | None = None,
    python: str = sys.executable,
    num_cpus: int | None = None,
    plugin_overrides: Callable[[Mapping[str, Any]], Iterable[str]] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) that train `run_cfg` with verl: ``python -m creditlab.engines.verl.main <overrides>``, wrapped in
    ``python -m creditlab.engines.verl.ray_slurm --gpus-per-node G [--num-cpus C] --`` when the run spans several
    nodes. `num_cpus` (the job's CPUs per node: jobs.train.slurm_cpus) goes to verl's ``ray_kwargs.ray_init.num_cpus``
    on one node, where verl's ``ray.init`` starts Ray; on several, to each node's ``ray start`` (ray_slurm), since
    the driver's ``ray.init`` then joins ray_slurm's cluster (RAY_ADDRESS) and Ray refuses num_cpus/num_gpus there.

    `env` holds only the variables to set on top of the caller's environment: VERL_USE_EXTERNAL_MODULES (the
    plug-in), CREDITLAB_METHOD_MODULES where the method config names method modules (`method.modules`), and with
    `mlflow_run_id` MLFLOW_RUN_ID / MLFLOW_TRACKING_URI (verl's MLflow logger then logs into that
    run instead of creating one; without a run id, e.g. tracking offline, verl logs to the console only).
    `plugin_overrides` defaults to the plug-in's own (imported here, PluginUnavailable if absent); tests inject one.
    """
    fn = plugin_overrides if plugin_overrides is not None else load_plugin_overrides()
    ours = verl_overrides(run_cfg, run_paths, mlflow=mlflow_run_id is not None, num_cpus=num_cpus)
    argv = [python, "-m", VERL_MAIN, *merge_overrides(ours, fn(run_cfg))]
    v = run_cfg["model"]["verl"]
    if int(v["nnodes"]) > 1:  # a Ray cluster over the SLURM allocation's nodes first (the driver runs on the head)
        cpus = ["--num-cpus", str(int(num_cpus))] if num_cpus is not None else []
        argv = [python, "-m", RAY_SLURM, "--gpus-per-node", str(int(v["n_gpus_per_node"])), *cpus, "--", *argv]
    env = {"VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE}
    if (run_cfg.get("method") or {}).get("modules"):  # method plug-ins named in the config, for every verl process
        from creditlab.algos.plugins import ENV_MODULES, env_modules

        env[ENV_MODULES] = ",".join([*env_modules(), *run_cfg["method"]["modules"]])
    if cpu.device_of(run_cfg) == "cpu":
        env.update(cpu.cpu_env())
    if mlflow_run_id is not None:
        env["MLFLOW_RUN_ID"] = mlflow_run_id
        if tracking_uri:
            env["MLFLOW_TRACKING_URI"] = tracking_uri
    return argv, env


# ----------------------------------------------------------------------------------------------- after the run


LATEST = "latest_checkpointed_iteration.txt"
"""verl's record of the last saved global step in trainer.default_local_dir."""


def steps_done(ckpt_dir: str | Path) -> int:
    """The last global step verl checkpointed in `ckpt_dir` (0 when it saved none)."""
    path = Path(ckpt_dir) / LATEST
    return int(path.read_text().strip()) if path.is_file() else 0


def prune_checkpoints(ckpt_dir: str | Path, keep_step: int) -> list[int]:
    """Delete every ``global_step_N/`` in `ckpt_dir` but `keep_step`'s (the one final/ was merged from); returns the
    steps deleted. Called once final/ and DONE exist (trainer.prune_checkpoints): a 32B run's optimizer-state
    checkpoints are ~0.5 TB each, and verl keeps trainer.keep_checkpoints of them."""
    ckpt_dir, gone = Path(ckpt_dir), []
    if steps_done(ckpt_dir) != keep_step or not (ckpt_dir / f"global_step_{keep_step}").is_dir():
        raise ValueError(f"{ckpt_dir}: step {keep_step} is not its last checkpoint; nothing pruned")
    for d in sorted(ckpt_dir.glob("global_step_*")):
        step = d.name.removeprefix("global_step_")
        if step.isdigit() and int(step) != keep_step and d.is_dir():
            shutil.rmtree(d)
            gone.append(int(step))
    return sorted(gone)


def merge_command(ckpt_dir: str | Path, step: int, target_dir: str | Path, python: str = sys.executable) -> list[str]:
    """verl's model merger: the FSDP actor shards of `step` -> a Hugging Face model in `target_dir` (run_dir/final)."""
    actor = Path(ckpt_dir) / f"global_step_{int(step)}" / "actor"
    return [
        python,
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(actor),
        "--target_dir",
        str(target_dir),
    ]


def merge_env(run_cfg: Mapping[str, Any]) -> dict[str, str]:
    """Environment of the model merger: on a CPU run, verl imports the plug-in (VERL_USE_EXTERNAL_MODULES), which
    installs the CPU platform and registers the attention implementation named in the checkpoint's HF config."""
    if cpu.device_of(dict(run_cfg)) != "cpu":
        return {}
    return {"VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE, **cpu.cpu_env()}


def finish_merged(target_dir: str | Path, run_cfg: Mapping[str, Any]) -> None:
    """After the merger: make ``target_dir`` (run_dir/final) the trained model, as every other run's final/ is.

    * A CPU run's final/config.json names creditlab's CPU attention (the training override): dropped, so that every
      loader (vLLM, transformers) uses its own default, as for the hub snapshot.
    * A LoRA run (trainer.lora.enable): verl's merger writes the *base* weights to final/ and the adapter to
      final/lora_adapter/ (:func:`place_verl_adapter`): the adapter, checked and its lora_alpha repaired, goes to
      run_dir/adapter (where the evaluator and the local engine's runs have it) and is merged into final/'s weights.
      A LoRA run whose merger wrote no adapter raises :class:`LaunchError` (final/ would be the base model)."""
    target = Path(target_dir)
    lora = dict(run_cfg["trainer"].get("lora") or {})
    if lora.get("enable"):
        place_verl_adapter(target, lora)
    if cpu.device_of(dict(run_cfg)) != "cpu":
        return
    import json

    path = target / "config.json"
    conf = json.loads(path.read_text())
    if conf.get("attn_implementation") == cpu.ATTN_IMPL or conf.get("_attn_implementation") == cpu.ATTN_IMPL:
        conf.pop("attn_implementation", None)
        conf.pop("_attn_implementation", None)
        path.write_text(json.dumps(conf, indent=2))


VERL_ADAPTER_DIR = "lora_adapter"
"""The adapter's directory inside the merger's target dir (verl 0.9.1 model_merger/base_model_merger.py:394)."""
ADAPTER_PREFIX = "base_model.model."
"""The peft prefix of the adapter's tensor names (``<prefix><module>.lora_A.weight``; the merger strips it from the
base weights' names, base_model_merger.py:400-406)."""


def place_verl_adapter(final_dir: str | Path, lora: Mapping[str, Any]) -> Path:
    """A LoRA run's adapter from verl's merger (``final/lora_adapter``) -> ``run_dir/adapter``, merged into final/.

    verl 0.9.1's merger (model_merger/base_model_merger.py ``save_lora_adapter``, 311-408) writes the adapter with
    the rank and lora_alpha of the checkpoint's ``lora_train_meta.json`` (FSDPCheckpointManager writes it beside the
    shards, utils/checkpoint/fsdp_checkpoint_manager.py:122-129, 417) and ``lora_alpha`` 0 without one (345, 367-372),
    a no-op adapter. Here: rank must be ``lora.rank``; lora_alpha 0 becomes ``lora.alpha`` (the value verl trained
    with: ``verl_overrides`` maps it to actor_rollout_ref.model.lora_alpha), any other value must equal it; then the
    adapter moves to ``run_dir/adapter`` and W += (alpha / r) B A goes into final/'s safetensors
    (:func:`merge_adapter_into`). Moved before merging: a second call finds no final/lora_adapter and raises instead
    of merging twice (the train job re-runs the merger first). Returns ``run_dir/adapter``.
    """
    import json
    import shutil

    final = Path(final_dir)
    src, dest = final / VERL_ADAPTER_DIR, final.parent / "adapter"
    if not (src / "adapter_config.json").is_file():
        raise LaunchError(
            f"LoRA run (trainer.lora.enable): verl's model merger wrote no adapter {src}/adapter_config.json, so "
            f"{final} holds the base weights only; re-run the merger on the run's last checkpoint (the train job does)"
        )
    conf = json.loads((src / "adapter_config.json").read_text())
    rank, alpha = int(lora["rank"]), lora["alpha"]
    if int(conf.get("r") or 0) != rank:
        raise LaunchError(f"{src}: adapter rank r={conf.get('r')} but the run trained trainer.lora.rank={rank}")
    if not conf.get("lora_alpha"):  # no lora_train_meta.json in the checkpoint: verl's merger wrote 0
        conf["lora_alpha"] = int(alpha) if float(alpha).is_integer() else float(alpha)
    elif float(conf["lora_alpha"]) != float(alpha):
        raise LaunchError(
            f"{src}: adapter lora_alpha={conf['lora_alpha']} but the run trained trainer.lora.alpha={alpha}"
        )
    conf["task_type"] = conf.get("task_type") or "CAUSAL_LM"
    (src / "adapter_config.json").write_text(json.dumps(conf, indent=4))
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(src, dest)
    merge_adapter_into(final, dest)
    return dest


def merge_adapter_into(model_dir: str | Path, adapter_dir: str | Path) -> int:
    """Merge a peft LoRA adapter into a saved model's safetensors, in place: W += (lora_alpha / r) B A per adapted
    Linear (peft's merge), computed in float32 and stored in W's dtype; one shard in memory at a time. Returns the
    number of weights changed; LaunchError when the adapter has tensors other than Linear LoRA A / B, uses DoRA or
    rsLoRA (verl trains neither), or names a weight the model does not have."""
    import json

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    model_dir, adapter_dir = Path(model_dir), Path(adapter_dir)
    conf = json.loads((adapter_dir / "adapter_config.json").read_text())
    if conf.get("use_dora") or conf.get("use_rslora"):
        raise LaunchError(f"{adapter_dir}: DoRA / rsLoRA adapters are not merged here")
    scale = float(conf["lora_alpha"]) / int(conf["r"])
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name in tensors:
        module, dot, kind = name.removeprefix(ADAPTER_PREFIX).rpartition(".lora_")
        if not dot or kind not in ("A.weight", "B.weight"):
            raise LaunchError(f"{adapter_dir}: adapter tensor {name!r} is not a Linear layer's lora_A / lora_B")
        if kind == "A.weight":
            pairs[f"{module}.weight"] = (tensors[name], tensors[name.replace(".lora_A.", ".lora_B.")])
    index = model_dir / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    )
    done: set[str] = set()
    for file in files:
        path = model_dir / file
        with safe_open(str(path), framework="pt") as f:
            hits, metadata = [k for k in f.keys() if k in pairs], f.metadata()
        if not hits:
            continue
        weights = load_file(str(path))
        for key in hits:
            a, b = pairs[key]
            w = weights[key]
            weights[key] = (w.float() + scale * (b.float() @ a.float())).to(w.dtype)
        tmp = path.with_name(path.name + ".tmp")
        save_file(weights, str(tmp), metadata=metadata)
        os.replace(tmp, path)
        done |= set(hits)
    missing = sorted(set(pairs) - done)
    if missing:
        raise LaunchError(
            f"{model_dir}: no weight {missing[:3]} for the adapter's LoRA layers ({len(missing)} missing)"
        )
    return len(done)


def run_streaming(argv: list[str], env: Mapping[str, str], cwd: str | Path | None = None) -> int:
    """Run `argv` with `env` added to this process's environment, its output going straight to ours (the job's log,
    line by line); SIGTERM / SIGINT (SLURM preemption, scancel) are passed on to it. Returns its exit status."""
    proc = subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd)

    def forward(signum: int, _frame: Any) -> None:
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
