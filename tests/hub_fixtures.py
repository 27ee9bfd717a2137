"""The Hub fixture files (tests/fixtures/hub/, written by make_math_fixtures.py) laid out as a raw_dir in the
``huggingface-cli download --local-dir`` layout: shared by tests/test_hub_data.py and tests/test_prepare_paper.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

HUB = Path(__file__).parent / "fixtures" / "hub"
_spec = importlib.util.spec_from_file_location("make_math_fixtures", HUB / "make_math_fixtures.py")
fx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fx)

# the fixtures' Hub layout and placement are the smoke scale's (creditlab.data.smoke), shared with the tests
from creditlab.data.smoke import GPQA_REL, LAYOUT, fixture, place  # noqa: E402,F401


def make_raw_dir(root: Path, names=None) -> Path:
    """A raw_dir ``root/raw`` in the Hub download layout holding ``names`` (default: every fixture), GPQA always."""
    raw = root / "raw"
    for name in names or LAYOUT:
        place(raw, name)
    place(raw, "gpqa-diamond")
    return raw
