# The rules' paths, targets, per-job params and resources. What the config implies beyond them (the
# config as jobs see it, the checks, SLURM settings, the environment, the hooks) is repexp.pipeline,
# plain Python. Parsed by every Snakemake invocation and every SLURM jobstep: no MLflow, torch or
# pandas imports.

import os
import re
import sys
from pathlib import Path

from repexp import config as C
from repexp import gpus as G
from repexp import jobs as J
from repexp import layout as L
from repexp import pipeline as P

# The GPUs jobs share, read once where they run: this host, unless a cluster executor gives each job
# whole GPUs, or this is a SLURM jobstep (repexp.gpus; docs/pilot.md, "Sharing the GPU"). The executor
# is not known yet while the Snakefile is read; Snakemake keeps --jobs (`nodes`) for cluster executors only
# (locally it is --cores), also in a dry run.
GPUS = [] if workflow.nodes is not None or workflow.remote_exec else G.read_gpus()
try:
    # GPU shares, cross-field rules, local paths, SLURM settings (repexp.pipeline.setup), before any job
    PIPELINE = P.setup(PARSED_CONFIG, Path(workflow.main_snakefile).resolve().parent, Path.cwd(), gpus=GPUS)
except C.ConfigError as err:
    raise ValueError(f"config error: {err}") from None
for name, limit in PIPELINE.gpu_pools().items():  # what `--resources` does not set
    if name not in workflow.global_resources:
        workflow.register_resource(name, limit)
if not workflow.remote_exec:
    for line in PIPELINE.gpu_lines():
        print(f"repexp: {line}", file=sys.stderr)
CFG = PIPELINE.cfg  # the config with every path as jobs see it; jobs read its snapshot
RESULTS = CFG.results_dir
HUB_MODELS = PIPELINE.hub_models
os.environ.update(
    PIPELINE.environment(sys.executable),
    # A SLURM jobstep's own Snakemake numbers its jobs afresh: its {jobid} is not the scheduler's.
    REPEXP_SNAKEMAKE_EXEC="remote" if workflow.remote_exec else "main",
)


RUNS = PIPELINE.runs
MODEL_ALIAS = CFG.model if CFG.model in C.MODEL_ALIASES else None
# download_model's wildcard: exactly the hub models of this config (no match when there are none)
HUB_MODEL_PATTERN = "|".join(re.escape(Path(path).name) for path in HUB_MODELS) or "(?!)"


# `run` matches exactly the sweep's run names (so b0.010 matches no rule); train/select only trained
# runs, merge only verl runs.
TRAINED_RUN_PATTERN = PIPELINE.run_pattern(trains=True)
VERL_RUN_PATTERN = PIPELINE.run_pattern(trains=True, backend="verl")


wildcard_constraints:
    task=C.TASK_PATTERN,
    run=PIPELINE.run_pattern(),
    alias=C.MODEL_ALIAS_PATTERN,


# --------------------------------------------------------------------------- paths
# Every path comes from repexp.layout (the results layout the commands write); defaults are the
# rules' wildcard patterns.


def log_path(rule, *parts):
    return str(L.log_file(RESULTS, rule, *parts))


def benchmark_path(rule, *parts):
    return str(L.benchmark_file(RESULTS, rule, *parts))


def data_file(split, task="{task}"):
    return str(L.data_file(RESULTS, task, split))


def manifest_file(task="{task}"):
    return str(L.manifest_file(L.data_dir(RESULTS, task)))


def train_file(name, task="{task}", run="{run}"):
    return str(L.train_run_dir(RESULTS, task, run) / name)


def eval_file(task="{task}", run="{run}"):
    return str(L.eval_json(RESULTS, task, run))


def testtime_file(task="{task}", run="{run}"):
    return str(L.testtime_json(RESULTS, task, run))


def aggregate_file(name):
    return str(L.aggregate_file(RESULTS, name))


def alias_model_dir(alias="{alias}"):
    return str(L.model_alias_dir(RESULTS, alias))


def hub_model_dir(hub_model="{hub_model}"):
    return str(L.hub_model_dir(RESULTS, hub_model))


def figure_index():
    return str(L.figure_index(RESULTS))


def model_dir():
    """The model directories the rules depend on: an offline alias (the model rule) and the hub
    models (download_model); a local directory given in the config has no rule."""
    return ([alias_model_dir(MODEL_ALIAS)] if MODEL_ALIAS else []) + list(HUB_MODELS)


def all_eval_files():
    return [eval_file(spec.task, spec.name) for spec in RUNS]


def all_testtime_files():
    """The test-time ordering of every evaluated run (`testtime.enabled`)."""
    return [testtime_file(spec.task, spec.name) for spec in RUNS] if CFG.testtime.enabled else []


# --------------------------------------------------------------------------- per-job config


def job_hash(rule):
    """The params of a rule: its job's settings hashed (repexp.pipeline.Pipeline.job_hash)."""
    names = J.RULES[rule].wildcards
    return lambda wildcards: PIPELINE.job_hash(rule, **{name: getattr(wildcards, name) for name in names})


def node_command(rule):
    """The shell of a rule: identities only (its wildcards); `repexp run` composes everything else from
    the config snapshot (repexp.jobs) and runs the stage inside its MLflow node run (repexp.run_cli).
    `--log`: each execution's output is also kept in its own file beside the log (repexp.joblog)."""
    identity = "".join(f" --{name.replace('_', '-')} {{wildcards.{name}}}" for name in J.RULES[rule].wildcards)
    # A job placed on one GPU sees only it, numbered as nvidia-smi numbers it (PCI bus order; vLLM takes
    # no UUIDs there); `env`, since train's launcher runs the command as its arguments.
    device = (
        "env CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={resources.cuda_device} "
        if PIPELINE.places(rule)
        else ""
    )
    return (
        f"{device}repexp run {rule}{identity} --attempt {{resources.attempt}} --snakemake-jobid {{{{{{jobid}}}}}} "
        "--log {log} > {log} 2>&1"
    )


def eval_inputs(wildcards):
    """Test split + the model: the pointer of a trained run (merged for verl), or the base model."""
    inputs = {"data": data_file("test", wildcards.task)}
    spec = PIPELINE.run(wildcards.task, wildcards.run)
    if spec.trains:
        pointer = L.MERGED if spec.backend == "verl" else L.SELECT
        inputs["pointer"] = train_file(pointer, wildcards.task, wildcards.run)
    elif MODEL_ALIAS or CFG.model in HUB_MODELS:  # a rule makes the initial policy
        inputs["model"] = alias_model_dir(MODEL_ALIAS) if MODEL_ALIAS else CFG.model
    return inputs


def train_inputs(wildcards):
    return {"train": data_file("train", wildcards.task), "dev": data_file("dev", wildcards.task), "model": model_dir()}


# --------------------------------------------------------------------------- resources


def rule_resources(rule):
    """Scheduler requests (repexp.pipeline.Pipeline.resources from config `resources.<rule>`, SLURM account and
    partition) and the attempt, which the node command tags its MLflow run with."""
    return {**PIPELINE.resources(rule), "attempt": lambda wildcards, attempt: attempt}


def rule_threads(rule):
    return C.rule_resources(CFG, rule).cpus_per_task


# --------------------------------------------------------------------------- targets


if not workflow.remote_exec:
    # At every start on the submit host: a model or data split rebuilt with the same content gets back
    # the time the jobs made from it were built against (repexp.intermediates.settle).
    from repexp import intermediates

    for line in intermediates.settle([*model_dir(), *(data_file(s, t) for t in CFG.sweep.tasks for s in L.SPLITS)]):
        print(f"repexp: {line}", file=sys.stderr)


def final_targets():
    return [*all_eval_files(), *all_testtime_files(), aggregate_file(L.PASS_AT_K_CSV), figure_index()]
