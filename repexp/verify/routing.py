"""Which scorer a (data_source, grader) pair gets (the graders: `repexp.verify`'s docstring).

`family` gives the repexp grader's answer family; `paper_scorer` routes as the recipe's
`default_compute_score` does. The built-in arithmetic tasks (`repexp/arith`, `repexp/arith-hard`,
`repexp/arith-mid`, not part of the paper) are scored by the repexp rule under both graders.
Unknown data sources raise ValueError.
"""

from __future__ import annotations

import functools
import re

GRADERS = ("repexp", "paper")
DEFAULT_GRADER = "repexp"

# answer families of the repexp grader
GSM8K = "gsm8k"
MATH = "math"
ARITH = "arith"  # the built-in arithmetic task: the last number of the response (docs/data.md)
FINAL_NUMBER = "final_number"  # arith-hard, arith-mid: the number the response ends with, else no answer
NUMERIC_FAMILIES = (GSM8K, ARITH, FINAL_NUMBER)  # golds and answers are exact rationals

# scorers of the paper grader
GSM8K_STRICT = "gsm8k_strict"
HENDRYCKS = "hendrycks"
MATH_VERIFY = "math_verify"

ARITH_DATA_SOURCE = "repexp/arith"
ARITH_HARD_DATA_SOURCE = "repexp/arith-hard"
ARITH_MID_DATA_SOURCE = "repexp/arith-mid"
FINAL_NUMBER_SOURCES = frozenset({ARITH_HARD_DATA_SOURCE, ARITH_MID_DATA_SOURCE})

_GSM8K_SOURCES = frozenset({"openai/gsm8k", "gsm8k"})
# The MATH datasets: Hendrycks string equivalence under the paper grader.
_HENDRYCKS_SOURCES = frozenset({"DigitalLearningGmbH/MATH-lighteval", "lighteval/MATH", "HuggingFaceH4/MATH-500",
                                "EleutherAI/hendrycks_math", "MATH", "math500"})
# DAPO and the recipe's generic "math" source: Math-Verify under the paper grader.
_MATH_VERIFY_SOURCES = frozenset({"math", "math_dapo", "math_dapo_reasoning", "ftajwar/deduplicated_dapo_dataset",
                                  "BytedTsinghua-SIA/DAPO-Math-17k"})
# Competition sets are routed by name: aime24, aime_2024, MathArena/aime_2024_I,
# HuggingFaceH4/aime_2024, Maxwell-Jia/AIME_2024, amc23, ...
_COMPETITION_RE = re.compile(r"(^|/)(aime|amc)", re.IGNORECASE)


def check_grader(grader: str) -> str:
    if grader not in GRADERS:
        raise ValueError(f"unknown grader {grader!r} (known: {', '.join(GRADERS)})")
    return grader


@functools.lru_cache(maxsize=256)
def family(data_source: str) -> str:
    """The repexp grader's answer family (`"gsm8k"`, `"math"`, `"arith"` or `"final_number"`) of a
    data_source; ValueError if unknown."""
    if not isinstance(data_source, str):
        raise TypeError(f"data_source must be a string, got {type(data_source).__name__}")
    if data_source in _GSM8K_SOURCES:
        return GSM8K
    if data_source == ARITH_DATA_SOURCE:
        return ARITH
    if data_source in FINAL_NUMBER_SOURCES:
        return FINAL_NUMBER
    if data_source in _HENDRYCKS_SOURCES or data_source in _MATH_VERIFY_SOURCES or _COMPETITION_RE.search(data_source):
        return MATH
    known = ", ".join(sorted(_GSM8K_SOURCES | _HENDRYCKS_SOURCES | _MATH_VERIFY_SOURCES | {ARITH_DATA_SOURCE}
                             | FINAL_NUMBER_SOURCES))
    raise ValueError(f"unknown data_source {data_source!r}: no verifier for it (known: {known}, aime*, amc*)")


@functools.lru_cache(maxsize=256)
def paper_scorer(data_source: str) -> str:
    """The paper grader's scorer (`gsm8k_strict`, `hendrycks` or `math_verify`) of a data_source.

    The recipe's own table: `openai/gsm8k` → strict `####`; `lighteval/MATH`,
    `DigitalLearningGmbH/MATH-lighteval`, `HuggingFaceH4/MATH-500` → Hendrycks; `math_dapo`,
    `math`, `math_dapo_reasoning`, `aime*` → Math-Verify. The other names repexp accepts are
    aliases of one of these datasets and follow it (`amc*` is scored like `aime*`). The built-in
    arithmetic tasks have no paper scorer (ValueError): both graders use the repexp rule there.
    """
    fam = family(data_source)  # raises for unknown sources
    if fam == GSM8K:
        return GSM8K_STRICT
    if fam in (ARITH, FINAL_NUMBER):
        raise ValueError(f"{data_source}: a built-in arithmetic task has no paper scorer (the repexp rule grades it)")
    if data_source in _HENDRYCKS_SOURCES:
        return HENDRYCKS
    return MATH_VERIFY
