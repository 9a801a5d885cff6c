"""The pure part of `repexp eval`: shard plan, seeds, settings and the `eval.json` result.

No framework imports here (numpy only), so the maths and the bookkeeping are testable without
a model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from repexp import passk
from repexp.config import VLLM_MEMORY_UTILIZATION, EvalConfig, TrainConfig, max_new_tokens

# The pipeline config's eval defaults are the defaults of `repexp eval` too, for a job that has its GPU
# to itself (the config's null memory fraction resolves to that; repexp.config.resolve_gpus).
EVAL_DEFAULTS = dataclasses.replace(EvalConfig(), gpu_memory_utilization=VLLM_MEMORY_UTILIZATION)

# Bumped when the sample-store layout or the seed derivation changes: a store written under
# another version is refused on resume instead of being silently mixed.
STORE_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """Everything that shapes the sample distribution (engine-independent); its values come from the config's
    checked `eval` section (repexp.evaluate.runner.EvalRun.of)."""

    n: int = EVAL_DEFAULTS.n_samples
    temperature: float = EVAL_DEFAULTS.temperature
    top_p: float = EVAL_DEFAULTS.top_p
    top_k: int = EVAL_DEFAULTS.top_k  # 0 = disabled (all tokens)
    max_new_tokens: int = max_new_tokens(EVAL_DEFAULTS, TrainConfig())
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def shard_plan(num_problems: int, shard_size: int, seed: int) -> list[np.ndarray]:
    """Problem indices of every shard: a seed-determined permutation cut into blocks of `shard_size`.

    The permutation makes every prefix of shards a random subset of the problems (so a partial
    run is representative) and spreads long and short problems across shards.
    """
    order = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED])).permutation(num_problems)
    return [order[i : i + shard_size] for i in range(0, num_problems, shard_size)]


def derived_seed(*parts: int) -> int:
    """A 62-bit seed derived from integers (e.g. (seed, shard) or (seed, shard, prompt))."""
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0]
    return int(state) >> 2


def content_hash(records: Sequence[Any]) -> str:
    """sha256 over canonical JSON lines of `records` (order matters)."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode())
        digest.update(b"\n")
    return "sha256:" + digest.hexdigest()


def json_float(x: float) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def eval_result(
    *,
    problem_ids: Sequence[str],
    scores: Sequence[Sequence[float]],
    answers: Sequence[Sequence[Hashable | None]] | None,
    num_tokens: Sequence[Sequence[int]] | None = None,
    truncated: Sequence[Sequence[bool]] | None = None,
    ks: Sequence[int] | None = None,
    maj_draws: int = 1000,
    maj_seed: int = 0,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `eval.json` object from per-problem sample scores (and extracted answers for maj@k).

    ``scores[p]`` are problem p's 0/1 verifier scores, one per sample (the problem ids are unique: load_problems
    checks). Keys follow the evaluation contract in docs/architecture.md; ``metadata`` (model path, sampling, …)
    is merged in.
    """
    n = np.array([len(s) for s in scores], dtype=np.int64)
    flat = np.concatenate([np.asarray(s, dtype=np.float64) for s in scores]) if len(scores) else np.array([])
    if not np.all((flat == 0) | (flat == 1)):
        raise ValueError("verifier scores must be 0 or 1 for pass@k")
    c = np.array([int(np.sum(s)) for s in scores], dtype=np.int64)
    ks = [int(k) for k in (passk.power_of_two_ks(int(n.min())) if ks is None else ks)]
    curve = grader_curve(n, c, ks)
    result: dict[str, Any] = {
        "pass_at_k": curve["pass_at_k"],
        "pass_at_k_sem": curve["pass_at_k_sem"],
        "mean_at_n": curve["mean_at_n"],
        "num_problems": len(problem_ids),
        "n_samples": int(n.max()) if int(n.min()) == int(n.max()) else [int(x) for x in n],
        "ks": ks,
        "per_problem": [{"problem_id": pid, "n": int(ni), "c": int(ci)} for pid, ni, ci in zip(problem_ids, n, c)],
        "samples_to_first_correct": passk.summarize_samples_to_correct(n, c),
    }
    if answers is not None:
        maj = passk.maj_at_k(answers, scores, ks, num_draws=maj_draws, seed=maj_seed)
        maj_mean, maj_sem = passk.summarize(maj)
        result["maj_at_k"] = {str(k): float(v) for k, v in zip(ks, maj_mean)}
        result["maj_at_k_sem"] = {str(k): json_float(v) for k, v in zip(ks, maj_sem)}
        result["maj_at_k_estimator"] = {"num_draws": maj_draws, "seed": maj_seed}
    if num_tokens is not None:
        tokens = np.concatenate([np.asarray(t, dtype=np.float64) for t in num_tokens])
        result["mean_response_tokens"] = float(tokens.mean())
    if truncated is not None:
        cut = np.concatenate([np.asarray(t, dtype=bool) for t in truncated])
        result["truncated_fraction"] = float(cut.mean())
    return add_metadata(result, metadata)


def add_metadata(result: dict[str, Any], metadata: dict[str, Any] | None) -> dict[str, Any]:
    """`result` with the caller's metadata keys added; a key that would overwrite a computed one is refused."""
    if metadata:
        overlap = set(metadata) & set(result)
        if overlap:
            raise ValueError(f"metadata would overwrite result keys {sorted(overlap)}")
        result.update(metadata)
    return result


def grader_curve(num_samples: Sequence[int], num_correct: Sequence[int], ks: Sequence[int]) -> dict[str, Any]:
    """pass@k (mean and SEM over problems), mean@n and the correct-sample total under one grader: an entry of
    eval.json's `graders` mapping (docs/evaluation.md)."""
    n = np.asarray(num_samples, dtype=np.int64)
    c = np.asarray(num_correct, dtype=np.int64)
    mean, sem = passk.summarize(passk.pass_at_k(n, c, [int(k) for k in ks]))
    return {
        "pass_at_k": {str(k): float(v) for k, v in zip(ks, mean)},
        "pass_at_k_sem": {str(k): json_float(v) for k, v in zip(ks, sem)},
        "mean_at_n": float(np.mean(c / n)),
        "num_correct": int(c.sum()),
    }


