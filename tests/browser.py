"""Headless Chromium for the browser tests: Debian's /usr/bin/chromium driven by Playwright over CDP.

Playwright's own browser downloads are not used (no network); the flags keep Chromium from reaching
out (this machine's network is closed: without them it retries Google's hosts at every start).
Screenshots are kept as test artifacts under `test-artifacts/browser/` at the repository root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from creditlab.procs import stop_group

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts" / "browser"
CHROMIUM = os.environ.get("CREDITLAB_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def require_chromium() -> str:
    """The Chromium binary; a clear failure (not a skip) when it is missing: `make install` installs it."""
    path = shutil.which(CHROMIUM) or (CHROMIUM if Path(CHROMIUM).is_file() else None)
    if path is None:
        raise AssertionError(
            f"Chromium not found at {CHROMIUM}: run `make install` (tools/sysdeps.sh installs "
            "Debian's chromium) or set CREDITLAB_CHROMIUM"
        )
    return path


@contextlib.contextmanager
def page(width: int = 1600, height: int = 1000) -> Iterator:
    """A fresh Playwright page in headless Chromium (own profile), closed afterwards."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=require_chromium(), args=FLAGS, timeout=60_000)
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            tab = context.new_page()
            tab.set_default_timeout(60_000)
            yield tab
        finally:
            browser.close()


def screenshot(tab, name: str) -> Path:
    """Save a full-page screenshot as a test artifact; returns its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    out = ARTIFACTS / f"{name}.png"
    tab.screenshot(path=str(out), full_page=True)
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve(
    argv: Sequence[str], url: str, health: str, log: Path, timeout_s: float = 90.0, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Run a server (own process group), wait until `health` answers 200, yield `url`; then kill the group."""
    with log.open("w") as fh:
        proc = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(health, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"server not up after {timeout_s:.0f}s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        stop_group(proc, timeout_s=15)
