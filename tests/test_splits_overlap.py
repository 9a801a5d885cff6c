"""Train/test overlap by problem text, blind to typesetting; the AIME tasks' response length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repexp import config as C
from repexp import splits

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / ".." / "shared" / "data"


def _rows(name):
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("a,b", [
    ("Let $d$ and $e$ solve $2x^2 + 3x - 5=0$.", "Let $d$ and $e$ solve $2x^{2}+3x-5=0$."),
    ("Let $f$ be linear with $f(6) - f(2) = 12.$ What is $f(12)?$",
     "Let $f$ be linear with $f(6)-f(2)=12$. What is $f(12)$?"),
    ("A parabola  $y = x^2 + bx + c$ passes through $(2,3)$.", "A parabola $y=x^2+bx+c$ passes through $(2,3)$."),
    ("Find $\\left( \\dfrac{1}{2} \\right)^{3}$.", "Find $(\\frac{1}{2})^3$."),
    ("What is \\(3\\,x\\)?", "what is $3x$?"),
])
def test_typesetting_does_not_count(a, b):
    assert splits.normalize_text(a) == splits.normalize_text(b)


@pytest.mark.parametrize("a,b", [
    ("What is $3.5 + 1$?", "What is $35 + 1$?"),  # the decimal point inside a number counts
    ("Evaluate $1,000 - 1$.", "Evaluate $1000 - 1$."),  # so does a thousands comma (kept conservative)
    ("Solve $x^{12} = 1$.", "Solve $x^{1}2 = 1$."),
    ("What is $2 + 3$?", "What is $2 - 3$?"),
    ("Find the points $(2,3)$ and $(4,3)$.", "Find the points $(2,3)$ and $(4,5)$."),
])
def test_content_still_counts(a, b):
    assert splits.normalize_text(a) != splits.normalize_text(b)


def test_the_math_near_duplicates_are_caught_and_nothing_else():
    train, test = _rows("math/train.jsonl"), _rows("math/test.jsonl")
    keep, dropped = splits.drop_overlapping([r["problem"] for r in train], [r["problem"] for r in test])
    assert dropped == [750, 1414, 1598, 2948]  # = test 3023, 1038, 311 (typeset differently) and 4656 (identical)
    assert len(keep) == len(train) - 4
    for i in dropped:  # each is the same problem: the answers agree
        key = splits.normalize_text(train[i]["problem"])
        twin = next(r for r in test if splits.normalize_text(r["problem"]) == key)
        assert twin["answer"] == train[i]["answer"]
    gsm8k_train, gsm8k_test = _rows("gsm8k/train.jsonl"), _rows("gsm8k/test.jsonl")
    assert splits.drop_overlapping([r["question"] for r in gsm8k_train], [r["question"] for r in gsm8k_test])[1] == []


def test_both_aime_tasks_evaluate_with_the_aime_response_length():
    """aime24 used to evaluate (and validate) with 1,024 new tokens: only dapo-with-aime24 had the AIME column."""
    paper = C.load(REPO / "configs" / "paper.yaml")
    paper.sweep.tasks.append("aime24")
    C.check(paper)
    for task in ("aime24", "dapo-with-aime24"):
        rc = C.compose(paper, C.parse_run(task, "verl_repexp_k128_b0.01_s41"))
        assert rc.train.max_response_length == rc.eval.max_new_tokens == 8192, task
        assert rc.train.max_prompt_length == 2048 and C.task_sweep(paper, task)["repexp"].sparse_dim == [128]
    assert paper.task_overrides["aime24"] == paper.task_overrides["dapo-with-aime24"]
    for task in ("math", "gsm8k"):
        assert C.compose(paper, C.parse_run(task, "verl_grpo_s41")).eval.max_new_tokens == 1024
