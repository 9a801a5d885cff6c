"""Light, meaning-preserving normalisation of boxed answers (repexp grader, MATH family).

`normalize_answer` is applied to gold and prediction alike. Its output is the string fast path
(equal strings score 1 without Math-Verify), the result-cache key and the maj@k voting key;
Math-Verify then compares the normalised forms. Rules, in order:

1. `\\dfrac`/`\\tfrac` → `\\frac`, `{,}` → `,`, Unicode minus → `-`;
2. drop `\\left`/`\\right`/`\\big…` sizing, spacing commands (`\\,` `\\;` `\\!` `\\ ` `\\quad` …) but
   never the row break `\\\\` (`\\\\ ` is a row break followed by a space, not `\\` + `\\ `);
3. drop degree marks (`^\\circ`, `^{\\circ}`, `°`, `\\degree`), percent and dollar signs;
4. drop insignificant whitespace (a space that ends a control word before a letter stays:
   `\\pi r` must not become `\\pir`), a trailing period, also inside a final `\\text{…}`;
5. matrices: `pmatrix`, `bmatrix`, `Bmatrix`, and `matrix`/`smallmatrix`/`array` inside `(…)` or
   `[…]` become one canonical `\\begin{pmatrix}a&b\\\\c&d\\end{pmatrix}` (rows by `\\\\`, entries
   by `&`, each entry normalised, a trailing row break dropped), so the environment and the
   spacing never matter and Math-Verify compares the entries.

`value_side` (applied by the scorer only when the gold is not an equation) reads `x = 5`,
`25 = m+n` and `x = 2 \\cdot 9 = 18` as the value they state.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Optional

_ROW_BREAK = "\\\\"
_ROW_MARK = "\ue000"  # a private-use character stands in for `\\` while spacing is removed
_SPACING_COMMANDS = re.compile(r"\\[!,;:> ]|\\(?:displaystyle|textstyle|quad|qquad)(?![a-zA-Z])")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![a-zA-Z])|\\[bB]igg?[lr]?(?![a-zA-Z])")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\degree(?![a-zA-Z])|°")
_WHITESPACE = re.compile(r"\s+")
_CONTROL_WORD_END = re.compile(r"\\[a-zA-Z]+$")
_TEXT_PERIOD = re.compile(r"\.(\}+)$")
_MATRIX = re.compile(
    r"(?P<open>[(\[])?\\begin\{(?P<env>pmatrix|bmatrix|Bmatrix|matrix|smallmatrix|array)\}"
    r"(?P<spec>\{[^{}]*\})?(?P<body>.*?)\\end\{(?P=env)\}(?P<close>[)\]])?",
    re.DOTALL,
)
_DELIMITED_ENVS = ("pmatrix", "bmatrix", "Bmatrix")
_MATCHING = {"(": ")", "[": "]"}


def normalize_answer(answer: str) -> str:
    """The canonical form of a boxed answer (see the module docstring); idempotent."""
    s = answer.strip()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("{,}", ",").replace("−", "-")
    s = _LEFT_RIGHT.sub("", s)
    has_rows = _ROW_BREAK in s
    if has_rows:
        s = s.replace(_ROW_BREAK, _ROW_MARK)
    s = _SPACING_COMMANDS.sub(" ", s)
    s = _DEGREES.sub("", s)
    # Percent signs: Math-Verify 0.9 cannot parse "50\%" inside a box; Hendrycks drops them too.
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace("\\$", "").replace("$", "")

    # Drop whitespace except where it ends a control word ("\pi r" must not become "\pir").
    def _space(match: re.Match) -> str:
        before = s[max(0, match.start() - 64) : match.start()]  # a bounded window: linear, not quadratic
        after = s[match.end() : match.end() + 1]
        return " " if after.isalpha() and _CONTROL_WORD_END.search(before) else ""

    s = _WHITESPACE.sub(_space, s)
    if has_rows:
        s = s.replace(_ROW_MARK, _ROW_BREAK)
    s = s.rstrip(".")
    if s.endswith("}") and "\\text" in s:  # \text{Evelyn.} says Evelyn
        s = _TEXT_PERIOD.sub(r"\1", s)
    if "\\begin" in s:
        s = _MATRIX.sub(_canonical_matrix, s)
    return s


def _canonical_matrix(match: re.Match) -> str:
    env, body = match["env"], match["body"]
    opened, closed = match["open"] or "", match["close"] or ""
    if env not in _DELIMITED_ENVS:
        if not opened or _MATCHING[opened] != closed:
            return match.group(0)  # a bare matrix/array: not a vector or matrix answer we can read
        opened = closed = ""
    rows = body.replace("\\hline", "").split(_ROW_BREAK)
    if len(rows) > 1 and not rows[-1].strip():
        rows.pop()  # a trailing row break
    cells = [[normalize_answer(cell) for cell in row.split("&")] for row in rows]
    text = _ROW_BREAK.join("&".join(row) for row in cells)
    return f"{opened}\\begin{{pmatrix}}{text}\\end{{pmatrix}}{closed}"


# --------------------------------------------------------------------------- equations

_TEXT_GROUP = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname)\{[^{}]*\}")
_CONTROL_WORD = re.compile(r"\\[a-zA-Z]+")
_LETTER = re.compile(r"[a-zA-Z]")
_NOT_EQUALITY = re.compile(r"[<>!:]=|=[<>]|\\[lg]eq?(?![a-zA-Z])|\\neq?(?![a-zA-Z])")
_OPENERS, _CLOSERS = "([{", ")]}"


def _has_variable(side: str) -> bool:
    """A Latin letter outside control words and text groups (`m+n`, `f(2)`; not `\\pi`, `5\\text{ cm}`)."""
    return bool(_LETTER.search(_CONTROL_WORD.sub("", _TEXT_GROUP.sub("", side))))


def _top_level_separator(s: str) -> bool:
    depth = 0
    for ch in s:
        if ch in _OPENERS:
            depth += 1
        elif ch in _CLOSERS:
            depth -= 1
        elif ch in ",;" and depth == 0:
            return True
    return False


def value_side(answer: str) -> str:
    """The value an equation states, for a gold that is not an equation; else `answer` unchanged.

    `x=5` → `5`, `25=m+n` → `25`, `x=2\\cdot9=18` → `18`: the variable side must be one end of
    the chain and every other side variable-free. Systems (`a=2,b=3`), inequalities and
    equations between expressions (`y=2x+1`) are left as they are.
    """
    if "=" not in answer or _NOT_EQUALITY.search(answer) or _top_level_separator(answer):
        return answer
    sides = answer.split("=")
    if not all(sides):
        return answer
    variable = [_has_variable(side) for side in sides]
    if variable[0] and not any(variable[1:]):
        return sides[-1]
    if variable[-1] and not any(variable[:-1]):
        return sides[0]
    return answer


# --------------------------------------------------------------------------- integers and rationals

INTEGER = re.compile(r"[+-]?\d+")
_RATIONAL = re.compile(r"(-?)(?:(\d+(?:\.\d+)?|\.\d+)|\\frac\{(-?\d+)\}\{(\d+)\}|(\d+)/(\d+))")
_WRAPPED = re.compile(r"\\(?:text|textbf|mathbf|mathrm|mbox)\{(.*)\}|\((.*)\)|\{(.*)\}")


def as_integer(answer: str) -> Optional[int]:
    """The integer an answer states once formatting is peeled off (`\\textbf{(073)}` → 73), else None."""
    for _ in range(4):
        if INTEGER.fullmatch(answer):
            return int(answer) if len(answer) <= 4_000 else None  # CPython refuses longer int strings
        match = _WRAPPED.fullmatch(answer)
        if not match:
            return None
        answer = next(group for group in match.groups() if group is not None).strip()
    return None


def as_rational(answer: str) -> Optional[Fraction]:
    """The exact value of a plain number: `-12`, `0.5`, `.5`, `\\frac{3}{4}`, `-\\frac{3}{4}`, `3/4`; else None.

    Normalised answers only (no spaces, `\\dfrac` already `\\frac`). Both sides plain numbers is
    the commonest Math-Verify call on MATH (a wrong number against a numeric gold): decided
    exactly here instead, so `0.333` ≠ `\\frac{1}{3}` (Math-Verify would round to 6 digits).
    """
    if len(answer) > 64:
        return None
    match = _RATIONAL.fullmatch(answer)
    if not match:
        return None
    sign, plain, *fraction = match.groups()
    numerator, denominator = fraction[:2] if fraction[0] is not None else fraction[2:]
    if plain is None and int(denominator) == 0:
        return None
    value = Fraction(plain) if plain is not None else Fraction(int(numerator), int(denominator))
    return -value if sign else value


_CHOICE = re.compile(r"\\text(?:bf)?\{\(([A-E])\)\}|\(([A-E])\)")
_MATRIX_BODY = re.compile(r"\\begin\{pmatrix\}(.*)\\end\{pmatrix\}", re.DOTALL)
NUMBER, TUPLE, LIST, MATRIX, CHOICE = "number", "tuple", "list", "matrix", "choice"


def _rationals(parts: list[str]) -> Optional[tuple]:
    values = tuple(as_rational(part) for part in parts)
    return None if any(v is None for v in values) else values


def exact_value(answer: str) -> Optional[tuple]:
    """`(kind, value)` of an answer made only of plain numbers, compared exactly; None otherwise.

    Kinds: a number (`0.5`, `\\frac{3}{4}`, `\\text{13}`), a tuple `(a,b)` (ordered), a bare list
    `a,b` (a set, as Math-Verify reads it), a canonical `pmatrix` (entry by entry), a choice letter
    `\\text{(C)}`/`(C)`. Answers of the same kind are decided here; `scoring` also decides a choice
    letter against a number (never equal) and leaves every other pair to Math-Verify.
    """
    if len(answer) > 200:
        return None
    number = as_rational(answer)
    if number is None:
        integer = as_integer(answer)
        number = None if integer is None else Fraction(integer)
    if number is not None:
        return NUMBER, number
    choice = _CHOICE.fullmatch(answer)
    if choice:
        return CHOICE, choice.group(1) or choice.group(2)
    matrix = _MATRIX_BODY.fullmatch(answer)
    if matrix:
        rows = [_rationals(row.split("&")) for row in matrix.group(1).split("\\\\")]
        return None if any(r is None for r in rows) else (MATRIX, tuple(rows))
    if answer.startswith("(") and answer.endswith(")") and "," in answer:
        items = _rationals(answer[1:-1].split(","))
        return None if items is None else (TUPLE, items)
    if "," in answer and not any(ch in answer for ch in "()[]") and "\\{" not in answer:
        items = _rationals(answer.split(","))
        return None if items is None else (LIST, frozenset(items))
    return None

