"""The one 0/1 verifier, used by training rewards, dev validation and test evaluation alike.

Upstream mixed three checkers (verl's strict GSM8K regex, Hendrycks string
equivalence for MATH, Math-Verify for DAPO/AIME) and scored AIME evaluation with a
±1 scorer. repexp has one function per question, all returning 0.0 or 1.0:

- `score(data_source, response, ground_truth)`: one response.
- `extract_answer(data_source, response)`: the response's final answer in a
  canonical string form (for maj@k voting), or None when it gave none.
- `score_answer(data_source, answer, ground_truth)`: an already extracted answer
  (the maj@k winner); `score(...) == score_answer(..., extract_answer(...), ...)`.
- `score_batch(...)` / `VerifierPool`: many responses in a process pool.

Routing by `data_source` (unknown sources raise ValueError):

- GSM8K family (`openai/gsm8k`, `gsm8k`): the number after the last `####`
  (`#### 1,000`, `#### $18`, `#### 18.00` all parse), else the last `\\boxed{}`;
  compared exactly as rationals, so `18.00 == 18`.
- MATH family (`DigitalLearningGmbH/MATH-lighteval`, `HuggingFaceH4/MATH-500`,
  `math_dapo`, `aime*`, `amc*`, ...): the content of the last `\\boxed{}` /
  `\\fbox{}` (a response without one scores 0: the prompt asks for it), lightly
  normalised (`\\dfrac`→`\\frac`, no `\\left`/`\\right`, `$`, `\\%`, `^\\circ`,
  spacing), then: identical strings → 1; two integers → exact integer comparison
  (AIME's `033` equals `33`); otherwise Math-Verify with the gold first
  (`verify(gold, prediction)` is not symmetric).

Timeout guard (Math-Verify's own one uses SIGALRM, which only works in the main
thread, so it is switched off here), in three layers:

1. A size guard: answers longer than MAX_ANSWER_CHARS are wrong, and expressions whose
   exact value would exceed MAX_RESULT_DIGITS digits (`9^{9^{9^9}}`, `(10^{10})!`) are
   refused before sympy evaluates them, because that evaluation is one CPython
   big-integer C call that nothing in-process can interrupt.
2. A soft limit per Math-Verify comparison (`time_limit`, default 5 s of the thread's
   CPU time, so a loaded machine does not turn slow answers into timeouts): one
   watchdog thread per process raises VerifyTimeout *in the thread that overran*
   (`PyThreadState_SetAsyncExc`). It works in any thread of any process (main or not,
   pool workers, verl/TRL reward threads) and costs microseconds per call; like a
   signal it is delivered between bytecodes, so it stops runaway sympy loops
   (`\\prod_{k=1}^{10^9} k`). The comparison then scores 0, logged once per
   (gold, answer) pair (results are cached).
3. A hard limit in the process pool: a worker that makes no progress for
   `hard_timeout` wall-clock seconds is killed and replaced; its current item scores
   0 and the rest of its chunk is re-queued.

The pool uses the `spawn` start method by default (safe next to torch/CUDA threads),
so scripts that call `score_batch` with workers > 1 need an
`if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import collections
import ctypes
import decimal
import functools
import heapq
import itertools
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import re
import threading
import time
from fractions import Fraction
from typing import Any, Callable, Optional, Sequence

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0  # soft limit per Math-Verify comparison
MAX_ANSWER_CHARS = 1_000  # the longest MATH gold is 159 characters; longer "answers" are wrong
GSM8K = "gsm8k"
MATH = "math"

# --------------------------------------------------------------------------- routing

_GSM8K_SOURCES = frozenset({"openai/gsm8k", "gsm8k"})
_MATH_SOURCES = frozenset(
    {
        "DigitalLearningGmbH/MATH-lighteval",
        "lighteval/MATH",
        "HuggingFaceH4/MATH-500",
        "EleutherAI/hendrycks_math",
        "math",
        "MATH",
        "math500",
        "math_dapo",
        "math_dapo_reasoning",
        "ftajwar/deduplicated_dapo_dataset",
        "BytedTsinghua-SIA/DAPO-Math-17k",
    }
)
# Competition sets are routed by name: aime24, aime_2024, MathArena/aime_2024_I,
# HuggingFaceH4/aime_2024, Maxwell-Jia/AIME_2024, amc23, ...
_COMPETITION_RE = re.compile(r"(^|/)(aime|amc)", re.IGNORECASE)


@functools.lru_cache(maxsize=256)
def family(data_source: str) -> str:
    """The scorer family (`"gsm8k"` or `"math"`) of a data_source; ValueError if unknown."""
    if not isinstance(data_source, str):
        raise TypeError(f"data_source must be a string, got {type(data_source).__name__}")
    if data_source in _GSM8K_SOURCES:
        return GSM8K
    if data_source in _MATH_SOURCES or _COMPETITION_RE.search(data_source):
        return MATH
    known = ", ".join(sorted(_GSM8K_SOURCES | _MATH_SOURCES))
    raise ValueError(f"unknown data_source {data_source!r}: no verifier for it (known: {known}, aime*, amc*)")


# --------------------------------------------------------------------------- extraction

_BOX_COMMANDS = ("\\boxed", "\\fbox", "\\framebox")


def last_boxed(text: str) -> Optional[str]:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` / `\\framebox{...}` (or `\\boxed X`), None if absent or unclosed.

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
        depth = 0
        for i in range(begin, len(text)):
            ch = text[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    content = text[begin + 1 : i].strip()
                    return content or None
        return None  # unclosed: a response cut off inside its answer
    if rest[:1].isspace():
        # "\boxed 2$." — up to the closing dollar or the end of the line
        content = re.split(r"[$\n]", stripped, maxsplit=1)[0].strip()
        return content or None
    return None


_SPACING_COMMANDS = re.compile(r"\\[!,;:> ]|\\(?:displaystyle|textstyle|quad|qquad)(?![a-zA-Z])")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![a-zA-Z])|\\[bB]igg?[lr]?(?![a-zA-Z])")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
_WHITESPACE = re.compile(r"\s+")


def normalize_answer(answer: str) -> str:
    """Light, meaning-preserving LaTeX normalisation of a final answer (both gold and prediction).

    Used as the string fast path, the dedup/cache key and the maj@k voting key;
    Math-Verify then compares the normalised forms.
    """
    s = answer.strip()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("{,}", ",").replace("−", "-")
    s = _LEFT_RIGHT.sub("", s)
    s = _SPACING_COMMANDS.sub(" ", s)
    s = _DEGREES.sub("", s)
    # Percent signs: Math-Verify 0.9 cannot parse "50\%" inside a box; Hendrycks drops them too.
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace("\\$", "").replace("$", "")

    # Drop whitespace except where it ends a control word ("\pi r" must not become "\pir").
    def _space(match: re.Match) -> str:
        before = s[max(0, match.start() - 64) : match.start()]  # a bounded window: linear, not quadratic
        after = s[match.end() : match.end() + 1]
        return " " if re.search(r"\\[a-zA-Z]+$", before) and after.isalpha() else ""

    s = _WHITESPACE.sub(_space, s)
    s = s.rstrip(".")
    return s


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_FRAC = re.compile(r"\\[dt]?frac\{(-?\d+)\}\{(\d+)\}")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def _parse_number(text: str) -> Optional[Fraction]:
    """A rational from a number string: `1,000`, `-$18.00`, `3/4`; None if it is not one."""
    s = text.replace(",", "").replace("−", "-")
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return Fraction(int(num), int(den)) if int(den) != 0 else None
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _canonical_number(value: Fraction) -> str:
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


def _number_in(text: str) -> Optional[Fraction]:
    """The number a GSM8K answer line states: after the last '=', the first number."""
    s = _TEXT_WRAPPER.sub(r" \1 ", text).replace("−", "-")
    frac = _FRAC.search(s)
    if frac:
        return Fraction(int(frac.group(1)), int(frac.group(2))) if int(frac.group(2)) else None
    if "=" in s:
        s = s.rsplit("=", 1)[1]
    s = re.sub(r"\\?\$|\*\*|\\[()\[\]]", " ", s)
    s = re.sub(r"-\s+(?=\d)", "-", s)  # "- $5" → "-5" after removing the dollar
    match = _NUMBER.search(s)
    return _parse_number(match.group(0)) if match else None


_GSM8K_MARK = "####"


def _extract_gsm8k(response: str) -> Optional[str]:
    pos = response.rfind(_GSM8K_MARK)
    if pos >= 0:
        line = response[pos + len(_GSM8K_MARK) : pos + len(_GSM8K_MARK) + 200].lstrip().split("\n", 1)[0]
        value = _number_in(line)
        if value is not None:
            return _canonical_number(value)
    boxed = last_boxed(response)
    if boxed is not None:
        value = _number_in(boxed)
        if value is not None:
            return _canonical_number(value)
    return None


def _extract_math(response: str) -> Optional[str]:
    boxed = last_boxed(response)
    if boxed is None:
        return None
    if len(boxed) > MAX_ANSWER_CHARS:
        return boxed  # scored 0 by its length; not worth normalising
    answer = normalize_answer(boxed)
    return answer or None


def extract_answer(data_source: str, response: str) -> Optional[str]:
    """The response's final answer in canonical form (the maj@k voting key), or None."""
    fam = family(data_source)
    _check_str("response", response)
    return _extract_gsm8k(response) if fam == GSM8K else _extract_math(response)


# --------------------------------------------------------------------------- comparison


def _check_str(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")


@functools.lru_cache(maxsize=16_384)
def _gold_key(fam: str, ground_truth: str) -> str:
    """The canonical gold; ValueError for a gold nothing can ever match."""
    if fam == GSM8K:
        value = _parse_number(ground_truth.strip().replace("$", ""))
        if value is None:
            raise ValueError(f"gsm8k ground_truth {ground_truth!r} is not a number")
        return _canonical_number(value)
    gold = normalize_answer(ground_truth)
    if not gold:
        raise ValueError(f"ground_truth {ground_truth!r} is empty: no answer can match it")
    return gold


_INTEGER = re.compile(r"[+-]?\d+")
_WRAPPED = re.compile(r"\\(?:text|textbf|mathbf|mathrm|mbox)\{(.*)\}|\((.*)\)|\{(.*)\}")


def _as_integer(answer: str) -> Optional[int]:
    """The integer an answer states once formatting is peeled off (`\\textbf{(073)}` → 73), else None."""
    for _ in range(4):
        if _INTEGER.fullmatch(answer):
            return int(answer) if len(answer) <= 4_000 else None  # CPython refuses longer int strings
        match = _WRAPPED.fullmatch(answer)
        if not match:
            return None
        answer = next(group for group in match.groups() if group is not None).strip()
    return None


def _fast_decision(fam: str, gold: str, answer: Optional[str]) -> Optional[float]:
    """The score when no Math-Verify call is needed, else None."""
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return 0.0
    if fam == GSM8K:
        return 1.0 if _parse_number(answer) == _parse_number(gold) else 0.0
    if answer == gold:
        return 1.0
    if _INTEGER.fullmatch(gold):
        value = _as_integer(answer)
        if value is not None:  # integer golds (all of AIME): exact, so "033" equals "33"
            return 1.0 if value == int(gold) else 0.0
    return None


def _math_verify_imports():
    # imported on first use: `import repexp.verify` stays cheap for GSM8K-only callers
    from math_verify import LatexExtractionConfig, parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" notices: we guard it
    return LatexExtractionConfig, parse, verify


@functools.lru_cache(maxsize=1)
def _mv():
    return _math_verify_imports()


@functools.lru_cache(maxsize=8_192)
def _parse_boxed(latex: str) -> tuple:
    config, parse, _ = _mv()
    return tuple(parse("\\boxed{" + latex + "}", [config()], parsing_timeout=None))


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
    name = type(expr).__name__
    if getattr(expr, "is_Pow", False):
        base, exponent = _log10_bound(args[0]), _log10_bound(args[1])
        if base == 0.0:
            return 0.0  # |base| <= 1 or symbolic: no big integer is built
        return math.inf if exponent > 300 else base * 10.0**exponent
    if name in {"factorial", "factorial2", "subfactorial", "gamma", "binomial", "RisingFactorial", "FallingFactorial"}:
        inner = max(_log10_bound(a) for a in args)
        return math.inf if inner > 300 else (10.0**inner) * max(inner, 1.0)
    return sum(_log10_bound(a) for a in args) + math.log10(len(args))


def _too_big(parsed: tuple) -> bool:
    return any(_log10_bound(item) > MAX_RESULT_DIGITS for item in parsed if not isinstance(item, str))


def _math_verify_equal(gold: str, answer: str) -> bool:
    _, _, verify = _mv()
    gold_parsed = _parse_boxed(gold)
    pred_parsed = _parse_boxed(answer)
    if not gold_parsed or not pred_parsed or _too_big(pred_parsed) or _too_big(gold_parsed):
        return False
    return bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None))


class _LRU:
    """A small thread-safe LRU map of (gold, answer) → score, shared by all calls in a process."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Optional[float]:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: Any, value: float) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


_RESULTS = _LRU(maxsize=1 << 17)


def clear_caches() -> None:
    """Forget cached comparisons and parses (benchmarks use it to measure cold throughput)."""
    _RESULTS.clear()
    _parse_boxed.cache_clear()
    _gold_key.cache_clear()


@functools.lru_cache(maxsize=1)
def warm_up() -> None:
    """Import Math-Verify and run one comparison (~1 s the first time), outside any time limit."""
    _mv()
    _math_verify_equal("\\frac{1}{2}", "0.5")


def _verify_key(key: tuple) -> float:
    """Math-Verify comparison of one (gold, answer, timeout) key under the soft deadline."""
    gold, answer, timeout = key
    warm_up()  # a cold process's first parse must not count against the first answer's limit
    try:
        with time_limit(timeout):
            equal = _math_verify_equal(gold, answer)
    except VerifyTimeout:
        logger.warning("verifier timed out after %.1fs (scored 0): gold=%r answer=%.200r", timeout, gold, answer)
        return 0.0
    except (ArithmeticError, ValueError, TypeError, AttributeError, RecursionError, IndexError, KeyError) as err:
        # sympy/latex2sympy failures on odd input are a wrong answer, not a crash
        logger.debug("math-verify failed on gold=%r answer=%.200r: %s", gold, answer, err)
        return 0.0
    return 1.0 if equal else 0.0


def score_answer(data_source: str, answer: Optional[str], ground_truth: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> float:
    """Score an answer already produced by `extract_answer` (None scores 0)."""
    fam = family(data_source)
    if isinstance(ground_truth, int) and not isinstance(ground_truth, bool):
        ground_truth = str(ground_truth)
    _check_str("ground_truth", ground_truth)
    gold = _gold_key(fam, ground_truth)
    if answer is not None:  # canonicalisation is idempotent, so raw answers work too
        if len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        if fam == MATH:
            answer = normalize_answer(answer) or None
        else:
            value = _number_in(answer)
            answer = None if value is None else _canonical_number(value)
    decided = _fast_decision(fam, gold, answer)
    if decided is not None:
        return decided
    key = (gold, answer, float(timeout or 0.0))
    cached = _RESULTS.get(key)
    if cached is None:
        cached = _verify_key(key)
        _RESULTS.put(key, cached)
    return cached


def score(data_source: str, response: str, ground_truth: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> float:
    """1.0 if `response`'s final answer equals `ground_truth` for this data_source, else 0.0."""
    return score_answer(data_source, extract_answer(data_source, response), ground_truth, timeout=timeout)


# --------------------------------------------------------------------------- timeout guard


class VerifyTimeout(BaseException):
    """Raised inside a thread whose `time_limit` expired.

    A BaseException so that sympy's broad `except Exception` handlers cannot swallow it.
    """


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


def _thread_cpu_clock(thread_id: int) -> Optional[int]:
    """The CPU-time clock of a thread (Linux), so limits measure work rather than machine load."""
    try:
        return time.pthread_getcpuclockid(thread_id)
    except (AttributeError, OSError):
        return None


class _Deadline:
    __slots__ = ("limit", "thread_id", "clock", "cpu_start", "wall_start", "when", "seq", "done", "fired", "deciding")

    def __init__(self, limit: float, thread_id: int, seq: int) -> None:
        self.limit = limit
        self.thread_id = thread_id
        self.clock = _thread_cpu_clock(thread_id)
        self.cpu_start = time.clock_gettime(self.clock) if self.clock is not None else 0.0
        self.wall_start = time.monotonic()
        self.when = self.wall_start + limit  # CPU time never runs ahead of wall time: first check then
        self.seq = seq
        self.done = False
        self.fired = False
        self.deciding = threading.Lock()  # held by the watchdog while it decides; by the owner once done

    def used(self) -> float:
        if self.clock is not None:
            try:
                return time.clock_gettime(self.clock) - self.cpu_start
            except OSError:
                pass
        return time.monotonic() - self.wall_start

    def __lt__(self, other: "_Deadline") -> bool:
        return (self.when, self.seq) < (other.when, other.seq)


class _Watchdog:
    """One daemon thread per process that raises VerifyTimeout in threads that overran their limit.

    Protocol with the guarded thread (`disarm`): the owner sets `done` and then takes the
    deadline's `deciding` lock for good; the watchdog only fires while holding that lock
    (taken without blocking) and only if `done` is unset. So once `disarm` has the lock,
    no exception can be fired any more, and one fired earlier but not yet raised is
    cleared, so a timeout never escapes the guarded block.
    """

    TICK_S = 0.05  # checks are rounded to this grid: few wake-ups however many calls are made

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[_Deadline] = []
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None

    def arm(self, seconds: float) -> _Deadline:
        deadline = _Deadline(seconds, threading.get_ident(), next(self._seq))
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="repexp-verify-watchdog", daemon=True)
                self._thread.start()
            first = not self._heap or deadline < self._heap[0]
            heapq.heappush(self._heap, deadline)
            if first:
                self._cond.notify()
        return deadline

    def disarm(self, deadline: _Deadline) -> None:
        deadline.done = True
        deadline.deciding.acquire()  # waits only while the watchdog is mid-decision (microseconds)
        if deadline.fired:
            _set_async_exc(deadline.thread_id, ctypes.py_object())  # NULL: drop a not-yet-raised timeout

    def _decide(self, deadline: _Deadline) -> Optional[_Deadline]:
        """Fire, drop, or return the deadline to check again later."""
        if not deadline.deciding.acquire(blocking=False):
            return None  # its owner is disarming it
        try:
            if deadline.done:
                return None
            used = deadline.used()
            if used >= deadline.limit:
                deadline.fired = True
                _set_async_exc(deadline.thread_id, ctypes.py_object(VerifyTimeout))
                return None
            deadline.when = time.monotonic() + (deadline.limit - used)
            return deadline
        finally:
            deadline.deciding.release()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                now = time.monotonic()
                head = self._heap[0].when
                if head > now:
                    wake = math.ceil(head / self.TICK_S) * self.TICK_S
                    self._cond.wait(timeout=max(wake - now, 0.0))
                    continue
                due = []
                while self._heap and self._heap[0].when <= now:
                    due.append(heapq.heappop(self._heap))
                for deadline in due:
                    again = self._decide(deadline)
                    if again is not None:
                        heapq.heappush(self._heap, again)

    def reset_after_fork(self) -> None:
        self.__init__()


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG.reset_after_fork)


class time_limit:
    """`with time_limit(seconds):` raises VerifyTimeout in this thread after `seconds` of its CPU time.

    Works in any thread. CPU time (not wall time) so a busy machine does not turn slow
    but legitimate comparisons into timeouts; where a thread CPU clock is unavailable,
    wall time is used. Python-level work is interrupted between bytecodes; a single long
    C call only when it returns (the process pool's wall-clock hard limit covers that).
    `seconds=None` or <= 0 disables the guard.
    """

    def __init__(self, seconds: Optional[float]) -> None:
        self.seconds = seconds
        self._deadline: Optional[_Deadline] = None

    def __enter__(self) -> "time_limit":
        if self.seconds is not None and self.seconds > 0:
            self._deadline = _WATCHDOG.arm(float(self.seconds))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._deadline is not None:
            _WATCHDOG.disarm(self._deadline)


# --------------------------------------------------------------------------- process pool


class _Worker:
    def __init__(self, process: Any, conn: Any) -> None:
        self.process = process
        self.conn = conn
        self.ready = False
        self.inflight: collections.deque = collections.deque()  # indices sent, not yet answered
        self.last_progress = time.monotonic()


def _worker_loop(conn: Any, fn: Callable[[Any], Any], initializer: Optional[Callable[[], Any]]) -> None:
    # Pool workers must not inherit the parent's SIGINT handling of a Ctrl-C: the parent cleans up.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer()
    conn.send(("ready", None, None))
    while True:
        try:
            chunk = conn.recv()
        except EOFError:
            return
        if chunk is None:
            return
        for index, item in chunk:
            try:
                conn.send(("result", index, fn(item)))
            except Exception as err:  # reported to the parent, which raises it with the item
                conn.send(("error", index, f"{type(err).__name__}: {err}"))


class _ProcessPool:
    """Chunked process pool with per-item progress and a hard per-item limit.

    `fn(item)` runs in worker processes (it must be picklable by reference). A worker
    that sends nothing for `hard_timeout` seconds is killed and replaced; the item it
    was working on gets `stuck_value`, the rest of its chunk is re-queued.
    """

    def __init__(
        self,
        fn: Callable[[Any], Any],
        workers: int,
        *,
        hard_timeout: float,
        stuck_value: Any = 0.0,
        start_timeout: float = 120.0,
        mp_context: str = "spawn",
        initializer: Optional[Callable[[], Any]] = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.fn = fn
        self.workers = workers
        self.hard_timeout = hard_timeout
        self.stuck_value = stuck_value
        self.start_timeout = start_timeout
        self.initializer = initializer
        self._ctx = multiprocessing.get_context(mp_context)
        self._pool: list[_Worker] = []
        self.killed = 0  # workers killed for being stuck (reported by benchmarks/tests)

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=_worker_loop, args=(child_conn, self.fn, self.initializer), daemon=True, name="repexp-verify-worker")
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn)

    def _kill(self, worker: _Worker) -> None:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=5)
        worker.conn.close()

    def map(self, items: Sequence[Any], chunk_size: int = 64) -> list[Any]:
        results: list[Any] = [None] * len(items)
        done = [False] * len(items)
        remaining = len(items)
        queue: collections.deque = collections.deque(
            list(range(i, min(i + chunk_size, len(items)))) for i in range(0, len(items), chunk_size)
        )
        while len(self._pool) < min(self.workers, len(queue)):
            self._pool.append(self._spawn())
        while remaining:
            now = time.monotonic()
            for worker in self._pool:
                if worker.ready and not worker.inflight and queue:
                    chunk = queue.popleft()
                    worker.conn.send([(i, items[i]) for i in chunk])
                    worker.inflight.extend(chunk)
                    worker.last_progress = now
            busy = [w for w in self._pool if w.inflight or not w.ready]
            limits = [w.last_progress + (self.hard_timeout if w.ready else self.start_timeout) for w in busy]
            wait_s = max(0.0, min(limits) - now) if limits else 0.1
            ready_conns = multiprocessing.connection.wait([w.conn for w in busy], timeout=wait_s)
            for worker in busy:
                if worker.conn not in ready_conns:
                    continue
                try:
                    while worker.conn.poll():
                        kind, index, payload = worker.conn.recv()
                        worker.last_progress = time.monotonic()
                        if kind == "ready":
                            worker.ready = True
                            continue
                        if kind == "error":
                            raise RuntimeError(f"verifier worker failed on item {items[index]!r:.300}: {payload}")
                        worker.inflight.popleft()
                        if not done[index]:
                            results[index], done[index] = payload, True
                            remaining -= 1
                except (EOFError, OSError):
                    self._replace(worker, queue, results, done, reason="died")
                    remaining = len(items) - sum(done)
            now = time.monotonic()
            for worker in list(self._pool):
                limit = self.hard_timeout if worker.ready else self.start_timeout
                if (worker.inflight or not worker.ready) and now - worker.last_progress > limit:
                    if not worker.ready:
                        raise RuntimeError(f"verifier worker did not start within {self.start_timeout:.0f}s")
                    self._replace(worker, queue, results, done, reason=f"made no progress for {limit:.1f}s")
                    remaining = len(items) - sum(done)
        return results

    def _replace(self, worker: _Worker, queue: collections.deque, results: list, done: list, *, reason: str) -> None:
        """Kill `worker`; its current item scores `stuck_value`, the rest of its chunk is re-queued."""
        self._kill(worker)
        self.killed += 1
        if worker.inflight:
            stuck = worker.inflight.popleft()
            if not done[stuck]:
                results[stuck], done[stuck] = self.stuck_value, True
                logger.warning("verifier worker %s on an item; killed it and scored the item %r", reason, self.stuck_value)
            if worker.inflight:
                queue.appendleft(list(worker.inflight))
        self._pool[self._pool.index(worker)] = self._spawn()

    def close(self) -> None:
        for worker in self._pool:
            try:
                worker.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for worker in self._pool:
            worker.process.join(timeout=2)
            self._kill(worker)
        self._pool = []


def default_workers() -> int:
    """CPUs this process may use (affinity-aware)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class VerifierPool:
    """A reusable process pool for `score_batch` (workers start once, caches stay warm).

    ```
    with VerifierPool(workers=8) as pool:
        scores = pool.score_batch(data_sources, responses, ground_truths)
    ```
    """

    def __init__(
        self,
        workers: Optional[int] = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        hard_timeout: Optional[float] = None,
        mp_context: str = "spawn",
    ) -> None:
        self.workers = default_workers() if workers is None else int(workers)
        self.timeout = float(timeout)
        # Soft (CPU-time) limits fire first; this wall-clock limit only catches a worker stuck in
        # one C call, with slack for a loaded machine.
        self.hard_timeout = float(hard_timeout) if hard_timeout is not None else 3 * self.timeout + 10.0
        self._pool = _ProcessPool(
            _verify_key, self.workers, hard_timeout=self.hard_timeout, mp_context=mp_context, initializer=warm_up
        )

    def map_keys(self, keys: Sequence[tuple]) -> list[float]:
        chunk = max(1, min(256, math.ceil(len(keys) / (4 * self.workers))))
        return self._pool.map(keys, chunk_size=chunk)

    @property
    def killed_workers(self) -> int:
        return self._pool.killed

    def score_batch(self, data_sources: Sequence[str] | str, responses: Sequence[str], ground_truths: Sequence[str]) -> np.ndarray:
        return score_batch(data_sources, responses, ground_truths, timeout=self.timeout, pool=self)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> "VerifierPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


MIN_POOL_ITEMS = 512  # below this many Math-Verify comparisons, starting processes costs more than it saves


def score_batch(
    data_sources: Sequence[str] | str,
    responses: Sequence[str],
    ground_truths: Sequence[str] | str,
    *,
    workers: Optional[int] = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    pool: Optional[VerifierPool] = None,
    min_pool_items: int = MIN_POOL_ITEMS,
) -> np.ndarray:
    """Scores (float64 array of 0/1) for many responses; equal to `[score(...) for ...]`.

    Answers are extracted in this process; only distinct (gold, answer) pairs that need
    Math-Verify are compared, in a process pool when there are at least
    `min_pool_items` of them (or always with a warm `pool`), else in-process.
    `data_sources` / `ground_truths` may be a single string for all responses.
    """
    n = len(responses)
    if isinstance(data_sources, str):
        data_sources = [data_sources] * n
    if isinstance(ground_truths, str):
        ground_truths = [ground_truths] * n
    if len(data_sources) != n or len(ground_truths) != n:
        raise ValueError(
            f"score_batch: {len(data_sources)} data_sources, {n} responses and {len(ground_truths)} ground_truths; lengths must match"
        )
    scores = np.zeros(n, dtype=np.float64)
    pending: dict[tuple, list[int]] = {}
    for i, (source, response, truth) in enumerate(zip(data_sources, responses, ground_truths)):
        fam = family(source)
        if isinstance(truth, int) and not isinstance(truth, bool):
            truth = str(truth)
        _check_str(f"ground_truths[{i}]", truth)
        _check_str(f"responses[{i}]", response)
        gold = _gold_key(fam, truth)
        answer = _extract_gsm8k(response) if fam == GSM8K else _extract_math(response)
        decided = _fast_decision(fam, gold, answer)
        if decided is not None:
            scores[i] = decided
            continue
        key = (gold, answer, float(timeout or 0.0))
        cached = _RESULTS.get(key)
        if cached is not None:
            scores[i] = cached
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
        values = [_verify_key(key) for key in keys]
    for key, value in zip(keys, values):
        _RESULTS.put(key, value)
        scores[pending[key]] = value
    return scores

