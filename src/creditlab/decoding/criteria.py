"""Token-selection criteria of the selective token replacement study and of selective extrapolation.

At every decoding step the decoding model proposes a token y; a criterion scores the position from
the two models' next-token log-probabilities and the position is resampled when the score crosses a
threshold. Every criterion has the same signature::

    criterion(logp_rl [B, V], logp_base [B, V], token [B] int64, *, decoder="base", uniforms=None) -> score [B]

with normalised log-probabilities over the full vocabulary (temperature 1, before any top-k/top-p, as
the log-probs vLLM reports in the official script). ``decoder`` names the model that proposes the
tokens ("base" or "rl"); ``uniforms`` [B] in [0, 1) is the step's criterion random stream.

Scores, and when they fire by default (threshold tau / thr):

* ``dlogp``: Δlog p(y) = log pi_RL(y) - log pi_base(y); base decoding: score <= tau; pi_RL
  decoding: score >= tau.
* ``kl``: KL(pi_RL || pi_base) = sum_v pi_RL(v) (log pi_RL(v) - log pi_base(v)); score >= thr.
* ``reverse_kl``: KL(pi_base || pi_RL); score >= thr.
* ``js``: KL(pi_RL || m) / 2 + KL(pi_base || m) / 2 with m = (pi_RL + pi_base) / 2; score >= thr.
* ``sym_kl``: (KL(pi_RL || pi_base) + KL(pi_base || pi_RL)) / 2; score >= thr.
* ``entropy``: H(pi_dec) = -sum_v pi_dec(v) log pi_dec(v) of the decoding model; score >= thr.
* ``random``: u ~ U[0, 1) from its own seeded stream; score <= thr.

Notes on the choices:

* ``dlogp`` with the base model decoding fires on tokens RLVR pushed down (Δlog p <= tau, tau < 0);
  when pi_RL decodes (the paper's "extrapolate pi_RL itself" variant) it fires on tokens RLVR pushed up
  (Δlog p >= tau), as the spec prescribes. Any direction can be forced with ``fire_when``.
* ``js`` is the Jensen-Shannon divergence. The official script's criterion named "js" is the
  symmetrised KL average; it is registered here as ``sym_kl``.
* ``random`` fires when u <= thr, so the threshold is the expected replacement rate (the official
  script fires on ``rand() < threshold`` too).

The criteria's registry is this module's :data:`CRITERIA` (every :class:`Criterion`, listed explicitly); look
them up with :func:`get_criterion`, their names with :func:`criterion_names`. (The methods' kinds have
:mod:`creditlab.algos.registry`, the rewards :mod:`creditlab.rewards.registry`.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Direction = Literal["le", "ge"]
Decoder = Literal["base", "rl"]
ScoreFn = Callable[..., Tensor]


@dataclass(frozen=True)
class Criterion:
    """A named score with the direction in which it fires for each decoding model.

    Calling it returns ``score(logp_rl, logp_base, token, decoder=..., uniforms=...)`` -> [B].
    fires_base / fires_rl: "le" (fire when score <= threshold) or "ge" (score >= threshold) when the
    base model / pi_RL proposes the tokens.
    """

    name: str
    score: ScoreFn
    fires_base: Direction = "ge"
    fires_rl: Direction = "ge"

    def __call__(
        self,
        logp_rl: Tensor,
        logp_base: Tensor,
        token: Tensor,
        *,
        decoder: Decoder = "base",
        uniforms: Tensor | None = None,
    ) -> Tensor:
        return self.score(logp_rl, logp_base, token, decoder=decoder, uniforms=uniforms)

    def direction(self, decoder: Decoder) -> Direction:
        """Default firing direction when ``decoder`` proposes the tokens."""
        return self.fires_rl if decoder == "rl" else self.fires_base


def fires(score: Tensor, threshold: float, direction: Direction) -> Tensor:
    """Bool [B]: score <= threshold ("le") or score >= threshold ("ge"), score [B]."""
    if direction == "le":
        return score <= threshold
    if direction == "ge":
        return score >= threshold
    raise ValueError(f"direction must be 'le' or 'ge', got {direction!r}")


# ------------------------------------------------------------------------------------------ building blocks
def kl_divergence(logp: Tensor, logq: Tensor) -> Tensor:
    """KL(p || q) = sum_v p(v) (log p(v) - log q(v)) over the last axis; logp, logq [..., V] -> [...].

    Terms with p(v) = 0 contribute 0 (also where log q(v) = -inf).
    """
    terms = logp.exp() * (logp - logq)
    return torch.where(logp > -math.inf, terms, 0.0).sum(-1)


def entropy(logp: Tensor) -> Tensor:
    """H(p) = -sum_v p(v) log p(v) over the last axis; logp [..., V] -> [...] (0 log 0 = 0)."""
    return -torch.where(logp > -math.inf, logp.exp() * logp, 0.0).sum(-1)


# ------------------------------------------------------------------------------------------------ criteria
def dlogp_score(logp_rl: Tensor, logp_base: Tensor, token: Tensor, **_: object) -> Tensor:
    """Δlog p(y) = log pi_RL(y) - log pi_base(y) of the proposed tokens y = token [B] -> [B]."""
    y = token[:, None]
    return (logp_rl.gather(1, y) - logp_base.gather(1, y)).squeeze(1)


def kl_score(logp_rl: Tensor, logp_base: Tensor, token: Tensor, **_: object) -> Tensor:
    """KL(pi_RL || pi_base) of each row [B, V] -> [B]."""
    return kl_divergence(logp_rl, logp_base)


def reverse_kl_score(logp_rl: Tensor, logp_base: Tensor, token: Tensor, **_: object) -> Tensor:
    """KL(pi_base || pi_RL) of each row [B, V] -> [B]."""
    return kl_divergence(logp_base, logp_rl)


def js_score(logp_rl: Tensor, logp_base: Tensor, token: Tensor, **_: object) -> Tensor:
    """Jensen-Shannon divergence KL(pi_RL || m) / 2 + KL(pi_base || m) / 2, m the mixture -> [B]."""
    log_m = torch.logaddexp(logp_rl, logp_base) - math.log(2.0)
    return 0.5 * (kl_divergence(logp_rl, log_m) + kl_divergence(logp_base, log_m))


def sym_kl_score(logp_rl: Tensor, logp_base: Tensor, token: Tensor, **_: object) -> Tensor:
    """(KL(pi_RL || pi_base) + KL(pi_base || pi_RL)) / 2 (the official script's "js") -> [B]."""
    return 0.5 * (kl_divergence(logp_rl, logp_base) + kl_divergence(logp_base, logp_rl))


def entropy_score(
    logp_rl: Tensor, logp_base: Tensor, token: Tensor, *, decoder: Decoder = "base", **_: object
) -> Tensor:
    """Entropy of the decoding model's distribution (pi_base when decoder="base", else pi_RL) -> [B]."""
    return entropy(logp_rl if decoder == "rl" else logp_base)


def random_score(
    logp_rl: Tensor, logp_base: Tensor, token: Tensor, *, uniforms: Tensor | None = None, **_: object
) -> Tensor:
    """The step's criterion uniforms [B] themselves (fires on u <= thr: thr is the replacement rate)."""
    if uniforms is None:
        raise ValueError("the random criterion needs the criterion stream's uniforms")
    return uniforms


CRITERIA: tuple[Criterion, ...] = (
    Criterion("dlogp", dlogp_score, fires_base="le", fires_rl="ge"),
    Criterion("kl", kl_score),
    Criterion("reverse_kl", reverse_kl_score),
    Criterion("js", js_score),
    Criterion("sym_kl", sym_kl_score),
    Criterion("entropy", entropy_score),
    Criterion("random", random_score, fires_base="le", fires_rl="le"),
)
"""The selection criteria, the registry of this kind (a name appears once)."""
_BY_NAME: dict[str, Criterion] = {c.name: c for c in CRITERIA}
if len(_BY_NAME) != len(CRITERIA):
    raise ValueError(f"a selection criterion name appears twice: {[c.name for c in CRITERIA]}")


def criterion_names() -> list[str]:
    """Sorted names of the selection criteria."""
    return sorted(_BY_NAME)


def get_criterion(name: str) -> Criterion:
    """The criterion named ``name``; KeyError lists the valid names."""
    if name not in _BY_NAME:
        raise KeyError(f"unknown selection_criterion {name!r}; valid choices: {criterion_names()}")
    return _BY_NAME[name]
