"""Where every output lives. Snakemake rules and the CLI both use these patterns (one source).

Patterns use Snakemake-style ``{wildcards}``; ``fmt`` fills them. Declared outputs (DONE markers,
metrics, tables) live under ``results/{scale}/``; resumable checkpoints live under
``results/{scale}/checkpoints/`` which no rule declares, so Snakemake never deletes them when a job
fails and a re-run resumes where the killed job stopped.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = "{results}/{scale}/data"
DATA_DONE = DATA_DIR + "/prep_report.json"
SUITE = DATA_DIR + "/suites/{suite}.parquet"  # an evaluation suite (normalised records)
VERL_DATA_DIR = DATA_DIR + "/verl/{dataset}"  # paper scale: a training set as verl reads it (prompt chat list,
VERL_TRAIN = VERL_DATA_DIR + "/train.parquet"  # data_source, reward_model.ground_truth, extra_info), data.train_files
VERL_VAL = VERL_DATA_DIR + "/val.parquet"  # its held-out slice: verl's data.val_files
TRAIN_SET_DIR = DATA_DIR + "/train/{dataset}"  # paper scale: a training set's prepare_hub folder (normalised
# train/val records, its contamination_report.json and prep_report.json)
CONTAMINATION = DATA_DIR + "/contamination_report.json"  # paper scale: every training set against every suite
HUB_RAW = "{results}/{scale}/raw"  # paper scale: hub dataset files, <raw>/<hf_id>/ as `huggingface-cli download
# --local-dir` lays them out (env CREDITLAB_HUB_RAW overrides: prepare_paper.raw_dir); no rule declares it
BASE_DIR = "{results}/{scale}/models/{backbone}/base"
BASE_DONE = BASE_DIR + "/DONE"
RUN_DIR = "{results}/{scale}/runs/{backbone}/{run}/s{seed}"
RUN_DONE = RUN_DIR + "/DONE"
RUN_METRICS = RUN_DIR + "/metrics.jsonl"
RUN_TOKEN_CREDIT = RUN_DIR + "/token_credit.json"  # mean credit weight per generated token string
CKPT_DIR = "{results}/{scale}/checkpoints/{backbone}/{run}/s{seed}"  # paper scale: verl's default_local_dir
EVAL_DIR = "{results}/{scale}/evals/{backbone}/{run}/s{seed}"
EVAL_METRICS = EVAL_DIR + "/metrics.json"
DECODE_EVAL_DIR = EVAL_DIR + "/decode/{decode}"  # test-time decoding with the base + RL models
DECODE_EVAL_METRICS = DECODE_EVAL_DIR + "/metrics.json"
TABLE_CSV = "{results}/{scale}/tables/{paper}/{table}.csv"
TABLE_MD = "{results}/{scale}/tables/{paper}/{table}.md"
TABLE_HTML = "{results}/{scale}/tables/{paper}/{table}.html"  # the Markdown as a page of the HTML report
LEDGER_CSV = "{results}/{scale}/ledger/{paper}.csv"  # reproduction ledger: every cell + the claims' verdicts
LEDGER_MD = "{results}/{scale}/ledger/{paper}.md"
LEDGER_HTML = "{results}/{scale}/ledger/{paper}.html"
CURVES_PNG = "{results}/{scale}/figures/{paper}/{table}_training_curves.png"
FIGURE_PNG = "{results}/{scale}/figures/{paper}/figure_{figure}.png"
FIGURE_MD = "{results}/{scale}/figures/{paper}/figure_{figure}.md"  # figures that also write a table
FIGURE_CSV = "{results}/{scale}/figures/{paper}/figure_{figure}.csv"
ANALYSIS_JSON = "{results}/{scale}/analyses/{paper}/{analysis}.json"  # post-hoc analyses (creditlab.analysis)
ANALYSIS_MD = "{results}/{scale}/analyses/{paper}/{analysis}.md"
ANALYSIS_HTML = "{results}/{scale}/analyses/{paper}/{analysis}.html"
ANALYSIS_PNG = "{results}/{scale}/figures/{paper}/analysis_{analysis}.png"
DIAG_PNG = "{results}/{scale}/figures/diagnostics/{backbone}/{run}/s{seed}_token_histograms.png"
MLFLOW_DB = "{results}/mlflow.db"
TRACKING_READY = "{results}/.mlflow_ready"


def fmt(pattern: str, **values) -> Path:
    """Fill a pattern: ``fmt(RUN_DIR, results="results", scale="tiny", backbone=..., run=..., seed=0)``."""
    return Path(pattern.format(**values))


def run_key(scale: str, backbone: str, run: str, seed: int) -> str:
    """Deterministic run identity used for directories, MLflow tags and table provenance."""
    return f"{scale}/{backbone}/{run}/s{seed}"
