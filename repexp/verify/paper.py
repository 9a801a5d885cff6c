"""The paper grader: the upstream recipe's three scorers, re-implemented to give identical scores.

The recipe (verl-recipe `rep_exp/reward_score`) routed by data_source (`routing.paper_scorer`):

- GSM8K → verl's strict scorer (`verl.utils.reward_score.gsm8k.compute_score`, method
  "strict"): in the last 300 characters, the last `#### ` followed by a number made of `-`,
  digits, `.` and `,`; commas removed; correct only when that string equals the ground truth
  exactly (`18.00`, `$18` and `#### 18.` are wrong for a gold of `18`).
- MATH → Hendrycks string equivalence (`verl.utils.reward_score.math_reward.compute_score`): the
  last `\\boxed{…}` (`\\fbox` as a fallback; a `\\boxed ` written with a space anywhere wins) and
  the gold, each passed through Hendrycks' `strip_string`, must be equal strings.
- DAPO / AIME → Math-Verify over the whole response (`repexp.verify.compare.whole_response_equal`).

`tests/test_graders.py` checks every function here against verl 0.9.1's own on the shipped
data and on the agreement corpus. The quirks are part of the contract and are kept on purpose:
an `\\fbox` answer always scores 0 (verl's `remove_boxed` only accepts `\\boxed`), a gold with two
`\\text{ ` units falls back to raw string equality, `0.5` equals `\\frac{1}{2}` but not `1/2.`
"""

from __future__ import annotations

import re
from typing import Optional

from repexp.verify.extract import closing_brace, extract_math
from repexp.verify.routing import GSM8K_STRICT, HENDRYCKS, paper_scorer

# --------------------------------------------------------------------------- GSM8K, strict

GSM8K_TAIL_CHARS = 300
_STRICT_ANSWER = re.compile(r"#### (-?[0-9.,]+)")


def gsm8k_strict_answer(response: str) -> Optional[str]:
    """The strict scorer's answer string (commas removed), or None."""
    found = _STRICT_ANSWER.findall(response[-GSM8K_TAIL_CHARS:])
    return found[-1].replace(",", "") if found else None


def gsm8k_strict(response: str, ground_truth: str) -> float:
    answer = gsm8k_strict_answer(response)
    return 1.0 if answer is not None and answer == ground_truth else 0.0


# --------------------------------------------------------------------------- MATH, Hendrycks


class _Unreadable(Exception):
    """Hendrycks' normaliser failed on this string (its callers then compare raw strings)."""


def hendrycks_boxed(response: str) -> Optional[str]:
    """The answer Hendrycks' `last_boxed_only_string` + `remove_boxed` read, or None (scores 0)."""
    if "\\boxed " in response:
        # any "\boxed " (with a space) wins: the text after the last one, up to a dollar sign
        return response.rsplit("\\boxed ", 1)[1].split("$", 1)[0]
    start = response.rfind("\\boxed")
    if start < 0:
        return None  # an \fbox is found by Hendrycks' extractor but refused when its box is removed
    end = closing_brace(response, start)
    if end is None:
        return None
    box = response[start : end + 1]
    return box[len("\\boxed{") : -1] if box.startswith("\\boxed{") else None


def _sqrt_braces(s: str) -> str:
    """`\\sqrt3` → `\\sqrt{3}` (one character)."""
    if "\\sqrt" not in s:
        return s
    head, *parts = s.split("\\sqrt")
    out = [head]
    for part in parts:
        if not part:
            raise _Unreadable("\\sqrt at the end")
        out.append("\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:]))
    return "".join(out)


def _frac_braces(s: str) -> str:
    """`\\frac12` → `\\frac{1}{2}`, `\\frac1{72}` → `\\frac{1}{72}`.

    A `\\frac` followed by fewer than 2 characters leaves the whole string as it was.
    """
    head, *parts = s.split("\\frac")
    out = [head]
    for part in parts:
        if not part:
            raise _Unreadable("\\frac at the end")
        if part[0] == "{":
            out.append("\\frac" + part)
            continue
        if len(part) < 2:
            return s  # too short to rewrite: the whole string is kept as it was
        numerator, second, rest = part[0], part[1], part[2:]
        if second == "{":
            out.append("\\frac{" + numerator + "}" + second + rest)
        else:
            out.append("\\frac{" + numerator + "}{" + second + "}" + rest)
    return "".join(out)


def _slash_fraction(s: str) -> str:
    """`3/4` → `\\frac{3}{4}` when both sides are integers written plainly."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        numerator, denominator = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    if s != f"{numerator}/{denominator}":
        return s
    return "\\frac{" + str(numerator) + "}{" + str(denominator) + "}"


def hendrycks_normalize(s: str) -> str:
    """Hendrycks' `strip_string`; raises `_Unreadable` where the original raises."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    if "\\text{ " in s:  # units on the right: only one such group is expected
        pieces = s.split("\\text{ ")
        if len(pieces) != 2:
            raise _Unreadable("more than one '\\text{ '")
        s = pieces[0]
    s = s.replace("\\\\%", "").replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 3" → "3"
        s = sides[1]
    s = _sqrt_braces(s)
    s = s.replace(" ", "")
    s = _frac_braces(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_fraction(s)


def hendrycks_equal(answer: str, ground_truth: str) -> bool:
    try:
        return hendrycks_normalize(answer) == hendrycks_normalize(ground_truth)
    except _Unreadable:
        return answer == ground_truth


def hendrycks(response: str, ground_truth: str) -> float:
    answer = hendrycks_boxed(response)
    return 1.0 if answer is not None and hendrycks_equal(answer, ground_truth) else 0.0


def hendrycks_answer(response: str) -> Optional[str]:
    """The maj@k voting key under Hendrycks: the normalised box (raw when it cannot be normalised)."""
    answer = hendrycks_boxed(response)
    if answer is None:
        return None
    try:
        return hendrycks_normalize(answer)
    except _Unreadable:
        return answer


# --------------------------------------------------------------------------- routing


def paper_answer(data_source: str, response: str) -> Optional[str]:
    """What the paper's scorer reads as the answer (the maj@k voting key).

    GSM8K: the strict `####` string; MATH: the Hendrycks-normalised box. Math-Verify reads the
    whole response and has no single answer string; its voting key is the last box (normalised as
    by the repexp grader), so maj@k stays defined.
    """
    kind = paper_scorer(data_source)
    if kind == GSM8K_STRICT:
        return gsm8k_strict_answer(response)
    return hendrycks_answer(response) if kind == HENDRYCKS else extract_math(response)
