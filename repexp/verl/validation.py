"""Unbiased dev pass@k from verl's validation samples (pure numpy + repexp.passk).

verl's own ``val-aux/.../pass@k`` counts the *sum* of scores as correct samples and only knows
its bootstrap helpers; the pipeline's selection metric is ``dev/pass_at_k`` from `repexp.passk`
(`repexp.metrics.dev_metrics`, the TRL backend's function too), computed here from the per-sample
uids and verifier scores that verl collects in ``_validate``.
Scores must be the 0/1 verifier's (a ±1 scorer silently corrupted upstream's AIME pass@k).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from repexp.metrics import dev_metrics


def dev_pass_at_k(uids: Sequence[str], scores: Sequence[float]) -> dict[str, float]:
    """``dev/pass_at_k`` for k = 1, 2, 4, ... up to the smallest per-problem sample count, plus bookkeeping."""
    if len(uids) != len(scores):
        raise ValueError(f"got {len(uids)} uids but {len(scores)} scores")
    if not uids:
        raise ValueError("validation produced no samples")
    bad = sorted({float(s) for s in scores} - {0.0, 1.0})
    if bad:
        raise ValueError(f"dev pass@k needs 0/1 verifier scores, got {bad[:5]}")
    n = Counter(uids)  # samples per problem, first-seen order
    c = Counter(uid for uid, score in zip(uids, scores) if float(score) == 1.0)
    return dev_metrics(np.array(list(n.values())), np.array([c[u] for u in n]))
