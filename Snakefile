# repexp: the RepExp sweep as one DAG (docs/pipeline.md).
#
#   snakemake --profile slurm all                                    # the paper (configs/paper.yaml)
#   snakemake --profile local --configfile configs/local.yaml all    # the README run, on a CPU
#   snakemake --configfile configs/test.yaml --cores 2 all           # CI
#
# preprocess(task) -> train -> select -> merge (verl) -> eval(test) -> aggregate -> figures.
# This file only configures and includes; Python helpers live in workflow/rules/common.smk.

from snakemake.utils import min_version, validate

min_version("9.0")


# The paper config is the default; a --configfile replaces it instead of being merged into it
# (Snakemake would otherwise overlay local.yaml on paper.yaml key by key).
if not workflow.overwrite_configfiles:

    configfile: Path(workflow.basedir, "configs", "paper.yaml")


# Per-field rules (types, ranges, unknown keys) first, then the cross-field rules
# (repexp.config.load in common.smk): both fail before any job is scheduled, naming the key.
validate(config, "configs/schema.yaml")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/preprocess.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/select.smk"
include: "workflow/rules/merge.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/testtime.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/figures.smk"


# MLflow records that nodes left for a later upload are in MLflow when the workflow returns.
onsuccess:
    upload_tracking_records()


onerror:
    upload_tracking_records()


rule all:
    default_target: True
    input:
        final_targets(),
