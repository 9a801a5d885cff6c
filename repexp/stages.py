"""The stage table: each rule's stage, the function that runs its job (repexp.jobs) in this process.

The stages are imported here, so the import graph shows what `repexp run` depends on: repexp.run_cli ->
repexp.stages -> each stage -> repexp.jobs (the job types) -> repexp.config. repexp.jobs imports no stage.
A stage module keeps its heavy imports inside its functions, so importing this table is cheap.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from repexp import aggregate, checkpoints, data, download, evaluate, figures, models, testtime, train
from repexp.stage import StageResult


def run_merge(job) -> int:
    """The merge stage (repexp.jobs.MergeJob): repexp/verl/ keeps its own `repexp merge` CLI, which takes
    these two paths."""
    from repexp.verl import merge

    return merge.run(argparse.Namespace(checkpoint_dir=None, pointer=Path(job.pointer), out=Path(job.out)))


STAGES = {
    "preprocess": data.run_job,
    "train": train.run_node,  # its own node: the trainer is a subprocess that logs into it (repexp.train)
    "select": checkpoints.run_job,
    "merge": run_merge,
    "eval": evaluate.run_job,
    "testtime": testtime.run_job,
    "model": models.run_job,
    "download_model": download.run_model_job,
    "download_data": download.run_data_job,
    "aggregate": aggregate.run_job,
    "figures": figures.run_job,
}


def run_job(rule: str, job) -> StageResult:
    """Run the stage in this process; a stage that returns an exit status only gets a bare result."""
    result = STAGES[rule](job)
    return result if isinstance(result, StageResult) else StageResult(code=int(result or 0))
