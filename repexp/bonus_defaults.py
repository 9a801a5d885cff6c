"""The RepExp bonus's choices and default values, defined once (the upstream recipe's; docs/bonus.md).

Read by `repexp.config` (BonusConfig, also the schema of verl's `actor_rollout_ref.repexp.bonus` node,
and the sweep) and the keyword defaults of `repexp.elliptical` and `repexp.elliptical_order`.
`configs/paper.yaml` states the paper's values explicitly, as a config.

Pure: no imports, so that the torch-only bonus maths and the torch-free config can both depend on it.
"""

REWARD_TYPES = ("leverage", "leave_one_out")  # x·A⁻¹x, or h / (1 − h)
NORMALIZATIONS = ("none", "rnd", "z_score")  # per-group rescaling of the bonus

BETA = 0.01  # bonus weight β (0: the GRPO baseline)
SPARSE_DIM = 32  # sparse projection dimension k
LAMB = 0.01  # ridge λ of A = λI + Σ x xᵀ
REWARD_TYPE = "leverage"
NORMALIZATION = "none"
CENTER = True  # centre features by the group mean
RANDOMIZE_PROJECTION = True  # a new projection every step
PERSIST_COVARIANCE = False  # accumulate per-prompt covariance across steps
ALPHA = 1.0  # verifier reward weight α
# the turn-off rules: zero the bonus of groups with no / some / all correct rollouts, of incorrect rollouts
TURN_OFF_IF_NONE_CORRECT = True
TURN_OFF_IF_SOME_CORRECT = False
TURN_OFF_IF_ALL_CORRECT = False
TURN_OFF_IF_ROLLOUT_INCORRECT = False
