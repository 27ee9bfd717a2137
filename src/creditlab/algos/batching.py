"""How rollouts become optimizer updates: mini-batch partitions (kind ``"batching"``) and the
reward-balanced buffer (Paper C, "The Cancellation Hypothesis", SPEC.md "Paper C" methods 1-2).

A batching function takes ``group_ids: Tensor[B]`` (prompt of each rollout), the number of
mini-batches M and a ``torch.Generator``; those that need them also name ``lengths: Tensor[B]``
(response tokens per rollout), ``advantages: Tensor[B]`` and ``n_ranks: int`` (data-parallel ranks)
as keyword parameters, and the engine passes what a function names (:func:`call_batching`).
It returns M index tensors that partition ``range(B)``: every rollout is used exactly once per
epoch. The token-count partitions also exist per data-parallel rank (:func:`partition_bins`:
``out[m][r]``), which a multi-rank engine (verl) uses and the tests check; the local engine trains
each mini-batch in one process.

Why it matters (Paper C): GRPO's group advantages sum to zero within a prompt, so the gradient
directions the rollouts of a prompt share cancel when they are in one update. Engines cut the
rollout batch into mini-batches at random or by token count (verl's ``balance_batch``), which
scatters a group over several optimizer steps (:func:`random_minibatches`,
:func:`token_balanced_minibatches`); :func:`query_preserved_minibatches` keeps every group whole.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from creditlab.algos.registry import register


def call_batching(fn: Callable, group_ids: Tensor, n_minibatches: int, generator: torch.Generator, *,
                  lengths: Tensor | None = None, advantages: Tensor | None = None, n_ranks: int = 1) -> list[Tensor]:
    """Call a registered batching function with the context it names (lengths, advantages, n_ranks)."""
    ctx = {"lengths": lengths, "advantages": advantages, "n_ranks": n_ranks}
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in ctx.items() if k in params}
    missing = [k for k, v in kwargs.items() if v is None]
    if missing:
        raise ValueError(f"batching {fn.__name__} needs {missing}, which the engine did not pass")
    return fn(group_ids, n_minibatches, generator, **kwargs)


@register("batching", "random")
def random_minibatches(group_ids: Tensor, n_minibatches: int, generator: torch.Generator) -> list[Tensor]:
    """Shuffle rollouts, then cut into ``n_minibatches`` near-equal chunks.

    The local engine's default order (as most RL frameworks do), so the rollouts of one prompt
    generally land in different optimizer steps.
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
    count; with groups the sizes differ by about one group; loads are close. Ties are broken by ``order_noise`` (seeded), so equal loads do not always land
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


def partition_bins(group_ids: Tensor, lengths: Tensor, n_minibatches: int, n_ranks: int, generator: torch.Generator,
                   *, whole_groups: bool) -> list[list[Tensor]]:
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
    nested = [[torch.cat([units[i] for i in b]) if b else torch.zeros(0, dtype=torch.long)
               for b in bins[m * n_ranks:(m + 1) * n_ranks]] for m in range(n_minibatches)]
    order = torch.randperm(n_minibatches, generator=generator).tolist()
    return [nested[m] for m in order]


def _flat(nested: list[list[Tensor]]) -> list[Tensor]:
    """Rank-major mini-batches (empty ones dropped) of :func:`partition_bins`."""
    return [mb for mb in (torch.cat(shards) for shards in nested) if mb.numel()]


@register("batching", "token_balanced")
def token_balanced_minibatches(group_ids: Tensor, n_minibatches: int, generator: torch.Generator, *,
                               lengths: Tensor, n_ranks: int = 1) -> list[Tensor]:
    """verl's default order: rollouts partitioned by token count into M x R bins (equal counts,
    balanced tokens), ignoring which prompt a rollout came from; bins of mini-batch m are its rank shards.

    Shapes: group_ids, lengths Tensor[B]; returns M tensors. Groups are scattered: that is the
    engine behaviour Paper C says breaks cancellation.
    """
    return _flat(partition_bins(group_ids, lengths, n_minibatches, n_ranks, generator, whole_groups=False))


@register("batching", "query_preserved")
def query_preserved_minibatches(group_ids: Tensor, n_minibatches: int, generator: torch.Generator, *,
                                lengths: Tensor, n_ranks: int = 1) -> list[Tensor]:
    """Query-preserved mini-batching (QB) [paper]: every group (all rollouts of one prompt) lands whole
    in one mini-batch (one optimizer step), and, with R data-parallel ranks, whole on one rank; groups
    are spread over the M x R bins so that every bin has the same number of rollouts (up to one group)
    and a balanced token load.

    Shapes: group_ids, lengths Tensor[B]; returns M tensors, rank-major (:func:`partition_bins` gives
    the shards). With fewer groups than mini-batches some are empty and dropped.
    """
    return _flat(partition_bins(group_ids, lengths, n_minibatches, n_ranks, generator, whole_groups=True))


@register("batching", "sign_partitioned")
def sign_partitioned_minibatches(group_ids: Tensor, n_minibatches: int, generator: torch.Generator, *,
                                 advantages: Tensor) -> list[Tensor]:
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
    """Reward-balanced batching (RB) [paper]: rollouts accumulate in a buffer, and an update happens
    only when a batch can be selected whose positive and negative rollouts each make up at least
    ``rho`` of it: n_pos(S) >= rho |S| and n_neg(S) >= rho |S|.

    Our reading [ours, configurable]:
      * the unit is a whole group (a prompt's G rollouts), so the group-relative advantages (computed
        on the full group when it was generated) still sum to zero and query-preserved mini-batching
        still applies; a batch is exactly ``n_groups`` groups (the engine's prompts per update);
      * a rollout is positive / negative by the sign of its advantage (``sign="advantage"``, default;
        zero-advantage rollouts count as neither) or of its reward minus ``reward_threshold``
        (``sign="reward"``);
      * age = current step - generation step; a group older than ``max_age`` is dropped, never trained
        on; selection prefers the oldest groups (fewest drops) and repairs the balance by swaps.
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
            raise ValueError(f"reward-balanced batching: n_groups >= 1 and max_age >= 0 needed, got "
                             f"{self.n_groups}, {self.max_age}")

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
            "rb_emitted": 1.0, "rb_fill": float(len(self.entries)),
            "rb_age_mean": sum(ages) / len(ages), "rb_age_max": float(max(ages)),
            "rb_pos_frac": sum(e.n_pos for e in chosen) / n, "rb_neg_frac": sum(e.n_neg for e in chosen) / n}

    def _deficit(self, pos: int, neg: int, size: int) -> float:
        return max(0.0, self.rho * size - pos) + max(0.0, self.rho * size - neg)

    def _choose(self) -> list[_Entry] | None:
        """The oldest ``n_groups`` groups, repaired by best single swaps (each strictly lowers the
        balance deficit, so the loop ends) until balanced; None when no swap helps any more."""
        if len(self.entries) < self.n_groups:
            return None
        pool = sorted(self.entries, key=lambda e: e.born)  # oldest first (stable: insertion order)
        chosen, rest = pool[: self.n_groups], pool[self.n_groups:]
        pos, neg, size = (sum(e.n_pos for e in chosen), sum(e.n_neg for e in chosen), sum(e.size for e in chosen))
        while (d := self._deficit(pos, neg, size)) > 1e-9:
            best = None
            for i, lose in enumerate(chosen):
                for j, gain in enumerate(rest):
                    d2 = self._deficit(pos - lose.n_pos + gain.n_pos, neg - lose.n_neg + gain.n_neg,
                                       size - lose.size + gain.size)
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


RB_SIGNS = ("advantage", "reward")


def rb_sign_values(sign: str, rewards: Tensor, scores: Tensor, group_ids: Tensor,
                   advantage: Callable[[Tensor, Tensor], Tensor], reward_threshold: float) -> tuple[Tensor, float]:
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
