"""Which parent run a node hangs under (no MLflow import).

- one parent per sweep point (``point:<task>/<run>``) with its params (task, method, backend,
  sparse_dim, beta, seed): train, select, merge, eval;
- one per task (``task:<task>``): preprocess;
- one per experiment (``experiment``): model, aggregate, figures.

A parent also belongs to one results directory (its results id, `names.results_id`): two
results directories that log to the same store and experiment get parents of their own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Optional

from repexp.tracking.names import RESULTS_ID_TAG, SWEEP_POINT_TAG

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

    def with_results(self, results_id: Optional[str]) -> Scope:
        return dataclasses.replace(self, results_id=results_id)

    @property
    def lookup_tags(self) -> dict[str, str]:
        """The tags that identify this scope's parent run."""
        from repexp.tracking.names import PARENT_KEY_TAG

        return {PARENT_KEY_TAG: self.key, **({RESULTS_ID_TAG: self.results_id} if self.results_id else {})}


def scope_for(task: Optional[str] = None, run: Optional[str] = None, *, results_id: Optional[str] = None) -> Scope:
    if run is not None:
        if task is None:
            raise ValueError("a run needs its task")
        from repexp.config import canonical, parse_run

        spec = parse_run(task, run)
        params = {k: canonical(v) for k, v in dataclasses.asdict(spec).items() if v is not None}
        tags = {SWEEP_POINT_TAG: spec.path, "repexp.task": task, "repexp.run": run, "repexp.method": spec.method}
        return Scope("point", f"point:{task}/{run}", spec.path, params, tags, results_id)
    if task is not None:
        return Scope("task", f"task:{task}", task, {"task": task}, {"repexp.task": task}, results_id)
    return Scope("experiment", "experiment", "experiment", {}, {}, results_id)


def scope_for_rule(rule: str, task: Optional[str], run: Optional[str], *, results_id: Optional[str] = None) -> Scope:
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
    scopes += [scope_for(spec.task, spec.name, results_id=results_id) for spec in sweep_runs(cfg)]
    return scopes
