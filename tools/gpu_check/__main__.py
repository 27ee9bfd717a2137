"""Run the GPU acceptance check: ``python tools/gpu_check [--device cuda|cpu] [--out DIR] [--size small|full]``.

Three checks, each a list of named cases with pass/fail and numbers, written to ``DIR/gpu_check.json`` and a short
``DIR/gpu_check.md`` (exit status 1 if a case failed):

1. ``methods``: every registered advantage, policy loss (and its gradient), credit function, token filter and
   batching, and every configs/method/*.yaml's credit pass, on the device in bf16 against the CPU in float64 on the
   same inputs (``gpu_check.methods``, tolerances in ``gpu_check.compare``);
2. ``engine``: the local engine in bf16 on the device: SFT warm-up of the micro stand-ins, the KV-cache sampler
   against float32 and ``transformers``, RL steps of every method config (``gpu_check.engine``);
3. ``verl``: which modules of the verl engine import without verl and Ray, and the plug-in's losses and advantages
   as verl's workers call them (``gpu_check.verl_side``).

It needs only torch, transformers, peft, numpy and PyYAML, and creditlab's source (``src/``, put on the path here;
no install): the packages the device image lacks (``gpu_check.isolation.DEVICE_ABSENT``: Ray, verl, vLLM, Hydra,
MLflow, ...) are hidden from the process first, so a run here fails where one there would (``--no-hide`` keeps
them). ``--device cpu`` runs the same checks on the CPU (bf16 there against float64): the dry run, which
tests/test_gpu_check.py runs at ``--size small``.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)  # run as `python tools/gpu_check`: import the package, not its modules as top-level names
for _p in (ROOT / "src", ROOT / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

CHECKS = ("methods", "engine", "verl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cuda | cpu | cuda:N | auto (cuda when available)")
    p.add_argument("--out", default=str(ROOT / "results" / "gpu_check"), help="report directory")
    p.add_argument("--size", choices=("small", "full"), default="full", help="small: the CPU dry run's sizes")
    p.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated subset of {','.join(CHECKS)}")
    p.add_argument("--methods", default="", help="method configs for the RL steps (default: all)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-hide", action="store_true", help="do not hide the packages the device image lacks")
    args = p.parse_args(argv)
    unknown = set(args.checks.split(",")) - set(CHECKS)
    if unknown:
        p.error(f"unknown checks {sorted(unknown)}; valid choices: {list(CHECKS)}")
    return args


def environment(device) -> dict:
    import importlib.metadata as md

    import torch

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": version("transformers"),
        "peft": version("peft"),
        "numpy": version("numpy"),
        "device": str(device),
        "machine": platform.machine(),
        "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        env |= {
            "device_name": torch.cuda.get_device_name(device),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(device))),
            "bf16_supported": torch.cuda.is_bf16_supported(),
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        }
    try:
        env["commit"] = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        env["commit"] = None
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from gpu_check import isolation

    hidden = [] if args.no_hide else list(isolation.DEVICE_ABSENT)
    too_late = isolation.hide(hidden) if hidden else []
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)

    import torch

    from gpu_check import report

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else None
    device = device or torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    checks = args.checks.split(",")
    t0 = time.perf_counter()
    result: dict = {"args": vars(args), "environment": environment(device), "checks": {}, "records": []}
    for name in CHECKS:
        if name not in checks:
            continue
        t1 = time.perf_counter()
        print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
        if name == "methods":
            from gpu_check import methods

            out = methods.run(str(device), args.size, args.seed)
        elif name == "engine":
            from gpu_check import engine

            out = engine.run(str(device), args.size, [m for m in args.methods.split(",") if m] or None)
        else:
            from gpu_check import verl_side

            out = verl_side.run(str(device), args.size, args.seed)
        result["records"] += out.pop("records")
        result["checks"][name] = out | {"seconds": round(time.perf_counter() - t1, 2)}
        print(f"gpu_check: {name} done in {time.perf_counter() - t1:.1f} s", file=sys.stderr, flush=True)
    import creditlab

    result["isolation"] = {
        "hidden": hidden,
        "imported_before_hiding": too_late,
        "imported": isolation.imported(hidden) if hidden else [],
        "creditlab": str(Path(creditlab.__file__).resolve().parent),
    }
    result["seconds"] = time.perf_counter() - t0
    result["ok"] = all(r["ok"] for r in result["records"]) and not result["isolation"]["imported"]
    js, md = report.write(result, Path(args.out))
    failed = [r["name"] for r in result["records"] if not r["ok"]]
    print(
        f"gpu_check: {'PASS' if result['ok'] else 'FAIL'}: {len(result['records'])} checks, {len(failed)} failed"
        + (f" ({', '.join(failed[:10])}{', ...' if len(failed) > 10 else ''})" if failed else "")
        + f"; {md} and {js.name}",
        flush=True,
    )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
