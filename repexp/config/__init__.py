"""The pipeline config: dataclasses, read as an OmegaConf structured config, one validation, one composition per job.

A package by job; this module re-exports their public API, so `from repexp import config as C` and
`C.load(...)`, `C.compose`, `C.TASKS`, `C.ConfigError`, ... read the same everywhere:

- `model`: the constants and dataclasses, the single source of the config's keys, types, defaults and
  per-field rules (`help`, `minimum`, `enum`, ... in each field's metadata), and `ConfigError`;
- `loading`: strict YAML and `parse`, which merges a YAML mapping (and `set=` dotlist overrides) into
  `OmegaConf.structured(PipelineConfig)`: unknown keys and wrong types fail naming the key, strings
  become numbers where the schema says so (`lr: 1e-5`, which YAML reads as a string, and Snakemake's
  `--config`, which passes strings), `task_overrides.<task>.<section>` are merged onto their section;
- `rules`: `check` applies the per-field rules and every cross-field rule of the pipeline and its two
  trainer backends, so a config that a job would reject fails at parse time, before any job;
  `check_paths` checks local paths (data sources, a local `model:` directory); `load` = read, parse, check;
- `runs`: the run names (`RUN_NAMES`, printed by `RunSpec.name`), the sweep's runs (`sweep_runs`,
  `find_run`, the Snakemake wildcard `run_pattern`), and `compose`, which resolves one job's
  `RunConfig` (defaults <- file <- task overrides <- sweep point), the only thing both trainer
  backends and the eval node read, with the training hash;
- `schema`: `configs/schema.yaml` (Snakemake's `validate`) is generated from the same dataclasses
  (`repexp config schema`), and a test keeps the committed copy in sync.

The modules import one another in that order (model <- loading <- runs <- rules; schema <- model),
never back; `rules` and `repexp.plan` import each other (the cost rule), the package's one circle.

Pure: OmegaConf and PyYAML only (imported where used).
"""

# The public API: every public name of the five modules (none defines a name another one defines).
from repexp.config.loading import *  # noqa: F403
from repexp.config.model import *  # noqa: F403
from repexp.config.rules import *  # noqa: F403
from repexp.config.runs import *  # noqa: F403
from repexp.config.schema import *  # noqa: F403
