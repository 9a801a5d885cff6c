"""The production trainer: RepExp as a plugin on verl 0.9.1 (no copied verl files).

Layout (see docs/verl_backend.md; the features' pooling is `repexp.features`, shared with the
TRL backend and test-time, and the step's bonus is `repexp.bonus_step`, shared with the TRL backend):

- `engine`    `RepExpHiddenMeanEngine`: a frozen, forward-only FSDP engine registered in verl's
              `EngineRegistry` as model type ``repexp_hidden_mean``.
- `worker`    `RepExpActorRolloutRefWorker`: builds that engine inside the colocated actor worker
              and exposes ``compute_repexp_hidden_mean``.
- `dataplane` every TransferQueue read/write of the trainer.
- `trainer`   `RepExpTrainer(PPOTrainerSync)`: injects ``beta * bonus`` in ``_compute_advantage``,
              dev pass@k, best-dev tracking, checkpoint completion and covariance state.
- `train`     the Hydra entry ``python -m repexp.verl.train``; `overrides` maps a RunConfig onto it.
- `merge`     ``repexp merge``: FSDP shards -> Hugging Face directory.
- `startup`   where a run's start-up goes: marks from each process -> ``startup.json`` phases.

Importing this package does not import verl; the modules that need verl import it themselves.
"""
