"""Reward shaping before advantages: DAPO's soft overlong punishment (SPEC.md, DAPO)."""

from __future__ import annotations


def overlong_penalty(length: int, max_len: int, buffer: int, factor: float) -> float:
    """DAPO soft overlong punishment of a response of ``length`` tokens under a budget of ``max_len``:
    min(-(L - (Lmax - buf)) / buf * factor, 0): 0 until the last ``buffer`` tokens, then linear down to -factor."""
    return min(-(length - (max_len - buffer)) / buffer * factor, 0.0)
