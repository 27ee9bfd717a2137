"""The `warmup` job: a backbone's base model (tiny: SFT warm-up; smoke: a stand-in; paper: the hub checkpoint)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import huggingface_hub

from creditlab import paths
from creditlab.data.io import read_records
from creditlab.data.prepare import warmup_records
from creditlab.data.smoke import data_texts, training_questions
from creditlab.engines.local.sft import save_model
from creditlab.engines.local.sft import warmup as sft
from creditlab.jobs.common import load_tokenizer, setup, write_json
from creditlab.jobs.evaluate import evaluate_suites
from creditlab.models.sources import check_prepared_world
from creditlab.models.standin import TAUGHT, write_standin
from creditlab.models.tiny import build_model, n_params
from creditlab.plan import check_world, compose
from creditlab.tracking.mlflow_tracker import Tracker
from creditlab.tracking.provenance import git_commit


def warmup(
    results: str | Path, scale: str, backbone: str, seed: int = 0, *, quiet: bool = False, world: str | None = None
) -> None:
    """The base model of ``backbone`` at ``scale`` under results/<scale>/base/<backbone>, with its DONE: at paper
    scale the fetched hub model (:func:`fetch_hub_model`), at smoke scale a stand-in (:func:`write_standin_model`),
    else the SFT warm-up (:func:`sft_warmup`)."""
    if scale == "paper":
        fetch_hub_model(results, scale, backbone, seed)
    elif scale == "smoke":
        write_standin_model(results, scale, backbone, seed)
    else:
        sft_warmup(results, scale, backbone, seed, quiet=quiet, world=world)


def sft_warmup(
    results: str | Path, scale: str, backbone: str, seed: int = 0, *, quiet: bool = False, world: str | None = None
) -> None:
    """SFT warm-up of one tiny backbone on the train split and the data config's SFT-only ``warmup_extra`` records
    (the transfer formats) of the prepared tiny world ``world`` (None: the scale's default, ``check_world``), its
    greedy accuracy on the validation split, MLflow (experiment base-models)."""
    world = check_world(world, scale)
    cfg = compose(scale, backbone, seed=seed, overrides=[f"data={world}"])
    setup(cfg)
    data_dir = paths.fmt(paths.DATA_DIR, results=results, scale=scale)
    check_prepared_world(data_dir, cfg)
    out = paths.fmt(paths.BASE_DIR, results=results, scale=scale, backbone=backbone)
    tok = load_tokenizer(data_dir)
    model = build_model(cfg["model"]["arch"], len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, seed)
    key = f"{scale}/{backbone}/warmup"
    tracker = Tracker.start(
        Path(results),
        "base-models",
        key,
        key,
        tags={"scale": scale, "backbone": backbone, "method": "sft-warmup", "git_commit": git_commit()},
        params=cfg,
        local_dir=out,
    )
    t0 = time.perf_counter()
    history = sft(model, tok, warmup_records(data_dir), cfg, seed, tracker.log_metrics, progress=not quiet)
    val = {"val": read_records(data_dir / "val.parquet")[: cfg["warmup"]["eval_n"]]}
    val_eval = evaluate_suites(model, tok, val, cfg, seed, out / "val_eval", quiet)
    acc = val_eval["suites"]["val"]["metrics"]["greedy"]["mean"]
    tracker.log_metrics({"val_greedy_acc": acc}, cfg["warmup"]["steps"])
    save_model(model, tok, out)
    tracker.end()
    done = {
        "steps_done": len(history),
        "steps_requested": cfg["warmup"]["steps"],
        "params": n_params(model),
        "final_loss": history[-1]["sft_loss"],
        "val_greedy_acc": acc,
        "seconds": time.perf_counter() - t0,
        "mlflow_run_id": tracker.run_id,
        "commit": git_commit(),
    }
    write_json(done, out / "DONE")
    print(json.dumps(done, indent=1))


def write_standin_model(results: str | Path, scale: str, backbone: str, seed: int = 0) -> None:
    """Scale smoke: the base model of a paper backbone is a stand-in of its architecture class taught to answer the
    prepared training questions right with a set probability each (creditlab.models.standin; its tokenizer covers the
    prepared data), written as a hub snapshot in the base model's directory; DONE records it as `warmup` records a
    fetched snapshot at paper scale, with what the stand-in learnt (`answers`: per question the exact probability of
    the right and the wrong answer)."""
    cfg = compose(scale, backbone, seed=seed)
    m = cfg["model"]
    out = paths.fmt(paths.BASE_DIR, results=results, scale=scale, backbone=backbone)
    data_dir = paths.fmt(paths.DATA_DIR, results=results, scale=scale)
    t0 = time.perf_counter()
    write_standin(m["arch"]["family"], data_texts(data_dir), out, seed=seed, questions=training_questions(data_dir))
    done = {
        "hf_id": m["hf_id"],
        "standin": True,
        "family": m["arch"]["family"],
        "path": str(out.resolve()),
        "answers": json.loads((out / TAUGHT).read_text()) if (out / TAUGHT).is_file() else [],
        "seconds": time.perf_counter() - t0,
        "commit": git_commit(),
    }
    write_json(done, out / "DONE")
    print(json.dumps(done, indent=1))


def fetch_hub_model(results: str | Path, scale: str, backbone: str, seed: int = 0) -> None:
    """Paper scale: the base model of a backbone is its hub checkpoint (no SFT warm-up: every paper starts RL from the
    released model). Download the snapshot once (huggingface_hub; the HF_HOME cache, so a pre-filled cache on an
    offline cluster works with HF_HUB_OFFLINE=1), check its config.json against configs/model/<backbone>.yaml (model
    type and context window), and write DONE with the hub id, the resolved commit and the local path (the verl
    launcher trains from that path)."""
    cfg = compose(scale, backbone, seed=seed)
    m = cfg["model"]
    if m.get("kind") != "hub":
        raise SystemExit(f"model {backbone!r} is not a hub model (kind={m.get('kind')!r}): nothing to fetch")
    out = paths.fmt(paths.BASE_DIR, results=results, scale=scale, backbone=backbone)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    local = Path(huggingface_hub.snapshot_download(repo_id=m["hf_id"], revision=m.get("revision")))
    hf_config = json.loads((local / "config.json").read_text())
    found = {"family": hf_config.get("model_type"), "max_position_embeddings": hf_config.get("max_position_embeddings")}
    wanted = {"family": m["arch"]["family"], "max_position_embeddings": m["arch"]["max_position_embeddings"]}
    if found != wanted:
        raise SystemExit(
            f"{m['hf_id']}: config.json says {found}, configs/model/{backbone}.yaml says {wanted} "
            f"(arch.family / arch.max_position_embeddings): fix the model config"
        )
    done = {
        "hf_id": m["hf_id"],
        "revision": m.get("revision"),
        "commit": local.name,
        "path": str(local),
        "seconds": time.perf_counter() - t0,
        "creditlab_commit": git_commit(),
    }
    write_json(done, out / "DONE")
    print(json.dumps(done, indent=1))
