"""Where a planned run's models, tokenizer, records and prompts come from, at every scale: the one resolver of the
verbs that load the models themselves (``diagnose``, ``analyze``; ``evaluate`` takes its base model, tokenizer and
stop tokens from here too). Per item, tiny / micro (the local engine) | paper / smoke (hub models trained by verl):

* base weights: ``BASE_DIR`` (the SFT warm-up) | the snapshot the `warmup` job recorded in ``BASE_DIR/DONE`` (paper:
  the hub download; smoke: the stand-in written in ``BASE_DIR``);
* trained weights: ``RUN_DIR/final`` (the local trainer's export | verl's model merger);
* tokenizer: ``DATA_DIR/tokenizer`` | ``model.tokenizer``, else the base snapshot's own;
* training records: ``DATA_DIR/train.parquet`` | ``TRAIN_SET_DIR`` of ``data.name``, the normalised records of the
  set verl trained on;
* prompts: the rendered text, the tokenizer adding BOS (as the local trainer renders them) | the rendered text as the
  user turn of the chat template with the generation prompt, kwargs ``eval.chat_template_kwargs`` (verl's rollout:
  the same kwargs are its ``data.apply_chat_template_kwargs``), by the evaluation's own
  :func:`creditlab.eval.evaluate.encode_prompts`;
* stop tokens: the tokenizer's EOS | EOS + generation_config ``eos_token_id`` (what verl's vLLM rollout stopped on);
* trained state (``start: trained``): the local trainer's checkpoint (``CKPT_DIR/state.pt``: weights, AdamW, scheduler,
  RNG) | verl's last FSDP checkpoint of the run (``CKPT_DIR/global_step_N/actor``): the fp32 master weights and AdamW
  moments gathered from its shards, the scheduler at step N (:func:`load_verl_train_state`). The merged ``final/`` is
  a bf16 cast of those masters, coarser than the updates of a few steps at lr 1e-6: it alone would lose them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditlab import paths


def base_weights(cfg: dict[str, Any], base_dir: Path) -> Path:
    """The base model's directory: the warmed-up tiny model (``base_dir``), or a hub model's snapshot (the path its
    `warmup` job recorded in ``base_dir/DONE``; FileNotFoundError when that job has not run)."""
    if cfg["model"].get("kind") != "hub":
        return Path(base_dir)
    done = Path(base_dir) / "DONE"
    if not done.is_file():
        raise FileNotFoundError(f"{done} is missing: the `warmup` job fetches {cfg['model']['hf_id']} first")
    return Path(json.loads(done.read_text())["path"])


@dataclass(frozen=True)
class RunSources:
    """The files of one run (see the module docstring). ``hub``: a hub-format model (paper / smoke)."""

    run_key: str
    hub: bool
    data_dir: Path
    base: Path
    trained: Path
    run_dir: Path
    ckpt_dir: Path
    tokenizer_path: Path
    train_records: Path
    template: str
    chat_kwargs: dict[str, Any]
    rl_prompts: dict[str, Any] | None = None

    def suite(self, name: str) -> Path:
        """An evaluation suite's records (``paths.SUITE``)."""
        return self.data_dir / "suites" / f"{name}.parquet"

    def weights(self, start: str) -> Path:
        """The weights of ``start``: ``base`` or ``trained``."""
        if start not in ("base", "trained"):
            raise ValueError(f"unknown start {start!r}; valid choices: ['base', 'trained']")
        return self.base if start == "base" else self.trained

    def load_tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.tokenizer_path))

    def load_records(self) -> list[dict[str, Any]]:
        """The training set's normalised records that are RL prompts (the prompts the run trained on: a tiny world's
        ``data.rl_prompts`` mix, :func:`creditlab.data.rule_arith.select_rl_prompts`)."""
        from creditlab.data.io import read_records
        from creditlab.data.rule_arith import select_rl_prompts

        if not self.train_records.is_file():
            raise FileNotFoundError(f"{self.run_key}: no training records at {self.train_records}: run `prepare`")
        return select_rl_prompts(read_records(self.train_records), self.rl_prompts)

    def encode(self, tok, records: list[dict[str, Any]]) -> list[list[int]]:
        """Prompt token ids of ``records``, rendered as the run's engine rendered its prompts (module docstring)."""
        from creditlab.eval.evaluate import encode_prompts

        return encode_prompts(tok, records, self.template, chat=self.hub, chat_kwargs=self.chat_kwargs)[1]

    def stop_ids(self, tok) -> int | list[int]:
        """Where a sampled response ends: the tokenizer's EOS (tiny), or every stop token of the hub checkpoint."""
        if not self.hub:
            return tok.eos_token_id
        from creditlab.eval.evaluate import stop_token_ids

        return stop_token_ids(tok, self.base)

    def load_model(self, start: str, *, dtype=None, device=None):
        """The causal LM of ``start`` (``base`` | ``trained``). ``dtype`` None: as saved (a tiny model's float32); a
        torch dtype or "auto". ``device``: where to move it (None: stay on the CPU)."""
        from transformers import AutoModelForCausalLM

        kw = {} if dtype is None else {"dtype": dtype}
        model = AutoModelForCausalLM.from_pretrained(str(self.weights(start)), **kw)
        return model if device is None else model.to(device)

    def verl_checkpoint(self) -> Path:
        """The verl checkpoint the run's DONE names (``CKPT_DIR/global_step_<steps_done>``): hub runs only."""
        done = self.run_dir / "DONE"
        if not done.is_file():
            raise FileNotFoundError(f"{self.run_key}: no {done}: the run is not trained")
        steps = int(json.loads(done.read_text())["steps_done"])
        return self.ckpt_dir / f"global_step_{steps}"

    def resume_trained(self, trainer) -> dict[str, Any]:
        """Put ``trainer`` (built on the trained weights) in the run's final training state: its model weights,
        AdamW moments, scheduler step. Tiny: the local trainer's own checkpoint (``Trainer.maybe_resume``, RNG states
        too). Hub: verl's last checkpoint (:func:`load_verl_train_state`). Never writes the run's checkpoint.
        Returns what was loaded (provenance); FileNotFoundError when there is no checkpoint."""
        if not self.hub:
            unused, trainer.ckpt_dir = trainer.ckpt_dir, self.ckpt_dir
            try:
                if not trainer.maybe_resume():
                    raise FileNotFoundError(f"{self.run_key}: no checkpoint under {self.ckpt_dir} to start from")
            finally:
                trainer.ckpt_dir = unused  # never written: the run's checkpoint stays as it is
            return {
                "source": "local",
                "checkpoint": str(self.ckpt_dir / "state.pt"),
                "step": trainer.step,
                "optimizer": "its AdamW moments, scheduler and RNG states",
                "weights": "its weights",
            }
        return load_verl_train_state(trainer, self.verl_checkpoint())


def check_prepared_world(data_dir: Path, cfg: dict[str, Any]) -> None:
    """A tiny-world job's data must be its config's world: ValueError when ``data_dir``'s prep_report.json names
    another data set than ``cfg["data"]["name"]`` (one world per results root: the pipeline's ``world``); nothing when
    the data are not prepared yet (the job's own read fails then, naming the file)."""
    report = Path(data_dir) / "prep_report.json"
    if not report.is_file():
        return
    have, want = json.loads(report.read_text()).get("name"), cfg["data"]["name"]
    if have != want:
        raise ValueError(
            f"{data_dir} holds the tiny world {have!r}, but this job's config is {want!r}: one world per results "
            f"root (prepare again with world={want}, or give this world its own results=...)"
        )


def run_sources(run, cfg: dict[str, Any], results: str | Path) -> RunSources:
    """The :class:`RunSources` of planned ``run`` (resolved config ``cfg``) under ``results``. The hub base snapshot
    is read from the warmup job's DONE (FileNotFoundError when it has not run)."""
    fill = dict(results=results, scale=run.scale, backbone=run.backbone, run=run.run, seed=run.seed)
    hub = cfg["model"].get("kind") == "hub"
    data_dir = paths.fmt(paths.DATA_DIR, **fill)
    base = base_weights(cfg, paths.fmt(paths.BASE_DIR, **fill))
    run_dir = paths.fmt(paths.RUN_DIR, **fill)
    if hub:
        tokenizer = Path(cfg["model"].get("tokenizer") or base)
        records = paths.fmt(paths.TRAIN_SET_DIR, dataset=cfg["data"]["name"], **fill) / "train.parquet"
    else:
        check_prepared_world(data_dir, cfg)
        tokenizer, records = data_dir / "tokenizer", data_dir / "train.parquet"
    return RunSources(
        run_key=run.key,
        hub=hub,
        data_dir=data_dir,
        base=base,
        trained=run_dir / "final",
        run_dir=run_dir,
        ckpt_dir=paths.fmt(paths.CKPT_DIR, **fill),
        tokenizer_path=tokenizer,
        train_records=records,
        template=cfg["data"].get("template", "tiny"),
        chat_kwargs=dict(cfg["eval"].get("chat_template_kwargs") or {}),
        rl_prompts=None if hub else cfg["data"].get("rl_prompts"),
    )


# --------------------------------------------------------------------------------------- verl's FSDP checkpoints
def _full(shards: list) -> Any:
    """One tensor from its per-rank FSDP2 pieces (DTensors sharded on dim 0 over a 1-D mesh, verl's default
    ``fsdp_size: -1``; plain tensors are taken as they are)."""
    import torch

    first = shards[0]
    if not hasattr(first, "to_local"):
        return first
    placements = tuple(first.placements)
    if len(placements) != 1 or not placements[0].is_shard(0):
        raise ValueError(f"FSDP placement {placements}: only verl's default 1-D mesh sharded on dim 0 is read")
    full = torch.cat([s.to_local() for s in shards], dim=0)
    if tuple(full.shape) != tuple(first.shape):
        raise ValueError(f"gathered shape {tuple(full.shape)} != the tensor's {tuple(first.shape)}")
    return full


def read_verl_checkpoint(step_dir: str | Path) -> dict[str, Any]:
    """verl's FSDP checkpoint of one step (``global_step_N``), gathered on the CPU: ``{"world_size", "model" (name ->
    full fp32 tensor, the actor's master weights in module order), "optim_state" (param index -> {step, exp_avg,
    exp_avg_sq} full tensors), "param_groups" (verl's AdamW hyperparameters), "lr_scheduler" (its state)}``.

    The files are what verl 0.9.1's ``FSDPCheckpointManager`` saves per rank: ``actor/model_world_size_W_rank_R.pt``,
    ``optim_world_size_W_rank_R.pt`` (a torch optimizer state dict whose entries are DTensor shards) and
    ``extra_state_world_size_W_rank_R.pt`` (``lr_scheduler``, ``rng``)."""
    import torch

    actor = Path(step_dir) / "actor"
    conf = json.loads((actor / "fsdp_config.json").read_text()) if (actor / "fsdp_config.json").is_file() else {}
    ws = int(conf.get("world_size") or len(list(actor.glob("model_world_size_*_rank_*.pt"))))
    if ws < 1:
        raise FileNotFoundError(f"no FSDP shards in {actor}")

    def load(kind: str) -> list[dict]:
        files = [actor / f"{kind}_world_size_{ws}_rank_{r}.pt" for r in range(ws)]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(
                f"verl checkpoint {actor}: missing {missing} (checkpoint.save_contents must keep "
                f"model, optimizer and extra)"
            )
        quiet = logging.getLogger("torch.distributed.device_mesh")  # "pickling/unpickling of the DeviceMesh occurred
        level, quiet.level = quiet.level, logging.ERROR  # before the PGs were created": no mesh is used
        try:
            return [torch.load(f, map_location="cpu", weights_only=False, mmap=True) for f in files]
        finally:
            quiet.setLevel(level)

    models, optims, extras = load("model"), load("optim"), load("extra_state")
    model = {k: _full([m[k] for m in models]).float() for k in models[0]}
    state = {}
    for i in optims[0]["state"]:
        per = [o["state"][i] for o in optims]
        state[i] = {k: (v if k == "step" else _full([p[k] for p in per]).float()) for k, v in per[0].items()}
    return {
        "world_size": ws,
        "model": model,
        "optim_state": state,
        "param_groups": [
            {k: v for k, v in g.items() if k != "params"} | {"n_params": len(g["params"])}
            for g in optims[0]["param_groups"]
        ],
        "lr_scheduler": extras[0].get("lr_scheduler") or {},
    }


def load_verl_train_state(trainer, step_dir: str | Path) -> dict[str, Any]:
    """Put ``trainer`` (a local Trainer without LoRA, built on the run's merged ``final/``) in the state verl's
    checkpoint ``step_dir`` holds: its fp32 master weights (``final/`` is the merger's cast of them), the AdamW moments
    and step counts of every parameter (matched by name: verl's optimizer indexes the actor's parameters in module
    order, deduplicated as ``named_parameters`` does, the order of its model state dict), the scheduler at verl's step.
    The local AdamW keeps its hyperparameters (the run's config, which verl got too; verl's are returned for the
    record). Returns the provenance. ValueError when the checkpoint does not fit the model (e.g. a LoRA actor)."""
    import torch

    if getattr(trainer, "peft", None) is not None:
        raise ValueError("a LoRA trainer cannot take verl's optimizer state (its actor's parameters differ)")
    ckpt = read_verl_checkpoint(step_dir)
    named = dict(trainer.model.named_parameters())
    order = [k for k in ckpt["model"] if k in named]  # module order; tied duplicates and buffers are not parameters
    if len(order) != len(named) or len(order) != len(ckpt["optim_state"]):
        raise ValueError(
            f"verl checkpoint {step_dir}: {len(ckpt['optim_state'])} optimizer entries and "
            f"{len(order)} of the model's {len(named)} parameters named in its state dict: not this "
            f"model's full-parameter actor"
        )
    with torch.no_grad():
        for k in order:
            p, w = named[k], ckpt["model"][k]
            if tuple(p.shape) != tuple(w.shape):
                raise ValueError(
                    f"verl checkpoint {step_dir}: {k} has shape {tuple(w.shape)}, the model's {tuple(p.shape)}"
                )
            p.copy_(w.to(p.dtype))
    index = {id(p): i for i, p in enumerate(trainer.params)}
    state = {}
    for j, k in enumerate(order):
        s = ckpt["optim_state"][j]
        if tuple(s["exp_avg"].shape) != tuple(named[k].shape):
            raise ValueError(
                f"verl checkpoint {step_dir}: optimizer entry {j} has shape {tuple(s['exp_avg'].shape)}, "
                f"parameter {k} {tuple(named[k].shape)}: the orders differ"
            )
        state[index[id(named[k])]] = {
            "step": torch.as_tensor(s["step"], dtype=torch.float32).clone(),
            "exp_avg": s["exp_avg"].to(trainer.device),
            "exp_avg_sq": s["exp_avg_sq"].to(trainer.device),
        }
    own = trainer.opt.state_dict()
    trainer.opt.load_state_dict({"state": state, "param_groups": own["param_groups"]})
    sched = ckpt["lr_scheduler"]
    step = int(sched.get("last_epoch", int(Path(step_dir).name.rsplit("_", 1)[-1])))
    trainer.sched.last_epoch = step
    lrs = [base * lam(step) for base, lam in zip(trainer.sched.base_lrs, trainer.sched.lr_lambdas)]
    for group, lr in zip(trainer.opt.param_groups, lrs):
        group["lr"] = lr
    trainer.sched._last_lr = lrs
    trainer.step = step
    adam_steps = sorted({float(s["step"]) for s in state.values()})
    return {
        "source": "verl",
        "checkpoint": str(step_dir),
        "world_size": ckpt["world_size"],
        "step": step,
        "optimizer": f"verl's AdamW moments ({len(state)} parameters, Adam step {adam_steps})",
        "weights": "verl's fp32 master weights of that checkpoint",
        "verl_param_groups": ckpt["param_groups"],
        "lr": lrs,
    }
