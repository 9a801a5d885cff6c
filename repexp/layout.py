"""The results layout: every path and file name under the results directory, defined once.

The Snakemake rules (through workflow/rules/common.smk) and every `repexp` command build their paths
here, so a rule's output and the file its command writes cannot drift apart; a test fails when a
file name of this module is spelled as a path anywhere else in repexp/ or workflow/.

    <results>/
      data/<task>/            train.parquet dev.parquet test.parquet, manifest.json (last)     preprocess
      train/<task>/<run>/     job.yaml, train_node.json, mlflow_run.json, metrics.jsonl,           train
                              best_dev.json, DONE (last; the rule's output)
                              checkpoints/global_step_<N>/  COMPLETE (last), budget.json, ...
                              select.json                                                         select
                              merged.json (verl: the model at checkpoints/global_step_<N>/actor/hf) merge
      train/<task>/.superseded/<run>-<hash>-<time>/   a run directory set aside (repexp run train)
      eval/<task>/<run>/      samples/ (shard-<i>.parquet, meta.json, timing/), eval.json (last)    eval
      testtime/<task>/<run>/  features/, order.parquet, testtime.json (last)                   testtime
      aggregate/              pass_at_k.csv (the rule's table), k_efficiency{,_by_k}.csv, .md, .html  aggregate
      figures/                <stem>.png/.pdf per figure, index.json (last)                      figures
      models/<alias>/         offline policies (tiny, smollm2)                                       model
      models/hub/<org>--<name>/   hub models                                                download_model
      downloads/data/         hub datasets, laid out like a local data source (MANIFEST.json)  download_data
      config/<name>-<hash>.yaml   the config snapshot every job reads ($REPEXP_CONFIG)
      logs/<rule>/<wildcards>.log, benchmarks/<rule>/<wildcards>.tsv   Snakemake's log and benchmark
      mlflow/                 the tracking store, outbox and parents (repexp.tracking.names)
      .<name>.content.json    beside a model directory or data split: its content digest and the time the
                              jobs made from it were built against (repexp.intermediates)

Pure: standard library only. Functions return `Path`s; pass wildcard patterns such as "{task}" for
Snakemake's rule declarations.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

PathLike = str | Path

# --------------------------------------------------------------------------- top level

DATA_DIR = "data"
TRAIN_DIR = "train"
EVAL_DIR = "eval"
TESTTIME_DIR = "testtime"
AGGREGATE_DIR = "aggregate"
FIGURES_DIR = "figures"
MODELS_DIR = "models"
HUB_MODELS_DIR = "hub"  # models/hub/<org>--<name>
DOWNLOADS_DIR = "downloads"
CONFIG_DIR = "config"
LOGS_DIR = "logs"
BENCHMARKS_DIR = "benchmarks"
MLFLOW_DIR = "mlflow"  # what lies below it: repexp.tracking.names

# --------------------------------------------------------------------------- data/<task>/

SPLITS = ("train", "dev", "test")
SPLIT_SUFFIX = ".parquet"
MANIFEST = "manifest.json"


def data_dir(results: PathLike, task: str) -> Path:
    return Path(results) / DATA_DIR / task


def split_file(task_data_dir: PathLike, split: str) -> Path:
    """A prepared split in a task's data directory (verl's row format)."""
    return Path(task_data_dir) / f"{split}{SPLIT_SUFFIX}"


def data_file(results: PathLike, task: str, split: str) -> Path:
    return split_file(data_dir(results, task), split)


def manifest_file(task_data_dir: PathLike) -> Path:
    return Path(task_data_dir) / MANIFEST


# --------------------------------------------------------------------------- train/<task>/<run>/

JOB_YAML = "job.yaml"  # the run's resolved RunConfig
NODE_STATE = "train_node.json"  # repexp run train: {"training_hash", "status": running|failed|done}
MLFLOW_RUN = "mlflow_run.json"  # the node's MLflow run id, for the trainer
METRICS = "metrics.jsonl"  # one {"step": N, "<metric>": value} per logged step
BEST_DEV = "best_dev.json"
DONE = "DONE"  # written last by the trainer: the train rule's output
CHUNK_END = "CHUNK_END"  # the trainer stopped at a walltime chunk's end: {"step", "deadline", "at"} (repexp.walltime)
SELECT = "select.json"  # the select rule's model pointer
MERGED = "merged.json"  # the merge rule's model pointer (verl)
SUPERSEDED_DIR = ".superseded"  # train/<task>/.superseded/: run directories set aside by repexp run train
CHECKPOINTS_DIR = "checkpoints"
STEP_PREFIX = "global_step_"
# inside a checkpoint directory
COMPLETE = "COMPLETE"  # written last: {"files": {relative path: size}}
SLIM_MARKER = "RESUME_STATE_REMOVED"  # a kept best-dev checkpoint without its resume state
BUDGET = "budget.json"  # {"train_seconds"}: training time over all attempts up to this step
VERL_STATE = "repexp_state.pt"  # verl: the persistent covariance
VERL_OUTCOME_STATE = "outcome_counts.json"  # verl: outcome exploration's historical answer counts
VERL_HF_DIR = ("actor", "huggingface")  # verl: config and tokenizer beside the FSDP shards
VERL_MERGED_MODEL = ("actor", "hf")  # verl: the merged Hugging Face model (repexp merge)
VERL_HYDRA_DIR = "hydra"  # verl: Hydra's run directory
VERL_STARTUP_LOG = "startup.log"  # verl: this attempt's start-up marks (repexp.verl.startup)
VERL_STARTUP = "startup.json"  # verl: this attempt's start-up phases, written when training returns
TRL_COVARIANCE = "repexp_covariance.pt"  # TRL: the persistent covariance
TRL_OUTCOME_COUNTS = "repexp_outcome_counts.json"  # TRL: outcome exploration's historical answer counts
TRL_CHECKPOINT_INFO = "repexp_checkpoint.json"  # TRL: step, optimizer steps, run, config hash
TRL_STAGING_DIR = "trl_staging"  # TRL saves here first, then the checkpoint is renamed into place
TRL_SETTINGS = "trl_settings.json"

_STEP_RE = re.compile(rf"^{STEP_PREFIX}(\d+)$")


def train_run_dir(results: PathLike, task: str, run: str) -> Path:
    return Path(results) / TRAIN_DIR / task / run


def superseded_dir(run_dir: PathLike) -> Path:
    return Path(run_dir).parent / SUPERSEDED_DIR


def checkpoints_dir(run_dir: PathLike) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def checkpoint_dir(run_dir: PathLike, step: int) -> Path:
    return checkpoints_dir(run_dir) / f"{STEP_PREFIX}{step}"


def checkpoint_step(path: PathLike) -> Optional[int]:
    """N of a `global_step_<N>` directory; None for any other name."""
    match = _STEP_RE.match(Path(path).name)
    return int(match.group(1)) if match else None


def step_in_path(path: PathLike) -> Optional[int]:
    """N of the innermost `global_step_<N>` component of a path (a model inside a checkpoint); None if none."""
    steps = [step for step in map(checkpoint_step, Path(path).parts) if step is not None]
    return steps[-1] if steps else None


def checkpoint_dirs(run_dir: PathLike) -> list[Path]:
    """Every `checkpoints/global_step_<N>` directory of a run (complete or not), by step."""
    root = checkpoints_dir(run_dir)
    found = [(checkpoint_step(path), path) for path in root.glob(f"{STEP_PREFIX}*")] if root.is_dir() else []
    return [path for step, path in sorted((s, p) for s, p in found if s is not None)]


def merged_model_dir(ckpt_dir: PathLike) -> Path:
    return Path(ckpt_dir).joinpath(*VERL_MERGED_MODEL)


# --------------------------------------------------------------------------- eval/<task>/<run>/

EVAL_JSON = "eval.json"  # written last: the eval rule's output
SAMPLES_DIR = "samples"
SAMPLES_META = "meta.json"  # in samples/ and testtime's features/: what the stored files were made with
SAMPLES_TIMING_DIR = "timing"
CORRUPT_DIR = "corrupt"  # samples/corrupt/: damaged shards set aside
SHARD_DIGITS = 5
_SHARD_RE = re.compile(rf"^shard-(\d{{{SHARD_DIGITS}}})\.(\w+)$")


def eval_dir(results: PathLike, task: str, run: str) -> Path:
    return Path(results) / EVAL_DIR / task / run


def eval_json(results: PathLike, task: str, run: str) -> Path:
    return eval_dir(results, task, run) / EVAL_JSON


def samples_dir(out_dir: PathLike) -> Path:
    return Path(out_dir) / SAMPLES_DIR


def shard_name(index: int, suffix: str) -> str:
    """`shard-00003.parquet` (sample shards), `.json` (their timings), `.pt` (testtime features)."""
    return f"shard-{index:0{SHARD_DIGITS}d}.{suffix}"


def shard_glob(suffix: str) -> str:
    return f"shard-*.{suffix}"


def shard_index(name: str, suffix: str) -> Optional[int]:
    """The index of a shard file name with this suffix; None for any other name."""
    match = _SHARD_RE.match(name)
    return int(match.group(1)) if match and match.group(2) == suffix else None


# --------------------------------------------------------------------------- testtime/<task>/<run>/

TESTTIME_JSON = "testtime.json"  # written last: the testtime rule's output
ORDER_FILE = "order.parquet"
FEATURES_DIR = "features"


def testtime_json(results: PathLike, task: str, run: str) -> Path:
    return Path(results) / TESTTIME_DIR / task / run / TESTTIME_JSON


# --------------------------------------------------------------------------- aggregate/

PASS_AT_K_CSV = "pass_at_k.csv"  # the tidy table (the aggregate rule's first output)
K_EFFICIENCY_CSV = "k_efficiency.csv"
K_EFFICIENCY_BY_K_CSV = "k_efficiency_by_k.csv"  # the same per reference k (the k-efficiency figure's data)
PASS_AT_K_MD = "pass_at_k.md"
PASS_AT_K_HTML = "pass_at_k.html"
PREREGISTERED_MD = "preregistered.md"  # the fourth design's registered analysis (repexp.aggregate.prereg)
PREREGISTERED_JSON = "preregistered.json"
AGGREGATE_FILES = (PASS_AT_K_CSV, K_EFFICIENCY_CSV, K_EFFICIENCY_BY_K_CSV, PASS_AT_K_MD, PASS_AT_K_HTML,
                   PREREGISTERED_MD, PREREGISTERED_JSON)


def aggregate_dir(results: PathLike) -> Path:
    return Path(results) / AGGREGATE_DIR


def aggregate_file(results: PathLike, name: str) -> Path:  # name: one of AGGREGATE_FILES
    return aggregate_dir(results) / name


# --------------------------------------------------------------------------- figures/

FIGURE_INDEX = "index.json"  # written last: the figures rule's marker
FIGURE_FORMATS = ("png", "pdf")  # each figure in both; the PNG is the one `snakemake --report` shows
PASS_AT_K_FIGURE = "pass_at_k"
TESTTIME_FIGURE = "testtime_pass_at_k"
K_EFFICIENCY_FIGURE = "k_efficiency"
FIGURE_KINDS = ("pass_at_k", "testtime", "k_efficiency", "heatmaps", "training", "dynamics")


def heatmap_figure(task: str, backend: str, method: str) -> str:
    """One method's sweep heatmap for a task and backend (`heatmap_grids` says which are drawn)."""
    return f"heatmap_{task}_{backend}_{method}"


def training_figure(task: str, backend: str) -> str:
    return f"training_{task}_{backend}"


def dynamics_figure(task: str, backend: str) -> str:
    """Policy entropy and rollout diversity over training steps."""
    return f"dynamics_{task}_{backend}"


def figure_kind(stem: str) -> str:
    """Which of FIGURE_KINDS a figure stem belongs to."""
    fixed = {PASS_AT_K_FIGURE: "pass_at_k", TESTTIME_FIGURE: "testtime", K_EFFICIENCY_FIGURE: "k_efficiency"}
    per_pair = {"heatmap_": "heatmaps", "training_": "training", "dynamics_": "dynamics"}
    kind = fixed.get(stem) or next((kind for prefix, kind in per_pair.items() if stem.startswith(prefix)), None)
    if kind is not None:
        return kind
    raise ValueError(f"{stem}: not a figure of repexp figures")


def figure_pairs(specs: Sequence) -> list[tuple[str, str]]:
    """(task, backend) pairs that get a heatmap and a training figure: those with trained runs
    (`repexp.config.RunSpec`s), in sweep order."""
    return list(dict.fromkeys((s.task, s.backend) for s in specs if s.trains))


def heatmap_params(specs: Sequence) -> Optional[tuple[str, str]]:
    """The (row, column) parameters of a heatmap of these runs (one method's, of one task and backend): the
    method's two named parameters (`Method.named_fields`, e.g. RepExp's sparse_dim × β) when it has exactly
    two and the runs hold more than one of its points; None otherwise. A heatmap of one cell is a near-white
    square with a meaningless colour bar, and a method of one swept parameter is a line in the pass@k figure:
    their numbers are rows of the aggregate tables (pass@k, k-efficiency) instead. Read from the method
    table only: a new method of two named parameters gets its heatmap without a change here."""
    from repexp.methods import METHODS  # lazily: layout stays importable without the method table

    trained = [s for s in specs if s.trains]
    methods = {s.method for s in trained}
    if len(methods) != 1:
        return None
    named = METHODS[methods.pop()].named_fields()
    if len(named) != 2 or len({s.point for s in trained}) < 2:
        return None
    return named[0], named[1]


def heatmap_grids(specs: Sequence) -> list[tuple[str, str, str]]:
    """(task, backend, method) of every sweep heatmap (`heatmap_params`), per figure pair in sweep order,
    the methods in the method table's order."""
    from repexp.methods import METHODS

    groups: dict[tuple[str, str, str], list] = {}
    for s in specs:
        if s.trains:
            groups.setdefault((s.task, s.backend, s.method), []).append(s)
    return [(task, backend, method) for task, backend in figure_pairs(specs) for method in METHODS
            if heatmap_params(groups.get((task, backend, method), ()))]


def figure_stems(specs: Sequence, *, training: bool = True) -> list[str]:
    """Every figure `repexp figures` draws for these runs: pass@k, test-time, k-efficiency, and per
    (task, backend) with trained runs a heatmap per method whose sweep is a grid of two parameters
    (`heatmap_grids`) and (with training curves) a training and a training-dynamics figure."""
    stems = [PASS_AT_K_FIGURE, TESTTIME_FIGURE, K_EFFICIENCY_FIGURE]
    heatmaps = heatmap_grids(specs)
    for task, backend in figure_pairs(specs):
        stems += [heatmap_figure(*grid) for grid in heatmaps if grid[:2] == (task, backend)]
        stems += [training_figure(task, backend), dynamics_figure(task, backend)] if training else []
    return stems


def figure_names(stem: str) -> list[str]:
    return [f"{stem}.{ext}" for ext in FIGURE_FORMATS]


def figures_dir(results: PathLike) -> Path:
    return Path(results) / FIGURES_DIR


def figure_file(results: PathLike, stem: str, ext: str) -> Path:
    return figures_dir(results) / f"{stem}.{ext}"


def figure_index(results: PathLike) -> Path:
    return figures_dir(results) / FIGURE_INDEX


# --------------------------------------------------------------------------- models, downloads, config, logs


def model_alias_dir(results: PathLike, alias: str) -> Path:
    """An offline policy built by the model rule (`model: tiny|smollm2`)."""
    return Path(results) / MODELS_DIR / alias


def hub_model_name(repo_id: str) -> str:
    """A hub model's local name, `<org>--<name>`: the download_model rule's `hub_model` wildcard."""
    return repo_id.replace("/", "--")


def hub_model_dir(results: PathLike, repo_id: str) -> Path:
    """Where the download_model rule puts a hub model (jobs read only this local copy)."""
    return Path(results) / MODELS_DIR / HUB_MODELS_DIR / hub_model_name(repo_id)


CONTENT_SUFFIX = ".content.json"


def content_sidecar(output: PathLike) -> Path:
    """`<dir>/.<name>.content.json` beside the output `<dir>/<name>`, a file or a directory
    (repexp.intermediates): not a Snakemake output, so it outlives the output's deletion."""
    output = Path(output)
    return output.parent / f".{output.name}{CONTENT_SUFFIX}"


def hub_data_dir(results: PathLike) -> Path:
    """Where the download_data rule puts the hub datasets, in the layout of a local data source."""
    return Path(results) / DOWNLOADS_DIR / DATA_DIR


# A data source (`data.source`: a local directory such as ../shared/data, or downloads/data/ when it is
# `hf`) holds `<table>/<split>.jsonl` (repexp.data.TABLES), the DAPO set in `dapo/`, and a manifest.
SOURCE_MANIFEST = "MANIFEST.json"
DAPO_SOURCE_DIR = "dapo"
DAPO_SOURCE_FILE = f"{DAPO_SOURCE_DIR}/train.jsonl"


def hub_dapo_dir(results: PathLike) -> Path:
    """The DAPO training set downloaded for `data.dapo_source: hf`."""
    return hub_data_dir(results) / DAPO_SOURCE_DIR


def config_snapshot(results: PathLike, name: str, config_hash: str) -> Path:
    """The content-addressed config snapshot the workflow writes and every job reads."""
    return Path(results) / CONFIG_DIR / f"{name}-{config_hash}.yaml"


def log_file(results: PathLike, rule: str, *parts: str) -> Path:
    """Snakemake's `log:` of one job: logs/<rule>/<wildcards...>.log."""
    return Path(results, LOGS_DIR, rule, *parts[:-1], f"{parts[-1] if parts else 'all'}.log")


def execution_log(log: PathLike, execution: int) -> Path:
    """One execution's own copy of a job's log, beside Snakemake's `log:` (which Snakemake deletes before
    each attempt): `<name>.execution-<N>.log`."""
    log = Path(log)
    return log.with_name(f"{log.stem}.execution-{execution}{log.suffix}")


def execution_logs(log: PathLike) -> dict[int, Path]:
    """The execution logs of a job's `log:` by execution number."""
    log = Path(log)
    prefix, suffix = f"{log.stem}.execution-", log.suffix
    found = {}
    for path in log.parent.glob(f"{glob.escape(prefix)}*{suffix}"):
        number = path.name[len(prefix):len(path.name) - len(suffix)]
        if number.isdigit():
            found[int(number)] = path
    return found


def benchmark_file(results: PathLike, rule: str, *parts: str) -> Path:
    """Snakemake's `benchmark:` of one job: benchmarks/<rule>/<wildcards...>.tsv."""
    return Path(results, BENCHMARKS_DIR, rule, *parts[:-1], f"{parts[-1] if parts else 'all'}.tsv")


def mlflow_dir(results: PathLike) -> Path:
    return Path(results) / MLFLOW_DIR
