"""How a low-precision result is compared with its float64 reference: the error measures and the bf16 tolerances.

bf16 keeps 8 significant bits: one rounding is a relative error of at most 2^-9 (about 2e-3), and the methods chain
a few roundings (inputs, exp/log, products, a reduction kept in fp32 by torch). Element by element a value passes
when |x - ref| <= RTOL |ref| + ATOL scale (scale = max |ref| of the tensor); RTOL = 3e-2 is eight bf16 units (ulps)
of headroom. A few elements may fail legitimately where the function is discontinuous: a clip boundary
(1 - eps, 1 + eps), a top-k / quantile cut-off, a sign test. A bf16 ratio differs from the float64 one by about
2e-3 relative, so only elements that close to a boundary can flip; MAX_MISMATCH (2% of the elements) bounds them,
far above what random inputs put there (reported as ``mismatch_frac``) and far below what a real bug gives. A scalar
loss is compared to the scale of its terms (the same loss with |A|), since a GRPO loss at ratio 1 is ~0 by
cancellation. Non-finite values where the reference is finite always fail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

RTOL = 3e-2
"""Relative tolerance per element (eight bf16 ulps)."""
ATOL = 1e-2
"""Absolute tolerance per element, as a fraction of the tensor's largest reference magnitude."""
MAX_MISMATCH = 0.02
"""Largest fraction of elements allowed outside the tolerance (discontinuities: clips, cut-offs, sign tests)."""
LOSS_RTOL = 3e-2
"""A scalar loss: |x - ref| <= LOSS_RTOL * max(|ref|, |ref of the same loss with |A||)."""


@dataclass
class Tolerance:
    rtol: float = RTOL
    atol: float = ATOL
    max_mismatch: float = MAX_MISMATCH

    def as_dict(self) -> dict[str, float]:
        return {"rtol": self.rtol, "atol_of_max": self.atol, "max_mismatch_frac": self.max_mismatch}


def _f64(x: Tensor) -> Tensor:
    return x.detach().to("cpu", torch.float64)


def tensor_errors(x: Tensor, ref: Tensor, tol: Tolerance | None = None) -> dict[str, Any]:
    """Error measures of ``x`` (any device, dtype) against ``ref`` (same shape) and whether they pass ``tol``.

    rel_err: ||x - ref||_2 / ||ref||_2 (0 when both are 0); max_err: max |x - ref| / max |ref|; mismatch_frac:
    elements outside RTOL |ref| + ATOL max |ref|; nonfinite: elements non-finite in x but finite in ref.
    """
    tol = tol or Tolerance()
    a, r = _f64(x), _f64(ref)
    if a.shape != r.shape:
        return {"ok": False, "why": f"shape {tuple(a.shape)} != reference {tuple(r.shape)}"}
    fin = torch.isfinite(r)
    nonfinite = int((~torch.isfinite(a) & fin).sum())
    a, r = torch.where(fin, a, 0.0), torch.where(fin, r, 0.0)
    a = torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
    diff = (a - r).abs()
    scale = float(r.abs().max()) if r.numel() else 0.0
    norm = float(r.norm())
    bad = diff > tol.rtol * r.abs() + tol.atol * scale
    n = max(1, r.numel())
    out = {
        "n": int(r.numel()),
        "rel_err": float((a - r).norm()) / norm if norm > 0 else float((a - r).norm()),
        "max_err": float(diff.max()) / scale if scale > 0 and r.numel() else float(diff.max()) if r.numel() else 0.0,
        "mismatch_frac": float(bad.sum()) / n,
        "nonfinite": nonfinite,
    }
    out["ok"] = nonfinite == 0 and out["mismatch_frac"] <= tol.max_mismatch
    return out


def scalar_errors(x: float | Tensor, ref: float | Tensor, scale: float | Tensor, rtol: float = LOSS_RTOL) -> dict:
    """A scalar against its reference, relative to ``scale`` (the magnitude of its terms)."""
    a, r, s = float(x), float(ref), abs(float(scale))
    s = max(s, abs(r))
    err = abs(a - r)
    rel = err / s if s > 0 else err
    ok = math.isfinite(a) == math.isfinite(r) and (not math.isfinite(r) or rel <= rtol)
    return {"value": a, "ref": r, "scale": s, "rel_err": rel, "ok": ok}


def exact(x: Any, ref: Any) -> dict[str, Any]:
    """Integer results (index partitions, token ids) must be equal."""
    return {"ok": x == ref, "equal": x == ref}
