"""Final-answer extraction (repexp grader): the last box, and GSM8K's `####` answer line.

MATH family: the content of the last `\\boxed{}` / `\\fbox{}` / `\\framebox{}` (or `\\boxed X`),
normalised by `repexp.verify.normalize`; no box, no answer (the prompt asks for one).

GSM8K family: the answer is the value of the **last `####` line that states a number**, else of
the last box. A `####` line states a number when, once decoration is removed (`$`, `\\$`, `**`,
`\\(…\\)`, `\\text{}`, `\\boxed{}`, commas, thin spaces), it

- starts with the number: `#### 18`, `#### $1,000.00`, `#### 1 000` (space-grouped thousands),
  `#### 18 dollars.`, `#### 18 = 9*2` (the number first, its derivation after it);
- or is an arithmetic chain ending in one: `#### x = 2*9 = 18`, `#### 2 \\times 9 = 18` (the value
  after the last `=`);
- or is an answer label followed by the number: `#### Answer: 18`, `#### The final answer is 18`
  (labels: `ANSWER_LABELS`).

Only the last 1,000 `####` markers are read (bounded work on pathological input). A compound
quantity (`#### 18 dollars and 50 cents`) states no single number. Markdown headings
are not answers: `#### Step 3: add them`, `#### Note:`, `#### 2. Compute the
total` (a numbered heading: number, `.` or `)`, then words) are skipped, so `#### 18` followed by
`#### Note:` gives 18 and `#### Step 3: …` before `\\boxed{18}` gives 18.

Arith family (the built-in arithmetic task, short answers from small models): the GSM8K rule, else
the **last number written anywhere in the response** (`The answer is 12.` gives 12). Lenient on
purpose: the task measures whether a small model computes the value, not whether it follows a
format; docs/data.md says so.

Final-number family (`arith-hard`, the GPU pilot's task): the answer is the number the response
**ends with** (trailing spaces and one `.` or `!` allowed): `85`, `47 + 38 = 85.`, `The answer is
85.`; a response that goes on after its number, or stops mid-sentence at the token cap (`... 47 +
38 is the same as 40 + 30 and`), has no answer. Strict on purpose: the last number of a truncated
explanation is usually an operand, and the pilot's pass@k must count the model's answers only.
"""

from __future__ import annotations

import decimal
import re
from fractions import Fraction
from typing import Optional

from repexp.verify.normalize import normalize_answer

MAX_ANSWER_CHARS = 1_000  # the longest MATH gold is 159 characters; longer "answers" are wrong

# --------------------------------------------------------------------------- boxes

_BOX_COMMANDS = ("\\boxed", "\\fbox", "\\framebox")


def closing_brace(text: str, start: int) -> Optional[int]:
    """Index of the `}` that brings the brace depth, counted from `text[start]` on, back to 0; None if none.

    The count Hendrycks' `last_boxed_only_string` makes: a `}` before any `{` makes the depth
    negative, and it never returns to 0 at a `}` after that unless more `{` follow.
    """
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def last_boxed(text: str) -> Optional[str]:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` / `\\framebox{...}` (or `\\boxed X`).

    None if absent or unclosed.

    Braces are counted the way Hendrycks' `last_boxed_only_string` counts them, so on
    every MATH solution this returns exactly the dataset's `answer` field. Unlike
    verl's copy, the `\\boxed X` form is only used when the *last* box has it.
    """
    start, command = max((text.rfind(cmd), cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    pos = start + len(command)
    if pos < len(text) and (text[pos].isalpha()):
        return None  # another command, e.g. \boxedsymbol
    rest = text[pos:]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        begin = pos + (len(rest) - len(stripped))
        end = closing_brace(text, begin)
        if end is None:
            return None  # unclosed: a response cut off inside its answer
        return text[begin + 1 : end].strip() or None
    if rest[:1].isspace():
        # "\boxed 2$." — up to the closing dollar or the end of the line
        content = re.split(r"[$\n]", stripped, maxsplit=1)[0].strip()
        return content or None
    return None


def extract_math(response: str) -> Optional[str]:
    boxed = last_boxed(response)
    if boxed is None:
        return None
    if len(boxed) > MAX_ANSWER_CHARS:
        return boxed  # scored 0 by its length; not worth normalising
    answer = normalize_answer(boxed)
    return answer or None


# --------------------------------------------------------------------------- numbers


def parse_number(text: str) -> Optional[Fraction]:
    """A rational from a number string: `1,000`, `-18.00`, `3/4`; None if it is not one."""
    s = text.replace(",", "").replace(" ", "").replace("−", "-")
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return Fraction(int(num), int(den)) if int(den) != 0 else None
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def canonical_number(value: Fraction) -> str:
    """`18`, `18.5`, `2/3`: exact, and equal for equal values (the GSM8K voting key)."""
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    while den % 2 == 0:
        den //= 2
    while den % 5 == 0:
        den //= 5
    if den == 1:  # a terminating decimal: written exactly
        with decimal.localcontext() as ctx:
            ctx.prec = len(str(value.numerator)) + len(str(value.denominator)) + 5
            text = format((decimal.Decimal(value.numerator) / decimal.Decimal(value.denominator)).normalize(), "f")
        return text
    return f"{value.numerator}/{value.denominator}"


# --------------------------------------------------------------------------- GSM8K answer lines

ANSWER_LABELS = (
    "answer", "final answer", "the answer is", "the final answer is", "answer is", "final answer is",
    "total", "the total is", "result", "solution",
)
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mbox|boxed)\{([^{}]*)\}")
_DECORATION = re.compile(r"\\\$|\$|\*\*|__|`|\\[()\[\]]")
_THIN_SPACES = re.compile(r"\\[,;: ]|[\u00a0\u2009\u202f]|\{,\}")
_FRAC = re.compile(r"-?\\[dt]?frac\{(-?\d+)\}\{(\d+)\}")
# a number: space- or comma-grouped thousands, or plain digits; a decimal part or a /denominator
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d{1,3}(?: \d{3})+(?!\d)|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_OPERATOR = re.compile(r"(?:[*+×·/^÷]|x\s*\d|\\times|\\cdot|\\div|-\s*[\d(])")
_NUMBERED_HEADING = re.compile(r"[.)]\s+[A-Za-z]")
_COMPOUND = re.compile(r"[A-Za-z ]*\band\s+-?\d")  # "18 dollars and 50 cents": not a plain value
_LABEL = re.compile(r"(?i)(?:" + "|".join(re.escape(label) for label in ANSWER_LABELS) + r")\s*[:=]?\s*")
_WORD_START = re.compile(r"[A-Za-z]{2}")
_GSM8K_MARK = "####"
_MAX_MARKS = 1_000  # headings to skip at most: bounded work on pathological input
_LINE_CHARS = 200


def _clean(line: str) -> str:
    s = _TEXT_WRAPPER.sub(r" \1 ", line).replace("−", "-")
    s = _THIN_SPACES.sub(" ", s)
    s = _DECORATION.sub(" ", s)
    s = re.sub(r"-\s+(?=\d)", "-", s)  # "- $5" → "-5" after removing the dollar
    return " ".join(s.split())


def _leading_value(s: str) -> tuple[Optional[Fraction], str]:
    """(the number `s` starts with, the text after it), or (None, s)."""
    frac = _FRAC.match(s)
    if frac:
        num, den = int(frac.group(1)), int(frac.group(2))
        sign = -1 if frac.group(0).startswith("-") else 1
        return (Fraction(sign * num, den) if den else None), s[frac.end():]
    match = _NUMBER.match(s)
    if not match:
        return None, s
    return parse_number(match.group(0)), s[match.end():]


def answer_value(text: str) -> Optional[Fraction]:
    """The number an answer line (or a box) states, per the rules of the module docstring; else None."""
    s = _clean(text)
    if not s:
        return None
    label = _LABEL.match(s)
    if label:
        s = s[label.end():]
    elif _WORD_START.match(s):
        return None  # a heading or prose ("Step 3: …", "Note: …")
    value, rest = _leading_value(s)
    rest = rest.lstrip()
    if value is not None:
        if _NUMBERED_HEADING.match(rest) or _COMPOUND.match(rest):
            return None  # "2. Compute the total", "18 dollars and 50 cents"
        if not _OPERATOR.match(rest):
            return value  # "18", "18 dollars", "18 = 9*2"
    if "=" in s:  # "x = 2*9 = 18", "2 * 9 = 18": the value after the last "="
        value, rest = _leading_value(s.rsplit("=", 1)[1].lstrip())
        if value is not None and not _OPERATOR.match(rest.lstrip()):
            return value
    return None


def extract_gsm8k(response: str) -> Optional[str]:
    """The canonical number of the last `####` line stating one, else of the last box; None if neither."""
    end = len(response)
    for _ in range(_MAX_MARKS):
        pos = response.rfind(_GSM8K_MARK, 0, end)
        if pos < 0:
            break
        start = pos + len(_GSM8K_MARK)
        line = response[start : start + _LINE_CHARS].split("\n", 1)[0]
        value = answer_value(line.lstrip("#"))
        if value is not None:
            return canonical_number(value)
        end = pos
    boxed = last_boxed(response)
    if boxed is not None and len(boxed) <= MAX_ANSWER_CHARS:
        value = answer_value(boxed)
        if value is not None:
            return canonical_number(value)
    return None


_ANY_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
ARITH_TAIL_CHARS = 2_000  # the answer is near the end; bounded work on long responses
_FINAL_NUMBER = re.compile(r"(?<![\w.,])(-?\d+(?:,\d{3})*(?:\.\d+)?)\s*[.!]?\s*$")


def _canonical(number: Optional[str]) -> Optional[str]:
    value = None if number is None else parse_number(number)
    return None if value is None else canonical_number(value)


def extract_final_number(response: str) -> Optional[str]:
    """The final-number family's answer: the number that ends the response, else None."""
    found = _FINAL_NUMBER.search(response[-ARITH_TAIL_CHARS:])
    return _canonical(found.group(1) if found else None)


def extract_last_number(response: str) -> Optional[str]:
    """The arith family's answer: the GSM8K rule (`####` line, box), else the response's last number."""
    marked = extract_gsm8k(response)
    if marked is not None:
        return marked
    found = _ANY_NUMBER.findall(response[-ARITH_TAIL_CHARS:])
    return _canonical(found[-1] if found else None)
