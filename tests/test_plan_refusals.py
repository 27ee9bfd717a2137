"""Runs refused at plan time (`creditlab.plan.RunRefused`: a backbone verl cannot train right, e.g. Qwen3-Next under
verl 0.9.1, tests/test_suspected_qwen3_next.py) are left out of the DAG with what reads them, as tables without a
benchmark stand-in are: the plan collects them (`Plan.refused_runs`), the tables that read them are not built
(`Plan.refused_tables`), nor the figures and analyses drawn from those tables or runs, the ledger reports those
tables' claims "not built", and everything says why. Every other plan error still fails the plan. The paper-scale DAG
itself (`snakemake -n`): tests/test_paper_scale.py::test_snakemake_plans_the_paper_scale_dag."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from creditlab.plan import PlanError, RunRefused, build_plan, check_analyses, validate_runs
from creditlab.plan import runs as plan_runs

pytest.importorskip("verl")  # the paper-scale refusal reads the verl launcher's overrides

REPO = Path(__file__).resolve().parents[1]
# on H200s (141 GB): the refusals here are the backbone's; those of runs that do not fit: tests/test_resources.py
PIPE = {"papers": ["dfpo"], "seeds": [0], "results": "results", "scale": "paper", "cluster": {"gpu_mem_gb": 141}}
NEXT = "qwen3-next-80b-a3b"
REFUSED = [f"paper/{NEXT}/{run}/s{seed}" for run in ("gspo", "dfpo") for seed in range(5)]  # Table 1's rows, 5 seeds


@pytest.fixture(scope="module")
def dfpo_paper():
    """DFPO's validated paper-scale plan (its Table 1 has two Qwen3-Next rows)."""
    return build_plan(PIPE)


def test_paper_scale_refusal_leaves_out_the_table_and_keeps_the_others(dfpo_paper):
    plan = dfpo_paper
    assert list(plan.refused_runs) == REFUSED
    for why in plan.refused_runs.values():
        assert why.startswith("model.arch.family=qwen3_next") and "use_remove_padding" in why and "Ulysses" in why
    assert plan.get(NEXT, "dfpo", 0).key in plan.runs  # still planned (its config is valid), but nothing reads it
    assert plan.refused_tables == {("dfpo", "main"): REFUSED}
    assert plan.tables == plan.buildable_tables == [("dfpo", "group_size"), ("dfpo", "compute")]
    assert plan.skipped_tables == [] and plan.figures == [("dfpo", "group_size_bars")] and plan.refused_figures == {}
    read = {r.key for p, t in plan.tables for r in plan.table_runs(p, t)}
    assert read and not read & set(REFUSED)
    # what an evaluation covers does not depend on the refusal: the jobs' (unvalidated) plan asks the same suites
    whole = build_plan(PIPE, validate=False)
    assert whole.refused_runs == {} and whole.tables == [("dfpo", t) for t in ("main", "group_size", "compute")]
    gspo = plan.get("qwen3-32b", "gspo", 0)
    assert plan.eval_suites(gspo) == whole.eval_suites(gspo) == ["aime25", "livecodebench-v6", "hmmt25-feb"]
    (note,) = plan.notes()
    assert note.startswith("table dfpo/main reads runs refused at scale 'paper', not built: paper/")
    assert all(key in note for key in REFUSED) and note.endswith(plan.refused_runs[f"paper/{NEXT}/dfpo/s0"])


def test_python_m_creditlab_plan_shows_the_refusals(dfpo_paper, capsys):
    from creditlab.jobs.show import show_plan

    show_plan(dfpo_paper)
    lines = capsys.readouterr().out.splitlines()
    marked = {line.split()[0] for line in lines if " REFUSED method=" in line}
    assert marked == set(REFUSED) and len([line for line in lines if " method=" in line]) == len(dfpo_paper.runs)
    assert dfpo_paper.notes()[0] in lines
    table = dfpo_paper.resource_lines()  # then the resource table (its totals add the hub cache's size) and the
    n = next(i for i, line in enumerate(table) if line.startswith("totals (runs not refused): "))  # evaluation jobs'
    shown = lines[-len(table) :]
    assert (
        shown[:n] == table[:n]
        and shown[n].startswith("totals (runs not refused): ")
        and shown[n + 1 :] == table[n + 1 :]
    )
    assert table[n + 1].startswith("evaluation jobs ") and table[-1].startswith("evaluation totals")


def test_ledger_reports_the_refused_tables_claims_not_built(dfpo_paper, tmp_path):
    """The ledger job gets the tables the DAG builds (`--tables`, workflow/rules/common.smk ledger_tables): the claims
    on the refused Table 1 are reported not built, never tested (no file read)."""
    from creditlab.tables.ledger import NOT_TESTABLE, evaluate_claim

    tables = [f"{p}/{t}" for p, t in dfpo_paper.tables if p == "dfpo"]  # ledger_tables
    job = build_plan(PIPE | {"tables": tables}, validate=False)  # the ledger job's plan (python -m creditlab ledger)
    spec = job.papers["dfpo"]
    assert spec.built_at("paper") == ["group_size", "compute"]
    claims = [c for c in spec.claims if c.table == "main"]
    assert [c.id for c in claims] == [c.id for c in spec.claims] and len(claims) == 4  # all on Table 1
    for claim in claims:
        res = evaluate_claim(spec, claim, "paper", job.paper_seeds("dfpo"), tmp_path / "evals", 32, tmp_path / "runs")
        assert res.verdict == NOT_TESTABLE and "'main' is not built" in res.note, res


def test_only_the_refusal_is_collected_other_plan_errors_still_fail(dfpo_paper):
    """validate_runs collects a RunRefused (facts[key]["refused"]) and raises every other PlanError: a config error or
    the launcher's preflight on the same Qwen3-Next run still fails the plan; check_verl_run alone raises it."""
    run = dfpo_paper.get(NEXT, "dfpo", 0)
    (facts,) = validate_runs([run]).values()
    assert facts["refused"] == dfpo_paper.refused_runs[run.key]
    for extra, needle in [
        ("eval.ks=[1,64]", r"eval\.ks=\[1, 64\]: pass@j needs j <= eval.k=32"),  # check_ranges
        ("model.verl.rollout_tp=3", "verl engine would refuse this run at its first step.*rollout_tp=3"),  # preflight
    ]:
        with pytest.raises(PlanError, match=needle) as err:
            validate_runs([replace(run, overrides=(*run.overrides, extra))])
        assert not isinstance(err.value, RunRefused) and run.key in str(err.value)
    assert issubclass(RunRefused, PlanError)


def test_refused_runs_leave_out_their_tables_figures_and_analyses(monkeypatch):
    """At any scale a refusal takes the same path (a stand-in refusal here, micro scale): the tables reading a refused
    run, the figures drawn from those tables or from a refused run, the analyses of a refused run or reading a refused
    table are left out and said why; the others are kept, and no kept target reads a refused run."""
    first = {"micro/micro-m/delta/s0": "stand-in A", "micro/micro-s/arca-lora/s1": "stand-in B"}
    check = plan_runs.check_verl_run

    def refuse(cfg, key):
        if key in first:
            raise RunRefused(key, first[key])
        check(cfg, key)

    monkeypatch.setattr(plan_runs, "check_verl_run", refuse)
    plan = build_plan({"papers": ["delta", "headtohead"], "seeds": [0], "results": "r", "scale": "micro"})
    assert plan.refused_runs == first
    assert plan.refused_tables == {
        ("delta", "main"): ["micro/micro-m/delta/s0"],
        ("delta", "transfer"): ["micro/micro-m/delta/s0"],
        ("headtohead", "main"): ["micro/micro-s/arca-lora/s1"],  # headtohead: seeds 0, 1 at micro
    }
    assert plan.tables == [("delta", "diagnostics"), ("delta", "selection")]
    assert plan.refused_figures == {("headtohead", "accuracy_vs_cost"): "its table headtohead/main reads refused runs"}
    assert plan.figures == [("delta", "token_selection"), ("delta", "token_clouds")]
    assert plan.skipped_analyses == {
        ("headtohead", "fidelity_gains"): "micro/micro-s/dapo/s0: table headtohead/main is not built at scale 'micro'"
    }
    assert plan.analyses == [
        ("headtohead", "credit_fidelity"),
        ("headtohead", "credit_fidelity_mid"),
        ("headtohead", "credit_fidelity_lora_mid"),
    ]
    read = {r.key for p, t in plan.tables for r in plan.table_runs(p, t)}
    assert not read & set(plan.refused_runs)
    notes = plan.notes()  # after the table without a stand-in here (delta/statistics), as the DAG prints them
    assert notes[0] == "tables with no benchmark stand-in at scale 'micro', not built: delta/statistics"
    assert notes[1] == (
        "table delta/main reads runs refused at scale 'micro', not built: micro/micro-m/delta/s0: stand-in A"
    )
    assert "figure headtohead/accuracy_vs_cost refused at scale 'micro', not drawn: its table" in notes[4]
    assert notes[5].startswith("analysis headtohead/fidelity_gains refused at scale 'micro', not built: ")

    # a refused run that a run-based figure and analyses read (the paper's first seed's run)
    plan.refused_runs = first | {
        "micro/micro-s/delta/s0": "stand-in C",
        "micro/micro-s/dapo/s0": "stand-in D",
        "micro/micro-s/dapo-lora/s0": "stand-in E",
    }
    assert plan.refused_figures[("delta", "token_clouds")] == "its run micro/micro-s/delta/s0 is refused: stand-in C"
    assert plan.tables == [] and plan.figures == []
    plan.skipped_analyses = check_analyses(plan)
    assert plan.skipped_analyses[("headtohead", "credit_fidelity")] == (
        "micro/micro-s/dapo/s0: run refused at plan time: stand-in D"
    )
    assert plan.skipped_analyses[("headtohead", "credit_fidelity_lora_mid")] == (
        "micro/micro-s/dapo-lora/s0: run refused at plan time: stand-in E"
    )
    assert plan.analyses == []


def test_snakemake_refuses_a_refused_runs_output_with_the_reason(tmp_path):
    """A user who asks for a refused run's DONE (no target of the DAG reads it) gets the run and the reason, no job."""
    done = tmp_path / "results" / "paper" / "runs" / NEXT / "dfpo" / "s0" / "DONE"
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("snakemake")), "--snakefile", str(REPO / "Snakefile")]
        + ["--directory", str(tmp_path), "-n", "--config", "scale=paper", "papers=[dfpo]"]
        + [f"results={tmp_path / 'results'}", "--", str(done)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    why = f"run paper/{NEXT}/dfpo/s0 is refused at plan time, not trained or evaluated: model.arch.family=qwen3_next"
    assert why in out, out[-3000:]
    assert "WorkflowError" in out and "rule train" in out


def test_snakemake_refuses_runs_that_do_not_fit_the_cluster_with_the_numbers(tmp_path):
    """`snakemake -n` on GPUs that leave 20 GB to the model (`cluster={gpu_mem_gb: 26}`): every ARCA run is refused by
    the resource model, its tables are left out with the numbers and what to change, and the resource table is
    printed; no training job is planned."""
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("snakemake")), "--snakefile", str(REPO / "Snakefile")]
        + ["--directory", str(tmp_path), "-n", "--config", "scale=paper", "papers=[arca]", "cluster={gpu_mem_gb: 26}"]
        + [f"results={tmp_path / 'results'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    notes = [line for line in out.splitlines() if line.startswith("creditlab: table arca/")]
    assert notes and all("does not fit the cluster" in n and "> 20.0 GB usable of a 26 GB GPU" in n for n in notes), (
        notes or out[-3000:]
    )
    assert all("change: " in n for n in notes)
    rows = [line for line in out.splitlines() if line.startswith("creditlab resources: paper/qwen3-1.7b-base/arca")]
    assert rows and all(line.split()[-1] == "NO" for line in rows), rows
    assert "rule train:" not in out
