# Python helpers for the rules: config loading, path resolution, targets, per-job params and
# resources. Parsed by every Snakemake invocation and every SLURM jobstep, so it stays cheap:
# no MLflow, torch or pandas imports, no I/O beyond one small config snapshot and, on the submit
# host, the small content sidecars of the model and data splits (repexp.intermediates.settle).

import dataclasses
import functools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from repexp import config as C
from repexp import jobs as J
from repexp import layout as L
from repexp.io import write_text_atomic

REPO_ROOT = Path(workflow.main_snakefile).resolve().parent
WORKDIR = Path.cwd()


def _from_root(path):
    """A config path: absolute as given, else relative to the repository root (not the job's cwd)."""
    path = Path(path)
    return path if path.is_absolute() else REPO_ROOT / path


def _for_jobs(path):
    """How jobs (cwd = the Snakemake workdir) refer to an absolute path: relative when it lies
    below the workdir, so targets such as `results/eval/...` match the rules' outputs."""
    path = Path(os.path.normpath(path))
    try:
        return str(path.relative_to(WORKDIR))
    except ValueError:
        return str(path)


def _source_for_jobs(source):
    """A local data path as jobs see it (relative paths resolve against the repository root)."""
    if source is None:
        return None
    return os.path.relpath(_from_root(source), WORKDIR)


def _model_for_jobs(model, results_dir):
    """Aliases stay (the model rule builds them); a hub id becomes its local copy (download_model);
    a local directory becomes job-relative. Jobs never see a hub id."""
    kind = C.model_kind(model, REPO_ROOT)
    if kind == "alias":
        return model
    if kind == "hub":
        return str(L.hub_model_dir(results_dir, model))
    return _for_jobs(_from_root(os.path.expanduser(model)))


# --------------------------------------------------------------------------- SLURM settings
# The one place for cluster settings (docs/slurm.md): read from these variables of the submit
# shell, never from SLURM's own input variables (SLURM_ACCOUNT, SLURM_PARTITION, ... change what
# every interactive `srun`/`sbatch` does) and never through the profile's `$VAR` expansion (which
# leaves an unset variable in place, literally). Unset or empty: the flag is not passed and SLURM's
# defaults apply (the plugin guesses an account or submits without -A; the default partition).
SLURM_VARIABLES = {
    "account": "REPEXP_SLURM_ACCOUNT",  # -A for every job
    "partition": "REPEXP_SLURM_PARTITION",  # -p for CPU jobs (preprocess, merge, model)
    "gpu_partition": "REPEXP_SLURM_GPU_PARTITION",  # -p for jobs with resources.<rule>.gpu > 0 (train, eval)
}


def slurm_settings(cfg):
    """{account, partition, gpu_partition} from the environment; values are checked here, so a
    bad one fails before any job, naming the variable."""
    settings = {}
    for name, variable in SLURM_VARIABLES.items():
        value = os.environ.get(variable, "").strip()
        if value and not re.fullmatch(r"[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*", value):
            raise C.ConfigError(
                f"{variable}: {value!r} is not a SLURM account or partition name"
                + (" (an unexpanded shell variable?)" if "$" in value else "")
            )
        settings[name] = value or None
    gpu_rules = [rule for rule in C.RULES if C.rule_resources(cfg, rule).gpu > 0]
    if settings["partition"] and not settings["gpu_partition"] and gpu_rules:
        raise C.ConfigError(
            f"{SLURM_VARIABLES['gpu_partition']}: not set, but {SLURM_VARIABLES['partition']}="
            f"{settings['partition']} is, and rules {', '.join(gpu_rules)} request GPUs; set it to the GPU "
            f"partition (or to {settings['partition']} if that one has the GPUs)"
        )
    return settings


def slurm_resources(rule):
    """The -A/-p resources of one rule (none for settings left unset)."""
    out = {}
    if SLURM["account"]:
        out["slurm_account"] = SLURM["account"]
    partition = SLURM["gpu_partition"] if C.rule_resources(CFG, rule).gpu > 0 else SLURM["partition"]
    if partition:
        out["slurm_partition"] = partition
    return out


try:
    C.check(PARSED_CONFIG)
    C.check_paths(PARSED_CONFIG, REPO_ROOT)
    SLURM = slurm_settings(PARSED_CONFIG)
except C.ConfigError as err:
    raise ValueError(f"config error: {err}") from None

_loaded = PARSED_CONFIG
_results = _for_jobs(_from_root(_loaded.results_dir))
# The hub models and datasets the sweep needs; download_model / download_data fetch them once,
# on the submit host, into results/ (docs/pipeline.md, "Downloads").
HUB_MODELS = {
    str(L.hub_model_dir(_results, value)): value
    for value in (_loaded.model, _loaded.bonus.representation_model)
    if value is not None and C.model_kind(value, REPO_ROOT) == "hub"
}
HUB_DATA_DIR = str(L.hub_data_dir(_results))
HUB_DATA = _loaded.data.source == "hf" or _loaded.data.dapo_source == "hf"

# The effective config with every path as jobs see it. Jobs read its snapshot (not the
# configfile, which `--config` overrides may have changed).
CFG = dataclasses.replace(
    _loaded,
    results_dir=_results,
    model=_model_for_jobs(_loaded.model, _results),
    data=dataclasses.replace(
        _loaded.data,
        source=HUB_DATA_DIR if _loaded.data.source == "hf" else _source_for_jobs(_loaded.data.source),
        dapo_source=(
            str(L.hub_dapo_dir(_results))
            if _loaded.data.dapo_source == "hf"
            else _source_for_jobs(_loaded.data.dapo_source)
        ),
    ),
    bonus=dataclasses.replace(
        _loaded.bonus,
        representation_model=(
            _model_for_jobs(_loaded.bonus.representation_model, _results)
            if _loaded.bonus.representation_model
            else None
        ),
    ),
)
RESULTS = CFG.results_dir
CONFIG_HASH = C.config_hash(CFG)
CONFIG_SNAPSHOT = WORKDIR / L.config_snapshot(RESULTS, CFG.name, CONFIG_HASH)
# Every job's shell reads "$REPEXP_CONFIG"; local jobs inherit it, SLURM jobs get it through
# sbatch --export=ALL and set it again when their jobstep parses this file.
os.environ.update(
    # `repexp` from the environment that runs Snakemake (works without an activated venv;
    # with --sdm conda the rule's env is activated in front of it)
    PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    REPEXP_CONFIG=str(CONFIG_SNAPSHOT),
    REPEXP_ROOT=str(REPO_ROOT),  # also expanded by pip in workflow/envs/*.yaml
    REPEXP_WORKFLOW_DIR=str(REPO_ROOT / "workflow"),
    # A SLURM jobstep's own Snakemake numbers its jobs afresh: its {jobid} is not the scheduler's.
    REPEXP_SNAKEMAKE_EXEC="remote" if workflow.remote_exec else "main",
    # Jobs read local paths only: hub models and datasets are fetched once, on the submit host, by
    # download_model/download_data (which lift these for their own process); a job that would
    # reach for the Hub on a compute node without internet fails at once instead of hanging.
    HF_HUB_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
)


def upload_tracking_records():
    """At the workflow's end: upload what nodes left in the MLflow outbox (detached uploads under
    way are awaited), then stop the tracking server this workflow started (repexp.tracking.workflow)."""
    from repexp.tracking.workflow import on_end

    on_end(CONFIG_SNAPSHOT, RESULTS)


def print_where_results_are():
    """The last lines of a successful run (onsuccess): the table, the figures, the MLflow UI command."""
    from repexp.tracking.workflow import where_lines

    for line in where_lines(
        CFG,
        *(path.resolve() for path in (Path(RESULTS), L.aggregate_dir(RESULTS), L.figures_dir(RESULTS))),
        config=CONFIG_SNAPSHOT,
    ):
        print(line, file=sys.stderr)


def start_tracking():
    """Before the first job: the MLflow server (`tracking.server`; the cluster default) and every
    parent run, once (repexp.tracking.workflow)."""
    from repexp.tracking.workflow import on_start

    on_start(CONFIG_SNAPSHOT, workflow.non_local_exec)


def write_config_snapshot():
    """Content-addressed, so writing it never changes a file that another invocation uses."""
    if not CONFIG_SNAPSHOT.exists():
        write_text_atomic(CONFIG_SNAPSHOT, C.dump_yaml(CFG))


def check_intermediates():
    """Before the first job: stop a run that would rerun finished jobs only because a deleted
    intermediate is rebuilt, or whose jobs would read a checkpoint or merged model that is gone
    (repexp.intermediates). Not with --touch, which accepts outputs as they are."""
    if workflow.touch:
        return
    from repexp import intermediates

    problems = intermediates.check_pending(
        intermediates.pending_jobs(workflow.dag), sys.argv, workflow.dag_settings.targets
    )
    if problems:
        print("repexp: " + "\n  ".join(["not starting:", *problems, "No job was started."]), file=sys.stderr)
        raise SystemExit(1)


# Before the first job of a real run (not on dry runs).
onstart:
    check_intermediates()
    write_config_snapshot()
    start_tracking()


RUNS = C.sweep_runs(CFG)
MODEL_ALIAS = CFG.model if CFG.model in C.MODEL_ALIASES else None
# download_model's wildcard: exactly the hub models of this config (no match when there are none)
HUB_MODEL_PATTERN = "|".join(re.escape(Path(path).name) for path in HUB_MODELS) or "(?!)"
EXPERIMENT = CFG.tracking.experiment or CFG.name  # one MLflow experiment per config


wildcard_constraints:
    task=C.TASK_PATTERN,
    run=C.RUN_PATTERN,
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


def policy_dir():
    """The initial policy's directory when a rule makes it (alias or hub download), else []."""
    if MODEL_ALIAS:
        return [alias_model_dir(MODEL_ALIAS)]
    return [CFG.model] if CFG.model in HUB_MODELS else []


def hub_data_files():
    """The JSONL files download_data writes: every hub table the sweep's tasks read."""
    if not HUB_DATA:
        return []
    from repexp.download import data_files  # imports numpy: only for configs that download

    return [
        str(Path(HUB_DATA_DIR, name))
        for name in data_files(
            CFG.sweep.tasks, source_hf=PARSED_CONFIG.data.source == "hf", dapo_hf=PARSED_CONFIG.data.dapo_source == "hf"
        )
    ]


def preprocess_inputs(wildcards):
    return hub_data_files()


def all_eval_files():
    return [eval_file(spec.task, spec.name) for spec in RUNS]


def all_testtime_files():
    """The test-time ordering of every evaluated run (`testtime.enabled`)."""
    return [testtime_file(spec.task, spec.name) for spec in RUNS] if CFG.testtime.enabled else []


def all_train_markers():
    return [train_file(L.DONE, spec.task, spec.name) for spec in RUNS if spec.trains]


# `snakemake --report` entries of the figures: (subcategory, caption file) per kind of figure
FIGURE_REPORTS = {
    "pass_at_k": ("pass@k curves", "pass_at_k.rst"),
    "testtime": ("test-time RepExp", "testtime.rst"),
    "heatmaps": ("sweep heatmaps", "heatmap.rst"),
    "training": ("training curves", "training.rst"),
    "k_efficiency": ("k-efficiency", "k_efficiency_figure.rst"),
    "dynamics": ("training dynamics", "dynamics.rst"),
}


def figure_files():
    """What `repexp figures` draws (repexp.layout names them): PDFs, and the PNGs for the report."""
    files = []
    for stem in L.figure_stems(RUNS):
        kind, caption = FIGURE_REPORTS[L.figure_kind(stem)]
        # (`report(` must not start a line: Snakemake's parser would read it as the `report:` keyword)
        png = report(
            str(L.figure_file(RESULTS, stem, "png")),
            caption=f"../report/{caption}",
            category="Figures",
            subcategory=kind,
            labels={"figure": stem},
        )
        files += [str(L.figure_file(RESULTS, stem, "pdf")), png]
    return files


# --------------------------------------------------------------------------- per-job config


@functools.lru_cache(maxsize=None)
def run_spec(task, run):
    return C.parse_run(task, run)  # raises on non-canonical names such as b0.010


@functools.lru_cache(maxsize=None)
def run_config(task, run):
    return C.compose(CFG, run_spec(task, run), cfg_hash=CONFIG_HASH)


def training_hash(wildcards):
    """The job's resolved training config, hashed: a params value, so editing one task's
    settings reruns only that task's training jobs (and eval settings rerun none)."""
    return C.training_hash(run_config(wildcards.task, wildcards.run))


@functools.lru_cache(maxsize=None)
def _job_hash(rule, *identity):
    wildcards = dict(zip(J.RULES[rule][2], identity))
    rc = run_config(wildcards["task"], wildcards["run"]) if "run" in wildcards else None
    return J.job_hash(J.compose(CFG, rule, run_config=rc, **wildcards))


def job_hash(rule):
    """The params of a rule: its job's settings hashed, so a config change reruns exactly the jobs
    whose settings changed (the shell command carries none)."""
    return lambda wildcards: _job_hash(rule, *(getattr(wildcards, name) for name in J.RULES[rule][2]))


def node_command(rule):
    """The shell of a rule: identities only (its wildcards); `repexp run` composes everything else from
    the config snapshot (repexp.jobs) and runs the stage inside its MLflow node run (repexp.run_cli)."""
    identity = "".join(f" --{name.replace('_', '-')} {{wildcards.{name}}}" for name in J.RULES[rule][2])
    return f"repexp run {rule}{identity} --attempt {{resources.attempt}} --snakemake-jobid {{{{{{jobid}}}}}} > {{log}} 2>&1"


def eval_inputs(wildcards):
    """Test split + the model: the pointer of a trained run (merged for verl), or the base model."""
    inputs = {"data": data_file("test", wildcards.task)}
    spec = run_spec(wildcards.task, wildcards.run)
    if spec.trains:
        pointer = L.MERGED if spec.backend == "verl" else L.SELECT
        inputs["pointer"] = train_file(pointer, wildcards.task, wildcards.run)
    elif policy_dir():
        inputs["model"] = policy_dir()[0]
    return inputs


def train_inputs(wildcards):
    return {
        "train": data_file("train", wildcards.task),
        "dev": data_file("dev", wildcards.task),
        "model": model_dir(),
    }


# --------------------------------------------------------------------------- resources


def attempt_number(wildcards, attempt):
    """Exposed as a resource so the node command can tag its MLflow run with the attempt."""
    return attempt


def rule_resources(rule):
    """Scheduler requests from config `resources.<rule>` (SLURM: --gpus[=<model>:N], -C, --cpus-per-task,
    --mem, -t) plus account and partition (slurm_resources). Multi-node (nodes > 1): one task per node with
    the rule's CPUs and GPUs, started by the rule's own srun launcher (ray_slurm.sh)."""
    res = C.rule_resources(CFG, rule)
    out = {
        "mem_mb": res.mem_mb,
        "runtime": res.runtime,
        "cpus_per_task": res.cpus_per_task,
        "nodes": res.nodes,
        "gpus_per_node": res.gpu,  # for ray_slurm.sh's srun steps; not an sbatch flag
        "attempt": attempt_number,
        **slurm_resources(rule),
    }
    if res.nodes > 1:
        # --nodes=N --ntasks=N --ntasks-per-node=1 --cpus-per-task=C --gres=gpu:G: every node holds
        # C CPUs and G GPUs for its one task. `mpi` makes the jobstep run the command once in the
        # batch step (no `srun -n1` wrapper), so ray_slurm.sh can srun one Ray node per host;
        # tasks_per_gpu=0 keeps the plugin from adding --ntasks-per-gpu.
        out.update(tasks=res.nodes, mpi="srun", tasks_per_gpu=0, slurm_extra="--ntasks-per-node=1")
        if res.gpu:
            out["gres"] = f"gpu:{res.gpu_model}:{res.gpu}" if res.gpu_model else f"gpu:{res.gpu}"
    else:
        out["gpu"] = res.gpu
        if res.gpu_model:
            out["gpu_model"] = res.gpu_model  # the plugin: --gpus=<model>:<gpu>
    if res.constraint:
        out["constraint"] = res.constraint  # the plugin: -C '<features>'
    # Jobs sharing one GPU on one machine: `--resources gpu_share=100` per GPU (docs/pilot.md).
    out["gpu_share"] = res.gpu_share if res.gpu else 0
    return out


def rule_threads(rule):
    return C.rule_resources(CFG, rule).cpus_per_task


# --------------------------------------------------------------------------- targets


def settle_intermediates():
    """At every start on the submit host: a model or data split rebuilt with the same content gets
    back the time the jobs made from it were built against (repexp.intermediates.settle)."""
    from repexp import intermediates

    splits = [data_file(split, task) for task in CFG.sweep.tasks for split in L.SPLITS]
    for line in intermediates.settle([*model_dir(), *splits]):
        print(f"repexp: {line}", file=sys.stderr)


if not workflow.remote_exec:
    settle_intermediates()


def final_targets():
    return [*all_eval_files(), *all_testtime_files(), aggregate_file(L.PASS_AT_K_CSV), figure_index()]
