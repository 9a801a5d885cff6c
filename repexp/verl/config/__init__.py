"""Hydra config of `python -m repexp.verl.train` (a package so Hydra can find it as pkg://repexp.verl.config).

Importing it (Hydra does, to read ``repexp_trainer.yaml``) stores the pipeline's `BonusConfig` as the
schema of the node ``actor_rollout_ref.repexp.bonus`` (the trainer YAML's defaults list places it): the
bonus settings reach verl as one typed node whose keys, types and defaults are that dataclass's, so a
misspelled or mistyped key fails when Hydra composes, and nothing restates a default here.
"""

from hydra.core.config_store import ConfigStore

from repexp.config import BonusConfig

BONUS_SCHEMA = "repexp_bonus"

ConfigStore.instance().store(name=BONUS_SCHEMA, node=BonusConfig)
