"""Which sandbox tier may score code (creditlab.rewards.code.policy), probed where the job runs, and its record with
every code result: an evaluation refuses a weak tier at paper scale unless accepted in words, fails on a tier that
cannot run code, and the tier reaches the table cells and the ledger.

Tiers on this machine: ``bwrap`` is the real one (tools/sysdeps.sh installs bubblewrap); ``unshare`` and ``process``
are forced with ``CREDITLAB_CODE_SANDBOX`` (what a node without bubblewrap falls back to); ``none`` is the real
fallback of a forced ``bwrap`` with no bwrap on PATH (bubblewrap not installed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from creditlab.jobs.evaluate import evaluate_suites
from creditlab.papers.load import parse_paper
from creditlab.rewards.code import policy
from creditlab.rewards.code.runner import run_tests
from creditlab.rewards.code.sandbox import reset_sandbox_plan
from creditlab.tables import ledger as L
from creditlab.tables.build import build_table
from creditlab.tables.load import metrics_path
from table_helpers import cell, write_eval

CODE_SUITE = {"lcb": [{"id": "c0", "source": "tiny_code", "prompt": "p", "answer": "[]"}]}
CFG = {"eval": {}, "trainer": {"reward": "math_verify", "reward_timeout_s": 5}}


@pytest.fixture
def tier(monkeypatch, tmp_path):
    """Force a sandbox tier for this test ("none": bwrap forced with an empty PATH), re-probed before and after."""

    def force(name: str) -> None:
        if name == "none":
            monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, no unshare, no setpriv: nothing can start
            name = "bwrap"
        monkeypatch.setenv("CREDITLAB_CODE_SANDBOX", name)
        monkeypatch.delenv(policy.ACCEPT_ENV, raising=False)
        reset_sandbox_plan()

    yield force
    reset_sandbox_plan()


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed (tools/sysdeps.sh)")
def test_bwrap_scores_code_at_paper_scale(tier):
    tier("bwrap")
    rec = policy.code_sandbox("paper")
    assert rec["tier"] == "bwrap" and rec["isolating"] and rec["accepted"] is None


@pytest.mark.parametrize("name", ["unshare", "process"])
def test_weak_tier_refused_at_paper_scale_with_the_reason_and_the_fix(tier, name):
    tier(name)
    with pytest.raises(policy.SandboxRefused) as err:
        policy.code_sandbox("paper")
    msg = str(err.value)
    assert f"tier {name!r}" in msg and "bubblewrap" in msg and policy.ACCEPT_PHRASES[name] in msg
    # the evaluation job stops before any answer is scored, naming the code suite
    with pytest.raises(SystemExit, match=r"cannot score the code suite\(s\) \['lcb'\]"):
        evaluate_suites(None, None, CODE_SUITE, CFG | {"scale": "paper"}, 0, Path("unused"), True)
    # below paper scale the tier is allowed, and recorded
    assert policy.code_sandbox("tiny") == {
        "tier": name,
        "isolating": False,
        "accepted": None,
        "interpreter": policy.get_plan().interpreter,
        "notes": policy.get_plan().error,
    }


def test_weak_tier_accepted_in_words_only(tier, monkeypatch):
    tier("process")
    with pytest.raises(policy.SandboxRefused):  # accepting unshare does not accept the weaker process tier
        policy.code_sandbox("paper", accept=policy.ACCEPT_PHRASES["unshare"])
    with pytest.raises(ValueError, match="code_sandbox_accept must be one of"):  # a yes is not words
        policy.code_sandbox("paper", accept="yes")
    monkeypatch.setenv(policy.ACCEPT_ENV, policy.ACCEPT_PHRASES["process"])
    rec = policy.code_sandbox("paper")
    assert rec["tier"] == "process" and rec["accepted"] == policy.ACCEPT_PHRASES["process"]
    tier("unshare")  # accepting process accepts the stronger unshare too
    assert policy.code_sandbox("paper", accept=policy.ACCEPT_PHRASES["process"])["tier"] == "unshare"


def test_a_tier_that_cannot_run_code_fails_the_job_instead_of_scoring_zeros(tier):
    tier("none")
    # what scoring would do: every answer a sandbox_error, scored 0 (even a right one)
    res = run_tests("print(input())", [{"input": "1\n", "output": "1\n"}])
    assert res.reward == 0.0 and res.status == "sandbox_error" and res.sandbox == "none"
    for scale in ("tiny", "paper"):
        with pytest.raises(policy.SandboxRefused, match="no sandbox can run code"):
            policy.code_sandbox(scale, accept=policy.ACCEPT_PHRASES["process"])
        with pytest.raises(SystemExit, match="no sandbox can run code"):
            evaluate_suites(None, None, CODE_SUITE, CFG | {"scale": scale}, 0, Path("unused"), True)


PAPER = {
    "paper": "sb",
    "title": "Sandbox record (test fixture)",
    "backbones": {"Small": {"tiny": "tiny-s", "paper": "small"}},
    "benchmarks": {"Code": {"tiny": "sc", "paper": "c"}, "Math": {"tiny": "sm", "paper": "m"}},
    "runs": {"dapo": {"method": "dapo"}},
    "tables": {
        "main": {
            "columns": [
                {"name": "Code", "benchmark": "Code", "metric": "avg@k"},
                {"name": "Math", "benchmark": "Math", "metric": "avg@k"},
            ],
            "rows": [{"label": "DAPO", "backbone": "Small", "run": "dapo"}],
        }
    },
}


def test_tier_recorded_in_table_cells_and_ledger(tmp_path):
    evals = tmp_path / "tiny" / "evals"
    for seed, rec in ((0, {"tier": "bwrap"}), (1, {"tier": "process", "accepted": policy.ACCEPT_PHRASES["process"]})):
        path = metrics_path(evals, "tiny-s", "dapo", seed)
        write_eval(path, {"sc": [1, 2, 3], "sm": [0, 1, 2]}, 4, f"tiny/tiny-s/dapo/s{seed}", "id", "c.yaml", 1)
        data = json.loads(path.read_text())
        data["suites"]["sc"]["sandbox"] = rec  # as evaluate_suites records it on a code suite
        path.write_text(json.dumps(data))
    paper = parse_paper(PAPER, "sb.yaml")
    df = build_table(paper, "main", "tiny", [0, 1], evals, 4)
    assert cell(df, "DAPO", "Code")["sandbox"] == "bwrap;process (accepted)"
    assert cell(df, "DAPO", "Math")["sandbox"] == ""
    out = tmp_path / "main.csv"
    df.to_csv(out, index=False)
    ledger, results = L.build_ledger(paper, "tiny", [0, 1], {"main": L.pd.read_csv(out)}, evals, 4, tmp_path, "")
    cells = ledger[ledger["section"] == "cell"].set_index("column")
    assert cells.loc["Code", "sandbox"] == "bwrap;process (accepted)"
    md = L.ledger_markdown(paper, "tiny", ledger, results)
    assert "main / DAPO / Code: bwrap, process (accepted)" in md


def test_the_pipeline_config_takes_the_words_only():
    """`code_sandbox_accept` is checked when the DAG is built (workflow/schemas/pipeline.schema.yaml): the words of
    policy.ACCEPT_PHRASES or null, nothing else (a `true` accepts nothing)."""
    import yaml
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    repo = Path(__file__).resolve().parents[1]
    schema = str(repo / "workflow/schemas/pipeline.schema.yaml")
    base = yaml.safe_load((repo / "configs/pipeline.yaml").read_text())
    for words in [None, *policy.ACCEPT_PHRASES.values()]:
        validate(base | {"code_sandbox_accept": words}, schema)
    for bad in (True, "yes", "process"):
        with pytest.raises(WorkflowError, match="code_sandbox_accept"):
            validate(base | {"code_sandbox_accept": bad}, schema)
