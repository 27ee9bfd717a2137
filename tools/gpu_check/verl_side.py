"""Check 3: what of the verl engine's code runs on a GPU without verl and Ray: an import probe, then the plug-in's
policy losses and advantage estimators as verl's workers call them, bf16 on the device against CPU float64.

Import probe: every module of ``creditlab.engines.verl`` is imported; the report says which import and what the
others miss. In an image without verl (the device machine's) the worker class (``workers.py``: verl's
``ActorRolloutRefWorker``, ``tensordict``), the trainer, samplers and entry point do not import, so the GPU
worker itself cannot run there. The plug-in (``plugin.py``) is the part of it that does run on the workers' GPUs:
verl calls its registered ``creditlab_<loss>`` on each micro-batch and ``creditlab_<advantage>`` on the batch. It
imports verl only to register (``verl.trainer.ppo.core_algos.register_policy_loss`` / ``register_adv_est``), so
where verl is absent it is imported against a stand-in of those two registries (:func:`stub_core_algos`; removed
again afterwards) and its wrappers run unchanged:

* ``<profile>:plugin_loss/<loss>[agg]`` (the input profiles of check 1): ``verl_policy_loss(name)`` on 2
  data-parallel shards x 2 micro-batches each, with verl's ``config.global_batch_info`` (dp_size 2, the mini-batch's
  token count and size) and a bool response mask, group-coupled losses inside ``with_group_ids``' context
  (micro-batches of whole groups), as verl's ``ppo_loss`` calls it. The device's sum over micro-batches / dp and
  its gradients are compared with the float64 path, and the float64 path with creditlab's loss on the whole
  mini-batch (``identity``: the plug-in's rescaling by verl's normalisers is exact).
* ``<profile>:plugin_advantage/<adv>``: ``verl_advantage(name)`` with verl's token-level rewards (the score on the
  last valid token) and prompt uids (strings), against float64.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import time
import traceback
import types
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gpu_check.compare import Tolerance, scalar_errors, tensor_errors
from gpu_check.methods import AGG_MODES, KNOWN_LIMITS, PROFILES, REFERENCE, SIZES, Place, make_batch

STUB_MODULES = ("verl", "verl.trainer", "verl.trainer.ppo", "verl.trainer.ppo.core_algos")
IDENTITY_RTOL = 1e-9
"""float64: the plug-in's micro-batch losses, rescaled by verl's normalisers, sum to creditlab's mini-batch loss."""
DP, MICRO = 2, 2


def import_probe() -> dict[str, str]:
    """Every module of creditlab.engines.verl -> "ok" or the error its import raised."""
    import creditlab.engines.verl as pkg

    out = {}
    for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        name = f"{pkg.__name__}.{m.name}"
        try:
            importlib.import_module(name)
            out[name] = "ok"
        except Exception as e:  # noqa: BLE001 - the answer is the error
            out[name] = f"{type(e).__name__}: {e}"
    return out


@contextmanager
def stub_core_algos():
    """verl's two registries (``register_policy_loss``, ``register_adv_est``) as stand-in modules, for the
    duration of the block; whatever it added to ``sys.modules`` (stubs, the plug-in) is removed after."""
    before = set(sys.modules)
    saved = {name: sys.modules[name] for name in STUB_MODULES if name in sys.modules}  # e.g. a None blocking it
    losses: dict[str, Any] = {}
    advs: dict[str, Any] = {}
    mods = {name: types.ModuleType(name) for name in STUB_MODULES}
    core = mods["verl.trainer.ppo.core_algos"]
    core.POLICY_LOSS_REGISTRY, core.ADV_ESTIMATOR_REGISTRY = losses, advs
    core.register_policy_loss = lambda name: lambda fn: losses.__setitem__(name, fn) or fn
    core.register_adv_est = lambda name: lambda fn: advs.__setitem__(name, fn) or fn
    core.__creditlab_stub__ = True
    for parent, child in zip(STUB_MODULES, STUB_MODULES[1:]):
        mods[parent].__path__ = []  # a package, so that the submodule import resolves from sys.modules
        setattr(mods[parent], child.rsplit(".", 1)[1], mods[child])
    sys.modules.update(mods)
    saved_platform = os.environ.pop("VERL_PLATFORM", None)  # a CPU platform would install verl's CPU patches
    try:
        yield core
    finally:
        if saved_platform is not None:
            os.environ["VERL_PLATFORM"] = saved_platform
        for name in (set(sys.modules) - before) | set(STUB_MODULES):
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def _plugin():
    """The plug-in module and whether verl's real registries took it (else the stand-in is active)."""
    plugin = importlib.import_module("creditlab.engines.verl.plugin")
    core = sys.modules.get("verl.trainer.ppo.core_algos")
    return plugin, not getattr(core, "__creditlab_stub__", False)


def _shards(batch: dict[str, Tensor]) -> list[Tensor]:
    """Row indices of the DP x MICRO micro-batches: contiguous runs of whole groups (verl's dispatch of a
    group-aligned order, with force_group_size for group-coupled losses)."""
    gids = batch["group_ids"]
    starts = [0] + [i for i in range(1, gids.numel()) if gids[i] != gids[i - 1]]
    groups = [torch.arange(s, e) for s, e in zip(starts, starts[1:] + [gids.numel()])]
    n = DP * MICRO
    bounds = [round(i * len(groups) / n) for i in range(n + 1)]
    return [torch.cat(groups[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]


def _verl_loss(plugin, name: str, agg: str, batch: dict[str, Tensor], at: Place) -> dict[str, Any]:
    """Sum over the micro-batches of the plug-in loss / dp (the gradient verl applies after FSDP's average)."""
    fn = plugin.verl_policy_loss(name, loss_kwargs={"agg": agg})
    mask = batch["mask"]
    info = {"dp_size": DP, "batch_num_tokens": int(mask.sum()), "global_batch_size": int(mask.shape[0])}
    config = SimpleNamespace(global_batch_info=info)
    logp = at(batch, "logp").clone().requires_grad_(True)
    total = None
    metrics: dict[str, float] = {}
    for rows in _shards(batch):
        r = rows.to(logp.device)
        with plugin.group_ids_of_micro_batch(at(batch, "group_ids")[r], at(batch, "responses")[r]):
            value, metrics = fn(
                at(batch, "old_logp")[r],
                logp[r],
                at(batch, "adv_tok")[r],
                at(batch, "mask")[r] > 0,
                loss_agg_mode=agg,
                config=config,
            )
        total = value / DP if total is None else total + value / DP
    grad = torch.autograd.grad(total, logp)[0] if total.requires_grad else torch.zeros_like(logp)
    return {"loss": total.detach(), "grad": grad, "metrics": metrics}


def _direct_loss(name: str, agg: str, batch: dict[str, Tensor]) -> Tensor:
    """creditlab's loss on the whole mini-batch (float64, CPU)."""
    from creditlab.algos import registry
    from gpu_check.methods import run_policy_loss

    return run_policy_loss(registry.get("policy_loss", name), {"agg": agg}, batch, REFERENCE)["loss"]


def _verl_advantage(plugin, name: str, batch: dict[str, Tensor], at: Place) -> Tensor:
    mask = at(batch, "mask")
    last = (batch["mask"].sum(-1).long() - 1).clamp(min=0)
    rewards = torch.zeros_like(batch["mask"])
    rewards[torch.arange(rewards.shape[0]), last] = batch["rewards"]
    uids = np.array([f"uid-{int(g)}" for g in batch["group_ids"]], dtype=object)
    adv, _ = plugin.verl_advantage(name)(at.put(rewards, "rewards"), mask, index=uids)
    return adv


def run(device: str, size: str = "full", seed: int = 0, tol: Tolerance | None = None) -> dict[str, Any]:
    """Check 3: the import probe and the plug-in's losses and advantages (records), on ``device``."""
    from creditlab.algos import registry

    tol = tol or Tolerance()
    probe = import_probe()
    records: list[dict[str, Any]] = []
    batch = make_batch(SIZES[size], seed + 1)
    stub_used = probe.get("creditlab.engines.verl.plugin") != "ok"
    with stub_core_algos() if stub_used else _nothing():
        plugin, real_verl = _plugin()
        for profile in PROFILES:
            dev = Place(device, profile)
            for name in registry.names("policy_loss"):
                for agg in AGG_MODES:
                    records.append(_check_loss(plugin, name, agg, batch, dev, tol))
            for name in registry.names("advantage"):
                t0 = time.perf_counter()
                case = f"{profile}:plugin_advantage/{name}"
                try:
                    d, r = _verl_advantage(plugin, name, batch, dev), _verl_advantage(plugin, name, batch, REFERENCE)
                    res = tensor_errors(d, r, tol)
                    records.append(_rec(case, res["ok"], t0, metrics=res))
                except Exception as e:  # noqa: BLE001
                    records.append(_rec(case, False, t0, error=_err(e), tb=traceback.format_exc()))
    return {
        "imports": probe,
        "plugin_registries": "verl" if real_verl else "stand-in of verl.trainer.ppo.core_algos (verl absent)",
        "records": records,
    }


@contextmanager
def _nothing():
    yield None


def _err(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


def _rec(name: str, ok: bool, t0: float, **fields) -> dict[str, Any]:
    return {"check": "verl", "name": name, "ok": ok, "seconds": round(time.perf_counter() - t0, 4), **fields}


def _check_loss(plugin, name: str, agg: str, batch, dev: Place, tol: Tolerance) -> dict[str, Any]:
    t0 = time.perf_counter()
    case = f"{dev.profile}:plugin_loss/{name}[agg={agg}]"
    try:
        d = _verl_loss(plugin, name, agg, batch, dev)
        r = _verl_loss(plugin, name, agg, batch, REFERENCE)
        direct = _direct_loss(name, agg, batch)
        scale = max(abs(float(r["loss"])), float(r["grad"].abs().sum()))
        identity = scalar_errors(r["loss"], direct, scale, rtol=IDENTITY_RTOL)
        loss = scalar_errors(d["loss"], r["loss"], scale)
        valid = batch["mask"] > 0
        grad = tensor_errors(d["grad"].cpu()[valid], r["grad"][valid], tol)
        res = {"loss": loss, "grad": grad, "identity": identity, "ok": loss["ok"] and grad["ok"] and identity["ok"]}
        limit = KNOWN_LIMITS.get((dev.profile, "policy_loss", name))
        if limit and not res["ok"] and identity["ok"]:
            return _rec(case, True, t0, metrics=res, limited=limit)
        return _rec(case, res["ok"], t0, metrics=res)
    except Exception as e:  # noqa: BLE001
        return _rec(case, False, t0, error=_err(e), tb=traceback.format_exc())
