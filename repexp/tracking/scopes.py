"""Which parent run a node hangs under (no MLflow import).

- one parent per sweep point (``point:<task>/<run>``) with its params (task, method, backend, seed and
  the method's own parameters, e.g. RepExp's sparse_dim and beta): train, select, merge, eval;
- one per task (``task:<task>``): preprocess;
- one per experiment (``experiment``): model, aggregate, figures.

A parent also belongs to one results directory (its results id, `names.results_id`): two
results directories that log to the same store and experiment get parents of their own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Optional

from repexp.tracking.names import PARENT_KEY_TAG, RESULTS_ID_TAG, SWEEP_POINT_TAG

if TYPE_CHECKING:
    from repexp.config import RunSpec

# Which parent a rule's node run hangs under.
EXPERIMENT_RULES = ("model", "aggregate", "figures")
TASK_RULES = ("preprocess",)


@dataclasses.dataclass(frozen=True)
class Scope:
    """The parent run a node hangs under."""

    kind: str  # point | task | experiment
    key: str
    name: str
    params: Mapping[str, str]
    tags: Mapping[str, str] = dataclasses.field(default_factory=dict)  # on the parent and its node runs
    results_id: Optional[str] = None  # None only for standalone use without a results directory

    @property
    def lookup_tags(self) -> dict[str, str]:
        """The tags that identify this scope's parent run."""
        return {PARENT_KEY_TAG: self.key, **({RESULTS_ID_TAG: self.results_id} if self.results_id else {})}


def scope_for(task: Optional[str] = None, run: Optional[RunSpec] = None, *,
              results_id: Optional[str] = None) -> Scope:
    """The experiment's scope, a task's, or a sweep point's (`run`: one of the config's runs, whose fields
    are the point's params; its name is printed from them, never parsed)."""
    if run is not None:
        from repexp.config import canonical

        # the base model has no training seed (its eval samples with the sweep's first one: a job param)
        # and a method logs its own parameters only: those of other methods are absent (the UI shows "-")
        fields = {"task": run.task, "method": run.method, "backend": run.backend,
                  "seed": run.seed if run.trains else None, **dict(run.params)}
        params = {k: canonical(v) for k, v in fields.items() if v is not None}
        tags = {SWEEP_POINT_TAG: run.path, "repexp.task": run.task, "repexp.run": run.name, "repexp.method": run.method}
        return Scope("point", f"point:{run.task}/{run.name}", run.path, params, tags, results_id)
    if task is not None:
        return Scope("task", f"task:{task}", task, {"task": task}, {"repexp.task": task}, results_id)
    return Scope("experiment", "experiment", "experiment", {}, {}, results_id)


def scope_for_rule(rule: str, task: Optional[str], run: Optional[RunSpec], *,
                   results_id: Optional[str] = None) -> Scope:
    if rule in EXPERIMENT_RULES:
        return scope_for(results_id=results_id)
    if rule in TASK_RULES:
        return scope_for(task, results_id=results_id)
    return scope_for(task, run, results_id=results_id)


def all_scopes(cfg, results_id: Optional[str]) -> list[Scope]:
    """Every parent a pipeline config's workflow uses (created once at workflow start)."""
    from repexp.config import sweep_runs

    scopes = [scope_for(results_id=results_id)]
    scopes += [scope_for(task, results_id=results_id) for task in cfg.sweep.tasks]
    scopes += [scope_for(spec.task, spec, results_id=results_id) for spec in sweep_runs(cfg)]
    return scopes
