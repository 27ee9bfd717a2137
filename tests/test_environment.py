"""The cluster environment (environment.yml -> envs/cluster.txt) resolves to the GPU set verl 0.9.1 is made for.

`uv pip compile` resolves environment.yml's pip list (its `-r envs/cluster.txt` and `-e .`, with paths taken from
environment.yml's folder as conda does) for the cluster's platform, x86_64 manylinux, and environment.yml's Python:
metadata only, nothing is installed and no large wheel is downloaded (uv reads wheel metadata by range requests
and builds the metadata of the two pure-Python packages that ship no wheel). ~10 s with a cold uv cache.

This module needs PyPI (CI has it). An unreachable index is a failure that says so, never a skip
(`-m "not network"` deselects the two resolving tests on a machine that is offline on purpose).
"""

from __future__ import annotations

import re
import subprocess
from importlib.metadata import requires, version
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
ENV_FILE = ROOT / "environment.yml"

EXPECTED = {"torch": "2.11.0", "vllm": "0.24.0", "verl": "0.9.1", "transferqueue": "0.1.11"}
"""The pins of the GPU set: verl 0.9.1's `vllm` extra (torch, vLLM) and the verl / TransferQueue of .venv."""

PLATFORM = "x86_64-manylinux_2_28"
WHEEL_PLATFORM = "x86_64-manylinux_2_31"
"""All-wheel installs need glibc >= 2.31: llguidance 1.7.x (vLLM 0.24.0) has manylinux_2_31 wheels only."""
SDIST_ONLY = ("antlr4-python3-runtime", "connection-pool")
"""Pure-Python dependencies with no wheel on PyPI (hydra-core's antlr4 4.9.3; snakemake's connection-pool)."""

UV_TIMEOUT_S = 90
NETWORK_ERRORS = (
    "dns error",
    "error sending request",
    "Failed to fetch",
    "failed to lookup address",
    "Connection refused",
    "Request failed after",
    "operation timed out",
    "tcp connect error",
)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pip_list() -> tuple[str, list[str]]:
    """environment.yml's Python version and pip entries, relative paths made absolute (from environment.yml's
    folder: conda runs pip there)."""
    env = yaml.safe_load(ENV_FILE.read_text())
    deps = env["dependencies"]
    python = next(d.split("=", 1)[1] for d in deps if isinstance(d, str) and re.fullmatch(r"python=[\d.]+", d))
    pip = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    lines = []
    for entry in pip:
        entry = str(entry).strip()
        m = re.fullmatch(r"(-r|-e)\s+(\S+)", entry)
        if m and not re.match(r"[a-z+]+://", m.group(2)):
            entry = f"{m.group(1)} {(ENV_FILE.parent / m.group(2)).resolve()}"
        lines.append(entry)
    return python, lines


def _compile(tmp_path: Path, platform: str, *extra: str) -> dict[str, str]:
    """`uv pip compile` of environment.yml's pip list for `platform`: {normalized name: version}, '-e' lines
    under the key '-e'."""
    from uv import find_uv_bin

    python, lines = _pip_list()
    reqs = tmp_path / "environment-pip.txt"
    reqs.write_text("\n".join(lines) + "\n")
    cmd = [
        find_uv_bin(),
        "pip",
        "compile",
        str(reqs),
        "--python-platform",
        platform,
        "--python-version",
        python,
        "--no-header",
        "--no-annotate",
        "--no-python-downloads",
        "--quiet",
        *extra,
    ]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=UV_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`uv pip compile` took over {UV_TIMEOUT_S} s (slow or unreachable PyPI?): {' '.join(cmd)}")
    if proc.returncode != 0:
        if any(e.lower() in proc.stderr.lower() for e in NETWORK_ERRORS):
            pytest.fail(
                "PyPI is unreachable: this test resolves environment.yml against the package index "
                f"with `uv pip compile` and needs network access to it.\nuv said:\n{proc.stderr[-3000:]}"
            )
        pytest.fail(f"environment.yml does not resolve for {platform}, Python {python}:\n{proc.stderr[-6000:]}")
    pins: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-e "):
            pins.setdefault("-e", []).append(line[3:].strip())
        elif "==" in line:
            name, ver = line.split("==", 1)
            pins[_norm(name.split("[", 1)[0])] = ver.split(";", 1)[0].strip()
    return pins


@pytest.mark.network
@pytest.mark.timeout(2 * UV_TIMEOUT_S)
def test_cluster_environment_resolves_to_verl_gpu_set(tmp_path):
    pins = _compile(tmp_path, PLATFORM)
    got = {name: pins.get(name) for name in EXPECTED}
    assert got == EXPECTED, f"environment.yml resolves to {got} for {PLATFORM}, expected {EXPECTED}"
    # creditlab itself (`-e .`) is part of the resolution: pyproject's pins agree with the cluster set
    assert any(Path(p.removeprefix("file://")).resolve() == ROOT for p in pins.get("-e", [])), pins.get("-e")
    assert pins["transformers"] == _pyproject_pin("transformers")


@pytest.mark.network
@pytest.mark.timeout(2 * UV_TIMEOUT_S)
def test_cluster_environment_installs_from_wheels(tmp_path):
    """Nothing compiles on the cluster (glibc >= 2.31): every package but the pure-Python SDIST_ONLY has a wheel."""
    no_binary = [arg for name in SDIST_ONLY for arg in ("--no-binary", name)]
    pins = _compile(tmp_path, WHEEL_PLATFORM, "--only-binary", ":all:", *no_binary)
    assert {name: pins.get(name) for name in EXPECTED} == EXPECTED


def test_expected_pins_are_verls_vllm_extra():
    """EXPECTED is what verl (the version in this environment) pins in its own `vllm` extra (offline)."""
    extra = {}
    for spec in requires("verl") or []:
        req = Requirement(spec)
        if req.marker and req.marker.evaluate({"extra": "vllm"}) and not req.marker.evaluate({"extra": ""}):
            pinned = [s.version for s in req.specifier if s.operator == "=="]
            if pinned:
                extra[_norm(req.name)] = pinned[0]
    assert version("verl") == EXPECTED["verl"]
    assert version("TransferQueue") == EXPECTED["transferqueue"]
    assert {k: extra.get(k) for k in ("torch", "vllm")} == {k: EXPECTED[k] for k in ("torch", "vllm")}, extra


def _pyproject_pin(name: str) -> str:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(
        str(s.version)
        for d in deps
        for r in [Requirement(d)]
        if _norm(r.name) == name
        for s in r.specifier
        if s.operator == "=="
    )
