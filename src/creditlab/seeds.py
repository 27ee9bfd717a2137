"""Seeds derived as pure functions of their inputs (shared by both engines, so the same (seed, step) draws the
same random streams in the local engine and in the verl plug-in)."""

from __future__ import annotations

import hashlib

import numpy as np


def step_seed(seed: int, step: int, sub: int = 0) -> int:
    """A 63-bit seed that is a pure function of (seed, step, sub); sub names the stream (10_000: batching,
    20_000: credit rng, 30_000: LoRA init, a generation index: rollouts)."""
    return int(np.random.SeedSequence([seed, step, sub]).generate_state(1, dtype=np.uint64)[0] >> 1)


def derive_seed(seed: int, name: str) -> int:
    """A stable 63-bit seed for ``name`` under ``seed`` (a data split, a question's option permutation;
    independent of Python's hash randomisation)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
