"""verl worker side of the plug-in: final hidden states and adapter-on/off passes in the old-log-prob pass.

DelTA (Paper B) needs h_t, the LM-head input of the old-log-prob forward, for every valid token; ARCA
(Paper D) needs h_t^adapted - h_t^base, the same forward with the LoRA adapter on and off. Hidden states
are [B_mb, T, d] per micro-batch and never leave the GPU workers: the credit functions that name them
(``hidden``, ``base_hidden``) run here, inside verl's old-log-prob pass, and only their per-token weights
(Tensor[B, T]) go back to the driver through TransferQueue.

Against verl 0.9.1's worker API (``verl.workers.engine_workers``):

* :class:`CreditlabActorRolloutRefWorker` subclasses ``ActorRolloutRefWorker`` and overrides its
  ``compute_log_prob`` (same dispatch: ``make_nd_compute_dataproto_dispatch_fn("actor")``). Without our key
  in the batch it is verl's method unchanged. With ``creditlab_credit`` (a spec the trainer puts in the
  batch's ``extra_info``) it runs ``TrainingWorker.infer_batch`` under :func:`stream_credit` (for LoRA runs each
  micro-batch is forwarded again with the adapter disabled: verl's reference pass, which therefore happens here
  instead of in a separate ``compute_log_prob`` call), once more per further statistics pass of the streamed credit
  functions, and computes the credit functions of the spec with statistics all-reduced over the data-parallel group
  (``engine.get_data_parallel_group()``) (:func:`credit_pass`, :func:`worker_credit`).
* ``init_model`` is verl's, then :func:`install_group_ids`: for a group-coupled creditlab loss (grpo_fix, dfpo)
  the actor's loss ``partial(verl.workers.utils.losses.ppo_loss, config)`` is wrapped by
  ``plugin.with_group_ids`` (the micro-batch's ``uid`` -> group ids for the registered loss).
* :func:`capture_final_hidden` hooks the LM head's forward input (the final hidden states) and wraps the
  engine's ``prepare_model_outputs`` (``FSDPEngineWithLMHead``) so that each micro-batch's model output
  gains ``hidden``, a nested Tensor[B, S_i, d] over the full sequences laid out exactly as verl lays out
  ``log_probs`` (packed, Ulysses-gathered and unpadded with the engine's ``_gather_and_unpad_packed``):
  verl's own micro-batch reassembly (``postprocess_batch_func``) then orders it, and verl's
  ``response_from_nested`` cuts the response positions of log-probs and hidden states alike.

Cost [ours]: no rollout's hidden states outlive its micro-batch. The credit functions that hold a d-vector per
token have a streamed form (``algos.credit.base.credit_stream``): each micro-batch's h_t (and h_t^base) feed
per-micro-batch sums inside the forward (:func:`stream_credit`) and are dropped, as the official DelTA code does
(RUCBM/DelTA ``dp_actor.compute_log_prob_h``), so a rank's peak is one micro-batch's states plus O(d) statistics
(``algos.credit.delta.delta_pass_peak_bytes``) and per-token scalars, whatever its rollouts. The price is forwards:
DelTA re-runs the old-log-prob forward once per statistics pass (``delta_passes``: K + 3 in all, as the official
code; the first is verl's own), ARCA's reference forward is the one verl would run anyway. Only ``verl.sp_check``
(a smoke-scale check) still gathers every token's state. Ulysses sequence
parallelism (sp > 1): each rank's LM-head input is its shard of the packed sequence; the engine's
``_gather_and_unpad_packed`` all-gathers it over the sp group exactly as it gathers ``log_probs``, so every sp rank
feeds the streams the same micro-batch (each data-parallel group reduces its own copy of the statistics) and verl
returns outputs from sp rank 0 only, where the weights are assembled.
Not supported: fused LM-head kernels (``use_fused_kernels``: no LM-head call).

What can run on CPU is tested (tests/test_verl_plugin.py): the capture through verl's real
``FSDPEngineWithLMHead.forward_step`` on a tiny Qwen3 model (with a real peft LoRA adapter on and off),
:func:`credit_pass` on it, and :func:`worker_credit` on two data-parallel shards with a summing all-reduce;
tests/test_credit_stream.py: :func:`credit_pass` through verl's own micro-batching (fixed and dynamic sizes)
equals the in-memory credit, and its peak memory does not grow with the rollouts.
The worker class itself needs verl's GPU worker group.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable

import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch import Tensor

from creditlab.algos.credit.arca import adapter_residual_norm
from creditlab.algos.credit.base import (
    CreditInputs,
    compose_credit,
    credit_inputs_of,
    credit_stream,
    method_entries,
    named_inputs,
)
from creditlab.engines.verl.plugin import (
    DP_STATS,
    group_index,
    loss_name,
    needs_group_ids,
    with_group_ids,
)
from creditlab.seeds import step_seed

CREDIT_KEY = "creditlab_credit"
"""``extra_info`` key of the worker-side credit spec (:func:`worker_credit`)."""
SEQ_ADV = "creditlab_seq_adv"
"""TransferQueue field: the sequence advantage A_i (Tensor[B]), written by the trainer before the pass."""
OUT_WEIGHTS = "creditlab_credit_weights"
OUT_FILTER = "creditlab_token_filter"
OUT_REF = "creditlab_ref_log_probs"
OUT_RESIDUAL = "creditlab_arca_residual"
OUT_SP_CHECK = "creditlab_sp_check"
"""Tensor[B, 3] per rollout with ``verl.sp_check``: max |credit weight (sp) - credit weight (sp=1 forward)|, max
|hidden state (sp) - hidden state (sp=1)| and max |hidden state| over its response tokens."""
"""Fields the pass adds (nested over response tokens, except OUT_REF: full sequences like ``log_probs``)."""


# ------------------------------------------------------------------------------------------------------
# hidden-state capture


def find_lm_head(module: torch.nn.Module) -> torch.nn.Module:
    """The LM head of a (possibly FSDP- or peft-wrapped) causal LM: ``get_output_embeddings()`` of the module or
    of what it wraps, else the sub-module named ``lm_head``."""
    for m in (module, getattr(module, "module", None), getattr(module, "_fsdp_wrapped_module", None)):
        get = getattr(m, "get_output_embeddings", None)
        head = get() if callable(get) else None
        if isinstance(head, torch.nn.Module):
            return head
    for name, sub in module.named_modules():
        if name.rsplit(".", 1)[-1] == "lm_head":
            return sub
    raise ValueError(f"no LM head found in {type(module).__name__}")


def packed_hidden_to_nested(engine: Any, hidden: Tensor, output_args: dict, micro_batch: TensorDict) -> Tensor:
    """One micro-batch's LM-head input -> nested Tensor[B, S_i, d] over each full sequence (prompt + response).

    Mirrors how ``FSDPEngineWithLMHead.prepare_model_outputs`` lays out ``log_probs``:
      remove-padding: hidden (1, nnz_local + pad, d) -> squeeze -> ``engine._gather_and_unpad_packed``
                      (Ulysses all-gather, packed padding dropped) -> jagged by ``input_ids.offsets()``;
      padded:         hidden (B, max_seq_len, d) -> each row's first S_i positions -> jagged.
    Position s holds the state that predicts token s + 1 (as ``log_probs``), so verl's ``response_from_nested``
    cuts the response part of both identically.
    """
    from verl.utils import tensordict_utils as tu

    cu = micro_batch["input_ids"].offsets()
    if tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
        flat = engine._gather_and_unpad_packed(hidden.squeeze(0), output_args.get("pad_size", 0))
    else:
        lens = cu.diff().tolist()
        flat = torch.cat([hidden[i, :n] for i, n in enumerate(lens)])
    return torch.nested.nested_tensor_from_jagged(flat.contiguous(), cu.to(flat.device))


@contextmanager
def capture_final_hidden(engine: Any):
    """While active, every forward of ``engine`` (verl ``FSDPEngineWithLMHead``) adds ``hidden`` to its model
    output (:func:`packed_hidden_to_nested`). A forward hook on the LM head stashes its input; the engine's
    ``prepare_model_outputs`` is wrapped on the instance and restored on exit.

    Raises RuntimeError when a forward ran without the LM head (fused kernels compute log-probs without
    calling it: ``actor_rollout_ref.model.use_fused_kernels`` must be false for hidden-state credit).
    """
    head = find_lm_head(engine.module)
    stash: list[Tensor] = []
    hook = head.register_forward_hook(lambda mod, args, out: stash.append(args[0].detach()))
    inner = engine.prepare_model_outputs

    def prepare_model_outputs(output, output_args, micro_batch, logits_processor_func):
        model_output = inner(output, output_args, micro_batch, logits_processor_func)
        if len(stash) != 1:
            raise RuntimeError(
                f"the LM head ran {len(stash)} times in one forward; hidden-state capture needs "
                "exactly one call (use_fused_kernels must be false)"
            )
        model_output["hidden"] = packed_hidden_to_nested(engine, stash.pop(), output_args, micro_batch)
        return model_output

    engine.prepare_model_outputs = prepare_model_outputs
    try:
        yield
    finally:
        hook.remove()
        del engine.prepare_model_outputs  # the class method again


# ------------------------------------------------------------------------------------------------------
# credit on the workers


def dp_all_reduce(group: Any) -> Callable[[Tensor], Tensor]:
    """Sum over the data-parallel ``group`` (a torch.distributed process group): the ``all_reduce`` hook
    of DelTA's statistics. Returns a new tensor; the input is left as it is."""

    def reduce(x: Tensor) -> Tensor:
        y = x.detach().clone()
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)
        return y

    return reduce


@torch.no_grad()
def worker_credit(
    spec: dict,
    *,
    responses: Tensor,
    mask: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    uids: list[str],
    entropy: Tensor | None,
    hidden: Tensor | None,
    ref_logp: Tensor | None = None,
    base_hidden: Tensor | None = None,
    reduce: Callable[[Tensor], Tensor] | None = None,
    rank: int = 0,
    topk_logp: Tensor | None = None,
    topk_ids: Tensor | None = None,
    lm_head: Tensor | None = None,
) -> dict[str, Tensor | None]:
    """The credit functions / token filters of ``spec`` on one data-parallel rank's rollouts.

    spec: {"credit": [{name, **kwargs}], "token_filter": [...], "seed": int, "step": int,
           "dp_stats": "rank" | "global"} (those entries of the method config that need worker inputs; dp_stats:
           plugin.DP_STATS, default "rank", the official per-rank statistics).
    responses, mask, old_logp: Tensor[B, T] (padded response positions); advantages: Tensor[B] (A_i);
    uids: the B prompt uids (groups, local to this rank); entropy, ref_logp: Tensor[B, T] or None;
    hidden, base_hidden: Tensor[B, T, d] or None; topk_logp / topk_ids: Tensor[B, T, K] and lm_head: Tensor[V, d]
    (DelTA's top-K proxy, :func:`spec_topk` > 0) or None; reduce: the sum over ranks (``dp_all_reduce``), passed
    to functions that take ``all_reduce`` when ``dp_stats`` is "global" (with "rank" they see this rank's rollouts
    alone); rank seeds ``rng`` per rank.
    Returns {"weights": Tensor[B, T], "filter": Tensor[B, T] or None, "residual": ||h - h_base|| or None}.
    """
    inputs = CreditInputs(
        responses=responses,
        mask=mask,
        old_logp=old_logp,
        advantages=advantages,
        group_ids=group_index(uids).to(mask.device),
        hidden=hidden,
        entropy=entropy,
        ref_logp=ref_logp,
        base_hidden=base_hidden,
        topk_logp=topk_logp,
        topk_ids=topk_ids,
        lm_head=lm_head,
        rng=torch.Generator().manual_seed(step_seed(int(spec.get("seed", 0)), int(spec.get("step", 0)), 20_000 + rank)),
    )
    dp_stats = spec.get("dp_stats", "rank")
    if dp_stats not in DP_STATS:
        raise ValueError(f"credit spec dp_stats={dp_stats!r}; valid choices: {list(DP_STATS)}")
    extra = {"all_reduce": reduce} if reduce is not None and dp_stats == "global" else {}
    weights = compose_credit(method_entries("credit", spec.get("credit")), inputs, extra)
    filters = spec.get("token_filter") or []
    filt = compose_credit(method_entries("token_filter", filters), inputs, extra) if filters else None
    residual = None
    if hidden is not None and base_hidden is not None:
        residual = adapter_residual_norm(hidden, base_hidden) * mask
    return {"weights": weights, "filter": filt, "residual": residual}


@torch.no_grad()
def unsharded_hidden(engine: Any, data: TensorDict) -> Tensor:
    """The LM-head input of every full sequence of ``data`` from one plain padded forward of the engine's model,
    outside Ulysses (the sp=1 computation of the same batch): nested Tensor[B, S_i, d] laid out like the captured
    ``hidden``. Every rank of the FSDP mesh must call it (FSDP gathers the parameters collectively)."""
    from verl.utils.ulysses import get_ulysses_sequence_parallel_group, set_ulysses_sequence_parallel_group

    ids = data["input_ids"]
    cu = ids.offsets()
    lens = cu.diff().tolist()
    flat = ids.values()
    B, S = len(lens), max(lens)
    padded = torch.zeros(B, S, dtype=flat.dtype)
    mask = torch.zeros(B, S, dtype=torch.long)
    for i, n in enumerate(lens):
        padded[i, :n] = flat[cu[i] : cu[i] + n]
        mask[i, :n] = 1
    pos = torch.arange(S)[None].expand(B, S)
    head = find_lm_head(engine.module)
    stash: list[Tensor] = []
    hook = head.register_forward_hook(lambda mod, args, out: stash.append(args[0].detach()))
    with engine.eval_mode():
        prev = get_ulysses_sequence_parallel_group()
        set_ulysses_sequence_parallel_group(None)
        try:
            engine.module(input_ids=padded, attention_mask=mask, position_ids=pos, use_cache=False)
        finally:
            set_ulysses_sequence_parallel_group(prev)
            hook.remove()
    h = stash[0].float()
    rows = torch.cat([h[i, :n] for i, n in enumerate(lens)])
    return torch.nested.nested_tensor_from_jagged(rows.contiguous(), cu.to(rows.device))


def spec_topk(spec: dict) -> int:
    """The largest ``topk`` a worker-side credit function or token filter of ``spec`` asks for (0: none)."""
    return max([int(c.get("topk") or 0) for kind in ("credit", "token_filter") for c in spec.get(kind) or []] + [0])


@torch.no_grad()
def full_lm_head(engine: Any) -> Tensor:
    """The LM head's full weight Tensor[V, d] (FSDP2 shards it as a DTensor: gathered, which every rank of the mesh
    must call together), detached, float32."""
    w = find_lm_head(engine.module).weight
    w = w.full_tensor() if hasattr(w, "full_tensor") else w
    return w.detach().float()


@torch.no_grad()
def topk_logprobs(hidden: Tensor, lm_head: Tensor, k: int, chunk_tokens: int = 1024) -> tuple[Tensor, Tensor]:
    """The K most probable next tokens of every position: log_softmax(h W^T).topk(K), K = min(k, V), as the local
    engine's forward computes them (``lm.batch.response_forward``). hidden: Tensor[B, T, d]; lm_head:
    Tensor[V, d]. Returns (values, ids), Tensor[B, T, K] each; computed over chunks of tokens (a [chunk, V] block of
    logits at a time: the vocabulary of a paper backbone is 150k)."""
    B, T, d = hidden.shape
    flat = hidden.reshape(-1, d).float()
    K = min(int(k), lm_head.shape[0])
    vals = torch.empty(flat.shape[0], K, dtype=torch.float32, device=flat.device)
    ids = torch.empty(flat.shape[0], K, dtype=torch.long, device=flat.device)
    for s in range(0, flat.shape[0], chunk_tokens):
        top = torch.log_softmax(flat[s : s + chunk_tokens] @ lm_head.T, -1).topk(K, dim=-1)
        vals[s : s + chunk_tokens], ids[s : s + chunk_tokens] = top.values, top.indices
    return vals.reshape(B, T, K), ids.reshape(B, T, K)


def _padded(nt: Tensor, value: float = 0.0) -> Tensor:
    """Nested (jagged) Tensor[B, j(, d)] -> padded Tensor[B, max j(, d)]."""
    return torch.nested.to_padded_tensor(nt, value) if nt.is_nested else nt


STREAM_KEY = "creditlab_stream_{}"
"""Model-output field of the j-th credit stream's final-pass values (nested over response tokens, per micro-batch)."""


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


REF_LOGP_KEY, RESIDUAL_KEY, BASE_HIDDEN_KEY = "creditlab_ref_lp", "creditlab_residual", "creditlab_base_hidden"
"""Model-output fields of the per-micro-batch reference forward (adapter disabled): its log-probs (full sequences,
like ``log_probs``), ||h - h_base|| (response tokens) and, with ``keep_hidden``, its hidden states."""


@contextmanager
def stream_credit(
    engine: Any, streams: list, *, ref: bool, keep_hidden: bool, lm_head: Tensor | None, k: int, rng: Any
):
    """While active, every forward of ``engine`` (one micro-batch) feeds the credit streams that are not done
    (``algos.credit.base.credit_stream``: DelTA's statistics passes, ARCA's saliences) and then drops the
    micro-batch's hidden states. A stream's final-pass values join the model output as ``STREAM_KEY.format(j)``
    (nested over the micro-batch's response tokens), which verl's micro-batch reassembly orders like ``log_probs``.

    ``ref``: the same micro-batch is forwarded again with the LoRA adapter disabled (``engine.disable_adapter()``,
    verl's reference pass, made here per micro-batch so that h and h_base meet without holding the batch's): its
    log-probs, ||h - h_base|| and, for the streams, ``ref_logp`` / ``base_hidden`` (REF_LOGP_KEY, RESIDUAL_KEY).
    ``keep_hidden``: also keep ``hidden`` (and BASE_HIDDEN_KEY) in the model output, every token's state, for the
    in-memory sp check (``verl.sp_check``). ``lm_head``/``k``: the top-K next tokens of each micro-batch (DelTA's
    top-K proxy).

    Micro-batch inputs, on the device: responses, mask, old_logp (, ref_logp) Tensor[B_mb, T_mb] (padded response
    positions), advantages Tensor[B_mb] (the trainer's ``creditlab_seq_adv``), hidden (, base_hidden)
    Tensor[B_mb, T_mb, d], rng."""
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    live = [(j, s) for j, s in enumerate(streams) if not s.done]
    nested = [False]
    with capture_final_hidden(engine):
        inner = engine.prepare_model_outputs  # the capturing one

        def prepare_model_outputs(output, output_args, micro_batch, logits_processor_func):
            model_output = inner(output, output_args, micro_batch, logits_processor_func)
            if nested[0]:  # the reference forward below
                return model_output
            hidden_nt = model_output["hidden"] if keep_hidden else model_output.pop("hidden")
            if not live and not ref:
                return model_output
            device = _device()
            mask_nt = micro_batch["response_mask"]

            def resp(nt: Tensor) -> Tensor:
                return _padded(response_from_nested(nt, mask_nt)).to(device)

            mb = dict(
                responses=_padded(micro_batch["responses"]).to(device),
                mask=_padded(mask_nt).to(device).float(),
                old_logp=resp(model_output["log_probs"]),
                advantages=micro_batch[SEQ_ADV].reshape(-1).float().to(device),
                hidden=resp(hidden_nt),
                rng=rng,
            )
            del hidden_nt
            if ref:
                nested[0] = True
                try:
                    with engine.disable_adapter():
                        _, ref_out = engine.forward_step(micro_batch, loss_function=None, forward_only=True)
                finally:
                    nested[0] = False
                ref_out = ref_out["model_output"]
                base_nt = ref_out.pop("hidden")
                mb["base_hidden"], mb["ref_logp"] = resp(base_nt), resp(ref_out["log_probs"])
                model_output[REF_LOGP_KEY] = ref_out["log_probs"]
                residual = adapter_residual_norm(mb["hidden"], mb["base_hidden"]).float() * mb["mask"]
                model_output[RESIDUAL_KEY] = response_to_nested(residual, mask_nt)
                if keep_hidden:
                    model_output[BASE_HIDDEN_KEY] = base_nt
                del base_nt
            if lm_head is not None:
                mb["topk_logp"], mb["topk_ids"] = topk_logprobs(mb["hidden"], lm_head, k)
                mb["lm_head"] = lm_head
            for j, s in live:
                vals = s.update(**named_inputs(s.update, mb))
                if vals is not None:
                    model_output[STREAM_KEY.format(j)] = response_to_nested(vals, mask_nt)
            return model_output

        engine.prepare_model_outputs = prepare_model_outputs
        try:
            yield
        finally:
            engine.prepare_model_outputs = inner


def _end_passes(streams: list) -> None:
    for s in streams:
        if not s.done:
            s.end_pass()


def credit_pass(worker: Any, data: TensorDict, spec: dict) -> TensorDict:
    """``compute_log_prob`` with credit: verl's ``TrainingWorker.infer_batch`` feeding the credit streams
    (:func:`stream_credit`; with ``spec["fused_ref"]`` each micro-batch is forwarded again with the adapter
    disabled), again for each further statistics pass they need (``algos.credit.delta.delta_passes``: the official
    compute_log_prob_h's K + 3 forwards, the first being verl's own), then :func:`worker_credit` for the credit
    functions without a streamed form, on per-token outputs. No rollout's hidden states outlive its micro-batch,
    except with ``spec["sp_check"]`` (the in-memory credit on every token's state, against the sp=1 forward).

    worker: the ``ActorRolloutRefWorker`` (``worker.actor`` is its ``TrainingWorker``); data: this rank's
    TensorDict from TransferQueue (nested ``responses``, ``response_mask``, the trainer's ``creditlab_seq_adv``,
    ``uid``). Returns verl's output (``log_probs``, ``entropy``, metrics) plus the creditlab fields.
    """
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    engine = worker.actor.engine
    sp_check = bool(spec.get("sp_check")) and bool(getattr(engine, "use_ulysses_sp", False))
    plain = unsharded_hidden(engine, data) if sp_check else None  # before the early return: every rank forwards
    k = spec_topk(spec)
    device = _device()
    lm_head = full_lm_head(engine).to(device) if k else None  # likewise: FSDP gathers the weight on every rank
    reduce, rank = None, 0
    if dist.is_initialized():  # verl's workers: always; the sums go over the data-parallel group
        group = engine.get_data_parallel_group()
        reduce, rank = dp_all_reduce(group), dist.get_rank(group)
    dp_stats = spec.get("dp_stats", "rank")
    if dp_stats not in DP_STATS:
        raise ValueError(f"credit spec dp_stats={dp_stats!r}; valid choices: {list(DP_STATS)}")
    extra = {"all_reduce": reduce} if reduce is not None and dp_stats == "global" else {}
    streams, rest = [], {kind: [] for kind in ("credit", "token_filter")}
    for kind in rest:
        for entry, (fn, kw) in zip(spec.get(kind) or [], method_entries(kind, spec.get(kind))):
            s = None if sp_check else credit_stream(fn, kw, extra)  # sp check: the in-memory path
            if s is not None:
                streams.append((kind, s))
            else:
                rest[kind].append(entry)
    fused_ref = bool(spec.get("fused_ref"))
    rng = torch.Generator().manual_seed(step_seed(int(spec.get("seed", 0)), int(spec.get("step", 0)), 20_000 + rank))
    live = [s for _, s in streams]
    refs_later = fused_ref and any({"ref_logp", "base_hidden"} & set(credit_inputs_of(s.update)) for s in live)
    outputs = []
    with stream_credit(engine, live, ref=fused_ref, keep_hidden=sp_check, lm_head=lm_head, k=k, rng=rng):
        out = worker.actor.infer_batch(data)
    outputs.append(out)
    _end_passes(live)
    if any(not s.done for s in live):  # the further statistics passes: forwards only, no entropy
        entropy_flag = tu.get_non_tensor_data(data=data, key="calculate_entropy", default=False)
        tu.assign_non_tensor(data, calculate_entropy=False)
        while any(not s.done for s in live):
            with stream_credit(engine, live, ref=refs_later, keep_hidden=False, lm_head=lm_head, k=k, rng=rng):
                outputs.append(worker.actor.infer_batch(data))
            _end_passes(live)
        tu.assign_non_tensor(data, calculate_entropy=entropy_flag)
    if out is None:  # not the output rank of its Ulysses group (verl returns outputs from sp rank 0 only): the
        return None  # hidden states were all-gathered there; this rank's peers in other groups skip alike
    mask_nt = data["response_mask"]

    def resp(nt: Tensor) -> Tensor:  # full-sequence nested -> padded response positions, on device
        return _padded(response_from_nested(nt, mask_nt)).to(device)

    mask = _padded(mask_nt).to(device).float()
    hidden = resp(out["hidden"]) if sp_check else None
    base_hidden = resp(out[BASE_HIDDEN_KEY]) if sp_check and fused_ref else None
    entropy = resp(out["entropy"]) if "entropy" in out.keys() else None
    adv = data[SEQ_ADV].reshape(-1).float().to(device)
    responses = _padded(data["responses"]).to(device)
    top = {}
    if lm_head is not None and sp_check:  # DelTA's top-K proxy on the in-memory path
        top_logp, top_ids = topk_logprobs(hidden, lm_head, k)
        top = {"topk_logp": top_logp, "topk_ids": top_ids, "lm_head": lm_head}
    common = dict(
        responses=responses,
        mask=mask,
        old_logp=resp(out["log_probs"]),
        advantages=adv,
        uids=list(data["uid"]),
        entropy=entropy,
        ref_logp=resp(out[REF_LOGP_KEY]) if fused_ref else None,
        base_hidden=base_hidden,
        reduce=reduce,
        rank=rank,
    )
    res = worker_credit({**spec, **rest}, hidden=hidden, **common, **top)
    batch = dict(responses=responses, mask=mask, advantages=adv, rng=rng)
    for j, (kind, s) in enumerate(streams):
        nt = next(o[STREAM_KEY.format(j)] for o in outputs if o is not None and STREAM_KEY.format(j) in o.keys())
        w = s.finish(_padded(nt).to(device), **named_inputs(s.finish, batch))
        if kind == "credit":
            res["weights"] = res["weights"] * w
        else:
            res["filter"] = w if res["filter"] is None else res["filter"] * w
    if plain is not None:  # the same credit from the sp=1 forward of this batch: how far Ulysses moved it
        plain_top = {}
        if lm_head is not None:  # the top-K proxy from the sp=1 hidden states too
            p_logp, p_ids = topk_logprobs(resp(plain), lm_head, k)
            plain_top = {"topk_logp": p_logp, "topk_ids": p_ids, "lm_head": lm_head}
        ref_res = worker_credit(spec, hidden=resp(plain), **common, **plain_top)
        out[OUT_SP_CHECK] = torch.stack(
            [
                ((res["weights"] - ref_res["weights"]).abs() * mask).amax(-1),
                ((hidden - resp(plain)).abs().amax(-1) * mask).amax(-1),
                (hidden.abs().amax(-1) * mask).amax(-1),
            ],
            -1,
        ).cpu()  # the scale the gap is read against
    out[OUT_WEIGHTS] = response_to_nested(res["weights"].cpu(), mask_nt)
    if res["filter"] is not None:
        out[OUT_FILTER] = response_to_nested(res["filter"].cpu(), mask_nt)
    if fused_ref:
        out[OUT_RESIDUAL] = out[RESIDUAL_KEY]
        out[OUT_REF] = out[REF_LOGP_KEY]
    for key in [key for key in out.keys() if key == "hidden" or str(key).startswith("creditlab_")]:
        if key not in (OUT_WEIGHTS, OUT_FILTER, OUT_RESIDUAL, OUT_REF, OUT_SP_CHECK):
            del out[key]
    return out


# ------------------------------------------------------------------------------------------------------
# the worker class (verl's GPU worker group)

from verl.single_controller.base.decorator import (  # noqa: E402
    Dispatch,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from verl.utils import tensordict_utils as _tu  # noqa: E402
from verl.utils.profiler import DistProfiler  # noqa: E402
from verl.workers.engine_workers import ActorRolloutRefWorker, _with_routing_replay_flag  # noqa: E402


def install_group_ids(worker: Any) -> bool:
    """Wrap the actor's verl worker loss (``worker.loss_fn``: ``partial(ppo_loss, config=...)``) with
    ``plugin.with_group_ids`` when its ``policy_loss.loss_mode`` is a group-coupled creditlab loss (grpo_fix,
    dfpo), and hand it to the actor's ``TrainingWorker`` (``set_loss_fn``, as verl's ``init_model`` does).
    Returns whether it wrapped. Idempotent."""
    actor = getattr(worker, "actor", None)
    fn = getattr(worker, "loss_fn", None)
    if actor is None or fn is None or getattr(fn, "creditlab_group_ids", False):
        return False
    name = loss_name(str(worker.config.actor.policy_loss.get("loss_mode", "vanilla")))
    if name is None or not needs_group_ids(name):
        return False
    worker.loss_fn = with_group_ids(fn)
    actor.set_loss_fn(worker.loss_fn)
    return True


class CreditlabActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's hybrid actor/rollout/ref worker whose old-log-prob pass can also compute creditlab's
    worker-side credit (``creditlab_credit`` in the batch's extra_info; see :func:`credit_pass`) and whose
    actor loss gives group-coupled losses the micro-batch's group ids (:func:`install_group_ids`)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        install_group_ids(self)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    @DistProfiler.annotate(color="blue", role="actor_compute_log_prob")
    @_with_routing_replay_flag(enabled=True)
    def compute_log_prob(self, data: TensorDict) -> TensorDict:
        spec = _tu.pop(data, key=CREDIT_KEY, default=None)
        if spec is None:  # verl's compute_log_prob
            output = self.actor.infer_batch(data)
        else:
            output = credit_pass(self, data, spec)
        return output.cpu() if output is not None else None
