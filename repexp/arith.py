"""The built-in arithmetic task `arith`: single-digit `a + b`, `a - b` (a ≥ b) and `a * b` questions.

Why it exists: the README run has to show the method on a 2-core CPU in minutes, with pass@k
curves that are not all zero. On GSM8K a CPU-sized model (SmolLM2-135M-Instruct, offline) solves
almost nothing and needs hundreds of tokens per answer; on these questions it answers in about ten
tokens and is right about one time in five (measured: docs/data.md), so GRPO and RepExp have a
signal to work with and pass@k rises with k. It is a demonstration task, not a benchmark: no
paper number refers to it.

Every problem exists once: 81 sums, 45 differences, 81 products = 207 questions. The split is
seeded (`split_seed`): 48 test, 16 dev, the rest train, disjoint by construction. The answer is
scored by the `arith` verifier family (the last number of the response; `repexp.verify`). Pure:
no framework imports.
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
    test = sorted(order[:TEST_SIZE].tolist())
    dev = sorted(order[TEST_SIZE:TEST_SIZE + DEV_SIZE].tolist())
    train = sorted(order[TEST_SIZE + DEV_SIZE:].tolist())
    return {name: [questions[i] for i in idx] for name, idx in (("train", train), ("dev", dev), ("test", test))}
