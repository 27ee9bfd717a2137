import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

import torch  # noqa: E402

torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------------
# a small real Trainer for one-step tests of methods (tests/test_credit_delta.py, test_trainer_methods.py)


class _RandomScorer:
    """Scores half of the rollouts right, deterministically, so every group is informative."""

    def score(self, texts, golds):
        return [float(i % 2) for i in range(len(texts))]


def make_trainer(method, tmp_path, overrides=()):
    """A local-engine Trainer of `method` at micro size on 20 synthetic problems, scores alternating 0/1
    (every group informative), overlong shaping off."""
    from creditlab.data.synthetic import generate_split
    from creditlab.data.tokenizer import build_tokenizer
    from creditlab.engines.local.trainer import Trainer
    from creditlab.models.tiny import build_model
    from creditlab.plan import compose

    cfg = compose("micro", "micro-s", method, ["trainer.steps=1", "trainer.overlong.enable=false", *overrides])
    records = generate_split(0, 20, [1, 1], [1, 1])
    tok = build_tokenizer([r["question"] + r["solution"] for r in records] + ["Q: A:\n \\boxed{}0123456789+-*"])
    model = build_model(cfg["model"]["arch"], len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    return Trainer(cfg, model, tok, records, _RandomScorer(), tmp_path / method, progress=False)


# ---------------------------------------------------------------------------------------------------
# the micro end-to-end DAG, shared by tests/test_pipeline_e2e.py and tests/test_browser.py
from e2e import cancellation_results, delta_results, dfpo_main_results, micro_results, report_html  # noqa: E402,F401


# ---------------------------------------------------------------------------------------------------
# parallel runs (`make test`: pytest -n 2 --dist loadgroup --no-loadscope-reorder). Every test is put in a group
# that one worker runs whole: the tests of the micro DAG's session fixtures in one group (the DAG is built once, by
# that worker), every other module in its own (its module-scoped fixtures are built once). The groups that take
# minutes go first, in this order, so that the micro DAG (mostly one process at a time) runs beside the unit tests
# instead of before or after them; the rest keep their collection order.
MICRO_DAG_FIXTURES = {"micro_results", "delta_results", "dfpo_main_results", "cancellation_results", "report_html"}
LONG_GROUPS = ["micro-dag", "tests/test_slurm.py", "tests/test_resume.py", "tests/test_paper_scale.py",
               "tests/test_paper_eval.py"]


def test_group(item) -> str:
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return mark.args[0] if mark.args else mark.kwargs["name"]
    return "micro-dag" if MICRO_DAG_FIXTURES & set(item.fixturenames) else item.nodeid.split("::")[0]


def _order(group: str) -> int:
    return LONG_GROUPS.index(group) if group in LONG_GROUPS else len(LONG_GROUPS)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which appends the group to each test id
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(test_group(item)))
    items.sort(key=lambda item: _order(test_group(item)))  # stable: collection order within and after
