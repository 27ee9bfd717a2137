"""Code extraction: the program a response holds, its last closed fenced (preferably python) block.

Imports nothing but :mod:`re`, so data validation (:mod:`creditlab.data.schema`) can read code blocks
without the sandbox.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "python3", "py"}


def extract_code(response: str) -> str | None:
    """The code of the last ```` ```python ```` fenced block, else of the last fenced block, else None.

    A block must be closed (a generation cut inside a block has no code); a whitespace-only block
    counts as none.
    """
    blocks = [(m.group(1).strip().lower(), m.group(2)) for m in _FENCE.finditer(response)]
    blocks = [(tag, body) for tag, body in blocks if body.strip()]
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    if python:
        return python[-1]
    return blocks[-1][1] if blocks else None
