"""The test suite itself: no wall-clock assertions (they fail on a busy machine; timings belong in benchmarks/)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCKS = {"monotonic", "perf_counter", "time", "process_time"}


def _reads_clock(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in CLOCKS
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "time"
        for n in ast.walk(node)
    )


def _timing_names(tree: ast.AST) -> set[str]:
    """Names assigned from an expression that reads the clock (t0 = time.monotonic(); elapsed = time.time() - t0)."""
    return {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and _reads_clock(n.value)
        for t in n.targets
        if isinstance(t, ast.Name)
    }


def test_no_assertion_compares_wall_clock_time():
    offenders = []
    for path in sorted(TESTS.glob("*.py")):
        tree = ast.parse(path.read_text())
        timed = _timing_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assert):
                continue
            names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
            if _reads_clock(node.test) or (
                names & timed and any(isinstance(n, ast.Compare) for n in ast.walk(node.test))
            ):
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, f"wall-clock assertions (use a pytest timeout or a benchmark): {offenders}"
