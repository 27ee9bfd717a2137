"""Progress for long work: a tqdm bar on a terminal, periodic plain lines in log files.

Snakemake sends each job's stderr to a log file, where a tqdm bar is one ever-growing line of
carriage returns; there we print a readable line every ``every_s`` seconds instead.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from tqdm import tqdm


class LineProgress:
    """tqdm-like (update, set_postfix, close) progress that prints whole lines, rate-limited."""

    def __init__(self, total: int | None, desc: str, initial: int = 0, every_s: float = 10.0, file=None):
        self.total, self.desc, self.n, self.every_s = total, desc, initial, every_s
        self.file = file or sys.stderr
        self.t0 = self.last = time.monotonic()
        self.postfix = ""
        self._print()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every_s or (self.total is not None and self.n >= self.total):
            self.last = now
            self._print()

    def set_postfix(self, **kw: Any) -> None:
        self.postfix = " ".join(f"{k}={v}" for k, v in kw.items())

    def close(self) -> None:
        pass

    def _print(self) -> None:
        el = time.monotonic() - self.t0
        if self.total:
            frac = self.n / self.total
            eta = f" eta {el / frac - el:.0f}s" if 0 < frac < 1 else ""
            head = f"{self.n}/{self.total} ({100 * frac:.0f}%)"
        else:
            head, eta = f"{self.n}", ""
        print(f"[{self.desc}] {head} elapsed {el:.0f}s{eta} {self.postfix}".rstrip(), file=self.file, flush=True)


def progress(total: int | None, desc: str, initial: int = 0, enabled: bool = True, every_s: float = 10.0):
    """A tqdm bar on a TTY, LineProgress in a log file, a silent bar when ``enabled`` is False."""
    if not enabled or sys.stderr.isatty():
        return tqdm(total=total, desc=desc, initial=initial, disable=not enabled, dynamic_ncols=True)
    return LineProgress(total, desc, initial, every_s)
