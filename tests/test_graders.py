"""The two graders: accuracy on the labelled agreement corpus, and the paper grader = verl's own scorers.

The corpus (`tests/data/agreement_corpus.jsonl`, rules in `tests/data/make_agreement_corpus.py`
and docs/data.md) is labelled by construction. The paper grader must agree with verl 0.9.1's
functions on every item and on every shipped reference solution; verl's Math-Verify scorer is
called through `_verify_in_subprocess`, the function its `compute_score` runs in a worker process
(the wrapper adds only the process pool and a 30 s timeout).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from repexp import verify
from repexp.verify import paper, routing

CORPUS = Path(__file__).resolve().parent / "data" / "agreement_corpus.jsonl"
DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
MATH, MATH500, GSM8K = "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "openai/gsm8k"


def _rows(name):
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def corpus():
    return [json.loads(line) for line in CORPUS.read_text().splitlines()]


def _verl_module(name: str):
    """verl's `utils/reward_score/<name>.py`, loaded from the installed wheel without importing the verl
    package (whose `__init__` pulls in torch and Ray: ~10-20 s here); the three files import nothing from verl."""
    import importlib.util

    package = importlib.util.find_spec("verl")
    assert package is not None and package.origin, "verl is not installed"
    path = Path(package.origin).parent / "utils" / "reward_score" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_verl_reward_score_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def verl_scorers():
    """verl 0.9.1's scorers, called the way the recipe's `default_compute_score` routes them."""
    gsm8k, math_reward, verl_math_verify = (_verl_module(n) for n in ("gsm8k", "math_reward", "math_verify"))

    def score(data_source, response, ground_truth):
        kind = routing.paper_scorer(data_source)
        with contextlib.redirect_stdout(io.StringIO()):  # math_reward prints the exceptions it swallows
            if kind == routing.GSM8K_STRICT:
                return float(gsm8k.compute_score(response, ground_truth))
            if kind == routing.HENDRYCKS:
                return float(math_reward.compute_score(response, ground_truth))
            return float(verl_math_verify._verify_in_subprocess("\\boxed{" + ground_truth + "}", response))

    score.strip_string = math_reward.strip_string
    return score


def test_corpus_is_large_and_covers_the_three_tasks(corpus):
    counts = Counter(row["task"] for row in corpus)
    assert len(corpus) >= 500 and min(counts[t] for t in ("math", "gsm8k", "aime")) >= 100, counts
    assert {row["label"] for row in corpus} == {0, 1}
    assert len({row["id"] for row in corpus}) == len(corpus)


def test_repexp_grader_accuracy_on_clear_items(corpus, capsys):
    scores = verify.score_batch([r["data_source"] for r in corpus], [r["response"] for r in corpus],
                                [r["ground_truth"] for r in corpus], workers=1)
    lines, wrong = [], []
    for task in ("math", "gsm8k", "aime"):
        idx = [i for i, r in enumerate(corpus) if r["task"] == task and r["clear"]]
        misses = [corpus[i] for i in idx if scores[i] != corpus[i]["label"]]
        wrong += misses
        lines.append(f"  {task:<6} {len(idx) - len(misses):>4}/{len(idx):<4} = {1 - len(misses) / len(idx):.4f}")
    clear = [i for i, r in enumerate(corpus) if r["clear"]]
    accuracy = 1 - len(wrong) / len(clear)
    with capsys.disabled():
        print("\nrepexp grader vs labels (clear-cut items):\n" + "\n".join(lines) + f"\n  all    {accuracy:.4f}")
    assert accuracy >= 0.995, [(r["id"], r["rule"]) for r in wrong]
    # the batch path and the one-response path agree
    sample = corpus[::25]
    assert [verify.score(r["data_source"], r["response"], r["ground_truth"]) for r in sample] == \
        [scores[corpus.index(r)] for r in sample]


def test_paper_grader_equals_verl_on_the_corpus(corpus, verl_scorers):
    ours = verify.score_batch([r["data_source"] for r in corpus], [r["response"] for r in corpus],
                              [r["ground_truth"] for r in corpus], grader="paper", workers=1)
    theirs = np.array([verl_scorers(r["data_source"], r["response"], r["ground_truth"]) for r in corpus])
    differ = [(r["id"], r["rule"], ours[i], theirs[i]) for i, r in enumerate(corpus) if ours[i] != theirs[i]]
    assert differ == []
    # the one-response path agrees with the batch path
    assert all(verify.score(r["data_source"], r["response"], r["ground_truth"], grader="paper") == ours[i]
               for i, r in enumerate(corpus) if i % 10 == 0)


def test_paper_grader_equals_verl_on_the_shipped_solutions(verl_scorers):
    """Every MATH/GSM8K reference solution against its own gold and against another problem's gold."""
    rng = np.random.default_rng(0)
    cases = []
    for name, source in (("math/train.jsonl", MATH), ("math/test.jsonl", MATH), ("math500/test.jsonl", MATH500)):
        rows = [r for r in _rows(name) if r["answer"].strip()]
        others = rng.permutation(len(rows))
        cases += [(source, r["solution"], r["answer"]) for r in rows]
        cases += [(source, r["solution"], rows[j]["answer"]) for r, j in zip(rows, others)]
    for name in ("gsm8k/train.jsonl", "gsm8k/test.jsonl"):
        rows = _rows(name)
        golds = [r["answer"].split("####")[-1].strip().replace(",", "") for r in rows]
        others = rng.permutation(len(rows))
        cases += [(GSM8K, r["answer"], g) for r, g in zip(rows, golds)]
        cases += [(GSM8K, r["answer"], golds[j]) for r, j in zip(rows, others)]
    for r in _rows("aime24/test.jsonl"):
        cases.append(("aime24", r["solution"], str(r["answer"])))
    differ = [(s, g, resp[-80:]) for s, resp, g in cases
              if verify.score(s, resp, g, grader="paper") != verl_scorers(s, resp, g)]
    assert differ == []
    assert len(cases) > 40_000


def test_hendrycks_normalisation_equals_strip_string_on_every_gold(verl_scorers):
    golds = {r["answer"] for name in ("math/train.jsonl", "math/test.jsonl") for r in _rows(name)}
    for gold in golds:
        try:
            expected = verl_scorers.strip_string(gold)
        except Exception:
            expected = "<raises>"
        try:
            got = paper.hendrycks_normalize(gold)
        except paper._Unreadable:
            got = "<raises>"
        assert got == expected, gold


# Inputs that exercise every branch of Hendrycks' extractor and normaliser, quirks included.
HENDRYCKS_EDGES = [
    ("\\boxed{5}", "5"), ("\\boxed 5$.", "5"), ("\\boxed{5} and \\boxed 6", "6"), ("\\boxed 6 then \\boxed{5}", "5"),
    ("\\fbox{5}", "5"), ("\\boxed{5", "5"), ("\\boxed}{5}", "5"), ("\\boxed\\frac{1}{2}", "\\frac{1}{2}"),
    ("\\boxedsymbol{5}", "5"), ("\\boxed{\\frac12}", "\\frac{1}{2}"), ("\\boxed{\\frac1{72}}", "\\frac{1}{72}"),
    ("\\boxed{\\frac{1}2}", "\\frac{1}{2}"), ("\\boxed{\\frac1}", "1"), ("\\boxed{\\frac}", "\\frac"),
    ("\\boxed{\\sqrt3}", "\\sqrt{3}"), ("\\boxed{2\\sqrt}", "2"), ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{.5}", "\\frac12"), ("\\boxed{1/2}", "\\frac{1}{2}"), ("\\boxed{1/2/3}", "1/2/3"),
    ("\\boxed{-1/2}", "\\frac{-1}{2}"), ("\\boxed{01/2}", "\\frac{1}{2}"), ("\\boxed{k = 3}", "3"),
    ("\\boxed{abc = 3}", "3"), ("\\boxed{x=y=3}", "3"), ("\\boxed{10\\text{ cm}}", "10"),
    ("\\boxed{10\\text{ cm}\\text{ s}}", "10"), ("\\boxed{10\\text{ cm}\\text{ s}}", "10\\text{ cm}\\text{ s}"),
    ("\\boxed{50\\%}", "50"), ("\\boxed{50\\\\%}", "50"), ("\\boxed{90^\\circ}", "90"), ("\\boxed{90^{\\circ}}", "90"),
    ("\\boxed{\\left( 1,2 \\right)}", "(1,2)"), ("\\boxed{\\$5}", "5"), ("\\boxed{\\dfrac{1}{2}}", "\\tfrac12"),
    ("\\boxed{a\\!b}", "ab"), ("\\boxed{1 \\\\ 2}", "1\\2"), ("\\boxed{x\n+1}", "x+1"), ("\\boxed{}", ""),
    ("no box at all", "5"), ("\\boxed{ .5}", "0.5"), ("\\boxed{{.5}}", "{0.5}"), ("\\boxed{\\frac{a}{b}}", "a/b"),
]


@pytest.mark.parametrize("response,gold", HENDRYCKS_EDGES)
def test_hendrycks_edges_match_verl(response, gold, verl_scorers):
    assert verify.score(MATH, response, gold or "x", grader="paper") == verl_scorers(MATH, response, gold or "x")


def test_hendrycks_and_strict_gsm8k_match_verl_on_random_strings(verl_scorers):
    """A seeded fuzz over the characters and commands the normalisers treat specially."""
    tokens = ["\\boxed{", "\\boxed ", "\\fbox{", "{", "}", "$", "\\frac", "\\dfrac", "\\sqrt", "\\text{ ", "\\left",
              "\\right", "^\\circ", "\\%", "\\$", "=", "/", ".", " ", "\n", "\\!", "\\\\", "1", "2", "0", "5", "x",
              "k", "-", ",", "#### ", "####", "7.", "1,000"]
    rng = np.random.default_rng(16)
    for _ in range(3000):
        text = "".join(tokens[int(k)] for k in rng.integers(len(tokens), size=int(rng.integers(1, 14))))
        gold = "".join(tokens[int(k)] for k in rng.integers(len(tokens), size=int(rng.integers(1, 5)))).strip() or "1"
        # the scorers themselves: input validation (an empty gold is an error) is repexp's, not verl's
        assert paper.hendrycks(text, gold) == verl_scorers(MATH, text, gold), (text, gold)
        for truth in ("1000", "7.", "5"):
            assert paper.gsm8k_strict(text, truth) == verl_scorers(GSM8K, text, truth), (text, truth)


def test_paper_routing_follows_the_recipe():
    assert routing.paper_scorer("openai/gsm8k") == routing.GSM8K_STRICT
    for source in ("DigitalLearningGmbH/MATH-lighteval", "lighteval/MATH", "HuggingFaceH4/MATH-500"):
        assert routing.paper_scorer(source) == routing.HENDRYCKS
    for source in ("math_dapo", "math", "math_dapo_reasoning", "aime24", "aime_2024", "MathArena/aime_2024_I"):
        assert routing.paper_scorer(source) == routing.MATH_VERIFY
    with pytest.raises(ValueError, match="unknown data_source"):
        verify.score("squad", "x", "1", grader="paper")
    with pytest.raises(ValueError, match="unknown grader"):
        verify.score(GSM8K, "#### 1", "1", grader="verl")


def test_paper_grader_is_strict_where_the_paper_was():
    """The documented differences, one per class (docs/data.md)."""
    assert verify.score(GSM8K, "#### 18.00", "18", grader="paper") == 0.0
    assert verify.score(GSM8K, "#### $18", "18", grader="paper") == 0.0
    assert verify.score(GSM8K, "#### 18", "18", grader="paper") == 1.0
    assert verify.score(MATH, "\\boxed{\\begin{bmatrix}1\\\\2\\end{bmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}",
                        grader="paper") == 0.0
    assert verify.score(MATH, "\\fbox{5}", "5", grader="paper") == 0.0
    assert verify.score("aime24", "the answer is 33", "33", grader="paper") == 1.0  # Math-Verify reads prose
    assert verify.score("aime24", "\\boxed{33 = m+n}", "33", grader="paper") == 0.0


@pytest.mark.timeout(120)
def test_paper_math_verify_is_guarded_by_the_time_limit():
    long_prefix = "Let me think about this step by step. " * 40_000
    assert verify.score("aime24", long_prefix + "\\boxed{33}", "33", grader="paper") == 1.0
    assert verify.score("aime24", "\\boxed{9^{9^{9^{9}}}}", "33", grader="paper", timeout=0.5) == 0.0
    assert verify.score("aime24", "\\boxed{\\prod_{k=1}^{10^{9}} k}", "33", grader="paper", timeout=0.5) == 0.0
