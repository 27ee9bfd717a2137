"""The resource model of a run: peak GPU memory per rank, host memory per node, hours and disk, at plan time.

`estimate(run_cfg, cluster)` (estimate.py) sizes one verl run from its resolved config and the cluster's constants
(configs/pipeline.yaml ``cluster:``, `load_cluster`); `eval_estimate` (eval_time.py) the hours of one evaluation or
selective-decoding job; `shapes.py` holds the networks' shapes they size; `table.py` renders the plan's tables. The
plan (creditlab.plan) refuses a run that does not fit, or whose evaluation outlasts the site's job limit;
docs/cluster.md "Resources".
"""

from creditlab.resources.estimate import Cluster, RunResources, estimate, load_cluster, train_job_minutes
from creditlab.resources.eval_time import EvalResources, eval_estimate, eval_job_key, eval_job_minutes

__all__ = [
    "Cluster",
    "EvalResources",
    "RunResources",
    "estimate",
    "eval_estimate",
    "eval_job_key",
    "eval_job_minutes",
    "load_cluster",
    "train_job_minutes",
]
