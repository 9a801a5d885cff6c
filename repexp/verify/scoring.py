"""The public scoring functions, routed by grader and data_source.

`grader="repexp"` (default): extract (`extract`), normalise (`normalize`), then decide without
Math-Verify where possible — equal strings → 1; an integer gold against an answer that is an
integer once `\\text{}`/`\\textbf{}`/parentheses are peeled → exact integer comparison (`033` = `33`);
two plain numbers (integers, decimals, `\\frac{a}{b}`, `a/b`), or two tuples, lists or matrices of
them, or two choice letters → exact comparison (`normalize.exact_value`);
GSM8K numbers as exact rationals — and otherwise Math-Verify (`compare`).

`grader="paper"`: the recipe's scorers (`paper`), Math-Verify over the whole response for DAPO/AIME.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from repexp.verify import compare, paper
from repexp.verify.compare import BOXED, DEFAULT_TIMEOUT_S, WHOLE
from repexp.verify.extract import (
    MAX_ANSWER_CHARS,
    answer_value,
    canonical_number,
    extract_final_number,
    extract_gsm8k,
    extract_last_number,
    extract_math,
    parse_number,
)
from repexp.verify.normalize import CHOICE, INTEGER, NUMBER, as_integer, exact_value, normalize_answer, value_side
from repexp.verify.pool import ProcessPool, default_workers
from repexp.verify.routing import (
    ARITH,
    DEFAULT_GRADER,
    FINAL_NUMBER,
    GSM8K,
    GSM8K_STRICT,
    HENDRYCKS,
    MATH,
    NUMERIC_FAMILIES,
    check_grader,
    family,
    paper_scorer,
)


def _check_str(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")


def _as_text(name: str, value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # integer AIME answers straight from a dataset
    _check_str(name, value)
    return value


@functools.lru_cache(maxsize=16_384)
def _gold_key(fam: str, ground_truth: str) -> str:
    """The canonical gold; ValueError for a gold nothing can ever match."""
    if fam in NUMERIC_FAMILIES:
        value = parse_number(ground_truth.strip().replace("$", ""))
        if value is None:
            raise ValueError(f"{fam} ground_truth {ground_truth!r} is not a number")
        return canonical_number(value)
    gold = normalize_answer(ground_truth)
    if not gold:
        raise ValueError(f"ground_truth {ground_truth!r} is empty: no answer can match it")
    return gold


def _fast_decision(fam: str, gold: str, answer: Optional[str]) -> Optional[float]:
    """The repexp grader's score when no Math-Verify call is needed, else None."""
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return 0.0
    if fam in NUMERIC_FAMILIES:
        return 1.0 if parse_number(answer) == parse_number(gold) else 0.0
    if answer == gold:
        return 1.0
    if INTEGER.fullmatch(gold):
        value = as_integer(answer)
        if value is not None:  # integer golds (all of AIME): exact, so "033" equals "33"
            return 1.0 if value == int(gold) else 0.0
    exact = exact_value(gold)
    if exact is not None:  # plain numbers, tuples, lists, matrices of them, choice letters: exact
        value = exact_value(answer)
        if value is not None:
            if value[0] == exact[0]:
                return 1.0 if value[1] == exact[1] else 0.0
            if {value[0], exact[0]} == {NUMBER, CHOICE}:
                return 0.0
    return None


def _repexp_decision(fam: str, gold: str, answer: Optional[str], timeout: float) -> tuple[Optional[float], tuple]:
    """(score, ()) when decided here, else (None, the Math-Verify key to run)."""
    if answer is not None and fam == MATH and len(answer) <= MAX_ANSWER_CHARS and "=" not in gold:
        answer = value_side(answer)  # an equation's value when the gold is not an equation
    decided = _fast_decision(fam, gold, answer)
    if decided is not None:
        return decided, ()
    return None, (BOXED, gold, answer, float(timeout or 0.0))


def _paper(grader: str, fam: str) -> bool:
    """Whether the paper's scorers apply: the arithmetic tasks have none and use the repexp rule under both graders."""
    return grader == "paper" and fam in (GSM8K, MATH)


_EXTRACT = {GSM8K: extract_gsm8k, ARITH: extract_last_number, FINAL_NUMBER: extract_final_number, MATH: extract_math}


def _decision(
    grader: str, data_source: str, response: str, ground_truth: Any, timeout: float, i: Optional[int] = None
) -> tuple[Optional[float], tuple]:
    """One response's (score, ()) when decided without Math-Verify, else (None, the Math-Verify key)."""
    fam = family(data_source)
    _check_str("response" if i is None else f"responses[{i}]", response)
    ground_truth = _as_text("ground_truth" if i is None else f"ground_truths[{i}]", ground_truth)
    gold = _gold_key(fam, ground_truth)  # the same input checks under both graders
    if not _paper(grader, fam):
        return _repexp_decision(fam, gold, _EXTRACT[fam](response), timeout)
    scorer = {GSM8K_STRICT: paper.gsm8k_strict, HENDRYCKS: paper.hendrycks}.get(paper_scorer(data_source))
    if scorer is not None:  # the paper's string scorers; Math-Verify over the whole response otherwise
        return scorer(response, ground_truth), ()
    return None, (WHOLE, ground_truth, response, float(timeout or 0.0))


def extract_answer(data_source: str, response: str, *, grader: str = DEFAULT_GRADER) -> Optional[str]:
    """The response's final answer in canonical form (the maj@k voting key), or None."""
    check_grader(grader)
    fam = family(data_source)
    _check_str("response", response)
    return paper.paper_answer(data_source, response) if _paper(grader, fam) else _EXTRACT[fam](response)


def score_answer(data_source: str, answer: Optional[str], ground_truth: str, *, timeout: float = DEFAULT_TIMEOUT_S,
                 grader: str = DEFAULT_GRADER) -> float:
    """Score an answer already produced by `extract_answer` (None scores 0).

    For the repexp grader `score(...) == score_answer(..., extract_answer(...), ...)`. For the
    paper grader the answer is compared as the paper's scorer compares its own extraction (a
    Math-Verify source: as if the response were `\\boxed{answer}`).
    """
    check_grader(grader)
    fam = family(data_source)
    ground_truth = _as_text("ground_truth", ground_truth)
    gold = _gold_key(fam, ground_truth)
    if answer is None:
        return 0.0
    if _paper(grader, fam):
        kind = paper_scorer(data_source)
        if kind == GSM8K_STRICT:
            return 1.0 if answer == ground_truth else 0.0
        if kind == HENDRYCKS:
            return 1.0 if paper.hendrycks_equal(answer, ground_truth) else 0.0
        return compare.cached_run((WHOLE, ground_truth, "\\boxed{" + answer + "}", float(timeout or 0.0)))
    if len(answer) > MAX_ANSWER_CHARS:
        return 0.0
    if fam == MATH:  # canonicalisation is idempotent, so raw answers work too
        answer = normalize_answer(answer) or None
    else:
        value = answer_value(answer)
        answer = None if value is None else canonical_number(value)
    decided, key = _repexp_decision(fam, gold, answer, timeout)
    return decided if decided is not None else compare.cached_run(key)


def score(data_source: str, response: str, ground_truth: str, *, timeout: float = DEFAULT_TIMEOUT_S,
          grader: str = DEFAULT_GRADER) -> float:
    """1.0 if `response`'s final answer equals `ground_truth` for this data_source under `grader`, else 0.0."""
    check_grader(grader)
    decided, key = _decision(grader, data_source, response, ground_truth, timeout)
    return decided if decided is not None else compare.cached_run(key)


def clear_caches() -> None:
    """Forget cached comparisons and parses (benchmarks use it to measure cold throughput)."""
    compare.RESULTS.clear()
    compare._parse_boxed.cache_clear()
    _gold_key.cache_clear()


MIN_POOL_ITEMS = 512  # below this many Math-Verify comparisons, starting processes costs more than it saves


def score_batch(
    data_sources: Sequence[str] | str,
    responses: Sequence[str],
    ground_truths: Sequence[str] | str,
    *,
    workers: Optional[int] = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    pool: Optional[Any] = None,
    min_pool_items: int = MIN_POOL_ITEMS,
    grader: str = DEFAULT_GRADER,
) -> np.ndarray:
    """Scores (float64 array of 0/1) for many responses; equal to `[score(...) for ...]`.

    Answers are extracted in this process; only distinct Math-Verify keys are run (a key is a
    (gold, answer) pair for the repexp grader, a (gold, response) pair for the paper's
    Math-Verify scorer), in a process pool when there are at least `min_pool_items` of them
    (or always with a warm `pool`, a `VerifierPool`), else in-process.
    `data_sources` / `ground_truths` may be a single string for all responses.
    """
    check_grader(grader)
    n = len(responses)
    if isinstance(data_sources, str):
        data_sources = [data_sources] * n
    if isinstance(ground_truths, str):
        ground_truths = [ground_truths] * n
    if len(data_sources) != n or len(ground_truths) != n:
        raise ValueError(
            f"score_batch: {len(data_sources)} data_sources, {n} responses and {len(ground_truths)} ground_truths; "
            "lengths must match"
        )
    scores = np.zeros(n, dtype=np.float64)
    pending: dict[tuple, list[int]] = {}
    for i, (source, response, truth) in enumerate(zip(data_sources, responses, ground_truths)):
        decided, key = _decision(grader, source, response, truth, timeout, i)
        if decided is None and key[0] == BOXED:
            decided = compare.RESULTS.get(key)
        if decided is not None:
            scores[i] = decided
        else:
            pending.setdefault(key, []).append(i)
    if not pending:
        return scores
    keys = list(pending)
    n_workers = pool.workers if pool is not None else (default_workers() if workers is None else int(workers))
    if pool is not None and n_workers > 1 and len(keys) >= 2 * n_workers:
        values = pool.map_keys(keys)
    elif pool is None and n_workers > 1 and len(keys) >= min_pool_items:
        with VerifierPool(n_workers, timeout=timeout) as temporary:
            values = temporary.map_keys(keys)
    else:
        values = [compare.run_key(key) for key in keys]
    for key, value in zip(keys, values):
        if key[0] == BOXED:
            compare.remember(key, value)
        scores[pending[key]] = value
    return scores


class VerifierPool:
    """A reusable process pool for `score_batch` (workers start once, caches stay warm).

    ```
    with VerifierPool(workers=8) as pool:
        scores = pool.score_batch(data_sources, responses, ground_truths)
    ```
    """

    def __init__(self, workers: Optional[int] = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.workers = default_workers() if workers is None else int(workers)
        self.timeout = float(timeout)
        # Soft (CPU-time) limits fire first; this wall-clock limit only catches a worker stuck in
        # one C call, with slack for a loaded machine.
        self._pool = ProcessPool(compare.run_key, self.workers, hard_timeout=3 * self.timeout + 10.0,
                                 initializer=compare.warm_up)

    def map_keys(self, keys: Sequence[tuple]) -> list[float]:
        chunk = max(1, min(256, math.ceil(len(keys) / (4 * self.workers))))
        return self._pool.map(keys, chunk_size=chunk)

    def score_batch(self, data_sources: Sequence[str] | str, responses: Sequence[str],
                    ground_truths: Sequence[str] | str, *, grader: str = DEFAULT_GRADER) -> np.ndarray:
        return score_batch(data_sources, responses, ground_truths, timeout=self.timeout, pool=self, grader=grader)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
