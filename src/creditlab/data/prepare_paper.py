"""``python -m creditlab --scale paper prepare``: the Hub datasets of the paper-scale plan, fetched and prepared into
the files the rest of the pipeline reads (SPEC.md "Data at paper scale").

What is needed (:func:`plan_inputs`): the training set of every planned training run (its composed ``data`` config,
``configs/data/<name>.yaml``, ``kind: hub``) and every suite the planned tables read (``Plan.table_suites``),
described by the suite catalogue (``configs/suites/paper.yaml``, every hub data config's ``suites``). Each
``hf_id`` (+ ``config``, ``split``) maps to one loader of :data:`creditlab.data.hub_registry.HUB_DATASETS`
(:func:`creditlab.data.hub_registry.lookup`; an unknown one is refused with the choices).

Steps (:func:`prepare_paper`):

1. fetch (:func:`fetch`): every needed Hub repository into ``<raw_dir>/<hf_id>/`` with
   ``huggingface_hub.snapshot_download(repo_id=hf_id, repo_type="dataset", local_dir=..., allow_patterns=...)``
   (the registry's file patterns of the split / config read), unless its files are there already. With
   ``HF_HUB_OFFLINE=1`` nothing is downloaded: a missing dataset is an error naming it and the
   ``huggingface-cli download`` command that fetches it. A download creditlab started and did not finish
   (``.creditlab-download.json`` says ``complete: false``) counts as missing.
2. suites: loaded once, each question count checked against the catalogue's ``n`` (when not null), written as
   normalised records to ``suites/<suite>.parquet``.
3. each training set: :func:`creditlab.data.prepare_hub.prepare_hub` -- dedupe as its config says (DAPO-Math-17k:
   yes, SPEC), decontaminated against every prepared suite (13-gram / normalised exact match, action drop), ``val.n``
   held out (verl's validation set); the verl files at ``verl/<dataset>/{train,val}.parquet``.
4. the report, ``prep_report.json`` (``creditlab.paths.DATA_DONE``), written last: removed first, so a failed job
   leaves none.

Layout under ``results/paper/data`` (:mod:`creditlab.paths`)::

    suites/<suite>.parquet                      SUITE: normalised records (evaluation)
    verl/<dataset>/train.parquet, val.parquet   VERL_TRAIN / VERL_VAL: verl's data.train_files / data.val_files
    train/<dataset>/                            TRAIN_SET_DIR: prepare_hub's folder of the set (train / val normalised
                                                records, contamination_report.json, prep_report.json)
    contamination_report.json                   CONTAMINATION: {dataset: its contamination report}
    prep_report.json                            DATA_DONE: the whole report (written last)

``raw_dir``: ``$CREDITLAB_HUB_RAW``, else ``results/paper/raw`` (``creditlab.paths.HUB_RAW``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditlab import paths
from creditlab.data.dedupe import write_json
from creditlab.data.hub_registry import allow_patterns, download_command, find_files, get_dataset, lookup
from creditlab.data.io import write_records
from creditlab.data.prepare_hub import load_suites, prepare_hub

log = logging.getLogger(__name__)

RAW_ENV = "CREDITLAB_HUB_RAW"
"""Environment variable naming the raw_dir (default ``results/<scale>/raw``)."""
MARKER = ".creditlab-download.json"
"""Written into ``<raw_dir>/<hf_id>/`` around a download: ``complete`` false while it runs."""
CATALOGUE = "configs/suites/paper.yaml"
"""Where the suite catalogue comes from (for messages)."""


class PaperDataError(ValueError):
    """A paper-scale data problem to fix by hand; the message says what and how."""


class MissingHubData(PaperDataError, FileNotFoundError):
    """Hub datasets are not in raw_dir and may not be downloaded (``HF_HUB_OFFLINE=1``)."""


def raw_dir(results: str | Path, scale: str = "paper") -> Path:
    """The folder of the Hub files: ``$CREDITLAB_HUB_RAW``, else ``<results>/<scale>/raw``."""
    env = os.environ.get(RAW_ENV)
    return Path(env) if env else paths.fmt(paths.HUB_RAW, results=results, scale=scale)


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` set to a true value (as huggingface_hub reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


# ----------------------------------------------------------------------------------------------- what is needed


@dataclass
class PaperData:
    """What the paper-scale plan needs: its training sets and the suites its tables read."""

    datasets: dict[str, dict[str, Any]]
    """data config name -> the composed data config (configs/data/<name>.yaml)."""
    suites: list[str]
    """The suites the planned tables read, in catalogue order."""
    catalogue: dict[str, dict[str, Any]]
    """suite name -> its catalogue entry (hf_id, config, split, kind, n, sample, ...)."""
    runs: dict[str, list[str]] = field(default_factory=dict)
    """data config name -> the keys of the runs that train on it."""


def plan_inputs(plan: Any, config_dir: str | Path | None = None) -> PaperData:
    """The training sets (each training run's composed ``data``) and suites (``Plan.table_suites`` of every
    planned table) of ``plan``; the catalogue is the data configs' ``suites`` (configs/suites/paper.yaml).

    Raises:
        PaperDataError: a training run's data is not a hub data config, one data config name resolves to two
            different configs, the data configs disagree on the catalogue, or a table reads a suite the catalogue
            lacks.
    """
    from omegaconf import OmegaConf

    from creditlab.config_compose import CONFIG_DIR, CachedComposer, run_args

    config_dir = Path(config_dir) if config_dir is not None else CONFIG_DIR
    datasets: dict[str, dict[str, Any]] = {}
    runs: dict[str, list[str]] = {}
    by_args: dict[tuple, dict[str, Any]] = {}
    with CachedComposer(config_dir, "run") as composer:
        for run in plan.runs.values():
            if not run.trains:
                continue
            key = (run.backbone, run.method, tuple(run.overrides))  # the seed does not change the data
            if key not in by_args:
                cfg = composer.compose(run_args(run.scale, run.backbone, run.method, run.overrides, run.seed))
                by_args[key] = OmegaConf.to_container(cfg.data, resolve=True)
            data = by_args[key]
            name = str(data.get("name"))
            if data.get("kind") != "hub":
                raise PaperDataError(
                    f"run {run.key} trains on data {name!r} (kind {data.get('kind')!r}): at scale "
                    f"paper every training set is a hub data config (configs/data/*.yaml kind: hub)"
                )
            if name in datasets and datasets[name] != data:
                raise PaperDataError(
                    f"data config {name!r} resolves differently for runs {runs[name][0]} and "
                    f"{run.key}; prepare writes one training set per name: give the variant its "
                    f"own data config"
                )
            datasets.setdefault(name, data)
            runs.setdefault(name, []).append(run.key)
    catalogues = {name: data.get("suites") or {} for name, data in datasets.items()}
    if catalogues:
        first = next(iter(catalogues))
        catalogue = catalogues[first]
        for name, other in catalogues.items():
            if other != catalogue:
                raise PaperDataError(
                    f"data configs {first!r} and {name!r} carry different suite catalogues "
                    f"(`suites`); every hub data config includes {CATALOGUE}"
                )
    else:
        import yaml

        catalogue = yaml.safe_load((config_dir / "suites" / "paper.yaml").read_text()) or {}
    wanted = list(dict.fromkeys(s for p, t in plan.tables for s in plan.table_suites(p, t)))
    unknown = [s for s in wanted if s not in catalogue]
    if unknown:
        raise PaperDataError(
            f"planned tables read suite(s) {unknown} that {CATALOGUE} lacks; its suites: {sorted(catalogue)}"
        )
    return PaperData(
        datasets=datasets, suites=[s for s in catalogue if s in wanted], catalogue=dict(catalogue), runs=runs
    )


def _dataset_of(entry: Mapping[str, Any], where: str) -> str:
    """The registry name of a config's ``{hf_id, config, split}``."""
    for key in ("hf_id", "split"):
        if not entry.get(key):
            raise PaperDataError(f"{where}: missing key {key!r}")
    try:
        return lookup(str(entry["hf_id"]), entry.get("config"), str(entry["split"])).name
    except ValueError as err:
        raise PaperDataError(f"{where}: {err}") from None


def suite_entry(suite: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """A catalogue entry -> the prepare_hub dataset entry of the suite (registry name, ``sample``)."""
    where = f"{CATALOGUE} {suite}"
    name = _dataset_of(entry, where)
    kind = get_dataset(name).kind
    if entry.get("kind") not in (None, kind):
        raise PaperDataError(f"{where}: kind {entry['kind']!r}, but its loader {name!r} reads {kind!r} records")
    out: dict[str, Any] = {"dataset": name}
    if entry.get("sample"):
        out["sample"] = dict(entry["sample"])
    return out


def hub_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """A hub data config (configs/data/<name>.yaml) -> the prepare_hub config of its training set (without the
    suites, which :func:`prepare_paper` loads once for every set)."""
    name = str(data["name"])
    where = f"configs/data/{name}.yaml train"
    train = data.get("train") or {}
    val = data.get("val") or {}
    if int(val.get("n") or 0) < 1:
        raise PaperDataError(
            f"configs/data/{name}.yaml val.n must be >= 1: the verl launcher always passes the "
            f"held-out val file (paths.VERL_VAL) as data.val_files"
        )
    entry: dict[str, Any] = {"dataset": _dataset_of(train, where)}
    if train.get("sample"):
        entry["sample"] = dict(train["sample"])
    return {
        "name": name,
        "template": data.get("template", "boxed"),
        "train": [entry],
        "val": {"n": int(val["n"]), "seed": int(val.get("seed", 0))},
        "dedupe": {"train": bool(train.get("dedupe", False)), "eval": False},
        "contamination": {"enable": True, "action": "drop", **dict(data.get("contamination") or {})},
    }


@dataclass(frozen=True)
class Need:
    """One registry dataset the plan reads, and who reads it."""

    dataset: str
    used_by: tuple[str, ...]

    @property
    def hub_id(self) -> str:
        return get_dataset(self.dataset).hub_id


def needs(inputs: PaperData) -> list[Need]:
    """The registry datasets of ``inputs``: each training set's and each suite's (validated: unknown ids raise)."""
    users: dict[str, list[str]] = {}
    for name, data in inputs.datasets.items():
        users.setdefault(hub_config(data)["train"][0]["dataset"], []).append(f"training set {name}")
    for suite in inputs.suites:
        users.setdefault(suite_entry(suite, inputs.catalogue[suite])["dataset"], []).append(f"suite {suite}")
    return [Need(name, tuple(who)) for name, who in users.items()]


# ----------------------------------------------------------------------------------------------- fetch


def _marker(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _missing(group: list[Need], folder: Path, raw: Path) -> list[str]:
    """Why the files of ``group`` are not usable in ``folder`` (empty: they are)."""
    marker = _marker(folder)
    if marker is not None and not marker.get("complete"):
        return [
            (
                f"an unfinished download of {marker.get('repo_id')} (started {marker.get('started')}; "
                f"{folder / MARKER} says complete: false)"
            )
        ]
    why = []
    for need in group:
        try:
            find_files(need.dataset, raw)
        except FileNotFoundError as err:
            why.append(str(err))
    return why


def _download(hf_id: str, folder: Path, patterns: list[str]) -> None:
    import huggingface_hub

    folder.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    write_json({"repo_id": hf_id, "allow_patterns": patterns, "complete": False, "started": started}, folder / MARKER)
    log.info("downloading %s (%s) into %s", hf_id, patterns, folder)
    try:
        huggingface_hub.snapshot_download(
            repo_id=hf_id, repo_type="dataset", local_dir=str(folder), allow_patterns=patterns
        )
    except Exception as err:  # network, auth (gated), missing repo: say what to do by hand
        raise PaperDataError(
            f"downloading {hf_id} failed ({type(err).__name__}: {err}). A gated dataset (Idavidrein/gpqa) needs its "
            f"terms accepted on huggingface.co and a token (HF_TOKEN or `huggingface-cli login`); on a node without "
            f"network fetch it elsewhere with `{download_command(hf_id, folder, patterns)}` and run with "
            f"HF_HUB_OFFLINE=1"
        ) from err
    write_json(
        {
            "repo_id": hf_id,
            "allow_patterns": patterns,
            "complete": True,
            "started": started,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
        folder / MARKER,
    )


def fetch(wanted: list[Need], raw: str | Path, offline: bool | None = None) -> dict[str, dict[str, Any]]:
    """Make the files of every needed dataset present under ``raw`` (one download per Hub repository, with the
    union of its datasets' patterns); ``offline`` (default: ``HF_HUB_OFFLINE``) downloads nothing.

    Returns ``{hf_id: {status: present | downloaded, folder, datasets, allow_patterns}}``.

    Raises:
        MissingHubData: offline and some are missing: names each, who needs it, and the command to fetch it.
        PaperDataError: a download failed, or left no file a loader reads.
    """
    raw = Path(raw)
    offline = hub_offline() if offline is None else offline
    repos: dict[str, list[Need]] = {}
    for need in wanted:
        repos.setdefault(need.hub_id, []).append(need)
    report: dict[str, dict[str, Any]] = {}
    missing: list[str] = []
    for hf_id, group in repos.items():
        folder = raw / hf_id
        patterns = list(dict.fromkeys(p for need in group for p in allow_patterns(need.dataset)))
        entry = {"folder": str(folder), "datasets": [n.dataset for n in group], "allow_patterns": patterns}
        why = _missing(group, folder, raw)
        if not why:
            report[hf_id] = {"status": "present", **entry}
            continue
        if offline:
            users = ", ".join(u for need in group for u in need.used_by)
            missing.append(
                f"- {hf_id} ({', '.join(entry['datasets'])}; for {users}): {'; '.join(why)}\n"
                f"    {download_command(hf_id, folder, patterns)}"
            )
            continue
        _download(hf_id, folder, patterns)
        why = _missing(group, folder, raw)
        if why:
            raise PaperDataError(f"downloaded {hf_id} into {folder}, but no loader file is there: {'; '.join(why)}")
        report[hf_id] = {"status": "downloaded", **entry}
    if missing:
        raise MissingHubData(
            f"HF_HUB_OFFLINE=1 and {len(missing)} hub dataset(s) are missing from {raw} (set {RAW_ENV} to use "
            f"another folder); fetch them where there is network, then run again:\n" + "\n".join(missing)
        )
    return report


# ----------------------------------------------------------------------------------------------- prepare


def _check_count(what: str, got: int, expected: Any, where: str) -> str | None:
    if expected is None or int(expected) == got:
        return None
    return f"{what}: {got} questions after the loader's filters, but {where} says n: {int(expected)}"


def prepare_paper(
    inputs: PaperData,
    results: str | Path,
    scale: str = "paper",
    raw: str | Path | None = None,
    offline: bool | None = None,
) -> dict[str, Any]:
    """Fetch and prepare everything ``inputs`` needs into ``<results>/<scale>/data`` (the module docstring's
    layout); returns the report written to ``paths.DATA_DONE`` (last).

    Raises:
        MissingHubData, PaperDataError: see :func:`fetch`; a suite's (or training set's) question count differs
            from its ``n``; an unknown hf_id.
        ValueError, RuntimeError: from :func:`creditlab.data.prepare_hub.prepare_hub`.
    """
    t0 = time.perf_counter()
    fill = dict(results=results, scale=scale)
    data_dir = paths.fmt(paths.DATA_DIR, **fill)
    done = paths.fmt(paths.DATA_DONE, **fill)
    done.unlink(missing_ok=True)  # the DONE marker: never left stale by a failed job
    raw = Path(raw) if raw is not None else raw_dir(results, scale)
    wanted = needs(inputs)  # validates every hf_id before any download
    downloads = fetch(wanted, raw, offline)

    # the suites: loaded once, counted, written
    eval_cfg = {suite: suite_entry(suite, inputs.catalogue[suite]) for suite in inputs.suites}
    loaded = load_suites(eval_cfg, raw)
    errors = [
        _check_count(
            f"suite {suite} ({eval_cfg[suite]['dataset']})",
            len(loaded.records[suite]),
            inputs.catalogue[suite].get("n"),
            f"{CATALOGUE} {suite}",
        )
        for suite in inputs.suites
    ]
    errors = [e for e in errors if e]
    if errors:
        raise PaperDataError("; ".join(errors) + " (a changed hub dataset or loader: check, then fix `n`)")
    suite_dir = paths.fmt(paths.SUITE, suite="x", **fill).parent
    for stale in sorted(suite_dir.glob("*.parquet")) if suite_dir.is_dir() else []:
        if stale.stem not in loaded.records:
            log.info("removing %s: no planned table reads it", stale)
            stale.unlink()
    suites_report: dict[str, Any] = {}
    for suite, records in loaded.records.items():
        path = write_records(records, paths.fmt(paths.SUITE, suite=suite, **fill))
        entry = inputs.catalogue[suite]
        suites_report[suite] = {
            "file": os.path.relpath(path, data_dir),
            "count": len(records),
            "n": entry.get("n"),
            "dataset": eval_cfg[suite]["dataset"],
            "hf_id": entry["hf_id"],
            "config": entry.get("config"),
            "split": entry["split"],
            "kind": get_dataset(eval_cfg[suite]["dataset"]).kind,
            "sample": eval_cfg[suite].get("sample"),
            "source": loaded.sources[suite],
        }

    # the training sets, each decontaminated against every suite
    sets: dict[str, Any] = {}
    contamination: dict[str, Any] = {}
    for name, data in inputs.datasets.items():
        cfg = hub_config(data)
        out = paths.fmt(paths.TRAIN_SET_DIR, dataset=name, **fill)
        verl = paths.fmt(paths.VERL_DATA_DIR, dataset=name, **fill)
        rep = prepare_hub(cfg, raw, out, suites=loaded, write_suites=False, verl_dir=verl)
        err = _check_count(
            f"training set {name}",
            rep["counts"]["train"],
            (data.get("train") or {}).get("n"),
            f"configs/data/{name}.yaml train",
        )
        if err:
            raise PaperDataError(err)
        verl_train = paths.fmt(paths.VERL_TRAIN, dataset=name, **fill)
        verl_val = paths.fmt(paths.VERL_VAL, dataset=name, **fill)
        for p in (verl_train, verl_val):
            if not p.is_file():
                raise RuntimeError(f"prepare_hub did not write {p}")  # a layout bug, not a data problem
        contamination[name] = rep["contamination"]
        c = rep["contamination"] or {}
        sets[name] = {
            "dataset": cfg["train"][0]["dataset"],
            "hf_id": data["train"]["hf_id"],
            "runs": len(inputs.runs.get(name, [])),
            "counts": {"train": rep["counts"]["train"], "val": rep["counts"].get("val", 0)},
            "verl_train": os.path.relpath(verl_train, data_dir),
            "verl_val": os.path.relpath(verl_val, data_dir),
            "report": os.path.relpath(out / "prep_report.json", data_dir),
            "dedupe": {k: rep["dedupe"]["train"][k] for k in ("applied", "n_in", "n_kept", "n_dropped")},
            "contaminated_dropped": c.get("n_dropped", 0),
            "contaminated_by_suite": {
                s: v["train_items"] for s, v in (c.get("per_eval") or {}).items() if v["train_items"]
            },
            "max_prompt_chars": rep["max_prompt_chars"].get("train"),
        }
        log.info("training set %s: %s", name, sets[name]["counts"])
    contamination_path = write_json(contamination, paths.fmt(paths.CONTAMINATION, **fill))

    from creditlab.tracking.provenance import git_commit

    report = {
        "scale": scale,
        "raw_dir": str(raw),
        "offline": hub_offline() if offline is None else offline,
        "downloads": downloads,
        "datasets": {
            need.dataset: {
                "hf_id": need.hub_id,
                "config": get_dataset(need.dataset).hub_config,
                "split": get_dataset(need.dataset).hub_split,
                "used_by": list(need.used_by),
            }
            for need in wanted
        },
        "suites": suites_report,
        "training_sets": sets,
        "contamination_file": os.path.relpath(contamination_path, data_dir),
        "seconds": round(time.perf_counter() - t0, 3),
        "creditlab_commit": git_commit(),
    }
    write_json(report, done)  # last
    return report


def download(
    inputs: PaperData,
    results: str | Path,
    scale: str = "paper",
    raw: str | Path | None = None,
    offline: bool | None = None,
) -> dict[str, Any]:
    """Only step 1 of :func:`prepare_paper` (e.g. on a login node with network, before the job that prepares with
    ``HF_HUB_OFFLINE=1``): ``{raw_dir, downloads}``; writes nothing under ``<results>/<scale>/data``."""
    raw = Path(raw) if raw is not None else raw_dir(results, scale)
    return {"raw_dir": str(raw), "downloads": fetch(needs(inputs), raw, offline)}


def run(plan: Any, results: str | Path, offline: bool | None = None, download_only: bool = False) -> dict[str, Any]:
    """What ``python -m creditlab --scale paper prepare [--download-only]`` does: :func:`plan_inputs`, then
    :func:`prepare_paper` (or :func:`download`). At scale ``smoke`` the hub fixtures are placed in the raw_dir first
    and the catalogue counts are not checked (:mod:`creditlab.data.smoke`)."""
    inputs = plan_inputs(plan)
    if plan.scale == "smoke":  # the hub fixtures stand in for the downloads (creditlab.data.smoke)
        from creditlab.data import smoke

        inputs = smoke.smoke_inputs(inputs)
        raw = raw_dir(results, plan.scale)
        if download_only:
            raise PaperDataError("scale smoke downloads nothing: its data are the hub fixtures")
        for need in needs(inputs):
            smoke.place(raw, need.dataset)
        return prepare_paper(inputs, results, plan.scale, raw=raw, offline=True)
    if download_only:
        return download(inputs, results, plan.scale, offline=offline)
    return prepare_paper(inputs, results, plan.scale, offline=offline)
