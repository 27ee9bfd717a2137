"""What one verl run costs, from its resolved config: peak GPU memory per rank, host memory per node, hours, disk.

``estimate(run_cfg, cluster) -> RunResources``. A CPU cannot measure these, so they come from a stated model of how
verl 0.9.1 lays a run out (the launcher's settings: engines/verl/launch.py, engines/verl/sizing.py, the plug-in's
overrides) and the constants below, each with its source. The plan refuses a run whose peak does not fit its GPUs
or its nodes' memory (``creditlab.plan``), and the lead's SLURM wall time reads ``hours``.

GPU memory, per rank (W = GPUs of the run, P parameters, B = the micro-batch's tokens on one GPU: verl's
``ppo_max_token_len_per_gpu`` / ``log_prob_max_token_len_per_gpu``; under Ulysses a micro-batch of B x sp tokens is
split over sp ranks, verl workers/engine/utils.py:104-111), the largest of its phases:

* ``rollout``: vLLM's ``gpu_memory_utilization`` of the GPU (weights + KV cache), plus the actor's FSDP shards verl
  leaves on the GPU (parameters unless ``param_offload``, optimizer state unless ``optimizer_offload``: verl
  engine_workers.py:810-815 offloads only those). vLLM must also hold one ``max_model_len`` sequence's KV cache
  beside its weights (a ``kv_cache`` check).
* ``log_prob`` (the old-log-prob forward, and each further forward of a streamed credit pass): FSDP shards
  (float32 parameters 4 P / W; optimizer 8 P / W unless offloaded), two layers' gathered bf16 parameters (FSDP2
  prefetch), one layer's activations, the logits over the vocabulary with verl's entropy temporaries
  (B V :data:`LOGIT_BYTES_INFER`), and a streamed credit pass's own buffers (``algos.credit.delta``
  ``delta_pass_peak_bytes``).
* ``update`` (forward + backward under gradient checkpointing, which the launcher always enables): shards and
  float32 gradients (4 P / W; LoRA: adapter only), each layer's checkpointed input (B d 2 bytes x layers), one
  layer's recomputed activations and their gradients (:func:`act_bytes_per_token`), the logits and their gradient
  (B V :data:`LOGIT_BYTES_TRAIN`).
* ``credit`` (an in-memory hidden-state credit pass: DelTA before the streamed pass, or any credit function without
  a ``stream``): the worker's padded ``[rollouts per rank, max_new_tokens, d]`` bf16 hidden states on the device
  (per hidden input: ``hidden``, ``base_hidden``) plus a float32 copy of every valid token's vector.

Host memory per node: offloaded shards, vLLM's sleeping weights of a LoRA run (verl sleeps vLLM at level 1 for
adapters: weights kept in host memory, engine_workers.py:789-792), an in-memory credit pass's hidden states (the
workers gather every micro-batch's output before the credit runs), the rollout batch in Ray's object store, and a
per-GPU process baseline.

Time per step: generation FLOPs (2 x active parameters per token plus causal attention over the context) at
``gen_mfu``, training FLOPs (old-log-prob forward, extra credit forwards, and per PPO epoch a forward, a recomputed
forward and a backward of twice a forward) at ``train_mfu``, both of ``peak_tflops`` per GPU, with dynamic sampling's
expected generation batches; a generation batch lasts at least ``max_new_tokens`` decode steps of ``decode_step_s``
(its longest response), and each step pays ``step_overhead_s`` (weight sync, dispatch); ``hours`` adds checkpoint
writes. Disk: verl's checkpoint (float32 parameters and Adam's
two moments, measured on a smoke checkpoint: 4.04 + 8.08 bytes per parameter) times ``keep_checkpoints`` plus
``final/``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from creditlab.config_compose import CONFIG_DIR
from creditlab.resources.shapes import Shape, shape_of

GB = 1e9

LOGIT_BYTES_INFER = 6
"""Bytes per (token, vocabulary entry) of the old-log-prob forward: the bf16 logits (2) and, while verl computes
their entropy (``calculate_entropy: True`` for the old log-probs, trainer/ppo/v1/trainer_base.py:1653;
utils/torch_functional.py:243-244 entropy_from_logits: softmax, then logsumexp and the product with the logits), two
more bf16 [B, V] tensors alive at once (4)."""
LOGIT_BYTES_TRAIN = 4
"""Bytes per (token, vocabulary entry) of the update: bf16 logits and their gradient (flash-attn's cross entropy
writes the gradient in place, utils/torch_functional.py logprobs_from_logits_flash_attn; the LM head's matmul
backward still holds one [B, V] bf16 gradient)."""
RAY_BYTES_PER_TOKEN = 64
"""Bytes per rollout token of the batch in Ray's object store (ids, masks, positions, old log-probs, advantages,
rewards, entropies: int64 and float32 fields of verl's DataProto) [ours: a count of its fields]."""
HOST_BASE_GB_PER_GPU = 12.0
"""Host memory of one GPU's processes outside the model (CUDA context, torch, vLLM's engine, Ray's worker) [ours]."""
CKPT_BYTES_PER_PARAM = 12
"""verl's FSDP checkpoint per trained parameter: float32 model shards (4) and Adam's two float32 moments (8); a smoke
checkpoint (qwen3 stand-in, 362,752 parameters) measured 1,466,965 + 2,932,099 bytes = 12.1 per parameter."""


@dataclass(frozen=True)
class Cluster:
    """The cluster's constants: configs/pipeline.yaml ``cluster:`` (docs/cluster.md "Resources"), each overridable
    with ``snakemake --config 'cluster={...}'``; :func:`load_cluster` reads them."""

    gpu_mem_gb: float
    gpu_reserved_gb: float
    host_mem_gb: float
    peak_tflops: float
    train_mfu: float
    gen_mfu: float
    response_fraction: float
    prompt_fraction: float
    dynamic_sampling_keep: float
    ckpt_write_gbps: float
    decode_step_s: float
    step_overhead_s: float
    site_max_hours: float
    disk_tb: float
    eval_cores: float
    choice_response_fraction: float
    judge_answer_s: float
    code_startup_s: float
    code_test_s: float
    decode_pair_step_s: float

    @property
    def gpu_budget_gb(self) -> float:
        return self.gpu_mem_gb - self.gpu_reserved_gb


def load_cluster(overrides: Mapping[str, Any] | None = None, config_dir: Path = CONFIG_DIR) -> Cluster:
    """The ``cluster:`` block of configs/pipeline.yaml with ``overrides`` (a pipeline config's own ``cluster``, e.g.
    from ``--config``) on top. ValueError naming an unknown key and the valid ones."""
    with open(Path(config_dir) / "pipeline.yaml") as f:
        base = dict(yaml.safe_load(f).get("cluster") or {})
    unknown = sorted(set(overrides or {}) - set(Cluster.__dataclass_fields__))
    if unknown:
        raise ValueError(f"cluster: unknown key(s) {unknown}; valid: {sorted(Cluster.__dataclass_fields__)}")
    merged = {**base, **dict(overrides or {})}
    missing = sorted(set(Cluster.__dataclass_fields__) - set(merged))
    if missing:
        raise ValueError(f"cluster: configs/pipeline.yaml lacks {missing}")
    try:  # numbers, or their digits (snakemake --config passes every value as a string)
        values = {k: float(merged[k]) for k in Cluster.__dataclass_fields__}
    except (TypeError, ValueError):
        raise ValueError(f"cluster: every value must be a number; got {merged}") from None
    for k, x in values.items():
        low_ok = x >= 0 if k in ZERO_OK else x > 0
        if not low_ok or (k in AT_MOST_ONE and x > 1):
            bound = "in (0, 1]" if k in AT_MOST_ONE else (">= 0" if k in ZERO_OK else "> 0")
            raise ValueError(f"cluster.{k}={x}: must be {bound}")
    if values["gpu_reserved_gb"] >= values["gpu_mem_gb"]:
        raise ValueError(f"cluster.gpu_reserved_gb={values['gpu_reserved_gb']} leaves nothing of gpu_mem_gb")
    return Cluster(**values)


ZERO_OK = ("gpu_reserved_gb", "decode_step_s", "step_overhead_s", "judge_answer_s", "code_startup_s", "code_test_s")
AT_MOST_ONE = (
    "train_mfu",
    "gen_mfu",
    "response_fraction",
    "prompt_fraction",
    "dynamic_sampling_keep",
    "choice_response_fraction",
)


@dataclass
class RunResources:
    """One run's estimate. GB = 1e9 bytes, TB = 1e12."""

    gpus: int
    nodes: int
    gpu_mem_gb_per_rank: float
    """Peak over the phases (``phases``), per GPU."""
    peak_phase: str
    phases: dict[str, dict[str, float]]
    """Phase -> term -> GB on one GPU."""
    host_mem_gb_per_node: float
    host_terms: dict[str, float]
    hours_per_step: float
    hours: float
    """The run's expected hours (steps x hours_per_step + checkpoint writes): what SLURM's wall time is sized from."""
    hours_max: float
    """Every step at its worst: all of dynamic sampling's generation batches, every response at its budget."""
    gen_batches: float
    tokens_per_gpu: tuple[int, int]
    """(update, log-prob) tokens of one micro-batch on one GPU: verl's token budgets as the launcher and plug-in set
    them."""
    checkpoint_tb: float
    """Disk at the run's peak: keep_checkpoints checkpoints and final/."""
    kept_tb: float
    """Disk once the run is pruned (trainer.prune_checkpoints): final/ and the last checkpoint."""
    credit_pass: str | None
    """How a hidden-state credit runs on the workers: ``streamed`` (per micro-batch, several forwards), ``in_memory``
    (every rollout's hidden states at once), None (no such credit)."""
    fits: bool
    why: str = ""
    """Empty when it fits; else the numbers and what to change."""
    notes: list[str] = field(default_factory=list)


def _budgets(run_cfg: Mapping[str, Any]) -> tuple[int, int]:
    """(update, log-prob) tokens per GPU per micro-batch: the launcher's budget, raised by the plug-in's
    ``ppo_max_token_len_per_gpu`` for group-coupled losses (engines/verl/plugin.py)."""
    from creditlab.engines.verl.plugin import plugin_overrides
    from creditlab.engines.verl.sizing import token_len_per_gpu

    run_cfg = {**run_cfg, "run": {"key": "paper/x/x/s0", **(run_cfg.get("run") or {})}}  # validate_runs' has none
    base = token_len_per_gpu(run_cfg)
    update = base
    for o in plugin_overrides(dict(run_cfg)):
        if o.split("=", 1)[0].lstrip("+") == "actor_rollout_ref.actor.ppo_max_token_len_per_gpu":
            update = int(o.split("=", 1)[1])
    return update, base


def hidden_credit(run_cfg: Mapping[str, Any]) -> list[tuple[str, int, bool, int]]:
    """The run's credit functions and token filters that read final hidden states on the workers: (name, hidden
    inputs: 1 for ``hidden``, 2 with ``base_hidden``, streamed, forwards of the policy per old-log-prob pass).
    Streamed where the registered function has a ``stream`` (``algos.credit.base.credit_stream``) and the run does not
    ask the in-memory path (``verl.sp_check``, smoke); a streamed DelTA re-runs the forward per statistics pass
    (``algos.credit.delta.delta_passes``)."""
    from creditlab.algos import registry
    from creditlab.algos.credit.base import credit_inputs_of

    meth = run_cfg.get("method") or {}
    sp_check = bool((run_cfg.get("verl") or {}).get("sp_check"))
    out = []
    for kind in ("credit", "token_filter"):
        for entry in meth.get(kind) or []:
            fn = registry.get(kind, entry["name"])
            named = set(credit_inputs_of(fn))
            n_hidden = int("hidden" in named) + int("base_hidden" in named)
            if not n_hidden:
                continue
            streamed = getattr(fn, "stream", None) is not None and not sp_check
            passes = 1
            if entry["name"] in ("delta", "delta_select"):  # DelTA's statistics passes (K + 3 for the full variant)
                from creditlab.algos.credit.delta import delta_passes

                variant = str(entry.get("variant", "full"))
                passes = delta_passes("full" if variant == "topk_proxy" else variant, int(entry.get("refine_steps", 1)))
            out.append((str(entry["name"]), n_hidden, streamed, passes))
    return out


def _lora_params(shape: Shape, lora: Mapping[str, Any]) -> int:
    """Adapter parameters: r (in + out) per adapted projection per layer."""
    if not lora.get("enable"):
        return 0
    d, q = shape.hidden_size, shape.attn_width
    kv, i = shape.num_key_value_heads * shape.head_dim, shape.intermediate_size
    dims = {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d)}
    dims |= {"gate_proj": (d, i), "up_proj": (d, i), "down_proj": (i, d)}
    per_layer = sum(sum(dims[m]) for m in lora.get("target_modules") or [] if m in dims)
    return int(lora["rank"]) * per_layer * shape.num_hidden_layers


def act_bytes_per_token(shape: Shape) -> int:
    """One decoder layer's activations per token while its checkpointed forward is recomputed and back-propagated:
    the normed inputs, q/k/v, attention output and residual (4 d + q + 2 kv), the MLP's gate, up and product (3 I),
    bf16, and as much again for their gradients [ours: a reading of Qwen3DecoderLayer's forward]."""
    kv = shape.num_key_value_heads * shape.head_dim
    return 2 * 2 * (4 * shape.hidden_size + shape.attn_width + 2 * kv + 3 * shape.intermediate_size)


def _gb(x: float) -> float:
    return round(x / GB, 2)


def estimate(
    run_cfg: Mapping[str, Any], cluster: Cluster | None = None, credit_pass: str | None = None
) -> RunResources:
    """The resources of the verl run of ``run_cfg`` (a resolved run config with ``model.verl``) on ``cluster``
    (default: configs/pipeline.yaml's ``cluster:``). ``credit_pass`` (``in_memory`` | ``streamed``) overrides how a
    hidden-state credit is taken to run (default: what the code does, :func:`hidden_credit`). ValueError for a run
    without a verl job."""
    cluster = cluster or load_cluster()
    t, m = run_cfg["trainer"], run_cfg["model"]
    v = m.get("verl")
    if not v:
        raise ValueError(f"model {m.get('name')!r}: no verl job (model.verl) to size")
    shape = shape_of(run_cfg)
    nodes, gpn = int(v["nnodes"]), int(v["n_gpus_per_node"])
    W, sp, tp = nodes * gpn, int(v["ulysses_sp"]), int(v["rollout_tp"])
    dp = W // sp
    P, d, V, L = shape.params(), shape.hidden_size, shape.vocab_size, shape.num_hidden_layers
    lora = t.get("lora") or {}
    P_lora = _lora_params(shape, lora)
    trained = P_lora if P_lora else P
    prompt, resp = int(t["max_prompt_tokens"]), int(t["max_new_tokens"])
    B_update, B_infer = _budgets(run_cfg)
    G = int(t["group_size"])
    rollouts = int(t["prompts_per_step"]) * G
    per_rank = rollouts // max(dp, 1)
    smoke = run_cfg.get("scale") == "smoke"
    param_bytes = 4  # verl's actor keeps float32 parameters (the smoke checkpoint: 4.04 bytes per parameter)
    params_gpu = param_bytes * P / W
    optim_gpu = 8 * trained / W
    grads_gpu = 4 * trained / W
    gathered = 2 * 2 * (P - V * d * (1 if shape.tie_word_embeddings else 2)) / max(L, 1)  # two layers, bf16
    resident = {"params": params_gpu} if not v["param_offload"] else {}
    if not v["optimizer_offload"]:
        resident["optimizer"] = optim_gpu
    shards = {"params": params_gpu, **({"optimizer": optim_gpu} if not v["optimizer_offload"] else {})}

    # rollout: vLLM's share and what the actor leaves on the GPU
    vllm = float(v["gpu_memory_utilization"]) * cluster.gpu_mem_gb * GB
    phases: dict[str, dict[str, float]] = {"rollout": {"vllm": vllm, **resident}}
    weights_tp = 2 * P / tp
    kv_per_tok = shape.kv_bytes_per_token() * math.ceil(shape.num_key_value_heads / tp) / shape.num_key_value_heads
    kv_need = (prompt + resp) * kv_per_tok
    notes = []

    # credit passes reading hidden states
    credits = hidden_credit(run_cfg)
    mode = None
    extra_forwards = 0
    credit_terms: dict[str, float] = {}
    stream_terms: dict[str, float] = {}
    mean_resp = cluster.response_fraction * resp
    for name, n_hidden, streamed, passes in credits:
        streamed = streamed if credit_pass is None else credit_pass == "streamed"
        mode = "streamed" if streamed else "in_memory"
        if streamed:
            from creditlab.algos.credit.delta import delta_pass_peak_bytes

            stream_terms[f"credit {name} (streamed)"] = n_hidden * delta_pass_peak_bytes(B_infer, d)
        if streamed:
            extra_forwards += passes - 1
        else:
            credit_terms[f"credit {name}: padded hidden states"] = n_hidden * per_rank * resp * d * 2
            credit_terms[f"credit {name}: float32 valid tokens"] = per_rank * mean_resp * d * 4
    phases["log_prob"] = {
        **shards,
        "gathered layers": gathered,
        "activations": B_infer * act_bytes_per_token(shape) / 2,
        "logits+entropy": B_infer * V * LOGIT_BYTES_INFER,
        **stream_terms,
    }
    phases["update"] = {
        **shards,
        "grads": grads_gpu,
        "gathered layers": gathered,
        "checkpointed inputs": B_update * d * 2 * L,
        "recomputed layer": B_update * act_bytes_per_token(shape),
        "logits": B_update * V * LOGIT_BYTES_TRAIN,
    }
    phases["optimizer step"] = {"params": params_gpu, "grads": grads_gpu, "optimizer": optim_gpu}
    if credit_terms:
        phases["credit"] = {**shards, **credit_terms}
    totals = {ph: sum(terms.values()) for ph, terms in phases.items()}
    peak_phase = max(totals, key=totals.get)
    peak = totals[peak_phase]

    # host memory per node
    host = {"processes": HOST_BASE_GB_PER_GPU * GB * gpn}
    if v["param_offload"]:
        host["offloaded params"] = params_gpu * gpn
    if v["optimizer_offload"]:
        host["offloaded optimizer"] = optim_gpu * gpn
    if P_lora:
        host["vLLM sleeping weights (LoRA)"] = weights_tp * gpn
    for key, val in credit_terms.items():
        if "padded" in key:
            host[key.replace("credit ", "credit (host) ")] = val * gpn
    ds = bool(t.get("dynamic_sampling"))
    gen_batches = min(float(t["max_gen_batches"]), 1.0 / cluster.dynamic_sampling_keep) if ds else 1.0
    host["Ray object store (rollout batch)"] = rollouts * gen_batches * (prompt + resp) * RAY_BYTES_PER_TOKEN / nodes
    host_total = sum(host.values())

    # time
    def step_hours(batches: float, frac: float) -> float:
        p, r = cluster.prompt_fraction * prompt, frac * resp
        n = p + r
        lk, hw = shape.kv_layers, shape.attn_width
        gen = (
            rollouts
            * batches
            * (2 * shape.active_params() * n + 4 * lk * hw * (p * r + r * r / 2) + 2 * lk * hw * p * p)
        )
        fwd = rollouts * (2 * shape.active_params() * n + 2 * lk * hw * n * n)
        backward = 1 if P_lora else 2  # LoRA: activation gradients only, no weight gradients of the base
        train = fwd * (1 + extra_forwards + int(t["ppo_epochs"]) * (2 + backward))
        flops = W * cluster.peak_tflops * 1e12
        # a generation batch lasts at least as long as its longest response takes to decode, one token per step
        gen_s = max(gen / (flops * cluster.gen_mfu), batches * resp * cluster.decode_step_s)
        return (gen_s + train / (flops * cluster.train_mfu) + cluster.step_overhead_s) / 3600

    steps = int(t["steps"])
    ckpt_bytes = CKPT_BYTES_PER_PARAM * trained + (param_bytes * P if P_lora else 0)
    final_bytes = (4 if smoke else 2) * P  # final/: bf16 like the hub checkpoint (a smoke stand-in: float32)
    saves = math.ceil(steps / max(1, int(t["checkpoint_every"])))
    ckpt_hours = saves * ckpt_bytes / (cluster.ckpt_write_gbps * GB) / 3600
    hps = step_hours(gen_batches, cluster.response_fraction)
    hours = steps * hps + ckpt_hours
    hours_max = steps * step_hours(float(t["max_gen_batches"]) if ds else 1.0, 1.0) + ckpt_hours
    keep = max(1, int(t.get("keep_checkpoints") or 1))
    disk = keep * ckpt_bytes + final_bytes

    # does it fit?
    budget = cluster.gpu_budget_gb * GB
    why = []
    if peak > budget:
        terms = sorted(phases[peak_phase].items(), key=lambda kv: -kv[1])
        why.append(
            f"peak GPU memory {_gb(peak):.1f} GB per rank in its {peak_phase} phase > {cluster.gpu_budget_gb:.1f} GB "
            f"usable of a {cluster.gpu_mem_gb:.0f} GB GPU ({', '.join(f'{k} {_gb(x):.1f}' for k, x in terms[:4])}); "
            + _advice(
                phases[peak_phase],
                B_update if peak_phase == "update" else B_infer,
                W,
                sp,
                plugin_budget=peak_phase == "update" and B_update > B_infer,
            )
            + (
                f" (the update's {B_update} tokens per GPU are the plug-in's: a group-coupled loss holds G = {G} "
                f"whole sequences per micro-batch, G (prompt + response) / sp: token_len_factor does not lower them; "
                f"ulysses_sp or max_new_tokens does)"
                if peak_phase == "update" and B_update > B_infer
                else ""
            )
        )
    if weights_tp + kv_need > vllm:
        why.append(
            f"vLLM's {float(v['gpu_memory_utilization']):.2f} x {cluster.gpu_mem_gb:.0f} GB = {_gb(vllm):.1f} GB per "
            f"GPU cannot hold its weights ({_gb(weights_tp):.1f} GB at rollout_tp {tp}) and one {prompt + resp}-token "
            f"sequence's KV cache ({_gb(kv_need):.1f} GB): raise model.verl.rollout_tp or gpu_memory_utilization"
        )
    if host_total > cluster.host_mem_gb * GB:
        top = sorted(host.items(), key=lambda kv: -kv[1])[:3]
        why.append(
            f"host memory {_gb(host_total):.0f} GB per node > {cluster.host_mem_gb:.0f} GB "
            f"({', '.join(f'{k} {_gb(x):.0f}' for k, x in top)}): more nodes, less offload, or a streamed credit pass"
        )
    if hours > cluster.site_max_hours:
        notes.append(
            f"{hours:.0f} h expected > the site's {cluster.site_max_hours:.0f} h limit: runs over several allocations "
            f"(checkpoint and requeue)"
        )
    return RunResources(
        gpus=W,
        nodes=nodes,
        gpu_mem_gb_per_rank=_gb(peak),
        peak_phase=peak_phase,
        phases={ph: {k: _gb(x) for k, x in terms.items()} for ph, terms in phases.items()},
        host_mem_gb_per_node=_gb(host_total),
        host_terms={k: _gb(x) for k, x in host.items()},
        hours_per_step=hps,
        hours=hours,
        hours_max=hours_max,
        gen_batches=gen_batches,
        tokens_per_gpu=(B_update, B_infer),
        checkpoint_tb=disk / 1e12,
        kept_tb=(ckpt_bytes + final_bytes) / 1e12,
        credit_pass=mode,
        fits=not why,
        why="; ".join(why),
        notes=notes,
    )


def _advice(terms: Mapping[str, float], tokens: int, gpus: int, sp: int, plugin_budget: bool = False) -> str:
    """What to change for a phase that does not fit, from its largest term."""
    top = max(terms, key=terms.get)
    if top.startswith("credit"):
        return (
            "change: a streamed credit pass (a `stream` on the credit function: per-micro-batch statistics, "
            "algos/credit/base.py credit_stream), or more data-parallel ranks (fewer rollouts per rank)"
        )
    if top in ("logits", "logits+entropy", "checkpointed inputs", "recomputed layer", "activations"):
        return (
            f"change: a smaller micro-batch ({tokens} tokens per GPU"
            + ("" if plugin_budget else ": lower model.verl.token_len_factor")
            + f"), a larger "
            f"model.verl.ulysses_sp (now {sp}), or GPUs with more memory"
        )
    if top == "vllm":
        return "change: a lower model.verl.gpu_memory_utilization, or param_offload / optimizer_offload"
    return f"change: param_offload / optimizer_offload, or more GPUs (now {gpus}) to shard the states over"


TRAIN_JOB_MARGIN = 1.5
"""A training job asks for this many times its expected hours (the estimate rests on assumed MFUs and lengths)."""
MERGE_MINUTES = 60
"""Added to a training job's wall time: verl's model merger (final/) after the last step, and the job's start-up."""


def train_job_minutes(res: RunResources, cluster: Cluster) -> int:
    """SLURM wall time of a training job (sbatch -t, minutes): ``TRAIN_JOB_MARGIN`` x its expected hours plus
    ``MERGE_MINUTES``, within the site's longest job (``cluster.site_max_hours``). A run longer than one allocation,
    or slower than estimated, checkpoints and requeues itself before the allocation ends (creditlab.allocation)."""
    wanted = math.ceil(res.hours * TRAIN_JOB_MARGIN * 60) + MERGE_MINUTES
    return int(min(wanted, cluster.site_max_hours * 60))
