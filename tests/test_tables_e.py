"""Table-layer features for Paper E (DFPO): a paper's own seeds per scale, and the steps_to column
(training steps until the smoothed training reward reaches a threshold; Paper E's "compute to reach a
threshold: 0.91x of GSPO")."""

from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from creditlab import cli, paths
from creditlab import plan as plan_mod
from creditlab.papers.load import parse_paper
from creditlab.tables.build import build_table, write_table
from creditlab.tables.figures import plot_bars
from creditlab.tables.frame import LONG_COLUMNS
from creditlab.tables.load import load_steps_to, run_metrics_path
from creditlab.tables.render import steps_to_per_seed, steps_to_text, table_markdown
from creditlab.tables.stats import ema, steps_to_stats, steps_to_threshold
from table_helpers import DELETE as _DELETE
from table_helpers import cell as _cell
from table_helpers import edit as _edit

THRESHOLD, SMOOTHING, N = 0.7, 0.6, 8  # the column's threshold, the default EMA factor, steps per run
PAPER = {
    "paper": "te",
    "title": "Paper E toy: DFPO-like (test fixture)",
    "backbones": {"Small-32B": {"tiny": "tiny-s", "micro": "micro-s", "paper": "small-32b"}},
    "benchmarks": {"A": {"tiny": "sa", "micro": "sa", "paper": "bench-a"}},
    "runs": {
        "grpo": {"method": "grpo"},
        "gspo": {"method": "gspo"},
        "dfpo": {"method": "dfpo"},
        "never": {"method": "grpo", "overrides": ["trainer.mini_batches=2"]},
    },
    "seeds": {"tiny": [0, 1, 2]},
    "tables": {
        "compute": {
            "caption": "Toy compute-to-threshold table.",
            "columns": [
                {"name": "Steps to 0.7", "metric": "steps_to", "threshold": THRESHOLD},
                {
                    "name": "Compute vs GSPO",
                    "metric": "steps_to",
                    "threshold": THRESHOLD,
                    "relative_to": "gspo",
                    "relative": "ratio",
                },
                {"name": "Raw Δ", "metric": "steps_to", "threshold": THRESHOLD, "smoothing": 0, "relative_to": "gspo"},
                {"name": "Step time", "metric": "step_time", "relative_to": "gspo", "relative": "ratio"},
            ],
            "rows": [
                {"label": "Base", "backbone": "Small-32B", "run": "base"},
                {"label": "GRPO", "backbone": "Small-32B", "run": "grpo"},
                {"label": "GSPO", "backbone": "Small-32B", "run": "gspo"},
                {"label": "DFPO", "backbone": "Small-32B", "run": "dfpo", "paper": {"Compute vs GSPO": 0.91}},
                {"label": "Never", "backbone": "Small-32B", "run": "never"},
            ],
        },
    },
    "figures": {
        "compute_bars": {"kind": "bars", "table": "compute", "y": "Compute vs GSPO"},
        "clouds": {"kind": "token_credit", "backbone": "Small-32B", "run": "dfpo", "top": 2, "min_count": 1},
    },
}

# reward_mean per step: k zeros then ones (k = None: the reward stays at 0.5, the threshold is never reached)
ZEROS = {
    ("gspo", 0): 2,
    ("gspo", 1): 3,
    ("gspo", 2): 4,
    ("dfpo", 0): 1,
    ("dfpo", 1): 2,
    ("dfpo", 2): 3,
    ("grpo", 0): 3,
    ("grpo", 1): None,
    ("grpo", 2): 5,
    ("never", 0): None,
    ("never", 1): None,
    ("never", 2): None,
}
T_STEP = {"grpo": 1.0, "gspo": 1.2, "dfpo": 1.1, "never": 1.0}


def first_reach(k: int | None, smoothing: float = SMOOTHING, threshold: float = THRESHOLD) -> int | None:
    """Steps run until the debiased EMA of k zeros then ones reaches `threshold`, in closed form:
    after j ones the EMA is (1 - s^j) / (1 - s^(k+j)) (smoothing 0: the raw value, 1 after k + 1 steps)."""
    if k is None:
        return None
    if smoothing == 0:
        return k + 1
    for j in range(1, N - k + 1):
        if (1 - smoothing**j) / (1 - smoothing ** (k + j)) >= threshold:
            return k + j
    return None


def expected(run: str, seeds=(0, 1, 2), smoothing: float = SMOOTHING) -> tuple[np.ndarray, np.ndarray]:
    """(values, censored) per seed: the first reach, or N (censored)."""
    reach = [first_reach(ZEROS[(run, s)], smoothing) for s in seeds]
    return np.array([N if r is None else r for r in reach], float), np.array([r is None for r in reach])


def _paper(data: dict | None = None):
    return parse_paper(copy.deepcopy(data or PAPER), "te.yaml")


def _write_run(runs_dir: Path, backbone: str, run: str, seed: int) -> Path:
    k = ZEROS[(run, seed)]
    rewards = [0.5] * N if k is None else [0.0] * k + [1.0] * (N - k)
    path = run_metrics_path(runs_dir, backbone, run, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps(
                {
                    "step": i,
                    "reward_mean": r,
                    "response_len_mean": 5.0,
                    "entropy_mean": 1.0,
                    "t_step": T_STEP[run] + 0.01 * i,
                }
            )
            + "\n"
            for i, r in enumerate(rewards)
        )
    )
    (path.parent / "config.yaml").write_text("x: 1\n")
    (path.parent / "DONE").write_text(
        json.dumps(
            {"run_key": f"tiny/{backbone}/{run}/s{seed}", "mlflow_run_id": f"tr-{run}-{seed}", "commit": "abc123"}
        )
    )
    return path


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """results/tiny/runs for every trained row of the toy table, seeds 0, 1, 2 (no evaluation: none is read)."""
    root = tmp_path / "results"
    for run, seed in ZEROS:
        _write_run(root / "tiny" / "runs", "tiny-s", run, seed)
    return root


# ----------------------------------------------------------------------------------------------
# spec: seeds and steps_to columns


def test_paper_seeds_parse_and_default():
    te = _paper()
    assert te.seeds == {"tiny": (0, 1, 2)}
    assert te.seeds_at("tiny", [0]) == [0, 1, 2]
    assert te.seeds_at("micro", [0, 5]) == [0, 5]  # a scale not listed: the pipeline's
    data = copy.deepcopy(PAPER)
    del data["seeds"]
    assert _paper(data).seeds == {} and _paper(data).seeds_at("tiny", (3,)) == [3]
    col = te.table("compute").column("Steps to 0.7")
    assert (col.metric, col.threshold, col.smoothing, col.relative_to, col.is_training) == (
        "steps_to",
        0.7,
        0.6,
        None,
        True,
    )
    ratio, raw = te.table("compute").column("Compute vs GSPO"), te.table("compute").column("Raw Δ")
    assert (ratio.relative, ratio.relative_to, raw.relative, raw.smoothing) == ("ratio", "gspo", "percent", 0.0)
    assert te.table("compute").column("Step time").relative == "ratio"
    assert not te.needs_evals("compute", "tiny") and te.table("compute").leaves(col) == []


COLS = ["tables", "compute", "columns"]
E_ERRORS = {
    "seeds not a mapping": (_edit(["seeds"], [0, 1]), "seeds", "expected a mapping scale -> list of seeds"),
    "seeds unknown scale": (
        _edit(["seeds", "tny"], [0]),
        "seeds.tny",
        "unknown value 'tny'; choices: ['micro', 'paper', 'tiny']",
    ),
    "seeds empty": (_edit(["seeds", "tiny"], []), "seeds.tiny", "non-empty list of seeds"),
    "seeds not a list": (_edit(["seeds", "tiny"], 3), "seeds.tiny", "non-empty list of seeds"),
    "seed negative": (_edit(["seeds", "tiny"], [0, -1]), "seeds.tiny[1]", "non-negative integer seed, got -1"),
    "seed bool": (_edit(["seeds", "tiny"], [True]), "seeds.tiny[0]", "non-negative integer seed, got True"),
    "seed string": (_edit(["seeds", "tiny"], ["0"]), "seeds.tiny[0]", "non-negative integer seed, got '0'"),
    "seeds duplicate": (_edit(["seeds", "tiny"], [0, 1, 0]), "seeds.tiny", "duplicate seed(s) [0]"),
    "steps_to without threshold": (
        _edit([*COLS, 0, "threshold"], _DELETE),
        "columns[0] (Steps to 0.7)",
        "needs a threshold",
    ),
    "threshold not a number": (
        _edit([*COLS, 0, "threshold"], "high"),
        "columns[0] (Steps to 0.7).threshold",
        "expected a finite number, got 'high'",
    ),
    "threshold nan": (_edit([*COLS, 0, "threshold"], float("nan")), ".threshold", "expected a finite number"),
    "smoothing 1": (_edit([*COLS, 0, "smoothing"], 1.0), ".smoothing", "EMA factor in [0, 1)"),
    "smoothing negative": (_edit([*COLS, 0, "smoothing"], -0.1), ".smoothing", "EMA factor in [0, 1)"),
    "threshold on step_time": (
        _edit([*COLS, 3, "threshold"], 0.5),
        "columns[3] (Step time).threshold",
        "a step_time column takes no key 'threshold'; choices: ['name', 'metric', 'relative_to', 'relative']",
    ),
    "smoothing on accuracy": (
        _edit([*COLS, 0], {"name": "A", "benchmark": "A", "metric": "avg@k", "smoothing": 0.5}),
        "columns[0] (A).smoothing",
        "smoothing applies to a steps_to column only",
    ),
    "relative on accuracy": (
        _edit([*COLS, 0], {"name": "A", "benchmark": "A", "metric": "avg@k", "relative": "ratio"}),
        "columns[0] (A).relative",
        "relative applies to a training-cost column only",
    ),
    "relative without relative_to": (
        _edit([*COLS, 0, "relative"], "ratio"),
        "columns[0] (Steps to 0.7).relative",
        "needs relative_to",
    ),
    "relative unknown mode": (
        _edit([*COLS, 1, "relative"], "fold"),
        "(Compute vs GSPO).relative",
        "unknown value 'fold'; choices: ['percent', 'ratio']",
    ),
    "steps_to with a benchmark": (
        _edit([*COLS, 0, "benchmark"], "A"),
        "columns[0] (Steps to 0.7).benchmark",
        "takes no benchmark",
    ),
    "steps_to relative_to unknown run": (
        _edit([*COLS, 1, "relative_to"], "gspoo"),
        "relative_to",
        "unknown value 'gspoo'",
    ),
    "unknown metric lists steps_to": (_edit([*COLS, 0, "metric"], "steps_too"), "metric", "'steps_to'"),
    "threshold_of unknown run": (_edit([*COLS, 0, "threshold_of"], "gspoo"), ".threshold_of", "unknown value 'gspoo'"),
    "threshold_of share not positive": (
        lambda d: (_edit([*COLS, 0, "threshold_of"], "gspo")(d), _edit([*COLS, 0, "threshold"], 0)(d)),
        "columns[0] (Steps to 0.7).threshold",
        "a share of 'gspo''s final reward is > 0, got 0",
    ),
    "threshold_of on accuracy": (
        _edit([*COLS, 0], {"name": "A", "benchmark": "A", "metric": "avg@k", "threshold_of": "gspo"}),
        "columns[0] (A).threshold_of",
        "threshold_of applies to a steps_to column only",
    ),
    "threshold_of without its row": (
        lambda d: (_edit(["runs", "extra"], {"method": "grpo"})(d), _edit([*COLS, 0, "threshold_of"], "extra")(d)),
        "columns[0] (Steps to 0.7).threshold_of",
        "no row of run 'extra' on backbone 'Small-32B' (row 'GRPO') whose final reward sets the threshold",
    ),
}


@pytest.mark.parametrize("case", sorted(E_ERRORS))
def test_e_spec_errors_name_key_and_problem(case: str):
    mutate, key, problem = E_ERRORS[case]
    data = copy.deepcopy(PAPER)
    mutate(data)
    with pytest.raises(ValueError) as info:
        parse_paper(data, "te.yaml")
    message = str(info.value)
    assert message.startswith("te.yaml: ") and key in message and problem in message, message


# ----------------------------------------------------------------------------------------------
# steps_to: reached, censored, several seeds, one seed, relative (ratio and percent)


def test_steps_to_threshold_by_hand():
    steps, rewards = [0, 1, 2, 3], [0.0, 1.0, 1.0, 1.0]
    # debiased EMA, smoothing 0.5: 0, 0.5/0.75 = 0.667, 0.75/0.875 = 0.857, 0.875/0.9375 = 0.933
    assert ema(rewards, 0.5) == pytest.approx([0.0, 2 / 3, 6 / 7, 14 / 15])
    assert steps_to_threshold(steps, rewards, 0.8, 0.5) == (3, False, 4)  # reached at step 2: 3 steps run
    assert steps_to_threshold(steps, rewards, 0.8, 0.0) == (2, False, 4)  # raw reward: step 1
    assert steps_to_threshold(steps, rewards, 0.95, 0.5) == (4, True, 4)  # never: censored at N = 4
    assert steps_to_threshold(steps, rewards, 0.0, 0.5) == (1, False, 4)  # already there at the first step
    assert [first_reach(k) for k in (0, 1, 2, 3, 4, 5)] == [1, 3, 4, 6, 7, 8]  # the fixture's curves


def test_load_steps_to_resumed_and_cut_lines(tmp_path: Path):
    path = run_metrics_path(tmp_path, "tiny-s", "r", 0)
    path.parent.mkdir(parents=True)
    path.write_text(
        '{"step": 0, "reward_mean": 0.0}\n{"step": 1, "reward_mean": 0.9}\n'
        '{"step": 1, "reward_mean": 0.1}\n{"step": 2, "reward_mean": 0.8}\n{"step": 3, "rew'
    )
    with pytest.warns(UserWarning, match="not valid JSON"):
        st = load_steps_to(tmp_path, "tiny-s", "r", [0], threshold=0.75, smoothing=0.0)
    assert st.values.tolist() == [3.0] and not st.censored.any() and st.trained.tolist() == [3]  # step 1 resumed
    assert steps_to_per_seed(st) == "s0: 3" and steps_to_text(st) == "3 steps"
    path.write_text('{"step": 0, "t_step": 1.0}\n')
    with pytest.raises(ValueError, match="no step with a finite 'reward_mean'"):
        load_steps_to(tmp_path, "tiny-s", "r", [0], 0.5, 0.6)
    with pytest.raises(FileNotFoundError, match=r"r/s1/metrics\.jsonl is missing"):
        load_steps_to(tmp_path, "tiny-s", "r", [1], 0.5, 0.6)


def test_steps_to_cells_several_seeds(results: Path):
    te = _paper()
    df = build_table(te, "compute", "tiny", [0, 1, 2], results / "tiny" / "evals", k=8)  # no evaluation exists
    assert list(df.columns) == list(LONG_COLUMNS)
    gspo, _ = expected("gspo")
    dfpo, _ = expected("dfpo")
    grpo, grpo_cens = expected("grpo")
    assert gspo.tolist() == [4, 6, 7] and dfpo.tolist() == [3, 4, 6] and grpo.tolist() == [6, 8, 8]
    assert grpo_cens.tolist() == [False, True, False]  # seed 2 reaches it at its last step: not censored

    cell = _cell(df, "DFPO", "Steps to 0.7")
    assert cell.ours_mean == pytest.approx(dfpo.mean()) and cell.ours_lo < cell.ours_mean < cell.ours_hi
    assert dfpo.min() <= cell.ours_lo and cell.ours_hi <= dfpo.max()  # a bootstrap over the 3 seeds
    assert (cell.unit, cell.metric, cell.censored, cell.ref_censored, cell.n_steps, cell.seeds) == (
        "steps",
        "steps_to",
        0,
        0,
        3 * N,
        "0;1;2",
    )
    assert cell.detail == "s0: 3, s1: 4, s2: 6"
    assert cell.mlflow_run_ids == "tr-dfpo-0;tr-dfpo-1;tr-dfpo-2" and cell.sources.endswith("dfpo/s2/metrics.jsonl")
    grpo_cell = _cell(df, "GRPO", "Steps to 0.7")
    assert grpo_cell.ours_mean == pytest.approx(22 / 3) and grpo_cell.censored == 1  # censored seed counted at N
    assert grpo_cell.detail == "s0: 6, s1: >8, s2: 8"
    never = _cell(df, "Never", "Steps to 0.7")
    assert never.ours_mean == N and never.censored == 3 and never.detail == "s0: >8, s1: >8, s2: >8"
    base = _cell(df, "Base", "Steps to 0.7")
    assert math.isnan(base.ours_mean) and base.sources == "" and base.censored == 0

    ratio = _cell(df, "DFPO", "Compute vs GSPO")
    assert ratio.ours_mean == pytest.approx(dfpo.mean() / gspo.mean()) and ratio.unit == "x vs gspo"
    assert ratio.ours_lo < ratio.ours_mean < ratio.ours_hi and ratio.paper == 0.91
    assert ratio.detail == "4.33 steps vs 5.67 steps (gspo); s0: 3, s1: 4, s2: 6; gspo: s0: 4, s1: 6, s2: 7"
    ref = _cell(df, "GSPO", "Compute vs GSPO")
    assert (ref.ours_mean, ref.ours_lo, ref.ours_hi) == (1.0, 1.0, 1.0)
    assert ref.detail.startswith("reference: 5.67 steps")
    grpo_ratio = _cell(df, "GRPO", "Compute vs GSPO")
    assert grpo_ratio.ours_mean == pytest.approx(grpo.mean() / gspo.mean())
    assert (grpo_ratio.censored, grpo_ratio.ref_censored) == (1, 0)

    raw = _cell(df, "DFPO", "Raw Δ")  # smoothing 0, percent: the raw reward reaches 1 after k + 1 steps
    raw_gspo, _ = expected("gspo", smoothing=0)
    raw_dfpo, _ = expected("dfpo", smoothing=0)
    assert raw_dfpo.tolist() == [2, 3, 4] and raw.unit == "% vs gspo"
    assert raw.ours_mean == pytest.approx(100 * (raw_dfpo.mean() / raw_gspo.mean() - 1)) == pytest.approx(-25.0)
    assert _cell(df, "GSPO", "Raw Δ").ours_mean == 0.0

    step = _cell(df, "DFPO", "Step time")  # step_time with relative: ratio
    assert step.unit == "x vs gspo" and step.ours_mean == pytest.approx((1.1 + 0.035) / (1.2 + 0.035))

    md = table_markdown(df, te.table("compute"), te)
    for text in (
        f"| Small-32B | DFPO | {dfpo.mean():.2f} [{cell.ours_lo:.2f}, {cell.ours_hi:.2f}] | — | "
        f"{ratio.ours_mean:.2f}x [{ratio.ours_lo:.2f}, {ratio.ours_hi:.2f}] | 0.91x | -25.00% [",
        f"| Small-32B | GRPO | >7.33 [{grpo_cell.ours_lo:.2f}, {grpo_cell.ours_hi:.2f}] (1/3 censored) "
        f"| — | "
        f">{grpo_ratio.ours_mean:.2f}x [{grpo_ratio.ours_lo:.2f}, {grpo_ratio.ours_hi:.2f}] (censored: 1/3 "
        f"seeds, reference 0/3) | — |",
        "| Small-32B | Never | >8 (3/3 censored) | — |",
        "| Small-32B | GSPO | 5.67 [",
        "reference (5.67 steps) | — | reference (4 steps) | — | reference (",
        "first reaches **0.7**",
        "smoothing 0.6",
        "(no smoothing) the run's",
        "ratio of the means s / s_ref",
        "% difference of the means",
        "Seeds 0, 1, 2: this paper's own `seeds` at scale `tiny`",
        "Our steps-to-threshold cells",
        "95% percentile bootstrap CI over seeds",
        "ratio of the mean wall time per RL step",
        "training rewards from `",
    ):
        assert text in md, text
    base_line = next(line for line in md.splitlines() if line.startswith("| Small-32B | Base |"))
    assert base_line == "| Small-32B | Base |  | — |  | — |  | — |  | — |"


def test_steps_to_threshold_of_a_runs_final_reward(results: Path):
    """threshold_of: the level is the share x the reference run's final reward EMA (mean over the seeds), computed here
    in closed form: after k zeros and N - k ones the debiased EMA is (1 - s^(N-k)) / (1 - s^N)."""
    data = copy.deepcopy(PAPER)
    data["tables"]["compute"]["columns"] = [
        {"name": "Steps to 90% of GSPO", "metric": "steps_to", "threshold": 0.9, "threshold_of": "gspo"},
        {"name": "vs GSPO", "metric": "steps_to", "threshold": 0.9, "threshold_of": "gspo", "relative_to": "gspo"},
    ]
    data["tables"]["compute"]["rows"][3].pop("paper")
    data["figures"].pop("compute_bars")
    te = _paper(data)
    assert te.table("compute").columns[0].threshold_of == "gspo"
    s = SMOOTHING
    finals = [(1 - s ** (N - k)) / (1 - s**N) for k in (2, 3, 4)]  # gspo's seeds: 2, 3, 4 zeros
    level = 0.9 * np.mean(finals)
    assert level < min(finals)  # below every seed's last EMA: gspo reaches it in each seed
    df = build_table(te, "compute", "tiny", [0, 1, 2], results / "tiny" / "evals", k=8)
    for label, run in (("GSPO", "gspo"), ("DFPO", "dfpo"), ("GRPO", "grpo"), ("Never", "never")):
        reach = [first_reach(ZEROS[(run, seed)], threshold=level) for seed in (0, 1, 2)]
        want = [N if r is None else r for r in reach]
        cell = _cell(df, label, "Steps to 90% of GSPO")
        assert cell.ours_mean == pytest.approx(np.mean(want)), label
        assert cell.censored == sum(r is None for r in reach), label
        assert cell.detail.startswith(f"threshold {level:.4g} (0.9 x gspo's final reward EMA); "), cell.detail
    assert _cell(df, "GSPO", "Steps to 90% of GSPO").censored == 0
    ratio = _cell(df, "DFPO", "vs GSPO")
    dfpo = [first_reach(ZEROS[("dfpo", seed)], threshold=level) for seed in (0, 1, 2)]
    gspo = [first_reach(ZEROS[("gspo", seed)], threshold=level) for seed in (0, 1, 2)]
    assert ratio.ours_mean == pytest.approx(100 * (np.mean(dfpo) / np.mean(gspo) - 1))
    md = table_markdown(df, te.table("compute"), te)
    assert "0.9 x the last value of the same EMA of `gspo`'s reward" in md


def test_steps_to_one_seed_has_no_ci_and_roundtrips(results: Path, tmp_path: Path):
    te = _paper()
    df = build_table(te, "compute", "tiny", [0], results / "tiny" / "evals", k=8)
    cell = _cell(df, "DFPO", "Steps to 0.7")
    assert cell.ours_mean == 3 and math.isnan(cell.ours_lo) and math.isnan(cell.ours_hi)
    ratio = _cell(df, "DFPO", "Compute vs GSPO")
    assert ratio.ours_mean == pytest.approx(3 / 4) and math.isnan(ratio.ours_lo)
    assert _cell(df, "Never", "Steps to 0.7").censored == 1
    never_ratio = _cell(df, "Never", "Compute vs GSPO")
    assert never_ratio.ours_mean == pytest.approx(N / 4) and never_ratio.censored == 1
    out_csv, out_md = tmp_path / "t" / "compute.csv", tmp_path / "t" / "compute.md"
    write_table(df, te.table("compute"), te, out_csv, out_md)
    back = pd.read_csv(out_csv)
    assert list(back.columns) == list(LONG_COLUMNS) and back["censored"].dtype.kind == "i"
    md = out_md.read_text()
    assert table_markdown(back, te.table("compute"), te) == md  # the CSV carries everything
    for text in (
        "| Small-32B | DFPO | 3 | — | 0.75x | 0.91x | -33.33% | — |",
        "| Small-32B | Never | >8 | — | >2.00x (censored: 1/1 seeds, reference 0/1) |",
        "no CI: one seed",
        "mean over seeds 0 [no CI with a single seed]",
    ):
        assert text in md, text


def test_steps_to_stats_bounds_and_reference_censoring():
    from creditlab.tables.load import StepsTo

    def st(values, censored):
        return StepsTo(
            tuple(range(len(values))), np.array(values, float), np.array(censored), np.full(len(values), 8), {}
        )

    row, ref = st([3, 4, 6], [False] * 3), st([8, 8, 6], [True, True, False])
    mean, lo, hi = steps_to_stats(row, ref, "ratio")
    assert mean == pytest.approx(13 / 22) and lo < mean < hi
    assert steps_to_stats(row, ref, "percent")[0] == pytest.approx(100 * (13 / 22 - 1))
    assert steps_to_stats(st([5], [False]))[0] == 5 and math.isnan(steps_to_stats(st([5], [False]))[1])
    # the Markdown cell of a row whose reference is censored: an upper bound; both censored: no bound
    from creditlab.tables.render import _ours_cell

    line = pd.Series(
        {
            "unit": "x vs gspo",
            "detail": "",
            "metric": "steps_to",
            "run": "dfpo",
            "seeds": "0;1;2",
            "ours_mean": mean,
            "ours_lo": lo,
            "ours_hi": hi,
            "censored": 0,
            "ref_censored": 2,
        }
    )
    assert _ours_cell(line).startswith(f"<{mean:.2f}x [") and "reference 2/3)" in _ours_cell(line)
    both = pd.Series({**line.to_dict(), "censored": 1})
    assert _ours_cell(both).startswith(f"{mean:.2f}x [") and _ours_cell(both).endswith("reference 2/3: no bound)")


def test_bars_of_a_ratio_column_with_censored_rows(results: Path, tmp_path: Path):
    te = _paper()
    df = build_table(te, "compute", "tiny", [0, 1, 2], results / "tiny" / "evals", k=8)
    write_table(df, te.table("compute"), te, tmp_path / "c.csv", tmp_path / "c.md")
    with pytest.warns(UserWarning, match="row 'Base'"):
        out = plot_bars(pd.read_csv(tmp_path / "c.csv"), te, te.figures["compute_bars"], tmp_path / "bars.png")
    assert out.read_bytes()[:4] == b"\x89PNG" and out.stat().st_size > 5_000


# ----------------------------------------------------------------------------------------------
# per-paper seeds through the CLI verbs (table, figure): the paper's seeds, not the pipeline's


@pytest.fixture
def te_configs(tmp_path: Path, monkeypatch) -> Path:
    """configs/ copy with papers/te.yaml (seeds {tiny: [2, 0, 1]}); the pipeline's seeds are [0]."""
    cfg_dir = tmp_path / "configs"
    shutil.copytree(plan_mod.CONFIG_DIR, cfg_dir)
    data = copy.deepcopy(PAPER) | {"seeds": {"tiny": [2, 0, 1]}}
    (cfg_dir / "papers" / "te.yaml").write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    monkeypatch.setattr(cli, "build_plan", lambda pipe, validate=True: plan_mod.build_plan(pipe, cfg_dir, validate))
    pipe = tmp_path / "pipeline.yaml"
    pipe.write_text(yaml.safe_dump({"scale": "tiny", "papers": ["te"], "seeds": [0], "results": "results"}))
    return pipe


def test_cli_table_and_figure_use_the_papers_seeds(results: Path, te_configs: Path):
    common = ["--results", str(results), "--pipeline-config", str(te_configs)]
    cli.main([*common, "--seeds", "0", "table", "--paper", "te", "--table", "compute"])  # as Snakemake passes it
    fill = dict(results=results, scale="tiny", paper="te")
    df = pd.read_csv(paths.fmt(paths.TABLE_CSV, table="compute", **fill))
    assert set(df["seeds"]) == {"2;0;1"}
    dfpo = df[(df["row"] == "DFPO") & (df["column"] == "Steps to 0.7")].iloc[0]
    assert dfpo.ours_mean == pytest.approx(13 / 3) and dfpo.mlflow_run_ids == "tr-dfpo-2;tr-dfpo-0;tr-dfpo-1"
    assert paths.fmt(paths.CURVES_PNG, table="compute", **fill).stat().st_size > 5_000
    # token_credit reads the run of the paper's first seed (2), not the pipeline's (0)
    credit = {
        "tokens": [{"token": "=", "id": 4, "count": 9, "mean": 1.2}, {"token": "7", "id": 5, "count": 3, "mean": 0.9}],
        "n_tokens": 12,
        "steps": N,
        "weight": "credit",
    }
    path = paths.fmt(paths.RUN_TOKEN_CREDIT, results=results, scale="tiny", backbone="tiny-s", run="dfpo", seed=2)
    path.write_text(json.dumps(credit))
    cli.main([*common, "figure", "--paper", "te", "--name", "clouds"])
    md = paths.fmt(paths.FIGURE_MD, figure="clouds", **fill).read_text()
    assert "Run `dfpo` on Small-32B (`tiny-s`), seed 2" in md and "tr-dfpo-2" in md
    with pytest.warns(UserWarning, match="row 'Base'"):
        cli.main([*common, "figure", "--paper", "te", "--name", "compute_bars"])
    assert paths.fmt(paths.FIGURE_PNG, figure="compute_bars", **fill).read_bytes()[:4] == b"\x89PNG"
