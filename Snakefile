# creditlab: every table of the five papers, end to end. Thin by design: the logic lives in the
# `creditlab` package (python -m creditlab <verb>); rules only say what depends on what.
#   snakemake -n                      # show the DAG (tiny scale)
#   snakemake --cores 2               # build everything
#   snakemake --cores 2 table_dlogp_main   # one table
#   snakemake --report results/report.html
import os

from snakemake.utils import min_version, validate

min_version("9.0")


configfile: os.path.join(workflow.basedir, "configs/pipeline.yaml")


validate(config, "workflow/schemas/pipeline.schema.yaml")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


wildcard_constraints:
    backbone="[^/]+",
    run="[^/]+",
    seed=r"\d+",
    paper="[^/]+",
    table="[^/]+",
    decode="[^/]+",
    figure="[^/]+",
    analysis="[^/]+",


include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/tables.smk"
include: "workflow/rules/analysis.smk"


rule all:
    default_target: True
    input:
        all_tables(),
