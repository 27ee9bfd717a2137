"""How rollouts become optimizer updates: mini-batch partitions (kind ``"batching"``) and the
reward-balanced buffer (Paper C, "The Cancellation Hypothesis", SPEC.md "Paper C" methods 1-2).

A batching function takes ``group_ids: Tensor[B]`` (prompt of each rollout), the number of
mini-batches M and a ``torch.Generator``; those that need them also name ``lengths: Tensor[B]``
(response tokens per rollout), ``seq_lengths: Tensor[B]`` (prompt + response tokens), ``advantages: Tensor[B]``
and ``n_ranks: int`` (data-parallel ranks)
as keyword parameters, and the engine passes what a function names (:func:`call_batching`).
It returns M index tensors that partition ``range(B)``: every rollout is used exactly once per
epoch. The token-count partitions also exist per data-parallel rank (:func:`partition_bins`:
``out[m][r]``), which a multi-rank engine (verl) uses and the tests check; the local engine trains
each mini-batch in one process.

Why it matters (Paper C): GRPO's group advantages sum to zero within a prompt, so the gradient
directions the rollouts of a prompt share cancel when they are in one update. verl, the papers' engine,
balances workload over data-parallel ranks and cuts each rank's rows into contiguous mini-batches
(:func:`verl_default_minibatches`, the baseline), which splits some groups across optimizer steps; a shuffle
(:func:`random_minibatches`) or a per-rollout token balance (:func:`token_balanced_minibatches`) splits nearly
all; :func:`query_preserved_minibatches` keeps every group whole. Every engine logs ``groups_split_frac``.
"""

from __future__ import annotations

import heapq
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from creditlab.algos.registry import register


def call_batching(
    fn: Callable,
    group_ids: Tensor,
    n_minibatches: int,
    generator: torch.Generator,
    *,
    lengths: Tensor | None = None,
    seq_lengths: Tensor | None = None,
    advantages: Tensor | None = None,
    n_ranks: int = 1,
) -> list[Tensor]:
    """Call a registered batching function with the context it names (lengths, seq_lengths, advantages, n_ranks)."""
    ctx = {"lengths": lengths, "seq_lengths": seq_lengths, "advantages": advantages, "n_ranks": n_ranks}
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in ctx.items() if k in params}
    missing = [k for k, v in kwargs.items() if v is None]
    if missing:
        raise ValueError(f"batching {fn.__name__} needs {missing}, which the engine did not pass")
    return fn(group_ids, n_minibatches, generator, **kwargs)


@register("batching", "random")
def random_minibatches(group_ids: Tensor, n_minibatches: int, generator: torch.Generator) -> list[Tensor]:
    """Shuffle rollouts, then cut into ``n_minibatches`` near-equal chunks [ours].

    The rollouts of one prompt generally land in different optimizer steps (not the papers' engine order:
    :func:`verl_default_minibatches`).
    """
    perm = torch.randperm(group_ids.numel(), generator=generator)
    return [chunk for chunk in torch.tensor_split(perm, n_minibatches) if chunk.numel()]


@register("batching", "sequential")
def sequential_minibatches(group_ids: Tensor, n_minibatches: int, generator: torch.Generator) -> list[Tensor]:
    """Rollouts in batch order (groups contiguous), cut into ``n_minibatches`` near-equal chunks."""
    idx = torch.arange(group_ids.numel())
    return [chunk for chunk in torch.tensor_split(idx, n_minibatches) if chunk.numel()]


def _balanced_bins(loads: Tensor, sizes: Tensor, n_bins: int, order_noise: Tensor) -> list[list[int]]:
    """Assign items (load, size) to ``n_bins`` bins: largest load first, each to the least-loaded bin
    that still has room for its size (room = an equal share of the total size, rounded up).

    Greedy LPT with a cardinality bound: with unit sizes every bin holds floor or ceil of the mean
    count; with groups the sizes differ by about one group; loads are close. Ties are broken by ``order_noise``
    (seeded), so equal loads do not always land
    in the same bins. Returns the item indices of each bin.
    """
    total = int(sizes.sum())
    cap, floor = -(-total // n_bins), total // n_bins  # every bin holds between floor and cap rollouts
    order = sorted(range(loads.numel()), key=lambda i: (-float(loads[i]), float(order_noise[i])))
    bins: list[list[int]] = [[] for _ in range(n_bins)]
    bin_load = [0.0] * n_bins
    bin_size = [0] * n_bins
    left = total
    for i in order:
        s = int(sizes[i])
        short = [b for b in range(n_bins) if bin_size[b] < floor]
        if left <= sum(floor - bin_size[b] for b in short) and any(bin_size[b] + s <= cap for b in short):
            fits = [b for b in short if bin_size[b] + s <= cap]  # what is left must fill the short bins
        else:
            fits = [b for b in range(n_bins) if bin_size[b] + s <= cap] or list(range(n_bins))
        left -= s
        b = min(fits, key=lambda k: (bin_load[k], bin_size[k], k))
        bins[b].append(i)
        bin_load[b] += float(loads[i])
        bin_size[b] += s
    return bins


def partition_bins(
    group_ids: Tensor,
    lengths: Tensor,
    n_minibatches: int,
    n_ranks: int,
    generator: torch.Generator,
    *,
    whole_groups: bool,
) -> list[list[Tensor]]:
    """Split a rollout batch into M mini-batches x R rank shards: ``out[m][r]`` = rollout indices.

    Units (whole groups when ``whole_groups``, else single rollouts) go largest token load first to the
    least-loaded of the M x R bins that still has room (room = an equal share of the rollouts), so
    bins hold equal numbers of rollouts up to one unit and close token loads. Mini-batches come in a
    seeded random order; shapes: group_ids, lengths Tensor[B].
    """
    units = _groups(group_ids) if whole_groups else [torch.tensor([i]) for i in range(group_ids.numel())]
    loads = torch.tensor([float(lengths[u].sum()) for u in units], dtype=torch.float64)
    sizes = torch.tensor([u.numel() for u in units])
    noise = torch.rand(len(units), generator=generator)
    bins = _balanced_bins(loads, sizes, n_minibatches * n_ranks, noise)
    nested = [
        [
            torch.cat([units[i] for i in b]) if b else torch.zeros(0, dtype=torch.long)
            for b in bins[m * n_ranks : (m + 1) * n_ranks]
        ]
        for m in range(n_minibatches)
    ]
    order = torch.randperm(n_minibatches, generator=generator).tolist()
    return [nested[m] for m in order]


VERL_PADDING_SEQ_LEN = 128
"""Sequence length verl 0.9.1 gives the synthetic no-op rollouts it appends so that a batch divides evenly
(``verl.trainer.ppo.padding_utils.SYNTHETIC_PADDING_SEQ_LEN``) [code]."""


def verl_workload(seq_lengths: Tensor) -> Tensor:
    """verl's attention-FLOP proxy of a sequence of L = prompt + response tokens: 24576 L + L^2
    (``verl.utils.seqlen_balancing.calculate_workload``, calibrated for hidden size 4096) [code]. Tensor[B] int64."""
    L = seq_lengths.to(torch.int64)
    return 24576 * L + L * L


def ldm_partitions(loads: list[int], k: int) -> list[list[int]]:
    """Karmarkar-Karp's largest differencing method, k-way with equal cardinality: the partition verl 0.9.1's
    ``get_seqlen_balanced_partitions(loads, k, equal_size=True)`` returns (tests/test_batching.py checks equality).

    Items sorted by (load, index) ascending are taken k at a time; each k-tuple is a state of k one-item sets.
    Repeatedly the two states of largest spread (max set sum - min set sum; ties: the larger top set, sets
    compared by (sum, size, items)) are merged, set i of the one with set k-1-i of the other (largest with
    smallest), until one state is left. Needs len(loads) % k == 0. Returns k lists of indices, each sorted,
    in the final state's order (largest sum first).
    """
    n = len(loads)
    if k < 1 or n < k or n % k:
        raise ValueError(f"equal-size partition of {n} items into {k} sets is impossible")

    def ordered(sets: list[tuple[int, list]]) -> list[tuple[int, list]]:
        return sorted(sets, key=lambda s: (s[0], len(s[1]), s[1]), reverse=True)

    class _State:  # heap order: largest spread first, then the larger top set
        __slots__ = ("sets",)

        def __init__(self, sets: list[tuple[int, list]]) -> None:
            self.sets = ordered(sets)

        def key(self) -> tuple:
            top = self.sets[0]
            return (self.sets[0][0] - self.sets[-1][0], (top[0], len(top[1]), top[1]))

        def __lt__(self, other: "_State") -> bool:
            return self.key() > other.key()

    items = sorted((int(v), i) for i, v in enumerate(loads))
    heap = [_State([(v, [(i, v)]) for v, i in items[o : o + k]]) for o in range(0, n, k)]
    heapq.heapify(heap)
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        heapq.heappush(heap, _State([(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a.sets, reversed(b.sets))]))
    return [sorted(i for i, _ in s[1]) for s in heap[0].sets]


def verl_ray_partition_order(partition: list[int], loads: list[int]) -> list[int]:
    """The row order inside one rank's partition in verl's ``RayPPOTrainer._balance_batch`` (verl 0.9.1
    ``trainer/ppo/ray_trainer.py``; the PPO trainer of verl <= 0.8 and of the papers' forks) [code]: sorted by
    (workload, index), then the even positions ascending followed by the odd ones descending,
    ``p[::2] + p[1::2][::-1]`` ("smaller micro-batches at both ends"). ``loads[i]``: workload of row i."""
    p = sorted(partition, key=lambda x: (loads[x], x))
    return p[::2] + p[1::2][::-1]


def _rank_sliced_minibatches(B: int, parts: list[list[int]], n_minibatches: int) -> list[Tensor]:
    """Mini-batch m = slice m of every rank's rows (verl's dispatch in contiguous rank chunks, then the actor's
    contiguous mini-batches with ``shuffle=False``); rows >= B (padding) dropped, empty mini-batches dropped."""
    per_mb = len(parts[0]) // n_minibatches
    mbs = [
        torch.tensor([i for p in parts for i in p[m * per_mb : (m + 1) * per_mb] if i < B], dtype=torch.long)
        for m in range(n_minibatches)
    ]
    return [mb for mb in mbs if mb.numel()]


def _verl_partitions(seq_lengths: Tensor, B: int, R: int, M: int, *, ray_order: bool) -> list[list[int]]:
    """Steps 1-2 of :func:`verl_default_minibatches` (padding, :func:`ldm_partitions`), then, with ``ray_order``,
    :func:`verl_ray_partition_order` inside each partition."""
    pad = (-B) % (R * M)
    loads = verl_workload(torch.cat([seq_lengths.to("cpu", torch.int64), torch.full((pad,), VERL_PADDING_SEQ_LEN)]))
    parts = ldm_partitions(loads.tolist(), R)
    if ray_order:
        parts = [verl_ray_partition_order(p, loads.tolist()) for p in parts]
    return parts


@register("batching", "verl_default")
def verl_default_minibatches(
    group_ids: Tensor, n_minibatches: int, generator: torch.Generator, *, seq_lengths: Tensor, n_ranks: int = 1
) -> list[Tensor]:
    """verl 0.9.1's V1 trainer order (``v1/trainer_base._balance_batch`` then dispatch and the actor's mini-batch
    iterator with ``shuffle=False``) [code]:

      1. the batch is padded to a multiple of R x M with no-op rollouts of ``VERL_PADDING_SEQ_LEN`` tokens (verl pads
         to a multiple of lcm(R, its fixed mini-batch size) and so may make more mini-batches of a short batch; here M
         stays M [ours]; a full batch, the usual case, needs no padding in either);
      2. :func:`ldm_partitions` splits it into R equal-size partitions of balanced workload
         (:func:`verl_workload` of L = prompt + response tokens), indices sorted inside each partition;
      3. rank r takes partition r; its rows are cut into M contiguous slices; mini-batch m = slice m of every rank.
    Groups are contiguous in the batch, so a group is split only where it straddles a slice boundary of a rank:
    some groups stay whole and others do not (``groups_split_frac`` says how many). With R = 1 this is
    :func:`sequential_minibatches`. The order the papers' verl ran is :func:`verl_ray_minibatches`'s (design
    note 55). Shapes: group_ids, seq_lengths Tensor[B]; returns M index tensors (padding rows dropped).
    Deterministic: the generator is not used.
    """
    B, R, M = group_ids.numel(), int(n_ranks), int(n_minibatches)
    return _rank_sliced_minibatches(B, _verl_partitions(seq_lengths, B, R, M, ray_order=False), M)


@register("batching", "verl_ray")
def verl_ray_minibatches(
    group_ids: Tensor, n_minibatches: int, generator: torch.Generator, *, seq_lengths: Tensor, n_ranks: int = 1
) -> list[Tensor]:
    """verl's ``RayPPOTrainer._balance_batch`` order [code], the papers' engine (their verl forks; design note 55):
    as :func:`verl_default_minibatches` (same padding and :func:`ldm_partitions`), but each rank's rows are put in
    :func:`verl_ray_partition_order` (by workload, interleaved) before the contiguous mini-batch cut. A mini-batch
    slice then holds rows of every workload rank, not a run of neighbouring indices, so nearly every group is split
    across optimizer steps (32 prompts x 8, 4 mini-batches, 8 ranks: ~100% against the V1 order's ~50%).
    Shapes: group_ids, seq_lengths Tensor[B]; returns M index tensors (padding rows dropped). Deterministic.
    """
    B, R, M = group_ids.numel(), int(n_ranks), int(n_minibatches)
    return _rank_sliced_minibatches(B, _verl_partitions(seq_lengths, B, R, M, ray_order=True), M)


def _flat(nested: list[list[Tensor]]) -> list[Tensor]:
    """Rank-major mini-batches (empty ones dropped) of :func:`partition_bins`."""
    return [mb for mb in (torch.cat(shards) for shards in nested) if mb.numel()]


@register("batching", "token_balanced")
def token_balanced_minibatches(
    group_ids: Tensor, n_minibatches: int, generator: torch.Generator, *, lengths: Tensor, n_ranks: int = 1
) -> list[Tensor]:
    """Rollouts partitioned one by one by response tokens into M x R bins (equal counts, balanced tokens; greedy
    :func:`partition_bins`), ignoring which prompt a rollout came from; bins of mini-batch m are its rank shards
    [ours]. Not verl's order (that is :func:`verl_default_minibatches`): it balances every mini-batch, and scatters
    nearly every group. Shapes: group_ids, lengths Tensor[B]; returns M tensors.
    """
    return _flat(partition_bins(group_ids, lengths, n_minibatches, n_ranks, generator, whole_groups=False))


@register("batching", "query_preserved")
def query_preserved_minibatches(
    group_ids: Tensor, n_minibatches: int, generator: torch.Generator, *, lengths: Tensor, n_ranks: int = 1
) -> list[Tensor]:
    """Query-preserved mini-batching (QB) [paper]: every group (all rollouts of one prompt) lands whole
    in one mini-batch (one optimizer step), and, with R data-parallel ranks, whole on one rank; groups
    are spread over the M x R bins so that every bin has the same number of rollouts (up to one group)
    and a balanced token load.

    Shapes: group_ids, lengths Tensor[B]; returns M tensors, rank-major (:func:`partition_bins` gives
    the shards). With fewer groups than mini-batches some are empty and dropped.
    """
    return _flat(partition_bins(group_ids, lengths, n_minibatches, n_ranks, generator, whole_groups=True))


@register("batching", "sign_partitioned")
def sign_partitioned_minibatches(
    group_ids: Tensor, n_minibatches: int, generator: torch.Generator, *, advantages: Tensor
) -> list[Tensor]:
    """The "broken cancellation" control of Paper C [paper]: positive-advantage rollouts and the others
    (A <= 0) in separate mini-batches, so no update sees both signs.

    The M mini-batches are shared in proportion to the two sides' sizes (each non-empty side gets at
    least one, and both get one when M = 1 cannot hold them apart: then M + 1 are returned) [ours].
    Within a side rollouts are shuffled. Shapes: advantages Tensor[B]; returns index tensors.
    """
    pos = torch.nonzero(advantages > 0).flatten()
    rest = torch.nonzero(advantages <= 0).flatten()
    sides = [s[torch.randperm(s.numel(), generator=generator)] for s in (pos, rest) if s.numel()]
    if len(sides) == 1:
        return [c for c in torch.tensor_split(sides[0], n_minibatches) if c.numel()]
    m_pos = min(max(1, round(n_minibatches * pos.numel() / advantages.numel())), max(1, n_minibatches - 1))
    m_rest = max(1, n_minibatches - m_pos)
    out = [c for c in torch.tensor_split(sides[0], m_pos) if c.numel()]
    out += [c for c in torch.tensor_split(sides[1], m_rest) if c.numel()]
    order = torch.randperm(len(out), generator=generator).tolist()
    return [out[i] for i in order]


def groups_split_frac(minibatches: list[Tensor], group_ids: Tensor) -> float:
    """Share of the groups whose rollouts are spread over more than one mini-batch (0 under QB)."""
    where: dict[int, set[int]] = {}
    for m, idx in enumerate(minibatches):
        for g in group_ids[idx].tolist():
            where.setdefault(g, set()).add(m)
    return sum(len(v) > 1 for v in where.values()) / max(1, len(where))


WHOLE_GROUP_BATCHINGS = ("query_preserved",)
"""Batchings that keep every group whole in one mini-batch whatever the batch (QB)."""


def keeps_groups_whole(batching: str, n_prompts: int, n_minibatches: int) -> bool:
    """Whether ``batching`` puts every group of a rollout batch of ``n_prompts`` whole groups (in batch order) whole
    in one mini-batch, for every batch: QB always; ``sequential`` when the M near-equal contiguous chunks are whole
    groups (M divides the number of prompts); any other when there is one mini-batch (``random``,
    ``token_balanced``), never ``sign_partitioned`` (it splits a group with both signs even then)."""
    if batching in WHOLE_GROUP_BATCHINGS:
        return True
    if batching == "sequential":
        return n_prompts % n_minibatches == 0
    return n_minibatches == 1 and batching != "sign_partitioned"


def _groups(group_ids: Tensor) -> list[Tensor]:
    """Rollout indices of each group, groups in order of first appearance."""
    first: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids.tolist()):
        first.setdefault(g, []).append(i)
    return [torch.tensor(v, dtype=torch.long) for v in first.values()]


# ---------------------------------------------------------------------------------------------------
# reward-balanced batching (RB)


@dataclass
class _Entry:
    payload: Any
    n_pos: int
    n_neg: int
    size: int
    born: int  # step the group was generated at


@dataclass
class RewardBalancedBuffer:
    """Reward-balanced batching (RB) [paper]: rollouts accumulate in a buffer, and an update is made from a
    batch whose positive and negative rollouts each make up at least ``rho`` of it:
    n_pos(S) >= rho |S| and n_neg(S) >= rho |S| (:func:`rb_draw` generates more rounds until one exists).

    Our reading [ours, configurable]:
      * the unit is a whole group (a prompt's G rollouts), so the group-relative advantages (computed
        on the full group when it was generated) still sum to zero and query-preserved mini-batching
        still applies; a batch is exactly ``n_groups`` groups (the engine's prompts per update);
      * a rollout is positive / negative by the sign of its advantage (``sign="advantage"``, default;
        zero-advantage rollouts count as neither) or of its reward minus ``reward_threshold``
        (``sign="reward"``);
      * age = current generation round - the group's round; a group older than ``max_age`` is dropped, never
        trained on; selection prefers the oldest groups (fewest drops) and repairs the balance by swaps.
    ``rho`` default 0.25 (the paper's per-model values are lost).
    """

    n_groups: int
    rho: float = 0.25
    max_age: int = 2
    entries: list[_Entry] = field(default_factory=list)
    dropped_total: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.rho <= 0.5:
            raise ValueError(f"reward-balanced batching: rho must be in [0, 0.5], got {self.rho}")
        if self.n_groups < 1 or self.max_age < 0:
            raise ValueError(
                f"reward-balanced batching: n_groups >= 1 and max_age >= 0 needed, got {self.n_groups}, {self.max_age}"
            )

    def add(self, payload: Any, n_pos: int, n_neg: int, size: int, step: int) -> None:
        """Add one group generated at ``step`` with its counts of positive / negative rollouts."""
        if n_pos < 0 or n_neg < 0 or n_pos + n_neg > size:
            raise ValueError(f"bad group counts: n_pos={n_pos}, n_neg={n_neg}, size={size}")
        self.entries.append(_Entry(payload, n_pos, n_neg, size, step))

    def select(self, step: int) -> tuple[list[Any] | None, dict[str, float]]:
        """Evict groups older than ``max_age``, then try to select a balanced batch of ``n_groups``.

        Returns (payloads of the selected groups, oldest first; or None: defer the update) and the
        buffer statistics of this step (fill, ages, drops, the batch's sign fractions).
        """
        keep = [e for e in self.entries if step - e.born <= self.max_age]
        dropped = len(self.entries) - len(keep)
        self.dropped_total += dropped
        self.entries = keep
        stats = {"rb_dropped": float(dropped), "rb_dropped_total": float(self.dropped_total)}
        chosen = self._choose()
        if chosen is None:
            return None, stats | {"rb_emitted": 0.0, "rb_fill": float(len(self.entries))}
        ids = {id(e) for e in chosen}
        self.entries = [e for e in self.entries if id(e) not in ids]
        n = sum(e.size for e in chosen)
        ages = [step - e.born for e in chosen]
        return [e.payload for e in chosen], stats | {
            "rb_emitted": 1.0,
            "rb_fill": float(len(self.entries)),
            "rb_age_mean": sum(ages) / len(ages),
            "rb_age_max": float(max(ages)),
            "rb_pos_frac": sum(e.n_pos for e in chosen) / n,
            "rb_neg_frac": sum(e.n_neg for e in chosen) / n,
        }

    def _deficit(self, pos: int, neg: int, size: int) -> float:
        return max(0.0, self.rho * size - pos) + max(0.0, self.rho * size - neg)

    def _choose(self) -> list[_Entry] | None:
        """The oldest ``n_groups`` groups, repaired by best single swaps (each strictly lowers the
        balance deficit, so the loop ends) until balanced; None when no swap helps any more."""
        if len(self.entries) < self.n_groups:
            return None
        pool = sorted(self.entries, key=lambda e: e.born)  # oldest first (stable: insertion order)
        chosen, rest = pool[: self.n_groups], pool[self.n_groups :]
        pos, neg, size = (sum(e.n_pos for e in chosen), sum(e.n_neg for e in chosen), sum(e.size for e in chosen))
        while (d := self._deficit(pos, neg, size)) > 1e-9:
            best = None
            for i, lose in enumerate(chosen):
                for j, gain in enumerate(rest):
                    d2 = self._deficit(
                        pos - lose.n_pos + gain.n_pos, neg - lose.n_neg + gain.n_neg, size - lose.size + gain.size
                    )
                    key = (d2, gain.born, -lose.born, -i, j)  # keep the oldest (first inserted)
                    if d2 < d - 1e-9 and (best is None or key < best[0]):
                        best = (key, i, j)
            if best is None:
                return None
            _, i, j = best
            lose, gain = chosen[i], rest[j]
            chosen[i], rest[j] = gain, lose
            pos, neg, size = pos - lose.n_pos + gain.n_pos, neg - lose.n_neg + gain.n_neg, size - lose.size + gain.size
        return sorted(chosen, key=lambda e: e.born)

    def state_dict(self) -> dict[str, Any]:
        return {"entries": [vars(e).copy() for e in self.entries], "dropped_total": self.dropped_total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = [_Entry(**e) for e in state["entries"]]
        self.dropped_total = int(state["dropped_total"])


RB_ON_EXHAUSTED = ("train_unbalanced", "raise")


def rb_draw(
    buffer: RewardBalancedBuffer,
    round_: int,
    *,
    admit: Callable[[int], None],
    refill: Callable[[], None],
    max_rounds: int,
    on_exhausted: str = "train_unbalanced",
    select: Callable[[int], tuple[list[Any] | None, dict[str, float]]] | None = None,
) -> tuple[list[Any], dict[str, float], int]:
    """The batch of one update under reward-balanced batching, the same in both engines (verl's reading of RB):

      1. ``admit(r)``: the groups generated in round r join the buffer, born at r (ages count generation rounds);
      2. ``select(r)`` (default ``buffer.select``): groups older than ``max_age`` rounds are dropped; a balanced
         batch of ``buffer.n_groups`` groups, or None;
      3. None: ``refill()`` generates one more round of n prompts with the same policy, r += 1, back to 1; after
         ``max_rounds`` rounds ``on_exhausted`` decides: ``train_unbalanced`` takes the oldest n groups (the same
         selection with rho = 0, ``rb_forced`` = 1) or ``raise``.
    Every step therefore updates once per mini-batch, as the baseline does: RB and QB+RB runs make the same number
    of optimizer updates as their baseline and pay in generation rounds instead (``rb_rounds``).
    Returns (payloads of the selected groups, stats, the next round).
    """
    if on_exhausted not in RB_ON_EXHAUSTED:
        raise ValueError(f"reward_balance.on_exhausted must be one of {list(RB_ON_EXHAUSTED)}, got {on_exhausted!r}")
    if max_rounds < 1:
        raise ValueError(f"reward_balance.max_rounds must be >= 1, got {max_rounds}")
    select = select or buffer.select
    dropped, forced, rounds = 0.0, 0.0, 0
    while True:
        admit(round_)
        chosen, stats = select(round_)
        dropped += stats["rb_dropped"]
        rounds += 1
        if chosen is None and rounds >= max_rounds:
            if on_exhausted == "raise":
                raise RuntimeError(f"RB: no balanced batch (rho={buffer.rho}) after {rounds} generation rounds")
            rho, buffer.rho = buffer.rho, 0.0  # the oldest groups, through the same selection, same round
            try:
                chosen, stats = select(round_)
            finally:
                buffer.rho = rho
            forced = 1.0
        round_ += 1
        if chosen is not None:
            return chosen, {**stats, "rb_dropped": dropped, "rb_rounds": float(rounds), "rb_forced": forced}, round_
        refill()


RB_SIGNS = ("advantage", "reward")


def rb_sign_values(
    sign: str,
    rewards: Tensor,
    scores: Tensor,
    group_ids: Tensor,
    advantage: Callable[[Tensor, Tensor], Tensor],
    reward_threshold: float,
) -> tuple[Tensor, float]:
    """What makes a rollout positive or negative for reward-balanced batching, and the threshold.

    sign ``advantage``: the group advantage A_i = advantage(rewards, group_ids) of the shaped rewards (what the
    loss sees), threshold 0; sign ``reward``: the raw score (correctness, before overlong shaping), threshold
    ``reward_threshold``. rewards, scores, group_ids: Tensor[B]. Returns (values Tensor[B], threshold)."""
    if sign == "advantage":
        return advantage(rewards.float(), group_ids), 0.0
    if sign == "reward":
        return scores.float(), float(reward_threshold)
    raise ValueError(f"reward_balance.sign must be one of {list(RB_SIGNS)}, got {sign!r}")


def sign_counts(values: Tensor, group_ids: Tensor, threshold: float = 0.0) -> dict[int, tuple[int, int, int]]:
    """Per group id: (n values > threshold, n values < threshold, group size). Tensor[B] inputs."""
    out: dict[int, tuple[int, int, int]] = {}
    for v, g in zip(values.tolist(), group_ids.tolist()):
        p, n, s = out.get(g, (0, 0, 0))
        out[g] = (p + (v > threshold), n + (v < threshold), s + 1)
    return out
