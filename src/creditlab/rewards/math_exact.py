"""Exact numbers for the math-verify reward: no tolerance where the gold answer is exact.

math-verify 0.9.0 compares numbers with a tolerance (``verify(float_rounding=6, numeric_precision=15)``):

* an atomic float on either side is rounded to 6 decimals, so gold ``0.0000001`` equals ``0.0000002``;
* any other numeric pair is accepted when ``(gold - answer).evalf(n=15, chop=True) == 0``, and ``chop``
  drops values below the working precision, so gold ``\\frac{1}{2006!}`` equals ``\\frac{1}{2004!}``
  (both about 1e-5760), and ``2^{-100}`` equals ``2^{-101}``.

Raising the two parameters only moves the threshold: with ``float_rounding=60, numeric_precision=6000``
the cases above fail, but ``\\frac{1}{3000!}`` still equals ``\\frac{1}{2998!}`` and ``10^{-7000}`` equals
``2\\cdot 10^{-7000}`` (measured), and a float still equals any float that differs beyond the 60th decimal.
So :func:`exact_numbers` replaces math-verify's numeric comparison (``math_verify.grader.sympy_numeric_eq``,
which every comparison of math-verify goes through, in sets, intervals, tuples, equations and matrices)
by :func:`exact_numeric_eq` while the reward judges a pair (and its symbolic step,
``sympy_symbolic_eq``, by :func:`exact_symbolic_eq`). The rules [ours]:

* a decimal literal means the exact decimal it spells (``0.1`` is 1/10, never the binary double);
* an answer equals an exact gold only when the two are the same number, proved exactly: rational
  arithmetic, then ``simplify``/``equals`` for irrational values; a numerical difference (30 digits)
  only ever proves that two values differ;
* one tolerance is kept, of a precise kind: an answer that is a bare decimal with at least
  :data:`MIN_SIGNIFICANT_DIGITS` significant digits equals a gold without a finite decimal expansion
  (``\\pi``, ``\\sqrt{2}``, ``\\frac{1}{3}``) when its digits are the gold's, rounded or cut at its last
  digit (``0.333333`` for 1/3, ``3.141593`` or ``3.1415926535`` for pi; not ``3.14``, not ``0.3333331``).
  A gold with a finite decimal expansion (every decimal gold, ``\\frac{1}{8}``) is matched exactly;
* a percentage keeps math-verify's two readings (``50\\%`` equals ``50`` and ``\\frac{1}{2}``);
* expressions with free symbols are equal when ``simplify(gold - answer)`` is zero, their decimals read
  as exact rationals (``0.1x`` equals ``\\frac{x}{10}``, ``0.333333x`` is not ``\\frac{x}{3}``), never by a
  numerical evaluation;
* values beyond 10^(+-:data:`MAX_EXACT_DIGITS`) are never evaluated exactly (two such different
  expressions score 0, as a timeout would).

:func:`rewrite_scientific` turns ``1e308`` into ``1\\times 10^{308}`` before parsing: math-verify's
LaTeX parser reads a lower-case ``e`` as Euler's number (``1e308*10`` became ``3080 e``, so it never
equalled ``10^{309}``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import sympy
from sympy import Basic, Float, Integer, MatrixBase, Rational
from sympy.core.evalf import PrecisionExhausted

MIN_SIGNIFICANT_DIGITS = 6
"""Least significant digits of a decimal answer that approximates a gold without a finite decimal
expansion [ours: math-verify's own default compares 6 decimals]."""

_CHECK_DIGITS = 30
"""Digits of the numerical evaluation that proves two values different."""

MAX_EXACT_DIGITS = 1_000_000
"""Values beyond 10^(+-this) are not evaluated exactly (``2^{2^{40}}`` has 3e11 digits): two such values
equal only as the same expression [ours]."""

_DECIMAL_LITERAL = re.compile(r"(?<![\d.])\d*\.\d+(?![\d.])")
_STATED_PLACES: ContextVar[dict[Rational, int]] = ContextVar("stated_places", default={})
"""Decimal places of each decimal literal the judged answer spells (sympy drops trailing zeros)."""

_SCIENTIFIC = re.compile(r"(?<![\w.\\])(\d+(?:\.\d+)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")


def rewrite_scientific(latex: str) -> str:
    """``1e308`` -> ``1\\times 10^{308}``, ``2.5E-3`` -> ``2.5\\times 10^{-3}`` (exact, not Euler's e).

    Only a number, ``e``/``E`` and an integer exponent written together count; ``2e`` (twice e),
    ``e^{2}`` and names such as ``x1e5`` are left alone.
    """
    return _SCIENTIFIC.sub(lambda m: f"{m.group(1)}\\times 10^{{{m.group(2)}}}", latex)


def stated_places(latex: str) -> dict[Rational, int]:
    """``{value: decimal places as written}`` of the decimal literals in ``latex`` (``2.50`` -> {5/2: 2}).

    A parsed float keeps the value of ``2.50`` but not its trailing zero, which states a digit: the
    answer ``2.236070`` claims 7 significant digits of sqrt(5) = 2.2360680 and is wrong in the last one.
    """
    out: dict[Rational, int] = {}
    for literal in _DECIMAL_LITERAL.findall(latex):
        value, places = Rational(literal), len(literal.split(".")[1])
        out[value] = max(places, out.get(value, 0))
    return out


# ----------------------------------------------------------------------------------------------
# Exact values
# ----------------------------------------------------------------------------------------------


def _float_to_rational(f: Float) -> Basic:
    """The exact decimal a parsed literal spells (sympy keeps a literal's digits: ``str`` gives them back)."""
    if not f.is_finite:
        return f
    return Rational(str(f))


def exact_value(expr: Basic) -> Basic:
    """``expr`` with every float replaced by the decimal it was written as, then evaluated (``doit``)."""
    floats = expr.atoms(Float)
    if floats:
        expr = expr.xreplace({f: _float_to_rational(f) for f in floats})
    try:
        return expr.doit()
    except Exception:  # noqa: BLE001 - an expression sympy cannot evaluate stays as it is
        return expr


def _is_number(expr: object) -> bool:
    return isinstance(expr, sympy.Expr) and not isinstance(expr, MatrixBase) and expr.is_number


def _approx(expr: Basic) -> sympy.Expr | None:
    """A 30-digit value of ``expr`` (complex allowed), or None when it has none (nan, zoo, no precision)."""
    try:
        v = sympy.N(expr, _CHECK_DIGITS)
    except Exception:  # noqa: BLE001
        return None
    if v.has(sympy.nan, sympy.zoo) or not v.is_number or v.free_symbols:
        return None
    return v


def _differ_numerically(a: Basic, b: Basic, rel: int = _CHECK_DIGITS // 2) -> bool:
    """True only when 30-digit values of ``a`` and ``b`` differ by more than ``10**-rel`` of the larger
    (a proof that they differ; it never proves them equal)."""
    va, vb = _approx(a), _approx(b)
    if va is None or vb is None:
        return False
    try:
        finite_a, finite_b = va.is_finite, vb.is_finite
        if finite_a is None or finite_b is None:
            return False
        if not (finite_a and finite_b):  # oo, -oo: equal only to themselves
            return finite_a != finite_b or bool(va != vb)
        diff = abs(sympy.N(va - vb, _CHECK_DIGITS))
        scale = max(abs(va), abs(vb))
        return bool(diff > scale * sympy.Float(10) ** (-rel))
    except Exception:  # noqa: BLE001
        return False


def _too_large(v: sympy.Expr | None) -> bool:
    """True when a 30-digit value ``v`` lies beyond 10^(+-MAX_EXACT_DIGITS) (or has none)."""
    if v is None:
        return False
    limit = MAX_EXACT_DIGITS * 3.33  # bits
    for part in v.as_real_imag():
        if isinstance(part, Float) and part != 0:
            _sign, _man, exp, bits = part._mpf_
            if abs(exp + bits) > limit:
                return True
    return False


def exact_equal(a: Basic, b: Basic) -> bool:
    """``a == b`` as numbers, proved exactly (both free of symbols; floats count as their decimals)."""
    if _differ_numerically(a, b):  # cheap, and never evaluates a huge power exactly
        return False
    if _too_large(_approx(a)) or _too_large(_approx(b)):
        return False  # equal to 30 digits, but too large to evaluate (and not the same expression)
    ea, eb = exact_value(a), exact_value(b)
    if ea == eb:
        return True
    try:
        d = ea - eb
        if d.is_Number:
            return bool(d == 0)
        zero = d.is_zero
        if zero is not None:
            return bool(zero)
        try:
            if sympy.N(d, _CHECK_DIGITS, strict=True) != 0:
                return False
        except PrecisionExhausted:
            pass
        return sympy.simplify(d) == 0 or d.equals(0) is True
    except Exception:  # noqa: BLE001 - unprovable: not equal
        return False


def _terminating(r: Rational) -> bool:
    """True when rational ``r`` has a finite decimal expansion (its denominator is 2^a 5^b)."""
    q = int(r.q)
    for p in (2, 5):
        while q % p == 0:
            q //= p
    return q == 1


def _decimal_digits(value: Rational) -> tuple[int, int]:
    """``(places, significant digits)`` of a terminating decimal: 0.333333 -> (6, 6), 1414.21 -> (2, 6)."""
    places, scaled = 0, value
    while not scaled.is_Integer:
        scaled *= 10
        places += 1
    n = abs(int(scaled))
    return places, (len(str(n)) if n else 0)


def correctly_rounded(gold: Basic, answer: Float) -> bool:
    """``answer`` (a decimal literal) spells the digits of ``gold`` (exact, real, no finite decimal
    expansion): ``gold`` rounded, or cut, at the answer's last digit, with at least
    :data:`MIN_SIGNIFICANT_DIGITS` significant digits (1/3: ``0.333333``; 2/3: ``0.666667`` or ``0.666666``)."""
    decimal = _float_to_rational(answer)
    if not decimal.is_Rational:
        return False
    places, significant = _decimal_digits(decimal)
    written = _STATED_PLACES.get().get(abs(decimal), places)  # trailing zeros the literal had
    if written > places:
        significant += (written - places) if significant else 0
        places = written
    if significant < MIN_SIGNIFICANT_DIGITS:
        return False
    g = exact_value(gold)
    try:
        if g.is_real is not True:  # complex, or unknown: no approximation rule
            return False
        if g.is_Rational and _terminating(g):
            return bool(g == decimal)
        target = decimal * Integer(10) ** places  # an integer
        v = sympy.N(g * Integer(10) ** places, len(str(abs(int(target)))) + 25)
        frac = abs(v) - sympy.floor(abs(v))
        eps = sympy.Float(10) ** -20
        sign = 1 if v >= 0 else -1
        rounded = sign * sympy.floor(abs(v) + sympy.Rational(1, 2))
        cut = sign * sympy.floor(abs(v))
        if abs(frac - sympy.Rational(1, 2)) > eps and rounded == target:
            return True
        return bool(eps < frac < 1 - eps and cut == target)  # (too close to a digit boundary: no)
    except Exception:  # noqa: BLE001
        return False


# ----------------------------------------------------------------------------------------------
# The replacement of math-verify's numeric comparison
# ----------------------------------------------------------------------------------------------


def exact_numeric_eq(
    gold: Basic | MatrixBase, pred: Basic | MatrixBase, float_rounding: int = 6, numeric_precision: int = 15
) -> bool:
    """Drop-in for ``math_verify.grader.sympy_numeric_eq`` (same signature; the precisions are ignored).

    True when ``gold`` and ``pred`` are the same number (see the module docstring), element-wise for
    matrices; False for expressions with free symbols (math-verify's symbolic step decides those).
    """
    from math_verify.grader import get_pct_val, is_atomic_or_pct_atomic, safe_sympy_doit
    from sympy.matrices.expressions import MatrixExpr

    if isinstance(gold, (MatrixBase, MatrixExpr)) and isinstance(pred, (MatrixBase, MatrixExpr)):
        gold, pred = safe_sympy_doit(gold), safe_sympy_doit(pred)
        if isinstance(gold, MatrixBase) and isinstance(pred, MatrixBase) and gold.shape == pred.shape:
            return all(exact_numeric_eq(g, p) for g, p in zip(gold.flat(), pred.flat(), strict=True))
        return False
    if not (_is_number(gold) and _is_number(pred)):
        return False
    # "9\%" == "9" (math-verify's reading of two integers, one a percentage)
    if is_atomic_or_pct_atomic(gold, Integer) and is_atomic_or_pct_atomic(pred, Integer):
        if get_pct_val(gold, gold) == get_pct_val(pred, pred):
            return True
    # a percentage becomes its value; nothing else is evaluated yet (2^{2^{40}} must stay a power)
    gold_v, pred_v = (x if (p := get_pct_val(x, None)) is None else p * Rational(1, 100) for x in (gold, pred))
    if isinstance(pred_v, Float) and not gold_v.atoms(Float):
        if _differ_numerically(gold_v, pred_v, rel=MIN_SIGNIFICANT_DIGITS - 1) or _too_large(_approx(gold_v)):
            return False  # farther apart than any rounding at 6 digits (and no huge gold evaluated)
        g = exact_value(gold_v)
        if g.is_Rational and _terminating(g):
            return bool(g == _float_to_rational(pred_v))
        return correctly_rounded(g, pred_v)
    return exact_equal(gold_v, pred_v)


def exact_symbolic_eq(a: Basic | MatrixBase, b: Basic | MatrixBase) -> bool:
    """Drop-in for ``math_verify.grader.sympy_symbolic_eq``, which math-verify calls only after the numeric
    comparison said no: two numbers are then decided (:func:`exact_numeric_eq` already tried ``simplify``
    when they agree to 30 digits; running it again on ``2^{2^{40}}`` would never end); an expression with
    symbols is equal when ``simplify(gold - answer)`` is zero, its decimals read as exact rationals."""
    if _is_number(a) and _is_number(b):
        return False
    try:
        floats = a.atoms(Float) | b.atoms(Float)
        if floats:
            exact = {f: _float_to_rational(f) for f in floats}
            a, b = a.xreplace(exact), b.xreplace(exact)
        diff = sympy.simplify(a - b)
        if isinstance(diff, MatrixBase):
            return bool(diff.is_zero_matrix)
        return bool(isinstance(diff, Basic) and diff.is_zero)
    except Exception:  # noqa: BLE001 - math-verify's own treatment of a failure
        return False


_PATCH_LOCK = threading.RLock()


@contextmanager
def exact_numbers(answer: str = "") -> Iterator[None]:
    """Within the block, math-verify compares with :func:`exact_numeric_eq` and :func:`exact_symbolic_eq`.

    ``answer`` is the LaTeX of the judged answer: the digits its decimals state (:func:`stated_places`).
    Serialised by a lock, so concurrent threads judging through this block never see the tolerant
    comparison; math-verify's original function is restored on exit.
    """
    from math_verify import grader

    with _PATCH_LOCK:
        originals = grader.sympy_numeric_eq, grader.sympy_symbolic_eq
        grader.sympy_numeric_eq, grader.sympy_symbolic_eq = exact_numeric_eq, exact_symbolic_eq
        token = _STATED_PLACES.set(stated_places(answer))
        try:
            yield
        finally:
            grader.sympy_numeric_eq, grader.sympy_symbolic_eq = originals
            _STATED_PLACES.reset(token)
