"""Hydra config of `python -m repexp.verl.train` (a package, so Hydra finds it as pkg://repexp.verl.config).

Importing it stores the pipeline's `BonusConfig` as the schema of ``actor_rollout_ref.repexp.bonus`` (placed
by ``repexp_trainer.yaml``'s defaults list): a misspelled or mistyped bonus key fails when Hydra composes.
"""

from hydra.core.config_store import ConfigStore

from repexp.config import BonusConfig

ConfigStore.instance().store(name="repexp_bonus", node=BonusConfig)
