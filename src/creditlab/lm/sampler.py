"""Batched KV-cache sampler for transformers causal LMs (local RL engine, evaluation, decoding, analyses).

Every rollout and every evaluation at ``tiny`` scale goes through :func:`generate`, so it is built for
speed on small models, where the per-step cost is dominated by overhead rather than FLOPs:

* prompts are left-padded; positions restart at 0 on each prompt's first real token; a 4-D mask is
  built once and passed to the model as-is (no per-step mask construction);
* the KV cache is preallocated (:class:`PreallocCache`, a ``transformers.Cache``): one slice write per
  layer and step instead of ``DynamicCache``'s ``torch.cat`` of the whole cache;
* during decoding the model runs with a registered attention function (:data:`ATTN_IMPL`) that folds
  the grouped query heads onto their shared KV head instead of copying K/V ``n_rep`` times;
* rows that emitted EOS are dropped from the batch (KV cache included) once enough of them have
  accumulated (:data:`COMPACT_FRACTION`); decoding stops as soon as every row is done.

The loop is written around :class:`DecodeState` (one model, one batch: cache, mask, positions) so that
several models can be stepped together. The one loop is :func:`decode_with_chooser`: it steps a list of
states and asks a :class:`Chooser` for the next tokens given every state's logits and the step's
uniforms; the chooser may also return per-row flags, which the loop counts per sequence (selective
extrapolation decoding in :mod:`creditlab.decoding.extrapolation` counts its resampled tokens this
way). :func:`generate_with` is the case "combine the logits, then sample" (a ``combine`` function maps
the states' logits to the logits to sample from) and :func:`generate` is its one-model case.

Every decoder takes what decides its outputs as one :class:`SamplingParams` (token choice, length, stop tokens,
seed) and passes it on as is (the evaluator's ``generate_fn`` s, the selective extrapolation decoders, the vLLM
backend through its worker: ``dataclasses.asdict`` there, ``SamplingParams(**fields)`` back); only execution
arguments that cannot change an output (``batch_size``, ``progress``) are separate keywords.

Randomness: ``Chooser.n_streams`` uniform numbers per (prompt, step) are drawn up front from a
``torch.Generator`` seeded with ``seed`` (stream s is the s-th ``torch.rand(n_prompts, max_new_tokens)``
drawn from it, so stream 0 is the same for every chooser) and each token is sampled by inverting the
CDF of its (filtered) distribution. Which uniform a token uses therefore depends only on the prompt's
index and the step, not on ``batch_size``, the row compaction or the device: the same inputs and seed
give identical outputs. Changing ``batch_size`` can only change an output through floating-point
differences of the model's forward under a different batch shape (a token exactly at a CDF boundary),
which is vanishingly rare.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from creditlab.progress import progress as progress_bar

ATTN_IMPL = "creditlab_decode"
"""Name under which the sampler's attention function is registered in ``transformers``."""

COMPACT_FRACTION = 0.25
"""Finished rows are dropped from the batch once they are at least this fraction of its rows."""

DEFAULT_BATCH_SIZE = 512
"""Prompts decoded together when ``batch_size`` is None."""

PAD_ID = 0
"""The id prompts are left-padded with and finished rows are fed: any id of the vocabulary (padded positions are
masked out, finished rows' outputs dropped), so no decoder takes a tokenizer's pad id."""

Combine = Callable[[list[Tensor]], Tensor]
ChooseFn = Callable[[list[Tensor], Tensor | None], tuple[Tensor, Tensor | None]]


@dataclass
class Generation:
    """Output of :func:`generate`, one entry per prompt, in input order.

    response_ids: generated tokens without padding; ends with EOS when EOS was emitted.
    finished: True when EOS was emitted within ``max_new_tokens``.
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    finished: list[bool]


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """What decides a decoded response: how each token is chosen, where a response stops, the random streams.

    Every decoder (:func:`generate`, the selective extrapolation decoders, the vLLM backend, the evaluator's
    ``generate_fn`` s) takes one and passes it on as is. What only changes how the work is done (``batch_size``, the
    progress bar, the padding id) is not in it: the outputs do not depend on it (module docstring).

    greedy: argmax (temperature, top_p, top_k and seed unused). Otherwise, in HF order: logits / temperature, then
    top-k (0 = off), then nucleus top-p (1.0 = off; HF semantics: keep the smallest set of tokens whose cumulative
    probability reaches top_p, always keeping the most likely token).
    max_new_tokens: at most this many tokens per response (>= 0). None only where nothing is decoded (choosing one
    token: :func:`choose_tokens`); a decoder refuses it.
    eos_id: the stop token, or several (a hub checkpoint's stop tokens; a list is kept as a tuple): a row that emits
    one stops, the token included in its response. None: no stop token (every response has max_new_tokens tokens).
    seed: seed of the random streams (module docstring): same inputs and seed -> same outputs.
    """

    greedy: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int | None = None
    eos_id: int | tuple[int, ...] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.eos_id, (list, tuple)):
            object.__setattr__(self, "eos_id", tuple(int(i) for i in self.eos_id))
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.greedy:
            return
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling (use greedy=True), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The stop tokens as a tuple (empty: none)."""
        if self.eos_id is None:
            return ()
        return self.eos_id if isinstance(self.eos_id, tuple) else (int(self.eos_id),)

    def length(self) -> int:
        """``max_new_tokens``, refusing None (a decoder needs a length)."""
        if self.max_new_tokens is None:
            raise ValueError("decoding needs SamplingParams.max_new_tokens (None: only a token choice)")
        return int(self.max_new_tokens)


@dataclass(frozen=True)
class Chooser:
    """How :func:`decode_with_chooser` picks the next tokens from the stepped states' logits.

    choose(logits, uniforms) -> (tokens, flags): logits is the list of next-token logits [B, V]
    (float32), one per state in the order given to the loop; uniforms [B, n_streams] in [0, 1) are the
    step's pre-drawn uniforms of each row (None when ``n_streams == 0``); tokens [B] int64; flags
    [B, len(flag_names)] bool or None. The loop counts each flag per sequence over the tokens that
    sequence generated (steps after its EOS are not counted) and reports the counts under
    ``flag_names``. ``choose`` must treat rows independently (row i's outputs depend only on row i's
    inputs), which is what makes the result batch-size invariant.
    """

    choose: ChooseFn
    n_streams: int = 1
    flag_names: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------- attention
def decode_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[Tensor, None]:
    """Attention function used while the sampler runs a model (registered as :data:`ATTN_IMPL`).

    query: [B, H, q, D]; key, value: [B, Hkv, L, D]; attention_mask: [B, 1, q, L], bool (True = attend)
    or additive float. Returns ([B, q, H, D], None) like the ``transformers`` attention functions.

    With one query token (a decode step), the ``H / Hkv`` query heads of each KV group are folded into
    the query-length axis, so every group is one [rep, D] x [D, L] product against its KV head and the
    cache is never copied. Prefill (q > 1) is delegated to the ``transformers`` SDPA function.
    """
    batch, n_heads, q_len, head_dim = query.shape
    if q_len > 1 or dropout > 0.0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling)
    n_kv = key.shape[1]
    scale = head_dim**-0.5 if scaling is None else scaling
    q = query.view(batch, n_kv, n_heads // n_kv, head_dim)  # [B, Hkv, rep, D]
    scores = torch.matmul(q, key.transpose(2, 3)) * scale  # [B, Hkv, rep, L]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs, value)  # [B, Hkv, rep, D]
    return out.view(batch, 1, n_heads, head_dim), None


AttentionInterface.register(ATTN_IMPL, decode_attention)


@contextmanager
def decode_attention_enabled(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` with :func:`decode_attention` inside the block; restore its attention after."""
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = ATTN_IMPL
    try:
        yield
    finally:
        config._attn_implementation = previous


# --------------------------------------------------------------------------------------------- KV cache
class PreallocLayer(CacheLayerMixin):
    """One layer's KV cache in preallocated buffers [B, Hkv, capacity, D]; ``length`` slots are filled."""

    is_sliding = False

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        """Allocate the buffers with the shape, dtype and device of the first states [B, Hkv, q, D]."""
        b, h, _, dk = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = key_states.new_zeros(b, h, self.capacity, dk)
        self.values = value_states.new_zeros(b, h, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """Append states [B, Hkv, q, D]; return views of all cached keys and values [B, Hkv, length, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache overflow: {end} tokens > capacity {self.capacity}")
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def select_rows(self, rows: Tensor) -> None:
        """Keep only batch rows ``rows`` [B'] (int64, on the cache's device)."""
        if self.is_initialized:
            self.keys = self.keys.index_select(0, rows)
            self.values = self.values.index_select(0, rows)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_cache_shape(self) -> int:
        return self.capacity

    def get_max_length(self) -> int:
        """The cache's capacity: abstract in transformers >= 5.17's ``CacheLayerMixin`` (the GPU image's 5.17 and
        .venv-vllm's 5.19 refuse to instantiate a layer without it)."""
        return self.capacity


class PreallocCache(Cache):
    """A ``transformers`` cache of :class:`PreallocLayer` (one per decoder layer) that can drop rows."""

    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[PreallocLayer(capacity) for _ in range(num_layers)])

    def select_rows(self, rows: Tensor) -> None:
        """Keep only batch rows ``rows`` [B'] in every layer."""
        for layer in self.layers:
            layer.select_rows(rows)


# --------------------------------------------------------------------------------------------- decode state
class DecodeState:
    """Incremental decoding of one model over one batch: KV cache, attention mask and positions.

    Usage: ``logits = state.prefill(ids, mask, max_new_tokens)`` then ``logits = state.step(tokens)``
    once per generated token, and ``state.select_rows(rows)`` to drop finished rows. Must be used
    inside :func:`decode_attention_enabled` (``generate_with`` does it) and under ``torch.no_grad``.
    A state can be reused: ``prefill`` starts a new batch.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache: PreallocCache | None = None
        self.bias: Tensor | None = None  # [B, 1, 1, capacity] additive: 0 = attend, -inf = prompt padding
        self.next_pos: Tensor | None = None  # [B, 1] position id of the next token
        self.length = 0  # filled cache slots (prompt width + generated tokens)

    def prefill(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> Tensor:
        """Run the left-padded prompts and return the next-token logits.

        input_ids, attention_mask: [B, P] (mask 1 = real token, padding on the left).
        Returns logits [B, V] (float32) at each prompt's last position.
        """
        ids = input_ids.to(self.device)
        real = attention_mask.to(self.device).bool()  # [B, P]
        batch, width = ids.shape
        capacity = width + max(max_new_tokens, 1)
        positions = (real.long().cumsum(-1) - 1).clamp(min=0)  # [B, P]
        self.next_pos = positions[:, -1:] + 1
        self.bias = torch.zeros(batch, 1, 1, capacity, device=self.device)
        self.bias[:, 0, 0, :width].masked_fill_(~real, float("-inf"))
        self.cache = PreallocCache(self.model.config.num_hidden_layers, capacity)
        self.length = width
        return self._forward(ids, _prefill_mask(real), positions)

    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row, tokens [B] (int64); return the next-token logits [B, V] (float32)."""
        self.length += 1
        logits = self._forward(tokens.view(-1, 1), self.bias[..., : self.length], self.next_pos)
        self.next_pos = self.next_pos + 1
        return logits

    def select_rows(self, rows: Tensor) -> None:
        """Keep only batch rows ``rows`` [B'] (int64, any device) in the cache, mask and positions."""
        rows = rows.to(self.device)
        self.cache.select_rows(rows)
        self.bias = self.bias.index_select(0, rows)
        self.next_pos = self.next_pos.index_select(0, rows)

    def _forward(self, ids: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
        """ids, positions [B, q]; mask [B, 1, q, L] -> logits of the last position [B, V] (float32)."""
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].float()


def _prefill_mask(real: Tensor) -> Tensor:
    """Causal + padding mask [B, 1, P, P] (bool, True = attend) from the real-token mask real [B, P].

    Padding queries also attend to themselves so that no row is fully masked (which would give NaN).
    """
    width = real.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=real.device).tril()
    mask = causal & real[:, None, :]  # [B, P, P]
    mask |= torch.eye(width, dtype=torch.bool, device=real.device)
    return mask[:, None]


# --------------------------------------------------------------------------------------------- sampling
def filter_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """Temperature and top-k on logits [B, V] -> logits [B, V] with removed tokens at -inf (HF order)."""
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def nucleus(logits: Tensor, top_p: float) -> tuple[Tensor, Tensor]:
    """Top-p filter with HF semantics on logits [B, V].

    Returns (sorted_logits [B, V] ascending with tokens outside the nucleus at -inf, order [B, V] the
    vocabulary ids of the sorted entries). The most likely token is always kept.
    """
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cum <= (1 - top_p)
    remove[:, -1] = False
    return sorted_logits.masked_fill(remove, float("-inf")), order


def inverse_cdf(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Sample one index per row of unnormalised probs [B, V] from uniforms [B] in [0, 1) -> [B] int64.

    Index j is returned iff cdf[j-1] <= u * total < cdf[j]: zero-probability entries are never chosen
    (u < 1 gives u * total < total in floating point, so the index is always < V).
    """
    cdf = probs.cumsum(dim=-1)  # [B, V]
    target = uniforms[:, None] * cdf[:, -1:]  # [B, 1]
    return (cdf <= target).sum(dim=-1)


def choose_tokens(logits: Tensor, params: SamplingParams, uniforms: Tensor | None) -> Tensor:
    """Next tokens [B] (int64) from logits [B, V]; uniforms [B] in [0, 1) drive the sampling."""
    if params.greedy:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits, params)
    if params.top_p < 1.0:
        sorted_logits, order = nucleus(logits, params.top_p)
        idx = inverse_cdf(torch.softmax(sorted_logits, dim=-1), uniforms)
        return order.gather(1, idx[:, None]).squeeze(1)
    return inverse_cdf(torch.softmax(logits, dim=-1), uniforms)


# --------------------------------------------------------------------------------------------- generation
def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Left-pad token lists -> (input_ids [B, P] int64, attention_mask [B, P] int64, 1 = real token)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty")
        ids[i, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def _decode_batch(
    states: Sequence[DecodeState],
    chooser: Chooser,
    prompts: Sequence[Sequence[int]],
    uniforms: Tensor | None,
    max_new_tokens: int,
    stop_ids: Sequence[int],
) -> tuple[list[list[int]], list[bool], Tensor]:
    """Decode one batch of prompts with all ``states`` stepped together, at most ``max_new_tokens`` tokens each.

    uniforms: [B, max_new_tokens, n_streams] (None when the chooser uses none); stop_ids: the stop tokens (may be
    empty). Returns (responses, finished, flag_counts [B, n_flags] int64) per prompt. Rows that emitted a stop token
    stay in the batch (fed :data:`PAD_ID`, output ignored) until they are at least ``COMPACT_FRACTION`` of the rows,
    then they are dropped from every state.
    """
    pad_id = PAD_ID
    ids, mask = left_pad(prompts, pad_id)
    device = states[0].device
    n = len(prompts)
    out = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=device)
    n_gen = torch.zeros(n, dtype=torch.long, device=device)
    counts = torch.zeros(n, len(chooser.flag_names), dtype=torch.long, device=device)
    hit_eos = torch.zeros(n, dtype=torch.bool, device=device)
    rows = torch.arange(n, device=device)  # batch position -> prompt index in this batch
    alive = torch.ones(n, dtype=torch.bool, device=device)
    uniforms = uniforms.to(device) if uniforms is not None else None
    stops = torch.as_tensor(list(stop_ids), dtype=torch.long, device=device)
    logits = [s.prefill(ids, mask, max_new_tokens) for s in states]
    for t in range(max_new_tokens):
        u = uniforms[rows, t] if uniforms is not None else None
        tok, flags = chooser.choose(logits, u)
        tok = tok.masked_fill(~alive, pad_id)
        if flags is not None:
            counts[rows] += flags & alive[:, None]
        out[rows, t] = tok
        n_gen[rows] += alive
        done = torch.isin(tok, stops)
        hit_eos[rows] |= done
        alive &= ~done
        n_alive = int(alive.sum())
        if n_alive == 0 or t == max_new_tokens - 1:
            break
        if len(rows) - n_alive >= COMPACT_FRACTION * len(rows):
            keep = alive.nonzero().squeeze(1)
            for s in states:
                s.select_rows(keep)
            rows, alive, tok = rows[keep], alive[keep], tok[keep]
        logits = [s.step(tok) for s in states]
    lengths = n_gen.tolist()
    responses = [r[:k] for r, k in zip(out.tolist(), lengths)]
    return responses, hit_eos.tolist(), counts.cpu()


def draw_uniforms(n_prompts: int, max_new_tokens: int, n_streams: int, seed: int) -> Tensor | None:
    """The pre-drawn uniforms [n_prompts, max_new_tokens, n_streams] in [0, 1) (None if no stream).

    Stream s is the s-th ``torch.rand(n_prompts, max_new_tokens)`` of a generator seeded with ``seed``:
    stream 0 does not depend on how many streams are drawn.
    """
    if n_streams == 0:
        return None
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.rand(n_prompts, max_new_tokens, generator=gen) for _ in range(n_streams)], dim=-1)


def decode_with_chooser(
    states: Sequence[DecodeState],
    chooser: Chooser,
    prompt_ids: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    batch_size: int | None = None,
    progress: bool = False,
) -> tuple[Generation, dict[str, list[int]]]:
    """Decode ``prompt_ids`` stepping every state in ``states`` together; ``chooser`` picks the tokens.

    params: the length, stop tokens and seed (``chooser`` was built from its token choice). The chosen tokens are
    fed to every state. All states' models must share the vocabulary and live on the same device. ``batch_size``
    prompts are decoded at a time (None: :data:`DEFAULT_BATCH_SIZE`). Returns the generation and, for each of
    ``chooser.flag_names``, the per-prompt number of generated tokens at which that flag was set. See the module
    docstring for the random streams.
    """
    prompts = [list(p) for p in prompt_ids]
    if not states:
        raise ValueError("decoding needs at least one DecodeState")
    max_new_tokens = params.length()
    if not prompts or max_new_tokens == 0:
        empty = Generation(prompts, [[] for _ in prompts], [False] * len(prompts))
        return empty, {name: [0] * len(prompts) for name in chooser.flag_names}
    uniforms = draw_uniforms(len(prompts), max_new_tokens, chooser.n_streams, params.seed)
    size = batch_size or DEFAULT_BATCH_SIZE
    responses: list[list[int]] = []
    finished: list[bool] = []
    counts: list[Tensor] = []
    with ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        for model in {id(s.model): s.model for s in states}.values():
            stack.enter_context(decode_attention_enabled(model))
        starts = range(0, len(prompts), size)
        bar = progress_bar(len(prompts), "generate samples", enabled=progress)
        for start in starts:
            chunk = slice(start, start + size)
            u = None if uniforms is None else uniforms[chunk]
            r, f, c = _decode_batch(states, chooser, prompts[chunk], u, max_new_tokens, params.stop_ids)
            responses += r
            finished += f
            counts.append(c)
            bar.update(len(r))
        bar.close()
    per_flag = torch.cat(counts).T.tolist()
    return Generation(prompts, responses, finished), dict(zip(chooser.flag_names, per_flag))


def sampling_chooser(combine: Combine, params: SamplingParams) -> Chooser:
    """The chooser "sample ``combine(logits)`` with ``params``" (one uniform stream, none when greedy)."""

    def choose(logits: list[Tensor], uniforms: Tensor | None) -> tuple[Tensor, None]:
        return choose_tokens(combine(logits), params, None if uniforms is None else uniforms[:, 0]), None

    return Chooser(choose, n_streams=0 if params.greedy else 1)


def generate_with(
    states: Sequence[DecodeState],
    combine: Combine,
    prompt_ids: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    batch_size: int | None = None,
    progress: bool = False,
) -> Generation:
    """Decode ``prompt_ids`` stepping every state in ``states`` together.

    At each step ``combine([logits_1, ..., logits_m])`` (each [B, V] float32, one per state, same row
    order) returns the logits [B, V] the next token is chosen from with ``params`` (log-probabilities
    or any unnormalised logits); the chosen tokens are fed to every state. All states' models must
    share the vocabulary and live on the same device. ``batch_size`` prompts are decoded at a time
    (None: :data:`DEFAULT_BATCH_SIZE`). See the module docstring for the random stream.
    """
    chooser = sampling_chooser(combine, params)
    generation, _ = decode_with_chooser(states, chooser, prompt_ids, params, batch_size=batch_size, progress=progress)
    return generation


def _single(logits: list[Tensor]) -> Tensor:
    """Identity combine for one model: its logits [B, V]."""
    return logits[0]


def generate(
    model: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    batch_size: int | None = None,
    progress: bool = False,
) -> Generation:
    """Sample (or greedily decode) up to ``params.max_new_tokens`` tokens after each prompt with ``model``.

    prompt_ids: token lists of any lengths (left-padded internally). Decoding of a row stops after it emits one of
    ``params.eos_id`` (included in its response). Greedy decoding matches ``model.generate(do_sample=False)``;
    sampling applies temperature, top-k, then top-p (HF semantics) and is reproducible: same inputs and
    ``params`` -> same outputs (see module docstring). The model's train/eval mode is left as is; runs on the
    model's device.
    """
    return generate_with([DecodeState(model)], _single, prompt_ids, params, batch_size=batch_size, progress=progress)
