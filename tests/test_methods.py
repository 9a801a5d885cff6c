"""The pure cores of the training methods (repexp.methods): pass@k advantages, outcome-based exploration
bonuses, the KL-Cov / Clip-Cov policy loss. Each is checked on hand-computed cases and, where public code
exists, against it (docs/methods.md)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from repexp import metrics as M
from repexp.methods import cov, outcome, passk

# --------------------------------------------------------------------------- pass@k training


def test_passk_hand_computed_group():
    # n = 4, c = 1, k = 2: C(3,2)/C(4,2) = 3/6, so ρ = 0.5 and σ = sqrt(0.5·0.5) = 0.5.
    # A⁺ = (1 − ρ)/σ = 0.5/0.5 = 1; A⁻ = (1 − ρ − C(2,1)/C(3,1))/σ = (0.5 − 2/3)/0.5 = −1/3.
    adv = passk.passk_advantages(torch.tensor([0.0, 1.0, 0.0, 0.0]), ["p"] * 4, 2, epsilon=0.0)
    assert adv.dtype == torch.float64
    assert adv.tolist() == pytest.approx([-1 / 3, 1.0, -1 / 3, -1 / 3], abs=1e-15)
    # with the authors' ε = 1e-6 in the denominator: 0.5/0.500001 and (−1/6)/0.500001
    adv = passk.passk_advantages(torch.tensor([0.0, 1.0, 0.0, 0.0]), ["p"] * 4, 2)
    assert adv.tolist() == pytest.approx([-1 / 6 / 0.500001, 0.5 / 0.500001, -1 / 6 / 0.500001, -1 / 6 / 0.500001],
                                         rel=1e-14)


# (n, c, k) -> (A⁺, A⁻) printed by a faithful transcription of `calc_adv` in RUCAIBox/Passk_Training
# code/passk_adv.py (scipy.special.comb, σ + 1e-6), run in a scratch script outside this repository.
AUTHORS_REFERENCE = {
    (4, 1, 2): (0.999998000004, -0.3333326666679999),
    (8, 3, 4): (0.2773490211937191, -0.16640941271623166),
    (16, 5, 4): (0.4706116874731895, -0.21391440339690423),
    (32, 7, 8): (0.3385448726210666, -0.09479256433389889),
    (64, 10, 16): (0.21243575568235962, -0.03933995475599232),
    (256, 17, 64): (0.07922764484401322, -0.0056354391729857775),
    (12, 2, 6): (0.5423248504320815, -0.10846497008641619),
    (8, 1, 1): (2.6457433110887805, -0.37796333015554007),
    (8, 6, 4): (0.0, 0.0),  # n − c < k: every 4 of 8 hold a correct rollout, ρ = 1
    (256, 200, 100): (0.0, 0.0),
}


@pytest.mark.parametrize(("n", "c", "k"), sorted(AUTHORS_REFERENCE))
def test_passk_matches_the_authors_code(n, c, k):
    positive, negative = AUTHORS_REFERENCE[(n, c, k)]
    scores = torch.tensor([1.0] * c + [0.0] * (n - c))
    adv = passk.passk_advantages(scores, [0] * n, k)
    assert adv[:c].tolist() == pytest.approx([positive] * c, rel=1e-11, abs=1e-13)
    assert adv[c:].tolist() == pytest.approx([negative] * (n - c), rel=1e-11, abs=1e-13)


def test_passk_all_correct_or_all_wrong_groups_get_zero():
    for n in (1, 2, 8, 256):
        for scores in ([1.0] * n, [0.0] * n):
            assert passk.passk_advantages(torch.tensor(scores), ["g"] * n, 1).tolist() == [0.0] * n


def test_passk_group_mean_is_zero():
    gen = torch.Generator().manual_seed(0)
    n, groups = 16, 40
    scores = (torch.rand(n * groups, generator=gen) < torch.rand(groups, generator=gen).repeat_interleave(n)).double()
    ids = [i // n for i in range(n * groups)]
    for k in (1, 2, 4, 8):
        adv = passk.passk_advantages(scores, ids, k).view(groups, n)
        assert adv.sum(dim=1).abs().max().item() < 1e-12
        assert adv.abs().max().item() > 0.1  # not trivially zero
    # k = n: one correct rollout makes pass@n of the group 1 (n − c < k), so every advantage is 0
    assert passk.passk_advantages(scores, ids, n).abs().max().item() == 0.0


def test_passk_k1_is_grpo_with_the_population_std():
    # k = 1: ρ = c/n, A⁺ = (1 − p)/σ, A⁻ = −p/σ with σ the population std of the 0/1 scores; GRPO divides
    # by the unbiased std (× sqrt(n/(n−1))) + 1e-6, so passk = GRPO · sqrt(n/(n−1)) up to the two ε.
    from repexp.trl.reward import group_normalized

    gen = torch.Generator().manual_seed(1)
    n, groups = 8, 50
    scores = (torch.rand(n * groups, generator=gen) < 0.4).double()
    grpo = group_normalized(scores, n).double()
    adv = passk.passk_advantages(scores, [i // n for i in range(n * groups)], 1)
    torch.testing.assert_close(adv, grpo * math.sqrt(n / (n - 1)), rtol=1e-5, atol=1e-6)


def test_passk_groups_need_not_be_consecutive_and_excluded_rows_take_no_part():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    ids = ["a", "b", "a", "b", "a", "b", "a", "b"]  # a: 1,0,0,0  b: 0,1,0,1
    adv = passk.passk_advantages(scores, ids, 2)
    a = passk.passk_advantages(torch.tensor([1.0, 0, 0, 0]), ["a"] * 4, 2)
    b = passk.passk_advantages(torch.tensor([0.0, 1, 0, 1]), ["b"] * 4, 2)
    assert adv[0::2].tolist() == a.tolist() and adv[1::2].tolist() == b.tolist()
    # a fifth row of group a, excluded: group a stays n = 4, c = 1; the excluded row gets 0
    adv = passk.passk_advantages(torch.tensor([1.0, 0, 0, 0, 1.0]), ["a"] * 5, 2,
                                 excluded=torch.tensor([False, False, False, False, True]))
    assert adv.tolist() == [*a.tolist(), 0.0]


def test_passk_threshold_and_errors():
    # scores > 0.5 are correct: 0.7 counts, 0.5 does not
    assert passk.passk_advantages(torch.tensor([0.7, 0.5, 0.0, 0.0]), [0] * 4, 2, epsilon=0.0).tolist() == \
        pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    with pytest.raises(ValueError, match="passk_k"):
        passk.passk_advantages(torch.tensor([1.0, 0.0, 1.0]), [0, 0, 1], 2)  # group 1 has one row
    with pytest.raises(ValueError, match="passk_k"):  # exclusion leaves 1 < k rows
        passk.passk_advantages(torch.tensor([1.0, 0.0]), [0, 0], 2, excluded=torch.tensor([False, True]))
    with pytest.raises(ValueError, match="one per row"):
        passk.passk_advantages(torch.tensor([1.0, 0.0]), [0], 1)


# --------------------------------------------------------------------------- outcome-based exploration


def test_historical_ucb_con_hand_computed():
    # c = 1, b0 = 0.5, one question; the bonus reads the counts before the step's rollouts are added.
    state = outcome.AnswerCounts()
    q = ["q"] * 4
    # step 1: nothing seen, N = 0 -> min{1, ·} = 1 -> 1 − 0.5 = 0.5 for every rollout
    assert state.bonus(q, ["1", "1", "2", None], 1.0, b0=0.5).tolist() == [0.5] * 4
    state.update(q, ["1", "1", "2", None])  # N(1) = 2, N(2) = 1, N(None) = 1
    # step 2: '1' -> 1/√2 − 0.5 = 0.2071..., new '3' -> 1 − 0.5, '2' and None (N = 1) -> 1 − 0.5
    assert state.bonus(q, ["1", "3", "2", None], 1.0, b0=0.5).tolist() == \
        pytest.approx([1 / math.sqrt(2) - 0.5, 0.5, 0.5, 0.5], abs=1e-15)
    state.update(q, ["1", "3", "2", None])  # N(1) = 3, N(3) = 1, N(2) = 2, N(None) = 2
    state.update(q, ["1"] * 4)  # N(1) = 7
    # '1' seen 7 > 4 times: 1/√7 − 0.5 = −0.1220... (penalised); '2' seen twice: 1/√2 − 0.5; c = 2 doubles it
    assert state.bonus(["q", "q"], ["1", "2"], 2.0, b0=0.5).tolist() == \
        pytest.approx([2 * (1 / math.sqrt(7) - 0.5), 2 * (1 / math.sqrt(2) - 0.5)], abs=1e-15)
    assert state.count("q", "1") == 7 and state.count("q", None) == 2 and state.count("other", "1") == 0


def test_historical_mean_and_naive_baselines_hand_computed():
    state = outcome.AnswerCounts()
    state.update(["q", "q"], ["1", "1"])  # N(q, 1) = 2
    keys, answers, groups = ["q", "q", "q", "q", "r"], ["1", "2", "3", "4", "1"], [0, 0, 0, 0, 1]
    # raw: [1/√2, 1, 1, 1 | 1]; UCB-Mean subtracts the group's mean (1/√2 + 3)/4 and, for r, 1
    raw = [1 / math.sqrt(2), 1.0, 1.0, 1.0, 1.0]
    mean = (1 / math.sqrt(2) + 3) / 4
    got = state.bonus(keys, answers, 2.0, baseline="mean", groups=groups).tolist()
    assert got == pytest.approx([2 * (raw[0] - mean)] + [2 * (1 - mean)] * 3 + [0.0], abs=1e-15)
    assert state.bonus(keys, answers, 0.5, baseline="none").tolist() == pytest.approx([0.5 * b for b in raw])
    with pytest.raises(ValueError, match="outcome_baseline"):
        state.bonus(keys, answers, 1.0, baseline="median")


def test_batch_bonus_hand_computed():
    # group g (n = 4): two '1' -> −1/4 each (one other row agrees), '2' and None alone -> 0;
    # group h (n = 2): both '5' -> −1/2; group k (n = 3): two None match each other -> −1/3, 'x' -> 0
    groups = ["g", "h", "g", "g", "h", "g", "k", "k", "k"]
    answers = ["1", "5", "1", "2", "5", None, "x", None, None]
    got = outcome.batch_bonus(groups, answers, 1.0).tolist()
    assert got == pytest.approx([-0.25, -0.5, -0.25, 0.0, -0.5, 0.0, 0.0, -1 / 3, -1 / 3], abs=1e-15)
    assert outcome.batch_bonus(["g"] * 4, ["7"] * 4, 2.0).tolist() == [-1.5] * 4  # −2·3/4
    assert outcome.batch_bonus(["g"] * 3, ["a", "b", "c"], 1.0).tolist() == [0.0] * 3


STEPS = [
    (["q1"] * 4 + ["q2"] * 4, ["3", "3", "4", None, "x", "y", "y", "y"]),
    (["q1"] * 4 + ["q3"] * 4, ["3", "5", "4", "3", None, None, "1", "2"]),
    (["q2"] * 4 + ["q1"] * 4, ["y", "y", "z", "x", "3", "3", "3", "6"]),
    (["q1"] * 4 + ["q2"] * 4, ["3", "6", "7", None, "y", "y", "w", "x"]),
]


def _run(params, steps, state):
    out = []
    for keys, answers in steps:
        groups = [f"{k}/{i // 4}" for i, k in enumerate(keys)]
        bonus, _ = outcome.outcome_bonus(params, groups=groups, question_keys=keys, answers=answers,
                                         scores=torch.zeros(len(keys)), state=state)
        out.append(bonus.tolist())
    return out


@pytest.mark.parametrize("baseline", outcome.BASELINES)
def test_historical_state_round_trip_reproduces_the_uninterrupted_run(baseline):
    params = outcome.Params(outcome_mode="historical", outcome_c=0.7, outcome_baseline=baseline, outcome_b0=0.4)
    whole = outcome.AnswerCounts()
    uninterrupted = _run(params, STEPS, whole)
    first = outcome.AnswerCounts()
    before = _run(params, STEPS[:2], first)
    saved = json.loads(json.dumps(first.state_dict()))  # through JSON, as a checkpoint stores it
    resumed = outcome.AnswerCounts()
    resumed.load_state_dict(saved)
    after = _run(params, STEPS[2:], resumed)
    assert before + after == uninterrupted  # exactly
    assert resumed.state_dict() == whole.state_dict()
    # q1 saw 3 twice, twice, three times, once; 4 twice; 5 once; 6 twice; 7 once; no answer twice
    assert whole.state_dict()["counts"]["q1"] == [[None, 2], ["3", 8], ["4", 2], ["5", 1], ["6", 2], ["7", 1]]
    with pytest.raises(ValueError, match="format"):
        outcome.AnswerCounts().load_state_dict({"counts": {}})


def test_outcome_bonus_modes_and_metrics():
    keys = ["q"] * 4 + ["r"] * 4
    groups = [0] * 4 + [1] * 4
    answers = ["1", "1", "2", None, "5", "5", "5", "5"]
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    state = outcome.AnswerCounts()
    bonus, metrics = outcome.outcome_bonus(outcome.Params(), groups=groups, question_keys=keys, answers=answers,
                                           scores=scores, state=state)
    assert bonus.tolist() == [0.5] * 8  # UCB-Con, b0 = 0.5, c = 1, nothing seen yet: every rollout, correct or not
    assert state.count("r", "5") == 4  # counted after the bonus
    assert metrics[M.OUTCOME_DISTINCT_ANSWERS] == 2.0  # (3 + 1)/2 groups
    assert metrics[M.OUTCOME_NO_ANSWER_FRAC] == 1 / 8
    assert metrics[M.statistic(M.OUTCOME_BONUS, "mean")] == 0.5 and metrics[M.OUTCOME_QUESTIONS_SEEN] == 2.0
    bonus, metrics = outcome.outcome_bonus(outcome.Params(outcome_mode="batch", outcome_c=2.0), groups=groups,
                                           question_keys=keys, answers=answers, scores=scores, state=None)
    assert bonus.tolist() == pytest.approx([-0.5, -0.5, 0.0, 0.0, -1.5, -1.5, -1.5, -1.5])
    assert M.OUTCOME_QUESTIONS_SEEN not in metrics
    with pytest.raises(TypeError, match="AnswerCounts"):
        outcome.outcome_bonus(outcome.Params(), groups=groups, question_keys=keys, answers=answers, scores=scores,
                              state=None)


def test_final_answer_uses_the_graders_extractors():
    assert outcome.final_answer("openai/gsm8k", "3 + 15 = 18\n#### 18", "repexp") == "18"
    assert outcome.final_answer("openai/gsm8k", "The total is $1,000.00.\n#### $1,000.00", "repexp") == "1000"
    assert outcome.final_answer("HuggingFaceH4/MATH-500", "so \\boxed{\\frac{1}{2}}", "repexp") == "\\frac{1}{2}"
    assert outcome.final_answer("HuggingFaceH4/MATH-500", "no box here", "repexp") is None
    assert outcome.final_answer("repexp/arith-hard", "47 + 38 = 85.", "paper") == "85"
    with pytest.raises(ValueError, match="grader"):
        outcome.final_answer("openai/gsm8k", "#### 1", "other")


# --------------------------------------------------------------------------- KL-Cov / Clip-Cov


def _inputs(seed: int, batch: int = 6, length: int = 12):
    gen = torch.Generator().manual_seed(seed)
    log_prob = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 4
    old_log_prob = log_prob + 0.3 * torch.randn(batch, length, generator=gen, dtype=torch.float64)
    advantages = (2 * torch.randn(batch, 1, generator=gen, dtype=torch.float64)).expand(batch, length).clone()
    lengths = torch.tensor([length, length - 3, 5, 1, length - 1, 0][:batch])  # one empty response
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.float64)
    return log_prob, old_log_prob, advantages, mask


def _verl_config(params: cov.Params, clip_low: float, clip_high: float):
    policy_loss = SimpleNamespace(loss_mode=params.loss_mode, clip_cov_ratio=params.cov_ratio,
                                  clip_cov_lb=params.cov_clip_lb, clip_cov_ub=params.cov_clip_ub,
                                  kl_cov_ratio=params.cov_ratio, ppo_kl_coef=params.cov_kl_coef)
    return SimpleNamespace(clip_ratio=clip_low, clip_ratio_low=clip_low, clip_ratio_high=clip_high,
                           policy_loss=policy_loss, global_batch_info={})


def _both(params, agg, seed, *, clip_low=0.2, clip_high=0.28, rng_seed=1234):
    """(ours, verl's): loss, metrics and d loss / d log_prob on the same inputs; Clip-Cov's draw seeded alike
    (verl: the global RNG; ours: a torch.Generator with the same seed, which yields the same randperm)."""
    from verl.trainer.ppo import core_algos

    verl_loss_fn = {"kl_cov": core_algos.compute_policy_loss_kl_cov,
                    "clip_cov": core_algos.compute_policy_loss_clip_cov}[params.loss_mode]
    out = []
    for ours in (True, False):
        log_prob, old_log_prob, advantages, mask = _inputs(seed)
        log_prob.requires_grad_(True)
        if ours:
            loss, metrics = cov.cov_policy_loss(log_prob, old_log_prob, advantages, mask, params, clip_ratio=clip_low,
                                                clip_ratio_high=clip_high, loss_agg_mode=agg,
                                                generator=torch.Generator().manual_seed(rng_seed))
        else:
            torch.manual_seed(rng_seed)
            loss, metrics = verl_loss_fn(old_log_prob, log_prob, advantages, mask, loss_agg_mode=agg,
                                         config=_verl_config(params, clip_low, clip_high))
        loss.backward()
        out.append((loss.detach(), metrics, log_prob.grad.clone()))
    return out


AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_cov_equals_verl(agg, seed):
    params = cov.Params(loss_mode="kl_cov", cov_ratio=0.1, cov_kl_coef=0.7)
    (loss, metrics, grad), (verl_loss, verl_metrics, verl_grad) = _both(params, agg, seed)
    assert loss.item() == verl_loss.item()  # exactly: the same operations
    torch.testing.assert_close(grad, verl_grad, rtol=0, atol=0)
    assert metrics[M.POLICY_PPO_KL] == verl_metrics[M.POLICY_PPO_KL]
    valid = int(_inputs(seed)[3].sum().item())
    assert metrics[M.COV_SELECTED_FRAC] == pytest.approx(max(1, int(valid * 0.1)) / valid)


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize(("seed", "ratio"), [(0, 0.05), (1, 0.05), (2, 0.1), (3, 1.0)])
def test_clip_cov_equals_verl(agg, seed, ratio):
    # A window (0.2, 6) wide enough that several tokens are eligible; with ratio 0.05 / 0.1 the draw picks
    # some of them (the seeded generator draws verl's global-RNG permutation), with ratio 1 all of them
    # (no randomness left). Either way ours equals verl's to the bit.
    params = cov.Params(loss_mode="clip_cov", cov_ratio=ratio, cov_clip_lb=0.2, cov_clip_ub=6.0)
    (loss, metrics, grad), (verl_loss, verl_metrics, verl_grad) = _both(params, agg, seed)
    assert loss.item() == verl_loss.item()
    torch.testing.assert_close(grad, verl_grad, rtol=0, atol=0)
    assert metrics[M.POLICY_CLIPFRAC] == verl_metrics[M.POLICY_CLIPFRAC]
    assert metrics[M.POLICY_PPO_KL] == verl_metrics[M.POLICY_PPO_KL]
    assert metrics[M.POLICY_CLIPFRAC] > 0  # the rule removed some tokens' loss: the case is not trivial


def test_clip_cov_selection_is_independent_of_the_rng_when_it_takes_every_eligible_token():
    params = cov.Params(loss_mode="clip_cov", cov_ratio=1.0, cov_clip_lb=0.2, cov_clip_ub=6.0)
    log_prob, old_log_prob, advantages, mask = _inputs(4)
    losses = {cov.cov_policy_loss(log_prob, old_log_prob, advantages, mask, params, clip_ratio=0.2,
                                  loss_agg_mode="token-mean", generator=torch.Generator().manual_seed(s))[0].item()
              for s in range(5)}
    assert len(losses) == 1


def test_cov_hand_computed_kl_cov():
    # One sequence of 2 valid tokens (and a padded third), A = (1, −1), log π = (−1, −3), log π_old = (−1.5, −3).
    # cov = (A − 0)(log π − (−2)) = (1·1, −1·−1) = (1, 1): a tie, topk takes the first; ratio 0.5 -> 1 token.
    # loss per token: −A·r + [selected]·coef·|log r| = (−e^{0.5} + 2·0.5, +1·e^0) = (−1.6487 + 1, 1);
    # token-mean over 2 valid tokens: (−0.6487 + 1)/2.
    params = cov.Params(loss_mode="kl_cov", cov_ratio=0.5, cov_kl_coef=2.0)
    log_prob = torch.tensor([[-1.0, -3.0, -9.0]], dtype=torch.float64)
    old = torch.tensor([[-1.5, -3.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, metrics = cov.cov_policy_loss(log_prob, old, adv, mask, params, clip_ratio=0.2, loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx((-math.exp(0.5) + 1.0 + 1.0) / 2, abs=1e-15)
    assert metrics[M.POLICY_PPO_KL] == pytest.approx(0.25, abs=1e-8)  # mean |log r| = (0.5 + 0)/2
    assert metrics[M.COV_SELECTED_FRAC] == pytest.approx(0.5, abs=1e-8)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        cov.cov_policy_loss(log_prob, old, adv, mask, params, clip_ratio=0.2, loss_agg_mode="token-sum")
