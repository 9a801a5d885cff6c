"""The local trainer backend: every training method on TRL's `GRPOTrainer` (RepExp as one reward function).

Runs the whole experiment on a laptop, in CI or on one GPU (no Ray, no vLLM). See
docs/trl_backend.md for the config mapping and the run-directory contract.

- `settings`   pure: RunConfig -> step plan and GRPOConfig keyword arguments; unsupported
               settings fail here with the config key in the message.
- `reward`     `RepExpReward`: verifier scores, the method's reward or advantage hook (RepExp: frozen-model
               features and the step verl runs too, `repexp.bonus_step`), group-normalised as verl's GRPO
               advantage unless the method's advantage hook replaces it.
- `validation` dev pass@k with the in-memory policy (HF `generate`, seeded per step).
- `runlog`     `metrics.jsonl` writer and the optional MLflow sink (never fails training).
- `train`      ``python -m repexp.trl.train --config job.yaml``: data, trainer (with the advantage and loss
               hooks), checkpoints, resume.

Importing this package imports neither TRL nor transformers; the modules that need them
import them inside functions.
"""
