# repexp: the RepExp sweep as one DAG (docs/pipeline.md).
#
#   snakemake --profile slurm all                                    # the paper (configs/paper.yaml)
#   snakemake all --profile local --configfile configs/local.yaml    # the README run, on a CPU
#   snakemake --configfile configs/test.yaml --cores 2 all           # CI
#   snakemake ... all --config set="sweep.betas=[0.01,0.02] train.lr=2e-6"   # nested overrides
#
# download (hub ids, on the submit host) -> preprocess(task) -> train -> select -> merge (verl)
# -> eval(test) -> aggregate -> figures.
# This file only configures and includes; Python helpers live in workflow/rules/common.smk.

import dataclasses

from snakemake.utils import min_version, validate

from repexp import config as C

min_version("9.0")


# The paper config is the default; a --configfile replaces it instead of being merged into it
# (Snakemake would otherwise overlay local.yaml on paper.yaml key by key).
if not workflow.overwrite_configfiles:

    configfile: Path(workflow.basedir, "configs", "paper.yaml")


# Three checks before any job, each naming the key (or file): 1. structure and types (the files re-read
# strictly, merged into repexp/config/model.py's dataclasses with the `set=` dotlist applied, strings made
# numbers where the schema says so); 2. per-field rules (the JSON schema generated from the same
# dataclasses); 3. cross-field rules, trainer and scheduler consistency, local paths (common.smk).
try:
    PARSED_CONFIG = C.parse_files(config, workflow.configfiles)
except C.ConfigError as err:
    raise ValueError(f"config error: {err}") from None
# From here on `config` is the parsed config: every key present with its default, numbers as
# numbers, the `set=` overrides applied (rules read the job-path version, CFG, from common.smk).
config.clear()
config.update(dataclasses.asdict(PARSED_CONFIG))
validate(config, "configs/schema.yaml")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/preprocess.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/select.smk"
include: "workflow/rules/merge.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/testtime.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/figures.smk"


# Short nodes and downloads run in the main Snakemake process on the submit host, never as
# cluster jobs: downloads need the internet that compute nodes may lack; select, aggregate and
# figures take seconds and would otherwise wait in the queue (docs/slurm.md).
localrules:
    download_model,
    download_data,
    select,
    aggregate,
    figures,
    all,


# Before the first job of a real run (not on dry runs): the intermediates check, the config snapshot,
# the tracking server and parent runs. At the end, what nodes left in the MLflow outbox is uploaded.
onstart:
    P.on_start(PIPELINE, workflow)


onsuccess:
    P.on_end(PIPELINE, success=True)


onerror:
    P.on_end(PIPELINE, success=False)


rule all:
    default_target: True
    input:
        final_targets(),
