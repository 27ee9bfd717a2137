"""verl 0.9.1's own training loop on a CPU (scale ``smoke``): a platform, a rollout replica, three patched internals.

Used only when a run asks for it (``verl.device: cpu`` in the run config, set by ``configs/scale/smoke.yaml``): the
launcher then adds :func:`cpu_overrides` and :func:`cpu_env` (``VERL_PLATFORM=cpu``), and the plug-in, imported by
verl in every Ray process, calls :func:`install` when ``VERL_PLATFORM`` is ``cpu``. Nothing here is used on GPUs.

verl's extension points first:

* :class:`PlatformCPU` in ``verl.plugin.platform.PlatformRegistry`` as ``cpu``: device "cpu", gloo, Ray resource
  "GPU" (Ray is given fake GPUs: verl's resource pools count only GPU/NPU resources), no-op memory and profiling.
* :class:`CPUReplica` in ``RolloutReplicaRegistry`` as ``creditlab_cpu``: one Ray actor per replica
  (:class:`CPURolloutServer`) serving verl's token-in/token-out ``generate`` with creditlab's own KV-cache sampler
  (``lm.sampler.generate``) and the response log-probs of one scoring forward; its weights are the
  actor's, synced every step through the worker-side adapter :class:`CPUServerAdapter`.

Internal points with no extension point (each checked against verl's source and refused loudly if verl moved,
:func:`check_verl`):

1. ``verl/utils/distributed.py:89`` ``initialize_global_process_group_ray`` builds the backend string
   ``"cpu:gloo,{device}:{backend}"`` = ``"cpu:gloo,cpu:gloo"`` on a CPU platform, which torch rejects ("Duplicate
   device type cpu"): its ``backend`` default becomes ``"gloo"`` (the function's ``__defaults__``, so the names other
   modules imported see it too).
2. ``verl/workers/engine/fsdp/transformer_impl.py:462`` gives forward-only FSDP2 engines (the reference policy)
   ``CPUOffloadPolicy(pin_memory=True)``; ``pin_memory()`` fails on CPU-only torch: the module's ``CPUOffloadPolicy``
   name is rebound to a subclass that never pins.
3. ``verl/models/transformers/monkey_patch.py:23`` binds the kernel that verl's Ulysses wrapper
   (``_ulysses_flash_attention_forward``, installed over transformers' flash wrapper at ``monkey_patch.py:546-551``)
   calls after its all-to-all: flash-attn, which has no CPU build. It is rebound to :func:`varlen_sdpa_attention`
   (SDPA per packed sequence, split where position ids restart at 0), and :data:`ATTN_IMPL` is registered with
   transformers' ``AttentionInterface`` as transformers' own flash wrapper, so that verl's packed (remove-padding)
   forward and its Ulysses all-to-all are on the call path exactly as on the GPUs.
The worker-side adapter goes into verl's private ``_ROLLOUT_REGISTRY`` (``workers/rollout/base.py:89``): verl has no
public registration for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import threading
from typing import Any

import torch
import torch.nn.functional as F

VERL_VERSION = "0.9.1"
"""The verl release the internal patches below were written against (pinned in pyproject.toml)."""
PLATFORM = "cpu"
ROLLOUT = "creditlab_cpu"
"""``actor_rollout_ref.rollout.name`` of the CPU replica."""
ATTN_IMPL = "creditlab_varlen"
"""transformers attention implementation of CPU runs (``model.override_config.attn_implementation``)."""
SERVER_PREFIX = "creditlab_cpu_server_"
MIN_RAY_CPUS = 16
"""Logical CPUs Ray needs for verl's task runner, TransferQueue, storage units and the worker bundle (with 8 it hangs
silently after printing its config: research/verl-on-cpu.md)."""


class VerlMoved(RuntimeError):
    """verl is not the release (or layout) the CPU patches were written for."""


def device_of(run_cfg: dict | None) -> str:
    """``cuda`` (the default) or ``cpu``: the run config's ``verl.device``."""
    return str(((run_cfg or {}).get("verl") or {}).get("device", "cuda"))


# ------------------------------------------------------------------------------------------------------
# the launcher's side


def cpu_env() -> dict[str, str]:
    """Environment of a CPU verl run (added to the job's; every Ray worker inherits it through the runtime env)."""
    return {
        "VERL_PLATFORM": PLATFORM,
        "VERL_ENGINE_DEVICE": "cuda",  # the FSDP engines register for cuda only
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_DEDUP_LOGS": "0",
        # Ray starts one idle Python worker per logical CPU for the first driver (raylet --num_prestart_python_workers
        # = num_cpus, ray/_private/services.py:2020): 16 here, ~0.3 GB and a few CPU-seconds of imports each, none of
        # them usable by verl's actors (their runtime env differs). Measured: 7 idle workers (600 MB) 15 s after
        # ray.init with prestart, 2 (111 MB) without. Workers start on demand instead.
        "RAY_prestart_worker_first_driver": "0",
        "RAY_enable_worker_prestart": "0",
    }


def cpu_overrides(run_cfg: dict) -> dict[str, Any]:
    """verl overrides (key -> value) that put a run on the CPU; the launcher applies them last.

    FSDP2 (the launcher's strategy) over gloo in float32, the varlen SDPA attention, our rollout
    replica with one agent worker, Ray with fake GPUs and >= :data:`MIN_RAY_CPUS` logical CPUs, no torch.compile.
    """
    v = run_cfg["model"]["verl"]
    gpus = int(v["nnodes"]) * int(v["n_gpus_per_node"])
    arr = "actor_rollout_ref"
    o: dict[str, Any] = {
        "trainer.device": "cpu",
        "ray_kwargs.ray_init.num_cpus": max(MIN_RAY_CPUS, 8 * gpus),
        "+ray_kwargs.ray_init.num_gpus": gpus,
        "+ray_kwargs.ray_init.include_dashboard": False,
        f"+{arr}.model.override_config.attn_implementation": ATTN_IMPL,
        f"{arr}.model.enable_gradient_checkpointing": False,
        f"{arr}.model.use_fused_kernels": False,
        f"{arr}.rollout.name": ROLLOUT,
        f"{arr}.rollout.agent.num_workers": 1,
        f"{arr}.rollout.free_cache_engine": False,
        f"{arr}.rollout.calculate_log_probs": True,
        "reward.num_workers": 1,
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 2,
    }
    for role in ("actor", "ref"):  # strategy fsdp2 as on the GPUs (the launcher's); float32 on a CPU
        o[f"{arr}.{role}.fsdp_config.dtype"] = "float32"
        o[f"{arr}.{role}.use_torch_compile"] = False
        o[f"{arr}.{role}.fsdp_config.use_torch_compile"] = False  # what the FSDP engine reads (torch.compile of the
        #   entropy at transformer_impl.py:183-187): on a CPU a ~10 s compile in the first old-log-prob pass
        o[f"+{arr}.{role}.fsdp_config.mixed_precision"] = {
            "param_dtype": "fp32",
            "reduce_dtype": "fp32",
            "buffer_dtype": "fp32",
        }
        #   verl computes in bf16 whatever fsdp_config.dtype says (mixed_precision None -> param_dtype bf16,
        #   transformer_impl.py:391-399): on a CPU bf16 is slow, and it would put bf16 rounding (~0.03 on hidden
        #   states of size 10) between the actor and the float32 CPU rollout, and into ARCA's residual
    if (run_cfg["trainer"].get("lora") or {}).get("enable"):  # the CPU rollout loads full tensors: merged adapters
        o[f"{arr}.model.lora.merge"] = True
    o[f"{arr}.actor.fsdp_config.param_offload"] = False
    o[f"{arr}.actor.fsdp_config.optimizer_offload"] = False
    o[f"{arr}.ref.fsdp_config.param_offload"] = False
    return o


# ------------------------------------------------------------------------------------------------------
# attention: SDPA over packed sequences (the kernel behind verl's Ulysses wrapper)


def _segments(position_ids: torch.Tensor, length: int) -> list[tuple[int, int]]:
    """[start, end) of each packed sequence of a row: a sequence starts where position ids restart at 0."""
    pos = position_ids.reshape(-1)[:length]
    starts = torch.nonzero(pos == 0).reshape(-1).tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return list(zip(starts, [*starts[1:], length]))


def varlen_sdpa_attention(
    query_states: torch.Tensor,
    key_states: torch.Tensor,
    value_states: torch.Tensor,
    attention_mask: torch.Tensor | None,
    query_length: int,
    *args: Any,
    position_ids: torch.Tensor | None = None,
    is_causal: bool = True,
    softmax_scale: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' ``_flash_attention_forward`` contract on a CPU: q (B, S, H, D), k/v (B, S, Hk, D) ->
    (B, S, H, D), causal attention within each packed sequence (split where ``position_ids`` restart at 0), GQA by
    repeating k/v heads. A padded batch (``attention_mask`` (B, S), 1 = token) attends over its real tokens only.
    """
    B, S, H, D = query_states.shape
    rep = H // key_states.shape[2]
    k = key_states.repeat_interleave(rep, dim=2) if rep > 1 else key_states
    v = value_states.repeat_interleave(rep, dim=2) if rep > 1 else value_states
    out = torch.zeros_like(query_states)
    for b in range(B):
        if position_ids is not None:
            segs = _segments(position_ids[b if position_ids.shape[0] == B else 0], S)
        else:
            segs = [(0, S)]
        keep = None if attention_mask is None or attention_mask.dim() != 2 else attention_mask[b].bool()
        for s, e in segs:
            q_, k_, v_ = (t[b, s:e].transpose(0, 1) for t in (query_states, k, v))  # (H, L, D)
            if keep is not None:
                m = keep[s:e]
                idx = torch.nonzero(m).reshape(-1)
                if idx.numel() == 0:
                    continue
                q_, k_, v_ = q_[:, idx], k_[:, idx], v_[:, idx]
            o = F.scaled_dot_product_attention(q_, k_, v_, is_causal=is_causal, scale=softmax_scale, dropout_p=dropout)
            if keep is not None:
                out[b, s + idx] = o.transpose(0, 1).to(out.dtype)
            else:
                out[b, s:e] = o.transpose(0, 1).to(out.dtype)
    return out


# ------------------------------------------------------------------------------------------------------
# verl version and the internal patches


def check_verl() -> None:
    """Refuse (VerlMoved) a verl other than :data:`VERL_VERSION`, or one whose patched internals moved."""
    import verl

    if getattr(verl, "__version__", None) != VERL_VERSION:
        raise VerlMoved(
            f"creditlab.engines.verl.cpu patches verl {VERL_VERSION} internals; found verl "
            f"{getattr(verl, '__version__', '?')}: re-check the three points in this module's docstring"
        )
    from verl.models.transformers import monkey_patch
    from verl.utils import distributed
    from verl.workers.engine.fsdp import transformer_impl

    params = list(inspect.signature(distributed.initialize_global_process_group_ray).parameters)
    src = inspect.getsource(distributed.initialize_global_process_group_ray)
    if params != ["timeout_second", "backend"] or 'f"cpu:gloo,{get_device_name()}' not in src:
        raise VerlMoved("verl/utils/distributed.py initialize_global_process_group_ray changed (point 1)")
    if not hasattr(
        transformer_impl, "CPUOffloadPolicy"
    ) or "CPUOffloadPolicy(pin_memory=True)" not in inspect.getsource(transformer_impl):
        raise VerlMoved(
            "verl/workers/engine/fsdp/transformer_impl.py no longer builds CPUOffloadPolicy(pin_memory="
            "True) from its module-level name (point 2)"
        )
    if not hasattr(monkey_patch, "_flash_attention_forward") or "_flash_attention_forward(" not in inspect.getsource(
        monkey_patch._ulysses_flash_attention_forward
    ):
        raise VerlMoved(
            "verl/models/transformers/monkey_patch.py: _ulysses_flash_attention_forward no longer calls "
            "the module-level _flash_attention_forward (point 3)"
        )


def _patch_internals() -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy
    from transformers import AttentionInterface
    from transformers.integrations.flash_attention import flash_attention_forward
    from verl.models.transformers import monkey_patch
    from verl.utils import distributed
    from verl.workers.engine.fsdp import transformer_impl

    fn = distributed.initialize_global_process_group_ray  # point 1
    fn.__defaults__ = (fn.__defaults__[0] if fn.__defaults__ else None, "gloo")

    if not getattr(transformer_impl.CPUOffloadPolicy, "creditlab_no_pin", False):  # point 2

        class UnpinnedCPUOffloadPolicy(CPUOffloadPolicy):
            creditlab_no_pin = True

            def __init__(self, pin_memory: bool = False):
                super().__init__(pin_memory=False)

        transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy

    monkey_patch._flash_attention_forward = varlen_sdpa_attention  # point 3
    AttentionInterface.register(ATTN_IMPL, flash_attention_forward)


_INSTALLED = False


def install() -> None:
    """Register the CPU platform, rollout replica and adapter, and patch verl's three internals (idempotent).
    Called in every verl process by the plug-in when ``VERL_PLATFORM=cpu``."""
    global _INSTALLED
    if _INSTALLED:
        return
    from verl.plugin.platform.platform_manager import PlatformRegistry

    if PlatformRegistry.get(PLATFORM) is None:  # first: verl's modules ask for the platform when imported
        PlatformRegistry.register(PLATFORM)(_platform_class())
    check_verl()
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT, _replica_class)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = f"{__name__}.CPUServerAdapter"  # private: no public API
    _patch_internals()
    _INSTALLED = True


# ------------------------------------------------------------------------------------------------------
# the platform


class _CPUDeviceModule:
    """``torch.cpu`` with the ``torch.cuda`` calls verl makes on its device module (memory queries, RNG state,
    caches) answered for a CPU: memory numbers are zeros (there is no device memory to report)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def _zero(*a: Any, **k: Any) -> int:
        return 0

    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = _zero

    @staticmethod
    def _none(*a: Any, **k: Any) -> None:
        return None

    empty_cache = synchronize = reset_peak_memory_stats = set_device = ipc_collect = _none

    @staticmethod
    def mem_get_info(*a: Any, **k: Any) -> tuple[int, int]:
        return (16 << 30, 16 << 30)

    @staticmethod
    def get_rng_state(*a: Any, **k: Any) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, *a: Any, **k: Any) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def get_device_name(*a: Any, **k: Any) -> str:  # a string: verl's flops counter tests `key in name`
        return "cpu"

    @staticmethod
    def is_available() -> bool:
        return True


CPU_DEVICE = _CPUDeviceModule()


def _platform_class() -> type:
    from contextlib import contextmanager

    from verl.plugin.platform.platform_base import PlatformBase

    class PlatformCPU(PlatformBase):
        """verl's device interface on a CPU: gloo, no memory or profiling, Ray's (fake) GPU resource."""

        device_name = "cpu"
        vendor_name = "cpu"

        @property
        def device_module(self):
            return CPU_DEVICE

        def is_available(self) -> bool:
            return True

        def current_device(self):  # a string: verl's fsdp_utils builds torch.device(current_device())
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index=None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0):
            return (None, None)

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        @property
        def cudart(self):
            return None

        def get_rng_state(self, *a, **k):  # verl saves/restores device RNG state in checkpoints
            return torch.get_rng_state()

        def set_rng_state(self, state, *a, **k):
            torch.set_rng_state(state)

        def mem_get_info(self, *a, **k):
            return (16 << 30, 16 << 30)

        def memory_allocated(self, *a, **k):
            return 0

        def memory_reserved(self, *a, **k):
            return 0

        def max_memory_allocated(self, *a, **k):
            return 0

        def max_memory_reserved(self, *a, **k):
            return 0

    return PlatformCPU


# ------------------------------------------------------------------------------------------------------
# the rollout: server actor, replica, worker-side adapter


def _seed_of(prompt_ids: list[int], global_steps: int | None, k: int) -> int:
    """The sampling seed of the k-th request for ``prompt_ids`` under the weights of ``global_steps``: a function of
    what is sampled, not of verl's random request ids, so that a resumed run samples what an uninterrupted one did
    (the k samples of one prompt are exchangeable: which request gets which seed does not change the group)."""
    key = f"{','.join(map(str, prompt_ids))}/{global_steps}/{k}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little")


def _hf_name(name: str, own: dict) -> str:
    """A synced tensor's name in the rollout model's state dict (peft / FSDP wrapper prefixes dropped)."""
    for prefix in ("base_model.model.", "_fsdp_wrapped_module.", "module."):
        if name not in own and name.startswith(prefix):
            name = name[len(prefix) :]
    return name.replace(".base_layer.", ".") if name not in own else name


class CPURolloutServer:
    """A Ray actor serving verl's ``generate`` from an HF causal LM on the CPU, with creditlab's KV-cache sampler.

    The weights are the actor's: :meth:`update_weights` loads the full state dict the trainer's adapter sends
    before every step (verl's naive weight sync). Counters: ``syncs`` and the weights' checksum after each."""

    def __init__(self, model_path: str, response_length: int, eos_ids: list[int]):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        self.response_length = int(response_length)
        self.eos_ids = [int(i) for i in eos_ids]
        self.version = 0
        self.global_steps: int | None = None
        self._requests: dict[tuple, int] = {}  # (prompt ids, global steps) -> requests so far (sampling seeds)
        self._lock = threading.Lock()
        self.syncs: list[dict[str, Any]] = []

    def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> dict[str, Any]:
        own = self.model.state_dict()
        state = {_hf_name(k, own): v for k, v in state.items()}
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise KeyError(f"weights the rollout model does not have: {unknown[:5]}")
        missing = sorted(k for k in set(own) - set(state) if not k.endswith("lm_head.weight"))
        if missing:
            raise KeyError(f"weight sync left the rollout's {missing[:5]} stale")
        self.model.load_state_dict(state, strict=False)
        if getattr(self.model.config, "tie_word_embeddings", False):
            self.model.tie_weights()
        self.version += 1
        self.global_steps = global_steps
        with self._lock:
            self._requests.clear()  # new weights: seeds restart per (prompt, step)
        checksum = float(sum(p.double().sum().item() for p in self.model.parameters()))
        self.syncs.append(
            {"version": self.version, "global_steps": global_steps, "tensors": len(state), "checksum": checksum}
        )
        return self.syncs[-1]

    def sync_log(self) -> list[dict[str, Any]]:
        return list(self.syncs)

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, **_: Any):
        from verl.workers.rollout.replica import TokenOutput

        from creditlab.lm.sampler import SamplingParams, generate

        temperature = float(sampling_params.get("temperature", 1.0))
        greedy = temperature <= 0
        top_k = int(sampling_params.get("top_k", -1) or -1)
        max_new = int(
            sampling_params.get("max_tokens") or sampling_params.get("max_new_tokens") or self.response_length
        )
        with self._lock:
            slot = (tuple(prompt_ids), self.global_steps)
            k = self._requests.get(slot, 0)
            self._requests[slot] = k + 1
        params = SamplingParams(
            max_new_tokens=max_new,
            eos_id=tuple(self.eos_ids),  # stops at the first of them, included
            greedy=greedy,
            temperature=1.0 if greedy else temperature,
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=max(0, top_k),
            seed=_seed_of(list(prompt_ids), self.global_steps, k),
        )
        gen = generate(self.model, [list(prompt_ids)], params)
        resp = list(gen.response_ids[0])
        ids = torch.tensor([list(prompt_ids) + resp])
        logits = self.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
        logp = torch.log_softmax(logits / (1.0 if greedy else temperature), -1)
        lp = logp.gather(-1, torch.tensor(resp)[:, None]).reshape(-1).tolist() if resp else []
        return TokenOutput(
            token_ids=resp, log_probs=lp, stop_reason="completed", extra_fields={"global_steps": self.global_steps}
        )

    # verl's control calls: nothing to release on a CPU
    async def wake_up(self):
        return None

    async def sleep(self):
        return None

    async def abort_all_requests(self, reject_request: bool = False):
        return None

    async def resume_generation(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


def _stop_ids(model_path: str) -> list[int]:
    """The stop token ids of a checkpoint (:func:`creditlab.eval.evaluate.stop_token_ids`, as the evaluator)."""
    from transformers import AutoTokenizer

    from creditlab.eval.evaluate import stop_token_ids

    return stop_token_ids(AutoTokenizer.from_pretrained(model_path), model_path)


def _replica_class() -> type:
    import ray
    from verl.workers.rollout.replica import RolloutReplica

    class CPUReplica(RolloutReplica):
        """verl's rollout replica on a CPU: one :class:`CPURolloutServer` actor, named for the adapter to find."""

        async def launch_servers(self):
            path = getattr(self.model_config, "local_path", None) or self.model_config.path
            eos = _stop_ids(path)
            name = f"{SERVER_PREFIX}{self.replica_rank}"
            server = (
                ray.remote(CPURolloutServer)
                .options(name=name, num_cpus=0, max_concurrency=16)
                .remote(path, self.config.response_length, eos)
            )
            self.servers = [server]
            self._server_handle = server
            self._server_address = name

    return CPUReplica


def server_syncs(replica_rank: int = 0) -> list[dict[str, Any]]:
    """The weight syncs replica ``replica_rank``'s server received (from the driver or a test)."""
    import ray

    return ray.get(ray.get_actor(f"{SERVER_PREFIX}{replica_rank}").sync_log.remote())


try:  # the adapter subclasses verl's BaseRollout; importable without verl for the pure parts above
    from verl.workers.rollout.base import BaseRollout as _BaseRollout
except ImportError:  # pragma: no cover - verl is a dependency
    _BaseRollout = object


class CPUServerAdapter(_BaseRollout):
    """verl's worker-side rollout (the hybrid worker's ``self.rollout``) for :class:`CPUReplica`: receives the
    actor's full tensors in verl's naive weight sync and sends them to its replica's server (rollout rank 0)."""

    def __init__(self, config, model_config, device_mesh, *args, **kwargs):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", 0))
        world = (
            int(self.config.tensor_model_parallel_size)
            * int(self.config.data_parallel_size)
            * int(self.config.pipeline_model_parallel_size)
        )
        self.replica_rank, self.rollout_rank = rank // world, rank % world
        self.sleep_level = 1

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(
        self, weights, wire_format: str = "named_tensors", peft_config=None, global_steps: int | None = None, **kwargs
    ):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"weight sync wire format {wire_format!r} on the CPU rollout")
        if peft_config is not None:
            raise NotImplementedError(
                "LoRA adapters on the CPU rollout: verl syncs adapter weights separately; set "
                "actor_rollout_ref.model.lora.merge=true (the launcher does on CPU runs)"
            )
        state = {}
        for name, tensor in weights:  # every rank takes part in gathering the full tensors
            if self.rollout_rank == 0:
                t = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
                state[name] = t.detach().to("cpu", torch.float32).clone()
        if self.rollout_rank == 0:
            import ray

            server = ray.get_actor(f"{SERVER_PREFIX}{self.replica_rank}")
            await asyncio.wrap_future(server.update_weights.remote(state, global_steps).future())
