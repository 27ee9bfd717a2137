"""Pure batch layout of creditlab's verl trainer: the row orders, group checks and metrics of a rollout batch.

verl 0.9.1's V1 trainer dispatches a balanced batch to its data-parallel ranks in contiguous equal chunks and cuts
each rank's chunk into contiguous mini-batches (:func:`verl_minibatches`). The orders below are built so that this
dispatch realises creditlab's batchings: query-preserved (:func:`qb_order`, Paper C's QB), sequential
(:func:`sequential_order`, Paper E) and sign-partitioned (:func:`sign_order`, Paper C's control), each starting
from an order fixed by the batch's content (:func:`content_order`). :func:`groups_aligned` checks that a
group-coupled loss's order keeps every group whole; :func:`zero_signal_frac` and :func:`flip_metrics` are metrics
of a batch. The trainer (``engines/verl/trainer.py``) and the RB sampler (``engines/verl/samplers.py``) use them.

Nothing here imports verl, Ray or TransferQueue (tests/test_batching.py imports this module with them blocked), so
the orders are testable, and importable, wherever torch is.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from creditlab.algos.batching import partition_bins, sequential_minibatches
from creditlab.algos.flipping import flip_fractions


def uid_of(key: str) -> str:
    """The prompt uid of a verl rollout key ``{uid}_{session_id}_{index}`` (uids are uuid4 strings)."""
    return key.split("_", 1)[0]


def padded(nt: Tensor, value: float = 0.0) -> Tensor:
    """A TransferQueue field as a padded tensor: a nested tensor padded with ``value``, any other tensor as is."""
    return torch.nested.to_padded_tensor(nt, value) if nt.is_nested else nt


def verl_minibatches(n_rollouts: int, dp_size: int, mini_batch_size: int) -> list[list[int]]:
    """Rows (positions in the balanced batch) of each optimizer step, as verl 0.9.1 cuts them.

    Dispatch splits the batch into ``dp_size`` contiguous equal chunks (``BatchMeta.chunk``); each rank's
    ``TrainingWorker.train_mini_batch`` cuts its chunk into contiguous mini-batches of
    ``mini_batch_size / dp_size`` rows (``tu.make_iterator`` with ``shuffle=False``). Global mini-batch m =
    the m-th slice of every rank. Returns M lists of row positions.
    """
    per_rank, per_mb = n_rollouts // dp_size, mini_batch_size // dp_size
    return [
        [r * per_rank + m * per_mb + j for r in range(dp_size) for j in range(per_mb)]
        for m in range(per_rank // per_mb)
    ]


def qb_order(
    group_ids: Tensor, workloads: Tensor, n_minibatches: int, dp_size: int, generator: torch.Generator
) -> tuple[list[int], list[list[int]]]:
    """Query-preserved order of a rollout batch for verl (Paper C's QB).

    creditlab's ``partition_bins(..., whole_groups=True)`` (the QB of ``algos/batching.py``) assigns whole
    groups to M x R bins of equal size with balanced ``workloads`` (verl's ``calculate_workload`` of the
    sequence lengths). The order is rank-major: rank r's contiguous chunk holds its shards of mini-batch
    0, 1, ..., M-1, so verl's chunking and mini-batching (:func:`verl_minibatches`) realise bin (m, r) as
    rank r's part of optimizer step m.
    group_ids, workloads: Tensor[B]. Returns (order: permutation of range(B), per-rank index lists).
    Raises ValueError when whole groups cannot fill the bins exactly (group size must divide B / (M R)).
    """
    B = group_ids.numel()
    bins = partition_bins(group_ids, workloads, n_minibatches, dp_size, generator, whole_groups=True)
    size = B // (n_minibatches * dp_size)
    sizes = sorted({int(b.numel()) for row in bins for b in row})
    if B % (n_minibatches * dp_size) or sizes != [size]:
        raise ValueError(
            f"query-preserved batching cannot cut {B} rollouts into {n_minibatches} mini-batches x "
            f"{dp_size} ranks of whole groups (bin sizes {sizes}, needed {size}): the prompts per "
            "mini-batch (actor.ppo_mini_batch_size) must be a multiple of the data-parallel size"
        )
    per_rank = [[int(i) for m in range(n_minibatches) for i in bins[m][r]] for r in range(dp_size)]
    return [i for part in per_rank for i in part], per_rank


def sequential_order(group_ids: Tensor, n_minibatches: int, dp_size: int) -> tuple[list[int], list[list[int]]]:
    """Sequential mini-batching (creditlab's ``sequential_minibatches``, Paper E) laid out for verl.

    The batch is first made group-contiguous: groups in order of first appearance, each group's rollouts in
    their order (verl's sampled batch lists rollouts as TransferQueue received them, so groups may interleave).
    creditlab's ``sequential_minibatches`` then cuts that order into M contiguous mini-batches; rank r's
    contiguous chunk holds the r-th of R equal contiguous shards of mini-batch 0, 1, ..., M-1, so verl's
    dispatch and mini-batch iterator (:func:`verl_minibatches`) realise mini-batch m as optimizer step m, its
    rows in order (rank 0's shard, then rank 1's, ...). No balancing: the token load per rank is what it is.
    group_ids: Tensor[B]. Returns (order: permutation of range(B), per-rank index lists).
    Raises ValueError when the batch does not cut into M equal mini-batches of R equal shards.
    """
    B = group_ids.numel()
    if n_minibatches < 1 or B % (n_minibatches * dp_size):
        raise ValueError(
            f"sequential batching cannot cut {B} rollouts into {n_minibatches} equal mini-batches x "
            f"{dp_size} ranks (verl would pad the batch with synthetic rollouts)"
        )
    first: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids.tolist()):
        first.setdefault(g, []).append(i)
    seq = torch.tensor([i for rows in first.values() for i in rows], dtype=torch.long)
    mbs = sequential_minibatches(group_ids[seq], n_minibatches, torch.Generator())
    if sorted({int(mb.numel()) for mb in mbs}) != [B // n_minibatches]:
        raise ValueError(f"sequential batching: unequal mini-batches {[int(mb.numel()) for mb in mbs]}")
    per_rank = [[int(seq[i]) for mb in mbs for i in mb.chunk(dp_size)[r]] for r in range(dp_size)]
    return [i for part in per_rank for i in part], per_rank


def content_order(prompts: list[Tensor], responses: list[Tensor]) -> list[int]:
    """The rollouts of a batch in an order fixed by what they are, not by when they arrived: groups by a hash of their
    prompt's token ids, a group's rollouts by a hash of their response's (rollouts of a group are exchangeable).
    verl lists a sampled batch in the order TransferQueue received the rollouts, which the timing of the rollout
    server decides; every order built on it (sequential, QB, sign, verl's balancing, which breaks ties by position)
    then differs between an uninterrupted and a resumed run of the same seed. prompts, responses: B token-id tensors.
    Returns a permutation of range(B)."""

    def digest(t: Tensor) -> bytes:
        return hashlib.sha256(t.detach().to("cpu", torch.int64).numpy().tobytes()).digest()

    keys = [(digest(p), digest(r)) for p, r in zip(prompts, responses)]
    return sorted(range(len(keys)), key=keys.__getitem__)


def sign_order(
    advantages: Tensor, n_minibatches: int, dp_size: int, generator: torch.Generator
) -> tuple[list[int], list[list[int]], int]:
    """Paper C's sign-partitioned control ("broken cancellation") laid out for verl's equal mini-batches.

    The local engine (``algos.batching.sign_partitioned_minibatches``) gives each sign side its own mini-batches,
    of unequal sizes. verl cuts every rank's chunk into equal contiguous mini-batches, so here [ours] the rollouts are
    ordered side by side (A > 0 vs A <= 0, each side shuffled, which side comes first drawn per step) and cut into M
    equal contiguous mini-batches, each split into R equal contiguous rank shards laid out rank-major as
    :func:`sequential_order` does: every optimizer step holds a single sign except at most one, the step where the
    two sides meet (counted, and logged by the trainer as ``creditlab/sign_mixed_minibatches``).
    advantages: Tensor[B] sequence advantages. Returns (order, per-rank index lists, mixed mini-batches).
    Raises ValueError when the batch does not cut into M equal mini-batches of R equal shards.
    """
    B = advantages.numel()
    if n_minibatches < 1 or B % (n_minibatches * dp_size):
        raise ValueError(
            f"sign-partitioned batching cannot cut {B} rollouts into {n_minibatches} equal mini-batches "
            f"x {dp_size} ranks (verl would pad the batch with synthetic rollouts)"
        )
    pos = torch.nonzero(advantages > 0).flatten()
    rest = torch.nonzero(advantages <= 0).flatten()
    sides = [s[torch.randperm(s.numel(), generator=generator)] for s in (pos, rest)]
    if torch.rand((), generator=generator).item() < 0.5:
        sides.reverse()
    seq = torch.cat(sides)
    positive = advantages[seq] > 0
    mbs = list(seq.chunk(n_minibatches))
    mixed = sum(int(positive[m * len(mb) : (m + 1) * len(mb)].unique().numel() > 1) for m, mb in enumerate(mbs))
    per_rank = [[int(i) for mb in mbs for i in mb.chunk(dp_size)[r]] for r in range(dp_size)]
    return [i for part in per_rank for i in part], per_rank, mixed


def zero_signal_frac(advantages: Tensor, group_ids: Tensor) -> float:
    """Share of the batch's groups whose rollouts all have A_i = 0 (their rewards tie: no learning signal; DAPO's
    dynamic sampling drops such groups by its filter metric). advantages, group_ids: Tensor[B]."""
    groups = group_ids.unique()
    silent = [bool((advantages[group_ids == g] == 0).all()) for g in groups.tolist()]
    return sum(silent) / max(1, len(silent))


def groups_aligned(group_ids: Tensor, dp_size: int, group_size: int) -> bool:
    """Whether every group is G = ``group_size`` consecutive rows of one rank's contiguous chunk (what verl's
    ``force_group_size = G`` micro-batching needs to keep each group in one micro-batch): each aligned block of
    G rows of each rank holds a single group, and no group appears in two blocks. group_ids: Tensor[B]."""
    B = group_ids.numel()
    if B % dp_size or (B // dp_size) % group_size:
        return False
    blocks = group_ids.reshape(-1, group_size)
    return bool((blocks == blocks[:, :1]).all()) and blocks[:, 0].unique().numel() == blocks.shape[0]


def flip_metrics(delta: Tensor, mask: Tensor, adv: Tensor, eps: float) -> dict[str, float]:
    """Token flipping of one update as metrics ``creditlab/flip/{positive,negative,all}/{boosted,...}``:
    creditlab's ``flip_fractions`` (percent of the valid tokens with Δ log p > eps, < -eps, else).
    delta, mask: Tensor[B, T]; adv: Tensor[B] (its sign splits the rollouts)."""
    out = {}
    for side, fr in flip_fractions(delta, mask, adv, eps).items():
        out.update({f"creditlab/flip/{side}/{k}": float(v) for k, v in fr.items() if k != "n"})
    return out
