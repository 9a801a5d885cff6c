"""The training methods of a sweep, one module each, found through one explicit table (`METHODS`).

A method is what a training run does on top of the shared GRPO loop. Its module holds:

- `Params`: a frozen dataclass of the method's own settings (fields made with `param`: default, help,
  bounds), which the config lists as grids under ``sweep.methods.<name>`` (each field a list of values);
- its pure core (numpy/torch only: advantages, bonuses, losses) that both backends call;
- `METHOD`: its `Method` entry, which names the run, labels and colours it, checks its settings against
  the `train` section, and says which backend hooks it uses.

The backend adapters (`repexp.trl`, `repexp.verl`) and everything downstream (run names, MLflow params,
tables, figures, the cost plan) read the table only; adding a method is its module, a line in
`METHODS` and its tests (docs/methods.md).

Pure: standard library only at import time (the cores import torch inside the module's own functions).
"""

from __future__ import annotations

from repexp.fields import param
from repexp.methods import cov, grpo, outcome, passk, repexp
from repexp.methods.base import Method, params_dict

# --------------------------------------------------------------------------- the table

# The explicit table: config key -> method. Order is the order of tables, legends and sweeps.
METHODS: dict[str, Method] = {m.name: m for m in (repexp.METHOD, grpo.METHOD, passk.METHOD, outcome.METHOD,
                                                   cov.METHOD)}
BASE = "base"  # the untrained initial model: evaluated, never trained, no parameters
ARMS = (*METHODS, BASE)  # every value of a run's `method`
BASE_LABEL = "Base model"
BASE_COLOR = "#7f7f7f"


def method(name: str) -> Method:
    if name not in METHODS:
        raise KeyError(f"{name!r} is not a training method (known: {', '.join(METHODS)})")
    return METHODS[name]


def label(name: str) -> str:
    return BASE_LABEL if name == BASE else method(name).label


def color(name: str) -> str:
    return BASE_COLOR if name == BASE else method(name).color


__all__ = ["ARMS", "BASE", "METHODS", "Method", "color", "label", "method", "param", "params_dict"]
