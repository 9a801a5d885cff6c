"""Every metric name repexp logs, defined once, and the metric dicts both trainer backends build.

One spelling everywhere: what a trainer writes to `metrics.jsonl` and `best_dev.json` is what MLflow
shows. MLflow forbids '@' in names, so pass@k is always `pass_at_<k>`, under its split:

    dev/pass_at_<k>                    training validation, both backends (best-dev selection: dev/pass_at_1)
    dev/num_problems, dev/samples_per_problem, dev/best_step
    test/pass_at_<k>, test/pass_at_<k>_sem, test/maj_at_<k>, test/mean_at_n, test/<scalar>
                                       eval node runs (`eval_metrics` reads them from an eval.json);
                                       sweep-point parents (aggregate) for k = 1, 16, 256, n
    test/pass_at_k_curve.json          the full curve k = 1..n (an MLflow table on eval runs)
    <split>/pass_at_k, <split>/pass_at_k_<grader>
                                       pass@k against k: one metric whose step is k (every evaluated k), so
                                       MLflow's line chart draws the curve; eval runs (test/, and the other
                                       grader's `test/pass_at_k_<grader>`), select runs (dev/: the selected
                                       checkpoint's dev curve)
    testtime/pass_at_k_{repexp,random} the same for test-time RepExp's two orders (testtime runs)
    testtime/pass_at_<k>_repexp, testtime/pass_at_<k>_random, testtime/efficiency_at_<k>,
    testtime/samples_to_correct_{repexp,random,ratio}                    testtime node runs, parents
                                       (`testtime_metrics` reads them from a testtime.json)
    best_dev_value                     select node runs, at the selected step

Per training step, both backends (`bonus_metrics`, `group_metrics`, `rollout_diversity`, `dev_metrics`
below):

    repexp/bonus_raw/{mean,std,min,max}     the elliptical bonus before the turn-off rules and β
    repexp/bonus_scaled/{mean,std,min,max}  β × the bonus after the turn-off rules (added to the reward)
    repexp/bonus_turned_off_frac, repexp/hidden_norm/mean
    repexp/groups/{none,some,all}_correct_frac, reward/verifier/mean, reward/shaped/mean
    rollout/distinct_frac, rollout/all_correct_identical_frac (`rollout_diversity`); TRL also
    rollout/distinct_answers
    timing_s/repexp_forward, timing_s/repexp_bonus  (verl: its timers of these names), timing_s/step,
    timing_s/testing

A statistic of no rows is left out (never logged as 0). verl's own metrics keep verl's names; the
TRL backend maps TRL's names onto them (`TRL_TO_VERL`).

Pure: numpy and repexp.passk.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from typing import Any, Optional

import numpy as np

DEV = "dev"
TEST = "test"
TESTTIME = "testtime"

# --------------------------------------------------------------------------- pass@k and eval scalars


def pass_at_k(split: str, k: int) -> str:
    """`dev/pass_at_1`, `test/pass_at_16`."""
    return f"{split}/pass_at_{int(k)}"


def pass_at_k_sem(split: str, k: int) -> str:
    return f"{pass_at_k(split, k)}_sem"


def maj_at_k(split: str, k: int) -> str:
    return f"{split}/maj_at_{int(k)}"


def split_metric(split: str, name: str) -> str:
    """An eval scalar under its split: `test/mean_at_n`, `test/num_problems`, ..."""
    return f"{split}/{name}"


def pass_at_k_curve(split: str, grader: Optional[str] = None) -> str:
    """`test/pass_at_k`: pass@k logged at step = k, so MLflow draws it against k (the per-k metrics stay
    for the runs table); `test/pass_at_k_paper`: under another grader than the eval's own."""
    return f"{split}/pass_at_k" + (f"_{grader}" if grader else "")


def pass_at_k_table(split: str) -> str:  # the full curve, k = 1..n (an MLflow table)
    return split_metric(split, "pass_at_k_curve.json")


# --------------------------------------------------------------------------- training

DEV_SELECTION = pass_at_k(DEV, 1)  # the metric best-dev selection maximises
DEV_NUM_PROBLEMS = split_metric(DEV, "num_problems")
DEV_SAMPLES_PER_PROBLEM = split_metric(DEV, "samples_per_problem")
DEV_BEST_STEP = split_metric(DEV, "best_step")
BEST_DEV_VALUE = "best_dev_value"  # select: the selected checkpoint's dev value

BONUS_RAW = "repexp/bonus_raw"
BONUS_SCALED = "repexp/bonus_scaled"
STATISTICS = ("mean", "std", "min", "max")
BONUS_TURNED_OFF = "repexp/bonus_turned_off_frac"
HIDDEN_NORM_MEAN = "repexp/hidden_norm/mean"
REWARD_VERIFIER_MEAN = "reward/verifier/mean"
REWARD_SHAPED_MEAN = "reward/shaped/mean"
GROUP_STATUSES = ("none_correct", "some_correct", "all_correct")
POLICY_ENTROPY = "actor/entropy"  # verl's name; TRL's `entropy` maps onto it (TRL_TO_VERL)
# Rollout diversity: per prompt group, the number of distinct responses (token-identical ones count
# once) over n, averaged over the step's groups. 1 = every rollout differs; 1/n = all identical.
DISTINCT_FRACTION = "rollout/distinct_frac"
# Of the step's all-correct groups (every rollout's verifier score > 0, the rule of
# repexp/groups/all_correct_frac), the fraction whose rollouts are all token-identical: there the
# group-normalised bonus has no spread (every rollout has the same features), whatever β is. Left out
# of a step without an all-correct group.
ALL_CORRECT_IDENTICAL_FRACTION = "rollout/all_correct_identical_frac"
# Distinct final answers per prompt group (the run's grader's extraction, `repexp.methods.outcome.
# final_answer`; no answer counts as one outcome), mean over the step's groups: 1 = one answer per group.
DISTINCT_ANSWERS = "rollout/distinct_answers"

TIMING_PREFIX = "timing_s/"  # verl's prefix of its timers (`marked_timer(name)` -> timing_s/<name>)
TIMER_REPEXP_FORWARD = "repexp_forward"  # the frozen model's forward
TIMER_REPEXP_BONUS = "repexp_bonus"  # projection, bonus and reward shaping
TIMER_STEP = "step"
TIMER_TESTING = "testing"  # validation


def timing(timer: str) -> str:
    return f"{TIMING_PREFIX}{timer}"


def statistic(prefix: str, name: str) -> str:
    return f"{prefix}/{name}"


def group_fraction(status: str) -> str:
    """`repexp/groups/none_correct_frac`: the fraction of prompt groups with that status."""
    return f"repexp/groups/{status}_frac"


# TRL/transformers log keys -> verl's name for the same quantity (others are kept as TRL names them)
TRL_TO_VERL = {
    "loss": "actor/pg_loss",
    "grad_norm": "actor/grad_norm",
    "learning_rate": "actor/lr",
    "entropy": POLICY_ENTROPY,
    "clip_ratio/region_mean": "actor/pg_clipfrac",
    "completions/mean_length": "response_length/mean",
    "completions/max_length": "response_length/max",
    "completions/min_length": "response_length/min",
    "completions/clipped_ratio": "response_length/clip_ratio",
}
# TRL's reward statistics describe what the reward function returns, here the group-normalised
# advantage (mean 0, std 1 by construction); reward/shaped/mean and reward/verifier/mean replace them.
TRL_DROPPED = ("reward", "reward_std", "rewards/repexp/mean", "rewards/repexp/std")

# --------------------------------------------------------------------------- test-time RepExp


def testtime_pass_at_k(k: int, order: str) -> str:
    """pass@k of the samples taken in `order` (repexp | random)."""
    return f"{TESTTIME}/pass_at_{int(k)}_{order}"


def testtime_pass_at_k_curve(order: str) -> str:
    """`testtime/pass_at_k_repexp`: pass@k of the samples taken in `order`, at step = k."""
    return f"{TESTTIME}/pass_at_k_{order}"


_EVAL_SCALARS = ("mean_at_n", "num_problems", "mean_response_tokens", "truncated_fraction")


def eval_metrics(result: dict[str, Any]) -> dict[str, float]:
    """Flat MLflow metrics of one `eval.json`, under its split: `<split>/pass_at_<k>` for every
    evaluated k, `<split>/pass_at_<k>_sem`, `<split>/maj_at_<k>`, and the scalars (`<split>/mean_at_n`,
    `num_problems`, `n_samples`, `mean_response_tokens`, `truncated_fraction`,
    `samples_to_first_correct_<name>`). Undefined values (a one-problem SEM, maj@k when not computed)
    are left out. Here, beside `testtime_metrics`, so the tracking layer reads a stage's output
    without importing the stage."""
    split = result.get("split") or "test"
    out: dict[str, float] = {}
    for key, name in (("pass_at_k", pass_at_k), ("pass_at_k_sem", pass_at_k_sem), ("maj_at_k", maj_at_k)):
        per_k = {int(k): float(v) for k, v in (result.get(key) or {}).items() if v is not None}
        out.update({name(split, k): value for k, value in sorted(per_k.items())})
    scalars = {key: float(result[key]) for key in _EVAL_SCALARS if result.get(key) is not None}
    scalars.update({f"samples_to_first_correct_{name}": float(value)
                    for name, value in (result.get("samples_to_first_correct") or {}).items() if value is not None})
    if isinstance(result.get("n_samples"), int):
        scalars["n_samples"] = float(result["n_samples"])
    out.update({split_metric(split, name): value for name, value in scalars.items()})
    return out


def _per_k(values: Any) -> dict[int, float]:
    return {int(k): float(v) for k, v in sorted((values or {}).items(), key=lambda kv: int(kv[0])) if v is not None}


def eval_curves(result: dict[str, Any]) -> dict[str, dict[int, float]]:
    """pass@k against k of one `eval.json` ({metric: {k: value}}, logged at step = k): the eval's own
    grader as `<split>/pass_at_k`, each other grader as `<split>/pass_at_k_<grader>`."""
    split = result.get("split") or "test"
    curves = {pass_at_k_curve(split): _per_k(result.get("pass_at_k"))}
    for grader, curve in sorted((result.get("graders") or {}).items()):
        if grader != result.get("grader"):
            curves[pass_at_k_curve(split, grader)] = _per_k(curve.get("pass_at_k"))
    return {name: curve for name, curve in curves.items() if curve}


def dev_curve(entry: dict[str, Any]) -> dict[str, dict[int, float]]:
    """`dev/pass_at_k` against k of one dev evaluation (a `best_dev.json` history entry)."""
    found = {int(m.group(1)): float(v) for key, v in entry.items()
             if (m := re.fullmatch(rf"{DEV}/pass_at_(\d+)", key)) and v is not None}
    return {pass_at_k_curve(DEV): dict(sorted(found.items()))} if found else {}


def testtime_curves(result: dict[str, Any]) -> dict[str, dict[int, float]]:
    """pass@k against k (every k of the run) of one `testtime.json`, in RepExp's order and in random order."""
    return {testtime_pass_at_k_curve(order): {int(k): float(v) for k, v in zip(result["k"],
                                                                               result[f"pass_at_k_{order}"])
                                              if v is not None}
            for order in ("repexp", "random")}


def testtime_metrics(result: dict[str, Any]) -> dict[str, float]:
    """Flat MLflow metrics of one `testtime.json` (reference ks only): what its node run and its sweep
    point's parent run log. Here, not in `repexp.testtime.core`, so the tracking layer and `aggregate`
    read a stage's output without importing the stage."""
    metrics: dict[str, float] = {}
    for k, ratio in zip(result["efficiency"]["reference_k"], result["efficiency"]["ratio"]):
        at = result["k"].index(k)
        metrics[testtime_pass_at_k(k, "repexp")] = float(result["pass_at_k_repexp"][at])
        metrics[testtime_pass_at_k(k, "random")] = float(result["pass_at_k_random"][at])
        if ratio is not None:
            metrics[f"{TESTTIME}/efficiency_at_{int(k)}"] = float(ratio)
    for name in ("repexp", "random", "ratio"):
        value = result["samples_to_correct"].get(name)
        if value is not None:
            metrics[f"{TESTTIME}/samples_to_correct_{name}"] = float(value)
    return metrics


# --------------------------------------------------------------------------- MLflow-valid names

_INVALID_CHARS = re.compile(r"[^/\w.\- :]")


def metric_name(key: str) -> str:
    """An MLflow-valid name for any key (verl's own `.../mean@4` too), mapped as verl's MLflow logger
    maps it: `@` -> `_at_`, repeated slashes -> one, other invalid characters -> `_`."""
    return _INVALID_CHARS.sub("_", re.sub(r"/+", "/", str(key).replace("@", "_at_")))


# --------------------------------------------------------------------------- the metric dicts of both backends


def summary(prefix: str, values: Any) -> dict[str, float]:
    """{prefix/mean, /std, /min, /max} of the values (std unbiased; 0 for one value); {} for none."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if values.size == 0:
        return {}
    return {
        statistic(prefix, "mean"): float(values.mean()),
        statistic(prefix, "std"): float(values.std(ddof=1)) if values.size > 1 else 0.0,
        statistic(prefix, "min"): float(values.min()),
        statistic(prefix, "max"): float(values.max()),
    }


def bonus_metrics(raw: Any, kept: Any, beta: float, hidden_norms: Any) -> dict[str, float]:
    """The bonus statistics of one step over the rows that take part ({} for none): `raw` before the
    turn-off rules, `kept` after them (unscaled), the norms of the rows' pooled hidden states."""
    raw = np.asarray(raw, dtype=np.float64).reshape(-1)
    kept = np.asarray(kept, dtype=np.float64).reshape(-1)
    if raw.size == 0:
        return {}
    return {
        **summary(BONUS_RAW, raw),
        **summary(BONUS_SCALED, float(beta) * kept),
        BONUS_TURNED_OFF: float(np.mean((kept == 0) & (raw != 0))),
        HIDDEN_NORM_MEAN: float(np.mean(np.asarray(hidden_norms, dtype=np.float64))),
    }


def group_metrics(fractions: dict[str, float], verifier: Any, shaped: Any) -> dict[str, float]:
    """Group-status fractions and the mean verifier and shaped reward of one step ({} for no rows)."""
    verifier = np.asarray(verifier, dtype=np.float64).reshape(-1)
    if verifier.size == 0:
        return {}
    return {**{group_fraction(status): float(fractions[status]) for status in GROUP_STATUSES},
            REWARD_VERIFIER_MEAN: float(verifier.mean()),
            REWARD_SHAPED_MEAN: float(np.mean(np.asarray(shaped, dtype=np.float64)))}


def distinct_fraction(
    groups: Sequence[Hashable], responses: Sequence[Sequence[int]], lengths: Optional[Sequence[int]] = None
) -> dict[str, float]:
    """Rollout diversity of one step ({} for no rows): per prompt group (rows of one key), the number of
    distinct responses (token-identical ones count once) over the group's rows, averaged over groups.
    `responses` are the rows' response token ids; with `lengths`, only a row's first lengths[i] tokens
    are its response (the rest is padding)."""
    return rollout_diversity(groups, responses, lengths)


def rollout_diversity(
    groups: Sequence[Hashable],
    responses: Sequence[Sequence[int]],
    lengths: Optional[Sequence[int]] = None,
    *,
    scores: Optional[Sequence[float]] = None,
    answers: Optional[Sequence[Optional[str]]] = None,
) -> dict[str, float]:
    """The rollout-diversity metrics of one step, both backends ({} for no rows):

    - `DISTINCT_FRACTION` (`distinct_fraction`);
    - with `scores` (the rows' verifier scores), `ALL_CORRECT_IDENTICAL_FRACTION`: among the all-correct
      groups (`repexp.elliptical.group_statuses`, the reward's turn-off rules' own), the fraction with a
      single distinct response (left out when no group is all correct);
    - with `answers` (the rows' final answers, None for none), `DISTINCT_ANSWERS`: the number of distinct
      answers per group (None one of them), mean over groups.
    """
    n = len(responses)
    given = {"group keys": len(groups), "lengths": n if lengths is None else len(lengths),
             "scores": n if scores is None else len(scores), "answers": n if answers is None else len(answers)}
    if any(count != n for count in given.values()):
        raise ValueError(", ".join(f"{count} {name}" for name, count in given.items()) + f", {n} responses: "
                         "expected one per row")
    members: dict[Hashable, list[int]] = {}
    rows: list[tuple[int, ...]] = []
    for i, (key, tokens) in enumerate(zip(groups, responses)):
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if lengths is not None:
            tokens = tokens[: int(lengths[i])]
        rows.append(tuple(tokens.tolist()))
        members.setdefault(key, []).append(i)
    if not members:
        return {}
    distinct = {key: len({rows[i] for i in idx}) for key, idx in members.items()}
    out = {DISTINCT_FRACTION: float(np.mean([distinct[key] / len(idx) for key, idx in members.items()]))}
    if scores is not None:  # group statuses as the reward's turn-off rules see them (one definition)
        import torch

        from repexp.elliptical import GroupStatus, group_statuses, is_correct

        index = {key: j for j, key in enumerate(members)}
        status = group_statuses(is_correct(torch.as_tensor(np.asarray(scores, dtype=np.float64).reshape(-1))),
                                torch.tensor([index[key] for key in groups], dtype=torch.long), len(members))
        all_correct = [key for key in members if status[index[key]] == int(GroupStatus.ALL_CORRECT)]
        if all_correct:
            out[ALL_CORRECT_IDENTICAL_FRACTION] = float(np.mean([distinct[key] == 1 for key in all_correct]))
    if answers is not None:
        out[DISTINCT_ANSWERS] = float(np.mean([len({answers[i] for i in idx}) for idx in members.values()]))
    return out


def dev_metrics(num_samples: Any, num_correct: Any) -> dict[str, float]:
    """Dev validation from per-problem sample counts: unbiased pass@k averaged over problems for
    k = 1, 2, 4, ... up to the smallest sample count (and it), plus the problem and sample counts."""
    from repexp.passk import pass_at_k as estimate
    from repexp.passk import power_of_two_ks

    n = np.broadcast_to(np.asarray(num_samples, dtype=np.int64), np.shape(num_correct))
    if n.size == 0:
        raise ValueError("validation produced no problems")
    ks = power_of_two_ks(int(n.min()))
    values = estimate(n, np.asarray(num_correct, dtype=np.int64), ks).mean(axis=0)
    return {**{pass_at_k(DEV, k): float(v) for k, v in zip(ks, values, strict=True)},
            DEV_NUM_PROBLEMS: float(n.size), DEV_SAMPLES_PER_PROBLEM: float(n.min())}


# --------------------------------------------------------------------------- method cores (repexp.methods)

# Outcome-based exploration (repexp.methods.outcome), per training step:
OUTCOME_BONUS = "outcome/bonus"  # c × the bonus added per rollout: {mean, std, min, max} (`summary`)
OUTCOME_DISTINCT_ANSWERS = "outcome/distinct_answers"  # distinct final answers per prompt group, mean over groups
OUTCOME_NO_ANSWER_FRAC = "outcome/no_answer_frac"  # rollouts without an extracted final answer
OUTCOME_QUESTIONS_SEEN = "outcome/questions_seen"  # historical mode: questions with answer counts so far
# KL-Cov / Clip-Cov (repexp.methods.cov): verl's own names for what its policy losses return
POLICY_CLIPFRAC = "actor/pg_clipfrac"  # Clip-Cov: fraction of valid tokens whose loss the covariance rule removed
POLICY_PPO_KL = "actor/ppo_kl"  # Clip-Cov: mean log π_old − log π; KL-Cov: mean |log π − log π_old|
COV_SELECTED_FRAC = "actor/cov_selected_frac"  # both modes: fraction of valid tokens the covariance rule selected

# pass@k training (repexp.methods.passk), per training step:
PASSK_ADVANTAGE = "passk/advantage"  # the analytic pass@k advantage of every rollout: {mean, std, min, max}
PASSK_GROUP_PASS_AT_K = "passk/group_pass_at_k"  # the k of the objective: unbiased pass@k of a group, mean over groups


def passk_metrics(groups: Sequence[Hashable], scores: Any, advantages: Any, k: int) -> dict[str, float]:
    """The pass@k training statistics of one step ({} for no rows): the advantage's summary and the
    groups' own pass@k at the objective's k (a rollout is correct when its score is > 0.5)."""
    from repexp.passk import pass_at_k as estimate

    correct = np.asarray(scores, dtype=np.float64).reshape(-1) > 0.5
    if correct.size == 0:
        return {}
    members: dict[Hashable, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    n = np.array([len(rows) for rows in members.values()], dtype=np.int64)
    c = np.array([int(correct[rows].sum()) for rows in members.values()], dtype=np.int64)
    return {**summary(PASSK_ADVANTAGE, advantages),
            PASSK_GROUP_PASS_AT_K: float(estimate(n, c, [int(k)]).mean())}

# The verl adapters of the methods (repexp.verl.trainer, repexp.verl.methods):
TIMER_OUTCOME_BONUS = "outcome_bonus"  # verl timing_raw key (logged as timing_s/outcome_bonus): answers and term
