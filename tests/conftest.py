import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

import pytest  # noqa: E402
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
# a real TransferQueue (Ray local mode, one storage unit) for the verl samplers' and trainer's tests
# (tests/test_verl_plugin.py, tests/test_verl_dapo_cap.py); one per module


@pytest.fixture(scope="module")
def transfer_queue():
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    conf = OmegaConf.create(
        {
            "backend": {
                "storage_backend": "SimpleStorage",
                "SimpleStorage": {"num_data_storage_units": 1, "total_storage_size": 10000},
            }
        }
    )
    tq.init(conf)
    yield tq
    tq.close()
    ray.shutdown()


def clear_partition(tq, partition="train"):
    """Remove every key of a TransferQueue partition (tests start from an empty one)."""
    keys = list((tq.kv_list(partition) or {}).get(partition, {}))
    if keys:
        tq.kv_clear(keys=keys, partition_id=partition)


# ---------------------------------------------------------------------------------------------------
# parallel runs (`make test`: pytest -n 2 --dist loadgroup --no-loadscope-reorder). Each group of tests below is run
# whole by one worker: the two modules on the micro DAG's session fixtures together (the DAG is built once, by that
# worker), every other module on its own (its module-scoped fixtures are built once). The groups that take minutes
# go first, in this order, so that the micro DAG (mostly one process at a time) runs beside the unit tests instead
# of before or after them; the rest keep their collection order. The grouping is a scheduler of our own
# (pytest_xdist_make_scheduler): xdist 3.8's own `xdist_group` marks do not group under pytest 9 (seen here: a
# marked module's tests ran on both workers), and the groups are files anyway.
MICRO_DAG_MODULES = {"tests/test_browser.py", "tests/test_pipeline_e2e.py"}
LONG_GROUPS = [
    "micro-dag",
    "tests/test_verl_smoke.py",
    "tests/test_slurm.py",
    "tests/test_resume.py",
    "tests/test_paper_scale.py",
    "tests/test_paper_eval.py",
    "tests/test_example_method.py",  # ~3 min: after test_verl_smoke, so on the worker that runs everything else
]


def group_of(nodeid: str) -> str:
    module = nodeid.split("::")[0]
    return "micro-dag" if module in MICRO_DAG_MODULES else module


def pytest_collection_modifyitems(config, items):
    def order(item) -> int:
        group = group_of(item.nodeid)
        return LONG_GROUPS.index(group) if group in LONG_GROUPS else len(LONG_GROUPS)

    items.sort(key=order)  # stable: collection order within and after the long groups


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)
