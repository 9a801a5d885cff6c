"""Both backends' bonus step pinned on fixed inputs: shaped rewards, bonuses and the logged metrics.

The shared step (features → bonus → shaped reward → metrics) must give each backend exactly the
numbers it gave before the two copies were merged: `tests/data/bonus_step_golden.json` holds them,
written by this file (`python tests/test_bonus_step.py` rewrites it; only do that for an intended
change of numbers). Inputs are deterministic CPU tensors and a tiny fake transformers backbone, so
no model is downloaded or built. Timings are pinned by name only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from repexp import config as C

GOLDEN = Path(__file__).resolve().parent / "data" / "bonus_step_golden.json"
N = 4
HIDDEN = 16
VOCAB = 50


class FakeBackbone(torch.nn.Module):
    """What `completion_features` needs of a transformers base model: config.hidden_size and
    `forward(input_ids, attention_mask).last_hidden_state`; causal mixing so the prompt matters."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(hidden_size=HIDDEN, vocab_size=VOCAB)
        gen = torch.Generator().manual_seed(11)
        self.embed = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=gen))

    def forward(self, input_ids, attention_mask):
        x = self.embed[input_ids] * attention_mask.unsqueeze(-1)
        return SimpleNamespace(last_hidden_state=torch.tanh(x.cumsum(dim=1) / 3.0))


class FakeTokenizer:
    pad_token_id = 0

    def __len__(self):
        return VOCAB

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1 + ord(c) % (VOCAB - 1) for c in text]}


def _trl_config(beta: float, bonus: dict) -> C.RunConfig:
    raw = {
        "model": "unused",
        "sweep": {"tasks": ["gsm8k"], "backends": ["trl"], "sparse_dims": [4], "betas": [beta or 0.01], "seeds": [3]},
        "bonus": bonus,
        "train": {"n_rollouts": N, "train_batch_size": 2, "ppo_mini_batch_size": 2},
        "trl": {"device": "cpu", "bonus_micro_batch_size": 3},
    }
    spec = (C.RunSpec.of("gsm8k", "repexp", "trl", 3, sparse_dim=4, beta=beta) if beta
            else C.RunSpec.of("gsm8k", "grpo", "trl", 3))
    return C.compose(C.load(raw), spec)


def _trl_batch():
    prompts = ["What is 2 + 5?"] * N + ["Add 3 and 4."] * N + ["1 + 1?"] * N
    gen = torch.Generator().manual_seed(5)
    completion_ids = [torch.randint(1, VOCAB, (int(length),), generator=gen).tolist()
                      for length in torch.randint(1, 7, (3 * N,), generator=gen)]
    completion_ids[3] = list(completion_ids[2])  # a duplicate (distinct fraction)
    scores = [0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1]
    keys = [0] * N + [1] * N + [2] * N
    return prompts, completion_ids, [float(s) for s in scores], keys


TRL_CASES = {
    "default": (0.5, {}),
    "loo_zscore_rules": (0.3, {"reward_type": "leave_one_out", "normalization": "z_score", "center": False,
                               "turn_off_if_none_correct": False, "turn_off_if_rollout_incorrect": True,
                               "alpha": 2.0, "lamb": 0.2}),
    "rnd_all_off": (0.7, {"normalization": "rnd", "turn_off_if_all_correct": True, "randomize_projection": False}),
    "some_off": (0.4, {"turn_off_if_none_correct": False, "turn_off_if_some_correct": True}),
    "persistent": (0.5, {"persist_covariance": True, "randomize_projection": False}),
    "grpo_alpha": (0.0, {"alpha": 1.5}),
}


def _metrics(metrics: dict) -> dict:
    return {k: ("timing" if k.startswith("timing_s/") else v) for k, v in sorted(metrics.items())}


def trl_outputs() -> dict:
    from repexp.trl.reward import RepExpReward, group_normalized

    out = {}
    for name, (beta, bonus) in TRL_CASES.items():
        cfg = _trl_config(beta, bonus)
        reward = RepExpReward(cfg, FakeTokenizer(), optimizer_steps_per_step=1, device=torch.device("cpu"),
                              backbone_loader=FakeBackbone)
        prompts, completion_ids, scores, keys = _trl_batch()
        steps = []
        for step in (1, 2):  # a second step: another projection, or the accumulated covariance
            shaped, metrics = reward.shape(prompts, completion_ids, scores, step=step,
                                           prompt_keys=keys if cfg.bonus.persist_covariance else None)
            assert shaped.dtype == torch.float32
            steps.append({"shaped": shaped.tolist(), "returned": group_normalized(shaped, N).tolist(),
                          "metrics": _metrics(metrics)})
        out[name] = steps
    return out


def _verl_batch(seed: int):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(14, HIDDEN, generator=gen)
    uids = ["a"] * 4 + ["b"] * 4 + ["c"] * 4 + ["pad", "pad"]
    scores = torch.tensor([1.0, 0, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0])
    excluded = torch.tensor([False] * 6 + [True] + [False] * 5 + [True, True])  # an empty response in b
    keys = ["p1"] * 4 + ["p2"] * 4 + ["p3"] * 4 + ["x", "x"]
    return hidden, uids, scores, excluded, keys


VERL_CASES = {
    "default": {"beta": 0.5, "alpha": 2.0, "sparse_dim": 3, "lamb": 1.0, "seed": 7},
    "loo_zscore_rules": {"beta": 0.3, "sparse_dim": 4, "lamb": 0.2, "reward_type": "leave_one_out",
                         "normalization": "z_score", "center": False, "turn_off_if_none_correct": False,
                         "turn_off_if_rollout_incorrect": True},
    "rnd_all_off": {"beta": 0.7, "sparse_dim": 4, "normalization": "rnd", "turn_off_if_all_correct": True,
                    "randomize_projection": False},
    "some_off": {"beta": 0.4, "sparse_dim": 4, "turn_off_if_none_correct": False, "turn_off_if_some_correct": True},
    "persistent": {"beta": 0.5, "sparse_dim": 4, "persist_covariance": True, "randomize_projection": False},
}


def verl_outputs() -> dict:
    from repexp.bonus_step import BonusState, compute_step_bonus, group_metrics
    from repexp.verl.settings import RepExpSettings

    out = {}
    for name, values in VERL_CASES.items():
        settings = RepExpSettings(**values)
        state = BonusState(settings, sparse_dim=settings.sparse_dim, seed=settings.seed)  # as the trainer
        steps = []
        for step in (5, 6):
            hidden, uids, scores, excluded, keys = _verl_batch(step)
            result = compute_step_bonus(hidden, uids, scores, settings, beta=settings.beta, step=step, state=state,
                                        excluded=excluded, prompt_keys=keys if settings.persist_covariance else None)
            assert result.shaped.dtype == torch.float64 and result.bonus_scaled.dtype == torch.float64
            steps.append({"bonus_raw": result.bonus_raw.tolist(), "bonus_scaled": result.bonus_scaled.tolist(),
                          "shaped": result.shaped.tolist(), "metrics": _metrics(result.metrics)})
        out[name] = steps
    hidden, uids, scores, excluded, _ = _verl_batch(5)
    out["grpo_group_metrics"] = group_metrics(uids, scores, excluded)
    return out


def outputs() -> dict:
    return {"trl": trl_outputs(), "verl": verl_outputs()}


def _assert_same(actual, expected, where: str) -> None:
    # Exact on the machine that wrote the file; 1e-12 relative leaves room for another BLAS's rounding.
    if isinstance(expected, dict):
        assert sorted(actual) == sorted(expected), f"{where}: keys differ"
        for key in expected:
            _assert_same(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), f"{where}: lengths differ"
        for i, (a, e) in enumerate(zip(actual, expected)):
            _assert_same(a, e, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert math.isclose(actual, expected, rel_tol=1e-12, abs_tol=1e-15), f"{where}: {actual!r} != {expected!r}"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


@pytest.mark.parametrize("backend", ["trl", "verl"])
def test_bonus_step_gives_the_pinned_numbers(backend):
    golden = json.loads(GOLDEN.read_text())
    produce = trl_outputs if backend == "trl" else verl_outputs
    _assert_same(json.loads(json.dumps(produce())), golden[backend], backend)


def test_cases_cover_every_bonus_setting():
    """Each bonus setting is varied away from its default by at least one pinned case."""
    varied = {key for _, bonus in TRL_CASES.values() for key in bonus} | {"beta"}
    fields = {f.name for f in dataclasses.fields(C.BonusConfig)} - {"representation_model"}
    assert fields <= varied, f"not varied: {sorted(fields - varied)}"


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(outputs(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
