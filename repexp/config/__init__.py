"""The pipeline config: dataclasses read as an OmegaConf structured config, one validation, one composition per job.

The package re-exports its modules' public names (`C.load`, `C.compose`, `C.TASKS`, `C.ConfigError`, ...):

- `model`: the constants and dataclasses, the single source of keys, types, defaults and per-field rules;
- `loading`: strict YAML and `parse` (YAML mapping + `set=` overrides → a typed `PipelineConfig`);
- `rules`: `check` (every per-field and cross-field rule, so a bad config fails before any job),
  `check_paths` (local inputs) and `load` = read, parse, check;
- `runs`: run names, the sweep's runs, and `compose` (one job's `RunConfig`) with the training hash;
- `schema`: `configs/schema.yaml` generated from the same dataclasses, kept in sync by a test.

Imports run model <- loading <- runs <- rules and schema <- model; rules <-> `repexp.plan` (the cost rule)
is the one circle. Pure: OmegaConf and PyYAML only (imported where used).
"""

# The public API: every public name of the five modules (none defines a name another one defines).
from repexp.config.loading import *  # noqa: F403
from repexp.config.model import *  # noqa: F403
from repexp.config.rules import *  # noqa: F403
from repexp.config.runs import *  # noqa: F403
from repexp.config.schema import *  # noqa: F403
