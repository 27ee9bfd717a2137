"""The MLflow UI and the HTML report, opened in a real browser (Debian's headless Chromium).

Both run on the micro DAG's results (tests/e2e.py). The MLflow server is started by the project's own
command (`python -m creditlab mlflow-ui`) and stopped by the test; every step is bounded (Playwright
timeouts, the server's start-up deadline, pytest-timeout). Screenshots are kept in
`test-artifacts/browser/`.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.parse
from pathlib import Path

import pytest

from browser import free_port, page, screenshot, serve

pytestmark = pytest.mark.e2e

TABLE = "table dlogp/main"


def _store(results: Path):
    from mlflow.tracking import MlflowClient

    from creditlab.tracking.mlflow_tracker import tracking_uri

    return MlflowClient(tracking_uri(results))


def _row(tab, key: str) -> list[str]:
    """The value cells of the compare page's table row whose first cell is exactly `key`."""
    return (
        tab.evaluate(
            """key => {
        for (const tr of document.querySelectorAll('tr')) {
            const cells = Array.from(tr.querySelectorAll('th, td')).map(c => c.innerText.trim());
            if (cells.length > 1 && cells[0] === key) return cells.slice(1);
        }
        return null;
    }""",
            key,
        )
        or []
    )


@pytest.fixture(scope="module")
def mlflow_ui(micro_results: Path, tmp_path_factory: pytest.TempPathFactory):
    """The project's `mlflow-ui` command on a free port against the micro DAG's store; yields its URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    argv = [sys.executable, "-m", "creditlab", "--results", str(micro_results), "mlflow-ui", "--port", str(port)]
    log = tmp_path_factory.mktemp("mlflow-ui") / "server.log"
    with serve(argv, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/health", log, env=env) as url:
        yield url


def test_mlflow_ui_shows_table_runs_nested_and_compares_their_rows(micro_results: Path, mlflow_ui: str) -> None:
    client = _store(micro_results)
    exp = client.get_experiment_by_name("dlogp")
    (parent,) = client.search_runs([exp.experiment_id], "tags.run_key = 'micro/table/dlogp/main'")
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert parent.info.run_name == TABLE and parent.info.status == "FINISHED"
    assert children, "no run nested under the table"

    with page() as tab:
        # the experiment's runs: the table's parent run, unfolded to show its rows
        tab.goto(f"{mlflow_ui}/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning")
        row = tab.locator("[role=row]", has_text=TABLE).first
        row.wait_for()
        row.locator("button[data-component-id*=runnamecellrenderer]").click()  # the expander of nested runs
        for run in children:
            tab.get_by_text(run.info.run_name, exact=True).first.wait_for()
        screenshot(tab, "mlflow_experiment_table_runs")

        # the table's run: its description is the table itself
        tab.goto(
            f"{mlflow_ui}/#/experiments/{exp.experiment_id}/runs/{parent.info.run_id}?workflowType=machine_learning"
        )
        tab.get_by_text("Scale micro: these are NOT the paper's results.", exact=False).first.wait_for()
        screenshot(tab, "mlflow_table_run")

        # its compare link: every row's run, their tags and a metric, as logged
        link = parent.data.tags["compare_url"]
        ids = json.loads(urllib.parse.parse_qs(link.split("?", 1)[1])["runs"][0])
        assert set(ids) == set(parent.data.tags["row_run_ids"].split(","))
        tab.goto(f"{mlflow_ui}/{link}")
        tab.get_by_text("Run details").wait_for()
        for rid in ids:
            tab.get_by_text(client.get_run(rid).info.run_name, exact=True).first.wait_for()
        tab.get_by_text("Show diff only").first.wait_for()
        body = tab.inner_text("body")
        assert re.search(rf"Comparing {len(ids)} Runs", body), body[:500]
        runs = [client.get_run(rid) for rid in ids]
        methods = _row(tab, "method")  # the tag row: one cell per run, in the link's order
        assert methods == [r.data.tags["method"] for r in runs], methods
        trained = [r for r in runs if "reward_mean" in r.data.metrics]
        assert trained, "no row run logged training metrics"
        assert "clipfrac" in body.split("\nMetrics\n", 1)[-1]  # training metrics are compared (the list is virtualized)
        screenshot(tab, "mlflow_compare_table_rows")

        # a row's run page: its metrics as logged (the last value of reward_mean, full precision)
        run = trained[0]
        tab.goto(
            f"{mlflow_ui}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}?workflowType=machine_learning"
        )
        tab.get_by_text("reward_mean", exact=True).first.wait_for()
        cells = tab.evaluate("""() => Array.from(document.querySelectorAll('tr, [role=row]'))
            .map(r => r.innerText.trim()).filter(t => t.split('\\n')[0].trim() === 'reward_mean')""")
        assert cells and abs(float(cells[0].split()[-1]) - run.data.metrics["reward_mean"]) < 1e-9, cells
        screenshot(tab, "mlflow_row_run")


def _show(tab, kind: str) -> None:
    """Click the view button of the report entry labelled `kind` (the report lists a table's entries with
    their labels, as a list or, for two kinds, behind a toggle)."""
    toggle = tab.locator("fieldset").get_by_text(kind, exact=True)
    if toggle.count():
        toggle.first.click()
        row = tab.locator("tbody tr").first
    else:
        row = tab.locator("tbody tr").filter(has=tab.get_by_role("cell", name=kind, exact=True)).first
    row.locator("a[iconname=eye]").click()


def test_report_groups_results_by_paper_and_table_and_renders(report_html: Path) -> None:
    with page() as tab:
        tab.goto(report_html.as_uri())
        tab.get_by_text("dlogp", exact=True).first.click()  # category: the paper
        for table in ("main", "ledger", "figures"):
            tab.get_by_text(table, exact=True).first.wait_for()
        tab.get_by_text("main", exact=True).first.click()  # subcategory: the table

        _show(tab, "training curves")
        img = tab.locator("img[src^='data:image/png']").first
        img.wait_for()
        width = img.evaluate("i => i.complete ? i.naturalWidth : 0")
        assert width > 100, "the training-curves PNG did not render"
        screenshot(tab, "report_training_curves")

        _show(tab, "table")
        frame = tab.frame_locator("iframe").first
        frame.get_by_text("these are NOT the paper's results", exact=False).first.wait_for()
        assert frame.locator("table").count() >= 1
        assert "DAPO" in frame.locator("table").first.inner_text()
        screenshot(tab, "report_table")

        tab.get_by_text("dlogp", exact=True).first.click()  # back to the paper (breadcrumb)
        tab.get_by_text("ledger", exact=True).first.click()
        _show(tab, "reproduction ledger")
        frame = tab.frame_locator("iframe").first
        frame.get_by_role("heading", name="Claims").wait_for()
        verdicts = frame.locator("h3").all_inner_texts()
        verdict = re.compile(r"holds|contradicted|not resolved|not decidable")
        assert verdicts and all(verdict.search(v) for v in verdicts), verdicts
        screenshot(tab, "report_ledger")
