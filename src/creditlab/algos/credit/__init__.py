"""Per-token credit functions: multipliers of the advantage, computed without gradient.

Each module registers its functions under kind ``"credit"``. A credit function has the signature
``fn(batch: CreditInputs, **params) -> Tensor[B, T]`` and returns a weight per response token;
several credit functions compose by multiplication.
"""

from creditlab.algos.credit import base  # noqa: F401
