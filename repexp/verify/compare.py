"""Math-Verify comparisons under the timeout guard, their size guard and the result cache.

Two kinds of work, each a hashable key so that the process pool can run it (`run_key`):

- `("boxed", gold, answer, timeout)`: the repexp grader's comparison of two normalised answers,
  Math-Verify `verify(gold, answer)` (gold first: it is not symmetric) on `\\boxed{…}` of each;
- `("whole", gold, response, timeout)`: the paper grader's Math-Verify scorer: the gold parsed
  from `\\boxed{gold}` with `LatexExtractionConfig()`, the prediction from the whole response
  with `(ExprExtractionConfig(), LatexExtractionConfig())`, correct when any gold extraction
  equals any prediction extraction (verl 0.9.1 `utils/reward_score/math_verify.py`).

Guards (Math-Verify's own SIGALRM timeout is switched off: it works only in the main thread):

1. size: answers longer than MAX_ANSWER_CHARS are wrong, and expressions whose exact value would
   exceed MAX_RESULT_DIGITS digits (`9^{9^{9^9}}`, `(10^{10})!`) are refused before sympy
   evaluates them: that evaluation is one CPython big-integer C call nothing can interrupt;
2. time: each key runs under `time_limit(timeout)` (CPU seconds of the thread, default 5 s);
   an overrun scores 0, logged once per key (results are cached);
3. the process pool's hard wall-clock limit (`repexp.verify.pool`) for one long C call.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

from repexp.verify.timeout import VerifyTimeout, time_limit

logger = logging.getLogger("repexp.verify")

DEFAULT_TIMEOUT_S = 5.0  # soft limit per Math-Verify comparison, CPU seconds
BOXED = "boxed"
WHOLE = "whole"


@functools.lru_cache(maxsize=1)
def _mv():
    # imported on first use: `import repexp.verify` stays cheap for GSM8K-only callers
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" notices: we guard it
    return ExprExtractionConfig, LatexExtractionConfig, parse, verify


@functools.lru_cache(maxsize=8_192)
def _parse_boxed(latex: str) -> tuple:
    _, latex_config, parse, _ = _mv()
    return tuple(parse("\\boxed{" + latex + "}", [latex_config()], parsing_timeout=None))


_FACTORIALS = {"factorial", "factorial2", "subfactorial", "gamma", "binomial", "RisingFactorial", "FallingFactorial"}
MAX_RESULT_DIGITS = 100_000  # refuse expressions whose exact value would have more digits (ms to build)


def _log10_bound(expr: Any) -> float:
    """An upper bound on log10|value| of a numeric sympy expression (symbols count as 1).

    sympy evaluates `Pow(Integer, Integer)` with CPython's big-integer power, one C call
    that neither a signal nor the watchdog can interrupt: `9^{9^{9^9}}` would run for
    hours. Expressions bounded above MAX_RESULT_DIGITS digits are refused before
    Math-Verify evaluates them.
    """
    if getattr(expr, "is_Number", False):
        if getattr(expr, "is_Rational", False):
            return math.log10(max(abs(int(expr.p)), abs(int(expr.q)), 1))
        try:
            bound = math.log10(abs(float(expr)) + 1.0)
        except (TypeError, ValueError, OverflowError):
            return 0.0
        return bound if math.isfinite(bound) else 0.0  # oo, -oo, zoo, nan are symbols, not big numbers
    args = getattr(expr, "args", ())
    if not args or not all(hasattr(a, "args") for a in args):
        return 0.0
    if getattr(expr, "is_Pow", False):
        base, exponent = _log10_bound(args[0]), _log10_bound(args[1])
        if base == 0.0:
            return 0.0  # |base| <= 1 or symbolic: no big integer is built
        return math.inf if exponent > 300 else base * 10.0**exponent
    if type(expr).__name__ in _FACTORIALS:
        inner = max(_log10_bound(a) for a in args)
        return math.inf if inner > 300 else (10.0**inner) * max(inner, 1.0)
    return sum(_log10_bound(a) for a in args) + math.log10(len(args))


def _too_big(parsed: tuple) -> bool:
    return any(_log10_bound(item) > MAX_RESULT_DIGITS for item in parsed if not isinstance(item, str))


def boxed_equal(gold: str, answer: str) -> bool:
    """Math-Verify on two (normalised) answers, the gold first."""
    verify = _mv()[3]
    gold_parsed = _parse_boxed(gold)
    pred_parsed = _parse_boxed(answer)
    if not gold_parsed or not pred_parsed or _too_big(pred_parsed) or _too_big(gold_parsed):
        return False
    return bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None))


def whole_response_equal(gold: str, response: str) -> bool:
    """The paper's Math-Verify scorer: any gold extraction equals any extraction from the response."""
    expr_config, latex_config, parse, verify = _mv()
    gold_parsed = _parse_boxed(gold)
    if not gold_parsed:
        return False
    pred_parsed = parse(response, [expr_config(), latex_config()], parsing_timeout=None)
    if not pred_parsed or _too_big(pred_parsed) or _too_big(gold_parsed):
        return False
    return any(verify(g, p, timeout_seconds=None) for p in pred_parsed for g in gold_parsed)


MAX_RESULTS = 1 << 17
RESULTS: dict[tuple, float] = {}  # boxed key → score, shared by all threads of a process (dict ops are atomic)


def remember(key: tuple, value: float) -> None:
    if len(RESULTS) >= MAX_RESULTS:
        RESULTS.clear()  # a bound, not an LRU: a full cache simply starts again
    RESULTS[key] = value


@functools.lru_cache(maxsize=1)
def warm_up() -> None:
    """Import Math-Verify and run one comparison (~1 s the first time), outside any time limit."""
    _mv()
    boxed_equal("\\frac{1}{2}", "0.5")


_COMPARE = {BOXED: boxed_equal, WHOLE: whole_response_equal}


def run_key(key: tuple) -> float:
    """Run one `(kind, gold, text, timeout)` key under its soft deadline: 1.0 or 0.0."""
    kind, gold, text, timeout = key
    warm_up()  # a cold process's first parse must not count against the first answer's limit
    try:
        with time_limit(timeout):
            equal = _COMPARE[kind](gold, text)
    except VerifyTimeout:
        logger.warning("verifier timed out after %.1fs (scored 0): gold=%r answer=%.200r", timeout, gold, text)
        return 0.0
    except Exception as err:  # sympy/latex2sympy failures on odd input are a wrong answer, not a crash
        logger.debug("math-verify failed on gold=%r answer=%.200r: %s", gold, text, err)
        return 0.0
    return 1.0 if equal else 0.0


def cached_run(key: tuple) -> float:
    """`run_key` through the result cache (whole-response keys are not cached: they rarely repeat)."""
    if key[0] == WHOLE:
        return run_key(key)
    value = RESULTS.get(key)
    if value is None:
        value = run_key(key)
        remember(key, value)
    return value
