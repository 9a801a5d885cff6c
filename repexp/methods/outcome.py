"""Outcome-based exploration (Song, Kempe, Munos, arXiv 2509.06941, §3): an exploration bonus on final
answers, never on the reasoning that led to them (docs/methods.md).

Historical exploration (the paper's UCB variants). N(x, a) counts how often answer a to question x was
sampled over training so far; the bonus of a rollout with answer a is

    b_ucb(x, a) = min{1, 1/sqrt(N(x, a))}          (N = 0 gives 1)

with a baseline (`outcome_baseline`): `constant` (UCB-Con, the paper's best: b_ucb − b0, so an answer
seen more than 1/b0² times is penalised; b0 = 0.5 penalises answers seen more than 4 times), `mean`
(UCB-Mean: b_ucb minus its mean over the rollouts of the same prompt group) or `none` (naive UCB).
N is read BEFORE the step's rollouts are counted (that is what min{1, ·} is for: a new answer has
N = 0), then the step's answers are added (`AnswerCounts.update`); two rollouts of one step with the
same new answer both get the full bonus.

Batch exploration. Within the group of n rollouts of one prompt,

    b_batch(i) = −(1/n) · #{j ≠ i : a_j = a_i}

Both are scaled by c (`outcome_c`) and given to EVERY rollout, correct or not (the paper's objective
adds c·b to every sampled response). Where the term goes: the paper adds it to GRPO's advantage,
after the group normalisation (objective of §3: (1/n) Σ_i Â_i + c·b(x, a_i) − β·KL). Added to the
reward before the group normalisation instead, a constant shift per group cancels: UCB-Con's b0 and
UCB-Mean's baseline would have no effect, and the rest would be divided by the group's reward std.
`outcome_bonus` returns the term; the backend adds it where the method's hook says (docs/methods.md).

Answers. A rollout's answer is its final answer under the run's grader, in canonical form
(`final_answer`; the same key as maj@k voting). Two answers are one outcome when their canonical strings
are equal (no symbolic equivalence). A response without an extracted answer has answer None, and None
is one outcome of its own (“no answer”), counted and matched like any answer: its bonus shrinks, or its
batch penalty grows, as it repeats, so a policy gains nothing by giving no answer.

State. `AnswerCounts` is training state: `state_dict()` is JSON-serialisable and `load_state_dict`
restores it exactly, so a resumed run computes the bonuses of the uninterrupted one.

Pure: standard library and numpy at import; torch and repexp.verify inside the functions.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from repexp.methods.base import Method, param

OUTCOME_MODES = ("historical", "batch")
BASELINES = ("constant", "mean", "none")  # UCB-Con, UCB-Mean, naive UCB (historical mode only)
STATE_FORMAT = 1


@dataclass(frozen=True)
class Params:
    outcome_mode: str = param("historical", help="historical (UCB bonus on per-question answer counts over "
                              "training) or batch (penalty on answers repeated within a prompt's group)",
                              enum=OUTCOME_MODES)
    outcome_c: float = param(1.0, help="bonus coefficient c (the term added is c·b)", exclusiveMinimum=0)
    outcome_baseline: str = param("constant", help="historical mode: baseline subtracted from "
                                  "min{1, 1/sqrt(N)}: constant b0 (UCB-Con, the paper's best), mean over the "
                                  "prompt's group (UCB-Mean) or none (naive UCB)", enum=BASELINES)
    outcome_b0: float = param(0.5, help="historical mode, constant baseline: b0 (0.5 penalises answers seen "
                              "more than 4 times)", minimum=0, maximum=1)


# --------------------------------------------------------------------------- answers


def final_answer(data_source: str, response: str, grader: str) -> Optional[str]:
    """The response's final answer in canonical form under `grader` (the maj@k voting key of
    `repexp.verify.scoring.extract_answer`), or None when it has none."""
    from repexp.verify.scoring import extract_answer

    return extract_answer(data_source, response, grader=grader)


# --------------------------------------------------------------------------- historical exploration


def ucb_bonus(count: int) -> float:
    """min{1, 1/sqrt(N)}: 1 for an answer never seen (N = 0)."""
    if count < 0:
        raise ValueError(f"an answer count is never negative, got {count}")
    return 1.0 if count <= 1 else 1.0 / math.sqrt(count)


def _check_rows(name: str, values: Sequence[Any], size: int) -> None:
    if len(values) != size:
        raise ValueError(f"{len(values)} {name} for {size} rows: expected one per row")


def _group_means(values: list[float], groups: Sequence[Hashable]) -> list[float]:
    sums: dict[Hashable, float] = {}
    sizes: Counter = Counter(groups)
    for value, group in zip(values, groups):
        sums[group] = sums.get(group, 0.0) + value
    return [sums[group] / sizes[group] for group in groups]


class AnswerCounts:
    """Per question key, how often each final answer (None: no answer) was sampled over training."""

    def __init__(self) -> None:
        self._counts: dict[str, Counter] = {}

    def __len__(self) -> int:  # the questions seen
        return len(self._counts)

    def count(self, question_key: str, answer: Optional[str]) -> int:
        counts = self._counts.get(question_key)
        return 0 if counts is None else counts[answer]

    def raw_bonus(self, question_keys: Sequence[str], answers: Sequence[Optional[str]]) -> Any:
        """min{1, 1/sqrt(N(x, a))} per row from the counts as they are (float64 tensor)."""
        import torch

        _check_rows("answers", answers, len(question_keys))
        return torch.tensor([ucb_bonus(self.count(q, a)) for q, a in zip(question_keys, answers)],
                            dtype=torch.float64)

    def bonus(self, question_keys: Sequence[str], answers: Sequence[Optional[str]], c: float, *,
              baseline: str = "constant", b0: float = 0.5, groups: Optional[Sequence[Hashable]] = None) -> Any:
        """c·(min{1, 1/sqrt(N)} − baseline) per row (float64 tensor), N read before this step's rollouts
        are counted; the counts are not changed (`update` adds the step). `baseline`: constant (b0), mean
        (over the rows of one group; `groups` default to the question keys) or none."""
        import torch

        raw = self.raw_bonus(question_keys, answers)
        if baseline == "constant":
            shifted = raw - float(b0)
        elif baseline == "mean":
            groups = question_keys if groups is None else groups
            _check_rows("group ids", groups, len(question_keys))
            shifted = raw - torch.tensor(_group_means(raw.tolist(), groups), dtype=torch.float64)
        elif baseline == "none":
            shifted = raw
        else:
            raise ValueError(f"outcome_baseline: unknown baseline {baseline!r} (known: {', '.join(BASELINES)})")
        return float(c) * shifted

    def update(self, question_keys: Sequence[str], answers: Sequence[Optional[str]]) -> None:
        """Count the step's rollouts: N(x, a) += 1 per row."""
        _check_rows("answers", answers, len(question_keys))
        for question, answer in zip(question_keys, answers):
            if not isinstance(question, str):
                raise TypeError(f"question keys are strings, got {type(question).__name__}")
            if answer is not None and not isinstance(answer, str):
                raise TypeError(f"answers are strings or None, got {type(answer).__name__}")
            self._counts.setdefault(question, Counter())[answer] += 1

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable: {"format": 1, "counts": {question: [[answer or null, count], ...]}}, sorted."""
        return {"format": STATE_FORMAT,
                "counts": {q: sorted(([a, n] for a, n in counts.items()), key=lambda pair: (pair[0] is not None,
                                                                                             pair[0] or ""))
                           for q, counts in sorted(self._counts.items())}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"answer counts of format {state.get('format')!r}; this version reads {STATE_FORMAT}")
        counts: dict[str, Counter] = {}
        for question, pairs in state["counts"].items():
            counter = Counter()
            for answer, n in pairs:
                if (answer is not None and not isinstance(answer, str)) or not isinstance(n, int) or n < 1:
                    raise ValueError(f"bad answer count {[answer, n]!r} for question {question!r}")
                counter[answer] = n
            counts[str(question)] = counter
        self._counts = counts


# --------------------------------------------------------------------------- batch exploration


def batch_bonus(groups: Sequence[Hashable], answers: Sequence[Optional[str]], c: float) -> Any:
    """c·b_batch per row (float64 tensor): −c/n × the number of OTHER rows of the row's group (n rows)
    with the same answer (None matches None)."""
    import torch

    _check_rows("answers", answers, len(groups))
    sizes: Counter = Counter(groups)
    same: Counter = Counter(zip(groups, answers))
    return torch.tensor([0.0 - float(c) * (same[(g, a)] - 1) / sizes[g] for g, a in zip(groups, answers)],
                        dtype=torch.float64)


# --------------------------------------------------------------------------- the method's term


def outcome_bonus(params: Params, *, groups: Sequence[Hashable], question_keys: Sequence[str],
                  answers: Sequence[Optional[str]], scores: Any, state: Optional[AnswerCounts]
                  ) -> tuple[Any, dict[str, float]]:
    """The exploration term of every rollout (float64 tensor (B,)) and the step's metrics.

    Every rollout gets it, correct or not (module docstring: the paper adds it to the advantage after
    GRPO's group normalisation). Historical mode reads `state` (an `AnswerCounts`) and then counts the
    step's answers into it; batch mode needs no state. `scores`: the verifier scores, for the metrics."""
    import torch

    from repexp import metrics as M

    size = len(groups)
    _check_rows("question keys", question_keys, size)
    _check_rows("answers", answers, size)
    scores = torch.as_tensor(scores).reshape(-1)
    _check_rows("scores", scores, size)
    if params.outcome_mode == "historical":
        if not isinstance(state, AnswerCounts):
            raise TypeError("outcome_mode historical needs its AnswerCounts state")
        bonus = state.bonus(question_keys, answers, params.outcome_c, baseline=params.outcome_baseline,
                            b0=params.outcome_b0, groups=groups)
        state.update(question_keys, answers)
    elif params.outcome_mode == "batch":
        bonus = batch_bonus(groups, answers, params.outcome_c)
    else:
        raise ValueError(f"outcome_mode: unknown mode {params.outcome_mode!r} (known: {', '.join(OUTCOME_MODES)})")
    if size == 0:
        return bonus, {}
    per_group: dict[Hashable, set] = {}
    for group, answer in zip(groups, answers):
        per_group.setdefault(group, set()).add(answer)
    metrics = {**M.summary(M.OUTCOME_BONUS, bonus.numpy()),
               M.OUTCOME_DISTINCT_ANSWERS: sum(len(s) for s in per_group.values()) / len(per_group),
               M.OUTCOME_NO_ANSWER_FRAC: sum(a is None for a in answers) / size}
    if state is not None and params.outcome_mode == "historical":
        metrics[M.OUTCOME_QUESTIONS_SEEN] = float(len(state))
    return bonus, metrics


METHOD = Method(name="outcome", params=Params, run_name="{backend}_outcome_{outcome_mode}_c{outcome_c}_s{seed}",
                label="Outcome exploration", color="#8172b3", marker="D", hooks=("reward",),
                point_text=lambda p: f"{p.outcome_mode}, c={p.outcome_c:g}")
