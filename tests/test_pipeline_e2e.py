"""End to end: the whole Snakemake DAG at `micro` size, then a no-op re-run and the HTML report.

One session-scoped DAG run (tests/e2e.py, a few minutes on 2 cores) feeds several checks.
"""

from __future__ import annotations

import json
import re
import sqlite3

import pandas as pd
import pytest

from e2e import _snakemake  # the shared micro DAG; its fixtures come through conftest.py

pytestmark = pytest.mark.e2e


def test_arca_lora_runs_train_merge_and_evaluate(cancellation_results):
    """Paper D through the DAG: two LoRA runs (uniform and ARCA at the top rank) train, save the merged model
    and the adapter, log the concentration diagnostics, and the ARCA run is evaluated from its merged model
    (the whole sweep and its tables are `make run`; the table layer's train_mean cells are unit-tested)."""
    micro = cancellation_results / "micro"
    targets = [str(micro / "runs/micro-s/uniform-r64/s0/DONE"), str(micro / "evals/micro-s/arca-r64/s0/metrics.json")]
    proc = _snakemake(*targets, results=cancellation_results, papers="dlogp,delta,dfpo,cancellation,arca")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    for run in ("uniform-r64", "arca-r64"):
        rd = micro / f"runs/micro-s/{run}/s0"
        assert (rd / "final/config.json").is_file() and (rd / "adapter").is_dir(), run
        rows = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
        for key in ("weight_gini", "eff_token_ratio", "ref_kl", "arca_residual_mean", "random_residual_gini"):
            assert all(key in r for r in rows), (run, key)
    uni = [json.loads(x) for x in (micro / "runs/micro-s/uniform-r64/s0/metrics.jsonl").read_text().splitlines()]
    assert all(abs(r["weight_gini"]) < 1e-6 for r in uni)  # uniform weights: Gini 0 at every step
    ev = json.loads((micro / "evals/micro-s/arca-r64/s0/metrics.json").read_text())
    assert "medium" in ev["suites"]


def test_cancellation_table_runs_and_analyses(cancellation_results):
    micro = cancellation_results / "micro"
    df = pd.read_csv(micro / "tables/cancellation/broken.csv")
    assert set(df["row"]) == {"Baseline", "+QB", "Sign-partitioned"}
    assert set(df["column"]) == {"AIME24", "AMC", "MATH-500", "Avg", "Split groups"}
    split = df[df["column"] == "Split groups"].set_index("row")["ours_mean"]
    assert split["+QB"] == 0 and split["Sign-partitioned"] > 0  # what each row's batching really did
    cfg = (micro / "runs/micro-s/qb-rb/s0/config.yaml").read_text()
    assert "batching: query_preserved" in cfg and "enable: true" in cfg
    rows = [json.loads(x) for x in (micro / "runs/micro-s/qb-rb/s0/metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all("rb_rounds" in r and "rb_fill" in r for r in rows)
    assert all("skipped" not in r and r["groups_split_frac"] == 0 for r in rows)  # RB updates every step
    flips = json.loads((micro / "analyses/cancellation/flipping.json").read_text())
    assert {r["mode"] for r in flips["rows"]} == {"joint", "positive_only", "negative_only", "shuffled"}
    assert flips["provenance"]["run_key"] == "micro/micro-s/dapo/s0" and flips["provenance"]["start"] == "base"
    trained = json.loads((micro / "analyses/cancellation/flipping_trained.json").read_text())
    assert trained["provenance"]["start"] == "trained"
    coupling = json.loads((micro / "analyses/cancellation/coupling.json").read_text())
    assert set(coupling["updates"]) == {"lm_head", "full"}
    budget = json.loads((micro / "analyses/cancellation/value_budget.json").read_text())
    assert [(r["axis"], r["value"]) for r in budget["rows"]] == [
        ("batch size", 8),
        ("batch size", 16),
        ("batch size", 32),
        ("rollout n", 4),
        ("rollout n", 8),
        ("rollout n", 16),
    ]
    for a in ("flipping", "flipping_trained", "value", "value_budget", "coupling"):
        assert (micro / f"figures/cancellation/analysis_{a}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", a
        assert "never the paper's" in (micro / f"analyses/cancellation/{a}.md").read_text()


def test_delta_transfer_table_figures_and_tracking(delta_results):
    df = pd.read_csv(delta_results / "micro/tables/delta/transfer.csv")
    assert set(zip(df["row"], df["paper_backbone"])) == {
        (m, b) for m in ("DAPO", "DelTA") for b in ("Olmo3-7B-Base", "Qwen3-8B-Base", "Qwen3-14B-Base")
    }
    assert set(df["column"]) == {"Math Avg", "OOD", "Code", "Step time (s)", "Overhead vs DAPO"}
    for col in ("OOD", "Code"):  # the transfer suites (multiple choice, code execution): a real cell in every row
        cells = df[df["column"] == col]
        assert len(cells) == 6 and cells["ours_mean"].between(0, 100).all(), cells
        assert (cells["ours_lo"] <= cells["ours_mean"]).all() and (cells["ours_mean"] <= cells["ours_hi"]).all()
    evals = json.loads((delta_results / "micro/evals/micro-s/delta/s0/metrics.json").read_text())["suites"]
    assert {s: evals[s]["reward"] for s in ("choice4", "choice10", "code")} == {
        "choice4": "multiple_choice",
        "choice10": "multiple_choice",
        "code": "code_exec",
    }
    steps = df[df["column"] == "Step time (s)"]
    assert (steps["ours_mean"] > 0).all() and (steps["ours_lo"] <= steps["ours_hi"]).all()
    md = (delta_results / "micro/tables/delta/transfer.md").read_text()
    assert "averages only 3 of its 7 benchmarks" in md and "reference (" in md and "10.20" in md
    cfg = (delta_results / "micro/runs/micro-olmo/delta/s0/config.yaml").read_text()
    assert "family: olmo" in cfg and "name: delta" in cfg
    clouds = json.loads((delta_results / "micro/runs/micro-s/delta/s0/token_credit.json").read_text())
    assert clouds["n_tokens"] == sum(t["count"] for t in clouds["tokens"]) > 0
    for f in ("figure_token_selection.png", "figure_token_clouds.png"):
        assert (delta_results / "micro/figures/delta" / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f
    assert "Highest mean weight" in (delta_results / "micro/figures/delta/figure_token_clouds.md").read_text()
    with sqlite3.connect(delta_results / "mlflow.db") as db:
        n = db.execute(
            "select count(*) from runs r join experiments e on r.experiment_id = e.experiment_id "
            "where e.name = 'delta' and r.status = 'FINISHED'"
        ).fetchone()[0]
        assert n >= 9  # 6 transfer runs + 3 selection runs


def test_dfpo_compute_table_from_training_metrics_only(delta_results):
    """Paper E's compute-to-threshold table reads training metrics only: no evaluation job ran for it."""
    df = pd.read_csv(delta_results / "micro/tables/dfpo/compute.csv")
    assert set(df["row"]) == {"GRPO", "GSPO", "GRPO-fix", "DFPO"}
    steps = df[df["column"] == "Steps to reward"]
    assert (steps["ours_mean"] >= 1).all() and (steps["ours_mean"] <= 4).all()  # 4 micro steps (censored at 4)
    # the level: 90% of GSPO's final reward EMA on micro-s, the same in every cell, GSPO's own reached by construction
    levels = {d.split(" (")[0] for d in steps["detail"]}
    assert len(levels) == 1 and all("(0.9 x gspo's final reward EMA); " in d for d in steps["detail"]), levels
    assert steps.loc[steps["row"] == "GSPO", "censored"].eq(0).all()
    # no evaluation job ran for it: checked by the delta_results fixture, before Paper E's main table evaluates
    rows = [
        json.loads(x) for x in (delta_results / "micro/runs/micro-s/dfpo/s0/metrics.jsonl").read_text().splitlines()
    ]
    assert all("cancel_rel_residual" in r for r in rows)
    coefs = [r["cancel_group_coef_rel"] for r in rows if r["cancel_group_coef_rel"] == r["cancel_group_coef_rel"]]
    assert all(abs(c) < 1e-6 for c in coefs)  # DFPO cancels in every mini-batch (nan: no gradient that step)


def test_dfpo_main_table_has_the_code_column(dfpo_main_results):
    """Paper E's Table 1 at micro scale: the LiveCodeBench v6 column is the tiny code suite (code_exec), a real
    cell in every row next to the math ones."""
    df = pd.read_csv(dfpo_main_results / "micro/tables/dfpo/main.csv")
    assert set(df["column"]) == {"AIME25", "LiveCodeBench v6", "HMMT25"}
    code = df[df["column"] == "LiveCodeBench v6"]
    assert len(code) == 7 and code["ours_mean"].between(0, 100).all(), code  # DFPO's two transforms: 7 rows
    assert {"DFPO", "DFPO (Min-Replace)"} <= set(code["row"])
    jsonl = dfpo_main_results / "micro/evals/micro-s/dfpo/s0/code.jsonl"
    rows = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert rows and all(r["gold"].startswith('{"func_name": "f"') for r in rows)  # graded against the tests


def test_table_has_every_row_with_ci_and_provenance(micro_results):
    df = pd.read_csv(micro_results / "micro/tables/dlogp/main.csv")
    rows = set(zip(df["row"], df["paper_backbone"]))
    assert rows == {
        ("Base", "Qwen2.5-Math-7B"),
        ("DAPO", "Qwen2.5-Math-7B"),
        ("DAPO", "Qwen3-8B-Base"),
        ("Δlog p reweight", "Qwen2.5-Math-7B"),
        ("Δlog p reweight", "Qwen3-8B-Base"),
    }
    assert set(df["column"]) == {"AIME24", "AIME25", "AMC", "Avg", "Pass@16"}  # the paper's Pass@16: pass@4 at micro
    assert set(df[df["column"] == "Pass@16"]["metric"]) == {"pass@4"}
    ours = df[["ours_lo", "ours_mean", "ours_hi"]]
    assert ((ours >= 0) & (ours <= 100)).all().all()
    assert (df["ours_lo"] <= df["ours_mean"] + 1e-9).all() and (df["ours_mean"] <= df["ours_hi"] + 1e-9).all()
    assert df["paper"].notna().all()  # every cell of this table has a paper number beside ours
    dlogp_cfg = json.loads((micro_results / "micro/runs/micro-m/dlogp-ds-a0.1/s0/DONE").read_text())
    assert dlogp_cfg["steps_done"] == 4
    assert df["mlflow_run_ids"].notna().all() and df["commits"].notna().all()
    md = (micro_results / "micro/tables/dlogp/main.md").read_text()
    assert "35.73" in md and "not comparable" in md.lower()
    ablation = pd.read_csv(micro_results / "micro/tables/dlogp/ablation.csv")
    assert set(ablation["row"]) == {"PPL", "Dominate", "Ours (Δlog p)"}
    for png in (
        "dlogp/main_training_curves.png",
        "dlogp/figure_replacement_curves.png",
        "diagnostics/micro-s/dapo-ds/s0_token_histograms.png",
    ):
        assert (micro_results / "micro/figures" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png


def test_test_time_decoding_tables(micro_results):
    rep = pd.read_csv(micro_results / "micro/tables/dlogp/replacement.csv")
    rates = rep[rep["column"] == "Replaced"].set_index("row")["ours_mean"]
    assert rates[["Base", "DAPO (π_RL)"]].isna().all()  # plain decoding: not applicable
    decoded = rates.drop(["Base", "DAPO (π_RL)"])
    assert decoded.notna().all() and ((decoded >= 0) & (decoded <= 100)).all()
    assert rates["random (3)"] > rates["random (1)"]  # a looser threshold replaces more
    ext = pd.read_csv(micro_results / "micro/tables/dlogp/extrapolation.csv")
    assert ext[(ext["row"] == "Selective extrapolation") & (ext["column"] == "AIME24")]["paper"].item() == 55.42
    metrics = json.loads((micro_results / "micro/evals/micro-s/dapo-ds/s0/decode/extrap/metrics.json").read_text())
    assert metrics["provenance"]["decode"]["gamma"] == 0.05 and metrics["provenance"]["decode"]["threshold"] == -0.02


def test_runs_are_done_resumable_and_tracked(micro_results):
    done = json.loads((micro_results / "micro/runs/micro-s/dapo-ds/s0/DONE").read_text())
    assert done["steps_done"] == done["steps_requested"] == 4
    assert (micro_results / "micro/checkpoints/micro-s/dapo-ds/s0/state.pt").exists()
    report = json.loads((micro_results / "micro/data/prep_report.json").read_text())
    overlaps = [n for per_split in report["overlap"].values() for n in per_split.values()]
    assert overlaps and all(n == 0 for n in overlaps)
    lines = (micro_results / "micro/evals/micro-m/dapo-ds/s0/hard.jsonl").read_text().splitlines()
    assert len(lines) == 12 * (1 + 4)  # 12 questions x (greedy + k=4 samples): nothing lost
    with sqlite3.connect(micro_results / "mlflow.db") as db:
        names = {r[0] for r in db.execute("select name from experiments")}
        assert {"dlogp", "base-models"} <= names
        tags = dict(
            db.execute(
                "select t.key, t.value from tags t join runs r on r.run_uuid = t.run_uuid where r.run_uuid = ?",
                (done["mlflow_run_id"],),
            ).fetchall()
        )
        for key in ("paper", "table", "method", "backbone", "seed", "scale", "git_commit"):
            assert key in tags, key
        assert tags["method"] == "dapo" and tags["scale"] == "micro" and tags["paper"] == "dlogp"
        n_metrics = db.execute(
            "select count(*) from metrics where run_uuid = ? and key = 'reward_mean'", (done["mlflow_run_id"],)
        ).fetchone()[0]
        assert n_metrics >= 4
        evals = db.execute(
            "select count(*) from metrics where run_uuid = ? and key like 'eval/%'", (done["mlflow_run_id"],)
        ).fetchone()[0]
        assert evals > 0  # the evaluation logged into the run it evaluates


def test_noop_rerun_starts_no_job(micro_results, delta_results):
    proc = _snakemake("-n", results=micro_results, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_jobs_carry_their_priorities(micro_results):
    """Snakemake started each job with the priority creditlab.resources.order gives it: every warm-up above every
    run, each run its compute's (what orders the jobs on 2 cores; tests/test_order.py checks the values)."""
    from creditlab.plan import BASE_RUN, build_plan, composed_configs
    from creditlab.resources.order import train_priority

    log = (micro_results.parent / "snakemake.log").read_text()
    jobs = re.findall(r"rule (warmup|train):\n(?:    .*\n)*?    wildcards: (.*)\n    priority: ([0-9.]+)", log)
    warmups = [float(p) for rule, _, p in jobs if rule == "warmup"]
    trains = {w: float(p) for rule, w, p in jobs if rule == "train"}
    plan = build_plan({"scale": "micro", "papers": ["dlogp"], "seeds": [0], "results": str(micro_results)})
    configs = composed_configs(r for r in plan.runs.values() if r.run != BASE_RUN)  # the base model trains no run
    assert len(warmups) == 2 and len(trains) == len(configs) == 6, jobs
    for wildcards, priority in trains.items():
        w = dict(kv.split("=") for kv in wildcards.split(", "))
        cfg = configs[f"micro/{w['backbone']}/{w['run']}/s{w['seed']}"]
        assert priority == pytest.approx(train_priority(cfg), abs=1e-6), wildcards
    assert min(warmups) > max(trains.values())


def test_html_report(report_html):
    html = report_html.read_text(errors="replace")
    # tables as pages (HTML) and CSV downloads, training curves, ledger; rendering is checked in a browser
    for name in ("main.html", "main.csv", "main_training_curves.png", "dlogp.html"):
        assert name in html, name


def test_job_logs_show_progress(micro_results):
    """Long jobs report progress as readable lines in their Snakemake logs: RL steps with reward, evaluation
    samples and suites (a tqdm bar on a terminal; see creditlab.progress)."""
    logs = micro_results / "micro/logs"
    train = (logs / "train/micro-s/dapo-ds/s0.log").read_text()
    steps = re.findall(r"\[rl steps\] (\d+)/(\d+) \((\d+)%\).*reward=", train)
    assert steps and steps[-1][0] == steps[-1][1] and steps[-1][2] == "100", train[-800:]
    evaluate = (logs / "evaluate/micro-s/dapo-ds/s0.log").read_text()
    assert re.search(r"\[generate samples\] (\d+)/\1 \(100%\)", evaluate), evaluate[-800:]
    assert re.search(r"\[eval suites\] (\d+)/\1 \(100%\)", evaluate), evaluate[-800:]
