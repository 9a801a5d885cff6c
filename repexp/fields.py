"""`param`: a dataclass field with its help text and JSON-schema constraints, the one way settings are
declared (the pipeline config's sections, `repexp.config.model`, and each method's `Params`,
`repexp.methods`). The schema (`repexp.config.schema`) and the checks (`repexp.config.rules.check_fields`)
read the metadata, so a bound is written once, beside its field.

Pure: standard library only.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any


def param(default: Any = dataclasses.MISSING, *, help: str = "", **constraints: Any) -> Any:
    """A dataclass field with a help string and JSON-schema constraints (minimum, enum, ...).

    `runtime=True` marks a setting that changes how fast or where a job runs, never what a
    training run computes: it is left out of `training_hash`, so changing it reruns nothing."""
    meta = {"help": help, **constraints}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)
