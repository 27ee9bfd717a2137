"""Issue 10, the head-to-head table: method combinations composed from the registries, the refusal of ill-defined
ones (algos/compat.py) before any job starts, the versus claims (paired test + Holm) against direct computations,
the table's claims column and accuracy-vs-cost figure on synthetic evaluations, and the matched protocol of
configs/papers/headtohead.yaml."""

from __future__ import annotations

import copy
import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from creditlab.algos.batching import call_batching, groups_split_frac, keeps_groups_whole
from creditlab.algos.credit.base import CreditInputs, compose_credit, method_entries
from creditlab.algos.credit.delta import delta_weights
from creditlab.algos.credit.dlogp import dlogp_weights
from creditlab.algos.registry import get
from creditlab.config_compose import hydra_value
from creditlab.papers.load import parse_paper
from creditlab.plan import (
    CONFIG_DIR,
    PlanError,
    build_plan,
    check_registered,
    combination_overrides,
    compose,
    run_config,
)
from creditlab.tables import ledger as L
from creditlab.tables import stats as S
from creditlab.tables.build import build_table
from creditlab.tables.load import metrics_path, run_metrics_path
from creditlab.tables.render import table_markdown
from table_helpers import write_eval

# ------------------------------------------------------------------------------------------- composition


def _inputs(B: int = 8, T: int = 6, d: int = 5, seed: int = 0) -> CreditInputs:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T)
    mask[1, 4:] = 0
    mask[5, 2:] = 0
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.2, -0.7, 0.0, 0.3])[:B]
    return CreditInputs(
        responses=torch.randint(0, 9, (B, T), generator=g),
        mask=mask,
        old_logp=-torch.rand(B, T, generator=g) * 3,
        advantages=adv,
        group_ids=torch.arange(B) // 4,
        hidden=torch.randn(B, T, d, generator=g),
    )


def test_combined_run_config_multiplies_the_credit_functions():
    """`combine: [dlogp]` on DelTA: the resolved credit list is DelTA's then Δlog p's, and the composed weights equal
    lambda_DelTA x (1 + alpha (1 - p)) computed by calling the two functions directly."""
    over = combination_overrides("micro", "micro-s", "delta", ["dlogp"])
    cfg = compose("micro", "micro-s", "delta", [*over, "method.credit.1.alpha=0.3"])
    check_registered(cfg, "test")
    assert cfg["method"]["name"] == "delta+dlogp"
    assert [c["name"] for c in cfg["method"]["credit"]] == ["delta", "dlogp"]
    assert cfg["method"]["credit"][1]["alpha"] == 0.3  # an override addresses the combined list
    x = _inputs()
    got = compose_credit(method_entries("credit", cfg["method"]["credit"]), x)
    direct = delta_weights(x.responses, x.mask, x.old_logp, x.advantages, x.hidden) * dlogp_weights(x.old_logp, 0.3)
    assert torch.allclose(got, direct.float(), atol=1e-6)
    assert not torch.allclose(got, direct / dlogp_weights(x.old_logp, 0.3))  # both factors matter


def test_combination_takes_filters_too_and_keeps_the_base_loss():
    over = combination_overrides("micro", "micro-s", "gspo", ["dlogp"])
    cfg = compose("micro", "micro-s", "gspo", over)
    check_registered(cfg, "test")  # GSPO x a credit weight = GSPO-token with A_{i,t}: allowed
    assert cfg["method"]["policy_loss"] == "gspo" and cfg["method"]["loss_kwargs"]["eps_low"] == 3e-4
    over = combination_overrides("micro", "micro-s", "delta", ["forking"])
    cfg = compose("micro", "micro-s", "delta", over)
    assert [f["name"] for f in cfg["method"]["token_filter"]] == ["forking"]
    assert [c["name"] for c in cfg["method"]["credit"]] == ["delta"]


@pytest.mark.parametrize(
    "base,combine,match",
    [
        ("dapo", ["sapo"], "no credit function or token filter"),  # SAPO's mechanism is its loss
        ("delta", ["dapo"], "no credit function or token filter"),
        ("dapo", ["delta"], None),
    ],
)
def test_combining_a_loss_method_is_refused(base, combine, match):
    if match is None:
        assert combination_overrides("micro", "micro-s", base, combine)
        return
    with pytest.raises(PlanError, match=match):
        combination_overrides("micro", "micro-s", base, combine)


def test_combining_a_method_twice_is_refused():
    with pytest.raises(PlanError, match=r"adds \['dlogp'\], which the run already has"):
        combination_overrides("micro", "micro-s", "dlogp", ["dlogp"])
    with pytest.raises(ValueError, match="lists a method twice"):
        parse_paper({**copy.deepcopy(H2H), "runs": {"x": {"method": "dlogp", "combine": ["dlogp"]}}}, "hh.yaml")


def test_hydra_value_round_trips():
    v = [{"name": "a b", "x": None, "y": [0.8, 1.0], "z": True, "q": "it's"}, {"name": "n", "k": 3}]
    cfg = compose("micro", "micro-s", "dapo", [f"method.credit={hydra_value(v)}"])
    assert cfg["method"]["credit"] == v


# ------------------------------------------------------------------------------------------- refusals


def _cfg(method: str, over: list[str], combine: tuple[str, ...] = ()) -> dict:
    extra = list(combination_overrides("micro", "micro-s", method, combine)) if combine else []
    return compose("micro", "micro-s", method, [*extra, *over])


@pytest.mark.parametrize(
    "method,combine,over,rule",
    [
        ("dapo", ("arca",), [], "reference_pass"),
        ("dfpo", (), ["trainer.batching=random"], "whole_groups"),
        ("grpo_fix", (), ["trainer.batching=token_balanced"], "whole_groups"),
        ("dfpo", (), ["trainer.batching=sequential", "trainer.mini_batches=3"], "whole_groups"),  # 4 prompts / 3
        ("dfpo", ("dlogp",), ["trainer.batching=query_preserved"], "rollout_weight_transform"),
        ("dfpo", ("forking",), ["trainer.batching=query_preserved"], "rollout_weight_transform"),
        ("gspo", ("forking",), [], "sequence_ratio_filter"),
        ("dapo", (), ["trainer.batching=sign_partitioned", "trainer.reward_balance.enable=true"], "balanced_updates"),
    ],
)
def test_ill_defined_compositions_are_refused_with_their_reason(method, combine, over, rule):
    cfg = _cfg(method, over, combine)
    with pytest.raises(PlanError, match=rf"ill-defined composition: .*\[rule {rule}\]") as err:
        check_registered(cfg, "micro/micro-s/x/s0")
    assert "micro/micro-s/x/s0" in str(err.value)


@pytest.mark.parametrize(
    "method,combine,over",
    [
        ("dapo", ("arca",), ["trainer.lora.enable=true"]),
        ("dfpo", (), ["trainer.batching=query_preserved"]),
        ("dfpo", (), ["trainer.batching=sequential", "trainer.mini_batches=2"]),
        ("dfpo", ("dlogp",), ["trainer.batching=query_preserved", "method.loss_kwargs.transform=none"]),
        ("grpo_fix", ("dlogp",), ["trainer.batching=query_preserved"]),
        ("dfpo", (), ["trainer.batching=random", "trainer.mini_batches=1"]),
        ("delta", ("dlogp",), ["trainer.batching=query_preserved", "trainer.reward_balance.enable=true"]),
    ],
)
def test_well_defined_compositions_pass(method, combine, over):
    check_registered(_cfg(method, over, combine), "ok")


def test_the_trainer_refuses_what_the_plan_refuses(tmp_path):
    """The local trainer runs the same check when it is built (a one-run verb with a hand-made config)."""
    from conftest import make_trainer  # the helper that builds a micro-size local trainer

    with pytest.raises(ValueError, match=r"\[rule whole_groups\]"):
        make_trainer("dfpo", tmp_path, ["trainer.batching=random", "trainer.mini_batches=2"])


@pytest.mark.parametrize(
    "name",
    ["random", "sequential", "token_balanced", "verl_default", "verl_ray", "query_preserved", "sign_partitioned"],
)
def test_keeps_groups_whole_agrees_with_the_batchings(name):
    """Where keeps_groups_whole says so, the batching never splits a group (and where it says not, it does for some
    batch): checked on the registered functions themselves."""
    fn = get("batching", name)
    for P, G, M in itertools.product([2, 3, 4, 6], [2, 4], [1, 2, 3]):
        gids = torch.arange(P).repeat_interleave(G)
        split = []
        for s in range(20):
            gen = torch.Generator().manual_seed(s)
            adv = torch.randn(P * G, generator=gen)
            lengths = torch.randint(1, 30, (P * G,), generator=gen)
            mbs = call_batching(fn, gids, M, gen, lengths=lengths, seq_lengths=lengths + 5, advantages=adv, n_ranks=2)
            split.append(groups_split_frac(mbs, gids))
        if keeps_groups_whole(name, P, M):
            assert max(split) == 0, (name, P, G, M)
        else:
            assert max(split) > 0, (name, P, G, M)


def test_a_paper_config_with_an_ill_defined_run_fails_the_plan(tmp_path):
    """At DAG build: the plan names the run and the rule (configs are validated before any job starts)."""
    cfg_dir = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, cfg_dir)
    bad = (
        (CONFIG_DIR / "papers" / "headtohead.yaml")
        .read_text()
        .replace(
            "  dfpo-qb:                   # group-coupled loss: whole groups (QB) required\n    method: dfpo\n",
            "  dfpo-qb:                   # group-coupled loss: whole groups (QB) required\n"
            "    method: dfpo\n    combine: [dlogp]\n",
        )
    )
    assert bad != (CONFIG_DIR / "papers" / "headtohead.yaml").read_text()
    (cfg_dir / "papers" / "headtohead.yaml").write_text(bad)
    with pytest.raises(PlanError, match=r"micro/micro-s/dfpo-qb/s0.*rule rollout_weight_transform"):
        build_plan({"scale": "micro", "papers": ["headtohead"], "seeds": [0]}, cfg_dir)


# ------------------------------------------------------------------------------------------- the test


def test_bootstrap_p_matches_exact_enumeration():
    """For 5 questions every one of the 5^5 resamples can be enumerated: the exact bootstrap P*(diff <= 0) and the
    Monte Carlo one of paired_bootstrap_diff_suites agree (20000 resamples: within 0.01)."""
    a = np.array([1.0, 0.0, 1.0, 1.0, 0.5])
    b = np.array([0.0, 0.0, 1.0, 0.0, 1.0])
    d = a - b
    exact = np.mean([d[list(idx)].mean() <= 0 for idx in itertools.product(range(5), repeat=5)])
    exact_rev = np.mean([d[list(idx)].mean() >= 0 for idx in itertools.product(range(5), repeat=5)])
    _, _, _, p, p_rev = S.paired_bootstrap_diff_suites([a], [b], n_boot=20000, seed=1)
    assert p == pytest.approx(exact, abs=0.01) and p_rev == pytest.approx(exact_rev, abs=0.01)
    assert S.two_sided_p(p, p_rev) == pytest.approx(2 * min(exact, exact_rev), abs=0.02)


def test_versus_verdicts_against_a_direct_holm():
    diffs = [3.0, -2.0, 1.0, 0.5]
    p1, p1r = [0.004, 0.9, 0.02, 0.3], [0.99, 0.005, 0.9, 0.7]
    two = [0.008, 0.01, 0.04, 0.6]  # 2 min(p, p_rev)
    # Holm by hand: sorted 0.008 (x4 = 0.032), 0.01 (x3 = 0.03 -> max 0.032), 0.04 (x2 = 0.08), 0.6 (x1 -> 0.6)
    want_adj = [0.032, 0.032, 0.08, 0.6]
    got = S.versus_verdicts(diffs, p1, p1r)
    assert [g[0] for g in got] == pytest.approx(two)
    assert [g[1] for g in got] == pytest.approx(want_adj)
    assert [g[2] for g in got] == [S.BEATS, S.WORSE, S.TIED, S.TIED]  # 0.04 alone would pass: Holm says noise
    assert S.versus_verdicts([], [], []) == []


# ------------------------------------------------------------------------------------------- the table

K = 4
N_Q = 40
H2H = {
    "paper": "hh",
    "title": "Head-to-head toy (test fixture)",
    "backbones": {"B": {"tiny": "tiny-s", "paper": "b"}},
    "benchmarks": {"E": {"tiny": "se", "paper": "e"}, "H": {"tiny": "sh", "paper": "h"}},
    "runs": {r: {"method": "dapo"} for r in ("dapo", "good", "same", "bad", "lora", "lora-good", "lora-same")},
    "tables": {
        "main": {
            "columns": [
                {"name": "E", "benchmark": "E", "metric": "avg@k"},
                {"name": "H", "benchmark": "H", "metric": "avg@k"},
                {"name": "Avg", "average_of": ["E", "H"]},
                {"name": "Cost", "metric": "step_time", "relative_to": "dapo", "relative": "ratio"},
                {"name": "Claim", "metric": "versus", "of": "Avg", "relative_to": "dapo"},
            ],
            "rows": [
                {"label": "DAPO", "backbone": "B", "run": "dapo"},
                {"label": "Good", "backbone": "B", "run": "good"},
                {"label": "Same", "backbone": "B", "run": "same"},
                {"label": "Bad", "backbone": "B", "run": "bad"},
                {"label": "LoRA", "backbone": "B", "run": "lora"},
                {"label": "LoRA good", "backbone": "B", "run": "lora-good", "baseline": "lora"},
                {"label": "LoRA same", "backbone": "B", "run": "lora-same", "baseline": "lora"},
            ],
        }
    },
    "figures": {"acc_cost": {"kind": "scatter", "table": "main", "x": "Cost", "y": "Avg"}},
}
_rng = np.random.default_rng(5)
_BASE = _rng.integers(0, 3, size=N_Q)
# correct samples out of K per question and seed
COUNTS = {
    "dapo": lambda s: _BASE,
    "same": lambda s: _BASE[::-1].copy() if s == 0 else _BASE,
    "good": lambda s: np.minimum(_BASE + 2, K),
    "bad": lambda s: np.maximum(_BASE - 2, 0),
    "lora": lambda s: np.maximum(_BASE - 1, 0),
    "lora-good": lambda s: np.minimum(_BASE + 1, K),
    "lora-same": lambda s: np.maximum(_BASE - 1, 0),
}
SEEDS = [0, 1]


def _write(root: Path) -> None:
    for run, counts in COUNTS.items():
        for seed in SEEDS:
            c = counts(seed).tolist()
            write_eval(
                metrics_path(root / "evals", "tiny-s", run, seed),
                {"se": c, "sh": c},
                K,
                f"tiny/tiny-s/{run}/s{seed}",
                f"id-{run}-{seed}",
                f"cfg/{run}.yaml",
                greedy_above=1,
            )
            rpath = run_metrics_path(root / "runs", "tiny-s", run, seed)
            rpath.parent.mkdir(parents=True, exist_ok=True)
            t = 2.0 if run.startswith("lora") else 1.0
            rpath.write_text("".join(json.dumps({"step": i, "t_step": t + 0.01 * (i % 3)}) + "\n" for i in range(6)))


@pytest.fixture()
def built(tmp_path):
    _write(tmp_path)
    paper = parse_paper(copy.deepcopy(H2H), "hh.yaml")
    df = build_table(paper, "main", "tiny", SEEDS, tmp_path / "evals", K, tmp_path / "runs")
    return paper, df, tmp_path


def _line(df, row):
    sub = df[(df["row"] == row) & (df["column"] == "Claim")]
    assert len(sub) == 1
    return sub.iloc[0]


def test_claims_column_verdicts_and_holm_family(built):
    _, df, root = built
    assert _line(df, "DAPO")["verdict"] == "reference" and _line(df, "LoRA")["verdict"] != "reference"
    assert _line(df, "Good")["verdict"] == "beats DAPO"
    assert _line(df, "Bad")["verdict"] == "worse than DAPO"
    assert _line(df, "Same")["verdict"] == "noise"
    assert _line(df, "LoRA good")["verdict"] == "beats LoRA"  # its own baseline row
    assert _line(df, "LoRA")["verdict"] in ("worse than DAPO", "noise")
    assert _line(df, "LoRA same")["verdict"] == "noise vs LoRA"  # not the column's reference: named
    # the numbers: the ledger's paired bootstrap of each row vs its reference, two-sided, Holm over the 6 claims
    from creditlab.tables.load import load_eval, seed_matrix

    def per_suite(run):  # [questions, seeds]: the seeds are resampled with the questions
        res = [load_eval(root / "evals", "tiny-s", run, s) for s in SEEDS]
        return [100.0 * seed_matrix(res, s, f"avg@{K}") for s in ("se", "sh")]

    pairs = [
        ("Good", "good", "dapo"),
        ("Same", "same", "dapo"),
        ("Bad", "bad", "dapo"),
        ("LoRA", "lora", "dapo"),
        ("LoRA good", "lora-good", "lora"),
        ("LoRA same", "lora-same", "lora"),
    ]
    stats = [S.paired_bootstrap_diff_suites(per_suite(r), per_suite(ref), alpha=0.025) for _, r, ref in pairs]
    p2 = [S.two_sided_p(st[3], st[4]) for st in stats]
    adj = S.holm(p2)
    for (label, _, _), st, p, a in zip(pairs, stats, p2, adj):
        line = _line(df, label)
        assert line["ours_mean"] == pytest.approx(st[0]) and line["ours_lo"] == pytest.approx(st[1])
        assert line["p_value"] == pytest.approx(p) and line["p_adj"] == pytest.approx(a)
        assert line["unit"].startswith("pp vs ")
    # Same: the per-question values differ on seed 0 but the seed-averaged difference is not resolved
    assert _line(df, "Same")["p_adj"] >= 0.05


def test_claims_column_in_markdown_and_ledger_cells(built):
    paper, df, root = built
    md = table_markdown(df, paper.table("main"), paper)
    assert "**beats DAPO** (+" in md and "**worse than DAPO** (-" in md and "**noise**" in md
    assert "6 in the Holm family" in md and "Holm" in md and "seed-to-seed variance of RL is in p" in md
    ledger_df, _ = L.build_ledger(paper, "tiny", SEEDS, {"main": df}, root / "evals", K, root / "runs", "sqlite:///x")
    claims = ledger_df[(ledger_df["section"] == "cell") & (ledger_df["column"] == "Claim")]
    assert len(claims) == 7 and set(claims["unit"]) >= {"pp vs dapo", "pp vs lora"}


def test_accuracy_vs_cost_figure(built, tmp_path):
    from PIL import Image

    from creditlab.tables.figures import plot_scatter

    paper, df, _ = built
    out = plot_scatter(df, paper, paper.figures["acc_cost"], tmp_path / "fig.png")
    with Image.open(out) as im:
        assert im.width > 300 and im.height > 200


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda d: d["tables"]["main"]["columns"][4].pop("of"), "needs 'of'"),
        (lambda d: d["tables"]["main"]["columns"][4].update(of="Cost"), "of"),
        (lambda d: d["tables"]["main"]["columns"][4].update(weighting="count"), "takes no key 'weighting'"),
        (lambda d: d["tables"]["main"]["rows"][5].update(baseline="nope"), "baseline"),
        (lambda d: d["tables"]["main"]["columns"].append({"name": "X", "average_of": ["Claim"]}), "versus column"),
        (
            lambda d: d.update(
                claims=[
                    {
                        "id": "c",
                        "text": "t",
                        "table": "main",
                        "column": "Claim",
                        "kind": "better",
                        "row": "Good",
                        "over": ["DAPO"],
                    }
                ]
            ),
            "versus column is itself",
        ),
    ],
)
def test_versus_column_validation(mutate, match):
    data = copy.deepcopy(H2H)
    mutate(data)
    with pytest.raises(ValueError, match=match):
        parse_paper(data, "hh.yaml")


# ------------------------------------------------------------------------------------------- the config

ALLOWED = {"batching", "reward_balance", "lora", "lr"}
"""The trainer settings a head-to-head row may change from DAPO's: its method's batching (QB, RB, group-coupled
losses) and the LoRA pair's adapter and learning rate."""


@pytest.mark.parametrize("scale", ["tiny", "paper"])
def test_headtohead_is_a_matched_protocol(scale):
    plan = build_plan({"scale": scale, "papers": ["headtohead"], "seeds": [0]})
    spec = plan.papers["headtohead"]
    table = spec.table("main")
    assert len(table.rows) == 19 and len(plan.paper_seeds("headtohead")) == 3
    backbone = spec.backbone_for("Qwen3-8B-Base", scale)
    ref = run_config(plan.get(backbone, "dapo", 0))
    for row in table.rows:
        cfg = run_config(plan.get(backbone, row.run, 0))
        changed = {k for k in ref["trainer"] if cfg["trainer"][k] != ref["trainer"][k]}
        assert changed <= ALLOWED, (row.label, changed)
        if "lr" in changed:
            assert cfg["trainer"]["lora"]["enable"], row.label
        assert cfg["data"] == ref["data"] and cfg["eval"] == ref["eval"]
        # the model alike but for how a GPU holds it: the group-coupled rows run at Ulysses sp 8 at paper scale (16
        # whole rollouts per micro-batch do not fit at sp 2: creditlab.resources), the same computation
        sp = {"verl": {**cfg["model"]["verl"], "ulysses_sp": None}} if "verl" in cfg["model"] else {}
        ref_sp = {"verl": {**ref["model"]["verl"], "ulysses_sp": None}} if "verl" in ref["model"] else {}
        assert {**cfg["model"], **sp} == {**ref["model"], **ref_sp}, row.label
        if scale == "paper" and cfg["model"]["verl"]["ulysses_sp"] != ref["model"]["verl"]["ulysses_sp"]:
            assert row.run in ("grpo-fix-qb", "dfpo-qb", "dfpo-qb-rb") and cfg["model"]["verl"]["ulysses_sp"] == 8
        assert not cfg["trainer"]["dynamic_sampling"] and cfg["trainer"]["mini_batches"] == 4
    lora = run_config(plan.get(backbone, "arca-lora", 0))
    assert lora["trainer"]["lora"] == run_config(plan.get(backbone, "dapo-lora", 0))["trainer"]["lora"]
    assert [c["name"] for c in lora["method"]["credit"]] == ["arca"] and lora["method"]["policy_loss"] == "dapo"
    if scale == "paper":
        assert backbone == "qwen3-8b-base" and ref["data"]["name"] == "deepmath_103k"
        assert run_config(plan.get(backbone, "delta-dlogp", 0))["method"]["credit"][1]["alpha"] == 0.1


def test_headtohead_shares_the_runs_of_the_papers_it_repeats():
    """DAPO, DelTA, Forking, SAPO (DelTA's) and QB / RB (the cancellation paper's) are the same runs: trained once."""
    plan = build_plan({"scale": "tiny", "papers": ["delta", "cancellation", "headtohead"], "seeds": [0]})
    for run in ("dapo", "delta", "dapo-ft", "sapo", "qb", "rb", "qb-rb"):
        assert "headtohead" in plan.get("tiny-s", run, 0).papers and len(plan.get("tiny-s", run, 0).papers) >= 2
