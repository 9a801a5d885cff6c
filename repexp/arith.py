"""The built-in arithmetic tasks: `arith` (single-digit `a + b`, `a - b`, `a * b`), `arith-hard`, `arith-mid`.

Why it exists: the README run has to show the method on a 2-core CPU in minutes, with pass@k curves
that are not all zero. On GSM8K a CPU-sized model (SmolLM2-135M-Instruct) solves almost nothing; on
these questions, shown three worked examples, it answers with the bare number in about four tokens
(benchmarks/arith_prompt.py, docs/data.md) and is right about one time in ten, so GRPO and RepExp
have a signal and pass@k rises with k. A demonstration task, not a benchmark.

207 questions (81 sums, 45 differences, 81 products), split with `split_seed` into 48 test, 16 dev
and the rest train; scored by the `arith` verifier family (the last number of the response).

`arith-hard` and `arith-mid`, the GPU pilot's tasks (multi-digit kinds, few-shot prompt,
`final_number` verifier), are the second half of this module. Pure: no framework imports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SYSTEM_PROMPT = "Answer with just the number."  # replaces a chat template's default (longer) system prompt
TEST_SIZE = 48
DEV_SIZE = 16
DIGITS = range(1, 10)


@dataclass(frozen=True)
class Question:
    index: int
    text: str  # "What is 7 + 5?"
    answer: int


# Worked examples shown as earlier chat turns (as arith-hard does): the model copies their form, the
# number alone, instead of explaining until the token cap. Two-digit operands: none is a question.
SHOTS = (("What is 12 + 7?", "19"), ("What is 15 - 6?", "9"), ("What is 11 * 3?", "33"))


def shot_messages(question_text: str, shots=SHOTS) -> list[dict]:
    """A prompt as chat messages: the system instruction, the worked examples, the question (`arith`)."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for question, answer in shots:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return messages + [{"role": "user", "content": question_text}]


def all_questions() -> list[Question]:
    """Every question, in a fixed order (sums, differences, products; a then b ascending)."""
    expressions = [(f"{a} + {b}", a + b) for a in DIGITS for b in DIGITS]
    expressions += [(f"{a} - {b}", a - b) for a in DIGITS for b in DIGITS if a >= b]
    expressions += [(f"{a} * {b}", a * b) for a in DIGITS for b in DIGITS]
    return [Question(i, f"What is {expr}?", value) for i, (expr, value) in enumerate(expressions)]


def split(seed: int) -> dict[str, list[Question]]:
    """Seeded disjoint train/dev/test split of `all_questions()` (each split in question order)."""
    questions = all_questions()
    order = np.random.default_rng(np.random.SeedSequence([seed, 0xA217])).permutation(len(questions))
    test, dev, train = np.split(order, [TEST_SIZE, TEST_SIZE + DEV_SIZE])
    parts = {"train": train, "dev": dev, "test": test}  # in this order: callers unpack the values
    return {name: [questions[i] for i in sorted(idx.tolist())] for name, idx in parts.items()}


# --------------------------------------------------------------------------- arith-hard, arith-mid (the pilot's tasks)
#
# Why: the GPU pilot (configs/pilot.yaml, docs/pilot.md) needs questions on which
# SmolLM2-135M-Instruct is right sometimes but not always (base pass@1 of a few percent, pass@256
# clearly below 1), with enough distinct problems for a test split of more than 500 questions. Single-digit
# `arith` saturates (pass@256 = 1 for the base model); these leave room for exploration to matter.
# Each kind is a finite, enumerable space; the split draws questions without replacement from the
# union of a task's kinds (`KIND_TASKS`), so train, dev and test are disjoint by construction.

TWO_DIGITS = range(10, 100)
SMALL = range(2, 10)  # one-digit factors; 0 and 1 make trivial products

KINDS = {
    # name: (description, generator of (expression, value))
    "one": ("one-digit a + b, a - b (a >= b), a * b: the `arith` questions", lambda: (
        (q.text.removeprefix("What is ").removesuffix("?"), q.answer) for q in all_questions())),
    "add21": ("two-digit + one-digit", lambda: ((f"{a} + {b}", a + b) for a in TWO_DIGITS for b in DIGITS)),
    "sub21": ("two-digit - one-digit", lambda: ((f"{a} - {b}", a - b) for a in TWO_DIGITS for b in DIGITS)),
    "add2": ("two-digit + two-digit", lambda: ((f"{a} + {b}", a + b) for a in TWO_DIGITS for b in TWO_DIGITS)),
    "sub2": ("two-digit - two-digit, a > b",
             lambda: ((f"{a} - {b}", a - b) for a in TWO_DIGITS for b in TWO_DIGITS if a > b)),
    "mul21": ("two-digit * one-digit", lambda: ((f"{a} * {b}", a * b) for a in TWO_DIGITS for b in SMALL)),
    "addmul": ("two-digit + one-digit * one-digit",
               lambda: ((f"{a} + {b} * {c}", a + b * c) for a in TWO_DIGITS for b in SMALL for c in SMALL)),
    "mul22": ("two-digit * two-digit", lambda: ((f"{a} * {b}", a * b) for a in TWO_DIGITS for b in TWO_DIGITS)),
}


def kind_questions(kind: str) -> list[Question]:
    """Every question of one kind, in a fixed order (index = position within the kind)."""
    return [Question(i, f"What is {expr}?", value) for i, (expr, value) in enumerate(KINDS[kind][1]())]


HARD_SYSTEM_PROMPT = SYSTEM_PROMPT
# Worked examples shown as earlier chat turns: the model copies their form (the number alone), so
# answers end in a few tokens instead of running into the token cap. None of them belongs to any
# kind above (three-digit operands, or a one-digit first factor of a two-digit one), so no split
# question is shown.
HARD_SHOTS = (("What is 120 + 35?", "155"), ("What is 6 * 12?", "72"), ("What is 300 - 47?", "253"))


def hard_messages(question_text: str, shots: bool = True) -> list[dict]:
    """The arith-hard/arith-mid prompt as chat messages: the system instruction, the worked examples, the question."""
    return shot_messages(question_text, HARD_SHOTS if shots else ())


# kind: (test, dev, at most this many train questions). Test and dev are balanced over kinds; the
# one-digit kind (base pass@1 0.08 with this prompt, the others 0.006-0.05: docs/pilot.md) gives
# the model more reward signal early on, the multi-digit kinds keep pass@256 below 1. Train is capped
# per kind so that the two largest spaces (add2, sub2) do not drown the others.
HARD_KINDS = {"one": (64, 16, 640), "add21": (96, 32, 640), "sub21": (96, 32, 640), "add2": (96, 32, 640),
              "sub2": (96, 32, 640), "mul21": (96, 32, 640)}
# `arith-mid`: only the kinds whose every question the model can learn from a one-digit step
# (base pass@1 0.01-0.08 each). On arith-hard, GRPO's entropy stopped falling at 0.13-0.2 however
# long it trained, most likely held up by the questions it never solves (docs/pilot.md, "The third
# design"); this task is the candidate on which it can collapse. Same prompt and verifier.
MID_KINDS = {"one": (64, 16, 640), "add21": (224, 48, 640), "sub21": (224, 48, 640)}

# The tasks built from kinds: task -> its kind table. Each task has its own split salt, so the
# same seed gives unrelated permutations for different tasks (arith-hard's is the one it always had).
KIND_TASKS = {"arith-hard": HARD_KINDS, "arith-mid": MID_KINDS}
_SPLIT_SALT = {"arith-hard": 0xA218, "arith-mid": 0xA219}
TASKS = ("arith", *KIND_TASKS)  # every built-in task (they read no data.source)


def kind_split(task: str, seed: int) -> dict[str, list[Question]]:
    """Seeded disjoint train/dev/test split of a kind task's questions (its kinds one after another, indexed
    across them): per kind, a seeded permutation gives its test, then dev, then (up to the cap) train questions."""
    questions: list[Question] = []
    parts: dict[str, list[int]] = {"train": [], "dev": [], "test": []}
    for number, (kind, (test, dev, train)) in enumerate(KIND_TASKS[task].items()):
        start = len(questions)
        questions += [Question(start + q.index, q.text, q.answer) for q in kind_questions(kind)]
        size = len(questions) - start
        if size < test + dev + 1:
            raise ValueError(f"{task} kind {kind}: {size} questions cannot give {test} test + {dev} dev + train")
        salt = np.random.SeedSequence([seed, _SPLIT_SALT[task], number])
        order = start + np.random.default_rng(salt).permutation(size)
        for name, part in zip(("test", "dev", "train"), np.split(order, [test, test + dev, test + dev + train])):
            parts[name] += part.tolist()
    return {name: [questions[i] for i in sorted(idx)] for name, idx in parts.items()}


def task_split(task: str, seed: int) -> dict[str, list[Question]]:
    """The split of any built-in task (`TASKS`)."""
    return split(seed) if task == "arith" else kind_split(task, seed)
