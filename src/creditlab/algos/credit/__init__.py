"""Per-token credit functions: multipliers of the advantage, computed without gradient.

Each module registers its functions under kind ``"credit"``. A credit function has a plain tensor
signature whose argument names are CreditInputs fields (``old_logp``, ``mask``, ``group_ids``,
``hidden``, ...) plus its own hyperparameters, and returns a weight per token (Tensor[B, T]) or per
rollout (Tensor[B, 1]). ``base.apply_credit`` feeds it from a rollout batch; several compose by
multiplication.
"""

from creditlab.algos.credit import arca, base, delta, dlogp, forking  # noqa: F401
