"""repexp.elliptical against sequential Sherman–Morrison references written here.

The references follow upstream_recipe.md §6.4 (one rank-1 update per rollout from I/λ,
per group, in batch order) and §6.5 (persistent state keyed by prompt: running mean and
count, uncentred accumulation, mean-corrected rank-1 downdate, score after update).
CUDA-parametrised cases run when a GPU is present and are skipped otherwise.
"""

from __future__ import annotations

import io
import uuid

import numpy as np
import pytest
import torch

from repexp.elliptical import (
    CUDA_COVARIANCE_MAX_DIM,
    NORMALIZATIONS,
    REWARD_TYPES,
    GroupStatus,
    PersistentCovariance,
    bonuses,
    choose_solver,
    combine_rewards,
    group_ids,
    group_layout,
    sparse_projection,
)

CUDA = pytest.param(
    "cuda",
    marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on the GPU machine)")
)
DEVICES = ["cpu", CUDA]
WELL_CONDITIONED_RTOL = 1e-8
ILL_CONDITIONED_RTOL = 1e-6


# --------------------------------------------------------------------------- references


def sherman_morrison_inverse(rows: torch.Tensor, lamb: float, start: torch.Tensor | None = None) -> torch.Tensor:
    """(λI + Σ x xᵀ)⁻¹ by one rank-1 Sherman–Morrison update per row, starting from I/λ."""
    dim = rows.shape[1]
    inverse = torch.eye(dim, dtype=torch.float64) / lamb if start is None else start.clone()
    for row in rows:
        projected = inverse @ row
        inverse = inverse - torch.outer(projected, projected) / (1.0 + row @ projected)
    return inverse


def reference_bonus(rows: torch.Tensor, inverse: torch.Tensor, reward_type: str) -> torch.Tensor:
    values = []
    for row in rows:
        leverage = row @ inverse @ row
        if reward_type == "leverage":
            values.append(leverage)
        else:  # leave-one-out: downdate the inverse by this row, then score it
            projected = inverse @ row
            loo_inverse = inverse + torch.outer(projected, projected) / (1.0 - leverage)
            values.append(row @ loo_inverse @ row)
    return torch.stack(values) if values else torch.zeros(0, dtype=torch.float64)


def reference_normalize(values: torch.Tensor, normalization: str) -> torch.Tensor:
    """Upstream's per-group rule: unbiased std, rescale only if std > 0 (NaN for n = 1 is not > 0)."""
    if normalization == "none":
        return values
    std = torch.std(values) if values.numel() > 1 else torch.tensor(float("nan"))
    if normalization == "rnd":
        return values / std if std > 0 else values
    mean = torch.mean(values)
    return (values - mean) / std if std > 0 else values - mean


def reference_bonuses(features, labels, lamb, reward_type, normalization="none", center=True) -> torch.Tensor:
    """§6.4: per group, in order of first appearance, sequential Sherman–Morrison."""
    features = features.to(torch.float64).cpu()
    labels = np.asarray(labels, dtype=object)
    out = torch.zeros(features.shape[0], dtype=torch.float64)
    seen = []
    for label in labels:
        if label in seen:
            continue
        seen.append(label)
        mask = torch.as_tensor(labels == label)
        rows = features[mask]
        if center:
            rows = rows - rows.mean(0)
        inverse = sherman_morrison_inverse(rows, lamb)
        out[mask] = reference_normalize(reference_bonus(rows, inverse, reward_type), normalization)
    return out


class ReferencePersistent:
    """§6.5 sequentially: dicts of running mean, count and the (uncentred) inverse per prompt."""

    def __init__(self, lamb: float, reward_type: str, normalization: str = "none") -> None:
        self.lamb, self.reward_type, self.normalization = lamb, reward_type, normalization
        self.mean, self.count, self.inverse = {}, {}, {}

    def step(self, features: torch.Tensor, prompt_ids) -> torch.Tensor:
        features = features.to(torch.float64).cpu()
        prompt_ids = np.asarray(prompt_ids, dtype=object)
        out = torch.zeros(features.shape[0], dtype=torch.float64)
        seen = []
        for prompt in prompt_ids:
            if prompt in seen:
                continue
            seen.append(prompt)
            mask = torch.as_tensor(prompt_ids == prompt)
            rows = features[mask]
            n = rows.shape[0]
            # 1. running mean and count, count-weighted
            if prompt not in self.mean:
                self.mean[prompt], self.count[prompt] = rows.mean(0), n
            else:
                total = self.count[prompt] + n
                self.mean[prompt] = (self.mean[prompt] * self.count[prompt] + rows.mean(0) * n) / total
                self.count[prompt] = total
            # 2. uncentred rank-1 updates of the stored inverse (from I/λ the first time)
            start = self.inverse.get(prompt)
            self.inverse[prompt] = sherman_morrison_inverse(rows, self.lamb, start)
            # 3. centre by the running mean; correct the inverse by −N μμᵀ (one more rank-1 step)
            mu, count, inverse = self.mean[prompt], self.count[prompt], self.inverse[prompt]
            projected = inverse @ mu
            adjusted = inverse - torch.outer(projected, projected) / (-1.0 / count + mu @ projected)
            out[mask] = reference_normalize(reference_bonus(rows - mu, adjusted, self.reward_type), self.normalization)
        return out


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.double().cpu(), expected.double().cpu()
    scale = expected.abs().max().item() if expected.numel() else 0.0
    return (actual - expected).abs().max().item() / max(scale, 1e-300) if expected.numel() else 0.0


# --------------------------------------------------------------------------- inputs


def make_groups(sizes, dim, seed, *, spread=1.0, offset=0.0, near_duplicates=0):
    """Shuffled rows (groups non-contiguous) with uuid-string labels; returns (features, labels)."""
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    blocks, labels = [], []
    for size in sizes:
        centre = offset * torch.randn(dim, generator=generator, dtype=torch.float64)
        block = centre + spread * torch.randn(size, dim, generator=generator, dtype=torch.float64)
        if near_duplicates and size > near_duplicates:
            base = block[0]
            noise = torch.randn(near_duplicates, dim, generator=generator, dtype=torch.float64)
            block[1 : 1 + near_duplicates] = base + 1e-4 * noise
        blocks.append(block)
        labels += [str(uuid.UUID(int=int(rng.integers(2**63))))] * size
    features = torch.cat(blocks)
    permutation = torch.as_tensor(rng.permutation(features.shape[0]))
    return features[permutation], [labels[i] for i in permutation.tolist()]


# --------------------------------------------------------------------------- per-step bonuses


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reward_type", REWARD_TYPES)
@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_bonuses_match_sequential_reference_well_conditioned(device, reward_type, normalization):
    features, labels = make_groups([8, 3, 1, 12, 8, 5, 2], dim=6, seed=1)
    expected = reference_bonuses(features, labels, 0.5, reward_type, normalization)
    for solver in ("auto", "kernel", "covariance"):
        actual = bonuses(
            features.to(device), labels, lamb=0.5, reward_type=reward_type, normalization=normalization,
            solver=solver, out_dtype=torch.float64,
        )
        assert actual.device.type == device
        assert relative_error(actual, expected) <= WELL_CONDITIONED_RTOL, solver


@pytest.mark.parametrize("reward_type", REWARD_TYPES)
@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_bonuses_match_reference_paper_setting(reward_type, normalization):
    # λ = 0.01, d = 32 > n = 8: the paper's regime, where leverages sit near 1 − 1/n.
    features, labels = make_groups([8] * 6 + [4, 16], dim=32, seed=2)
    expected = reference_bonuses(features, labels, 0.01, reward_type, normalization)
    actual = bonuses(features, labels, lamb=0.01, reward_type=reward_type, normalization=normalization,
                     out_dtype=torch.float64)
    assert relative_error(actual, expected) <= WELL_CONDITIONED_RTOL


@pytest.mark.parametrize("reward_type", REWARD_TYPES)
@pytest.mark.parametrize("solver", ["kernel", "covariance"])
def test_bonuses_match_reference_ill_conditioned(reward_type, solver):
    # Near-duplicate rollouts (1e-4 apart) with a large common offset and a small λ.
    features, labels = make_groups([8, 8, 6], dim=16, seed=3, offset=50.0, near_duplicates=3)
    expected = reference_bonuses(features, labels, 1e-3, reward_type)
    actual = bonuses(features, labels, lamb=1e-3, reward_type=reward_type, solver=solver, out_dtype=torch.float64)
    assert relative_error(actual, expected) <= ILL_CONDITIONED_RTOL


@pytest.mark.parametrize("reward_type", REWARD_TYPES)
def test_bonuses_uncentred_match_reference(reward_type):
    features, labels = make_groups([4, 1, 7], dim=5, seed=4, offset=1.0)
    expected = reference_bonuses(features, labels, 0.3, reward_type, center=False)
    actual = bonuses(features, labels, lamb=0.3, reward_type=reward_type, center=False, out_dtype=torch.float64)
    assert relative_error(actual, expected) <= WELL_CONDITIONED_RTOL


def test_near_duplicates_get_small_leverage_and_others_saturate():
    features, labels = make_groups([8], dim=32, seed=5, near_duplicates=3)
    values = bonuses(features, labels, lamb=0.01, out_dtype=torch.float64)
    # the four mutually close rows (a row and its 3 near copies) share the budget of one direction
    close = torch.cdist(features, features).lt(1e-2).sum(1) > 1
    assert close.sum() == 4
    assert values[close].max() < 0.3
    assert torch.allclose(values[~close], torch.full_like(values[~close], 0.875), atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_fast_path_with_precomputed_ids_matches_labels(device):
    features, labels = make_groups([8, 8, 3, 8], dim=32, seed=6)
    ids, num_groups = group_ids(labels)
    slow = bonuses(features.to(device), labels, normalization="z_score")
    fast = bonuses(
        features.to(device), ids.to(device), num_groups=num_groups, max_group_size=10,
        normalization="z_score", check_finite=False,
    )
    torch.testing.assert_close(fast, slow, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_group_layout_path_matches_label_path(device, normalization):
    features, labels = make_groups([8, 3, 1, 8], dim=32, seed=15)
    features = features.to(device)
    layout = group_layout(labels, device=device)
    assert (layout.num_groups, layout.max_group_size, layout.device.type) == (4, 8, device)
    for reward_type in REWARD_TYPES:
        for solver in ("kernel", "covariance"):
            kwargs = {"reward_type": reward_type, "normalization": normalization, "solver": solver}
            expected = bonuses(features, labels, **kwargs)
            fast = bonuses(features, layout, check_finite=False, **kwargs)
            torch.testing.assert_close(fast, expected, rtol=0, atol=0)
    scores = torch.ones(len(labels), device=device)
    from_layout = combine_rewards(scores, expected, layout, beta=0.1)
    torch.testing.assert_close(from_layout.total, combine_rewards(scores, expected, labels, beta=0.1).total)
    with pytest.raises(ValueError, match="20 entries but the batch has 5"):
        bonuses(features[:5], layout)


def test_auto_solver_rule():
    assert choose_solver(8, 32, "cpu") == "kernel"
    assert choose_solver(64, 32, "cpu") == "covariance"
    assert choose_solver(8, 32, "cuda") == "covariance"
    assert choose_solver(8, CUDA_COVARIANCE_MAX_DIM + 1, "cuda") == "kernel"
    assert choose_solver(8, 0, "cpu") == "kernel"


@pytest.mark.parametrize("device", DEVICES)
def test_bonuses_accept_any_float_dtype_and_label_kind(device):
    features, labels = make_groups([8, 8], dim=32, seed=7)
    expected = bonuses(features, labels)
    as_object_array = np.array(labels, dtype=object)
    int_ids = torch.tensor([0 if label == labels[0] else 7 for label in labels], device=device)
    for groups in (labels, tuple(labels), as_object_array, np.array(labels), int_ids):
        torch.testing.assert_close(bonuses(features.to(device), groups).cpu(), expected)
    low_precision = bonuses(features.to(device=device, dtype=torch.bfloat16), labels)
    assert low_precision.dtype == torch.float32 and torch.isfinite(low_precision).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reward_type", REWARD_TYPES)
@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_degenerate_groups_give_finite_results(device, reward_type, normalization):
    dim = 4
    identical = torch.ones(5, dim)
    zeros = torch.zeros(3, dim)
    single = torch.randn(1, dim, generator=torch.Generator().manual_seed(8))
    features = torch.cat([identical, zeros, single]).to(device)
    labels = ["same"] * 5 + ["zero"] * 3 + ["one"]
    values = bonuses(features, labels, reward_type=reward_type, normalization=normalization)
    assert torch.isfinite(values).all()
    # centred identical / zero / single rows are all the zero vector: no novelty, no spread
    assert torch.equal(values.cpu(), torch.zeros(9))
    no_dims = bonuses(torch.zeros(4, 0, device=device), [0, 0, 1, 1], reward_type=reward_type,
                      normalization=normalization)
    assert torch.equal(no_dims.cpu(), torch.zeros(4))


def test_single_uncentred_row_has_closed_form():
    row = torch.tensor([[3.0, 4.0]], dtype=torch.float64)  # |x|² = 25
    leverage = bonuses(row, [0], lamb=0.5, center=False, out_dtype=torch.float64)
    loo = bonuses(row, [0], lamb=0.5, center=False, reward_type="leave_one_out", out_dtype=torch.float64)
    assert leverage.item() == pytest.approx(25 / 25.5, rel=1e-14)
    assert loo.item() == pytest.approx(25 / 0.5, rel=1e-12)


def test_saturated_group_is_not_rescaled_by_rounding_noise():
    # All leverages equal 1 − 1/n up to float64 rounding: rnd/z_score must not amplify the noise.
    features, labels = make_groups([8], dim=64, seed=9, spread=100.0)
    raw = bonuses(features, labels, lamb=1e-9, out_dtype=torch.float64)
    assert torch.allclose(raw, torch.full_like(raw, 0.875), atol=1e-12)
    assert torch.allclose(bonuses(features, labels, lamb=1e-9, normalization="rnd", out_dtype=torch.float64), raw)
    assert bonuses(features, labels, lamb=1e-9, normalization="z_score").abs().max() < 1e-9


def test_empty_batch():
    empty = torch.zeros(0, 32)
    for groups in ([], torch.zeros(0, dtype=torch.long), np.array([], dtype=object)):
        out = bonuses(empty, groups)
        assert out.shape == (0,) and out.dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lamb": 0.0}, "lamb"),
        ({"lamb": -1.0}, "lamb"),
        ({"lamb": float("nan")}, "lamb"),
        ({"reward_type": "elliptical"}, "reward_type"),
        ({"normalization": "minmax"}, "normalization"),
        ({"solver": "qr"}, "solver"),
        ({"center": 1}, "center"),
    ],
)
def test_bonuses_reject_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bonuses(torch.randn(4, 3), [0, 0, 1, 1], **kwargs)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_bonuses_reject_non_finite_features(bad):
    features = torch.randn(4, 3)
    features[2, 1] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        bonuses(features, [0, 0, 1, 1])


@pytest.mark.parametrize(
    "features, groups, message",
    [
        (torch.randn(4, 3), [0, 0, 1], "3 entries but the batch has 4"),
        (torch.randn(4), [0, 0, 1, 1], "2-D"),
        (torch.ones(4, 3, dtype=torch.long), [0, 0, 1, 1], "floating-point"),
        (torch.randn(4, 3), torch.zeros(2, 2, dtype=torch.long), "1-D"),
        (torch.randn(4, 3), torch.zeros(4), "integer ids"),
        (torch.randn(4, 3), np.zeros(4), "dtype float64"),
        (torch.randn(4, 3), [[1], [1], [2], [2]], "hashable"),
    ],
)
def test_bonuses_reject_bad_shapes_and_labels(features, groups, message):
    with pytest.raises(ValueError, match=message):
        bonuses(features, groups)


def test_fast_path_checks_ids_on_cpu():
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        bonuses(torch.randn(4, 3), torch.tensor([0, 1, 2, 2]), num_groups=2)
    with pytest.raises(ValueError, match="integer tensor"):
        bonuses(torch.randn(4, 3), ["a", "a", "b", "b"], num_groups=2)
    with pytest.raises(ValueError, match="max_group_size"):
        bonuses(torch.randn(4, 3), torch.tensor([0, 0, 0, 1]), num_groups=2, max_group_size=2)


def test_too_small_lambda_for_the_feature_scale_is_reported():
    # rank-1 rows of scale 1e10 in 10 dims: λ = 1e-300 vanishes next to the rounding of XᵀX
    direction = torch.linspace(1.0, 10.0, 10, dtype=torch.float64) * 1e10
    features = torch.stack([direction, -direction, 0.3 * direction])
    with pytest.raises(ValueError, match="positive definite"):
        bonuses(features, [0, 0, 0], lamb=1e-300, center=False, solver="covariance")


# --------------------------------------------------------------------------- group ids


def test_group_ids_first_appearance_order_for_every_label_kind():
    expected = torch.tensor([0, 1, 0, 2, 1, 2])
    uids = [str(uuid.UUID(int=k)) for k in (5, 3, 9)]
    cases = [
        torch.tensor([7, 3, 7, -1, 3, -1]),
        [7, 3, 7, -1, 3, -1],
        np.array([7, 3, 7, -1, 3, -1]),
        np.array(["b", "a", "b", "c", "a", "c"]),
        np.array([uids[0], uids[1], uids[0], uids[2], uids[1], uids[2]], dtype=object),
        (uids[0], uids[1], uids[0], uids[2], uids[1], uids[2]),
    ]
    for groups in cases:
        ids, num_groups = group_ids(groups)
        assert num_groups == 3 and ids.dtype == torch.long
        assert torch.equal(ids.cpu(), expected), groups


def test_group_ids_numpy_and_python_ints_are_one_label():
    ids, num_groups = group_ids([np.int64(4), 4, np.int32(4), "4"])
    assert num_groups == 2 and ids.tolist() == [0, 0, 0, 1]
    assert group_ids([])[1] == 0


# --------------------------------------------------------------------------- persistent mode


def persistent_steps(seed: int, dim: int, offset: float = 0.5):
    """Four steps: prompts recur, new ones appear, rows shuffled, group sizes vary, ids mixed types."""
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    plan = [
        {10: 8, 11: 8, 12: 3},
        {11: 8, 13: 1, 10: 5},
        {12: 8, 10: 8, 14: 8, 11: 2},
        {13: 4, 12: 8},
    ]
    centres = {p: offset * torch.randn(dim, generator=generator, dtype=torch.float64) for p in range(10, 15)}
    steps = []
    for sizes in plan:
        rows, prompts = [], []
        for prompt, size in sizes.items():
            rows.append(centres[prompt] + torch.randn(size, dim, generator=generator, dtype=torch.float64))
            prompts += [prompt] * size
        features = torch.cat(rows)
        order = rng.permutation(len(prompts))
        steps.append((features[torch.as_tensor(order)], [prompts[i] for i in order]))
    return steps


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reward_type", REWARD_TYPES)
@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_persistent_matches_sequential_reference(device, reward_type, normalization):
    reference = ReferencePersistent(0.05, reward_type, normalization)
    state = PersistentCovariance(6, lamb=0.05, reward_type=reward_type, normalization=normalization, device=device)
    for step, (features, prompts) in enumerate(persistent_steps(seed=10, dim=6)):
        expected = reference.step(features, prompts)
        ids = torch.tensor(prompts) if step % 2 else np.array(prompts)  # label kinds mix across steps
        actual = state.update_and_score(features.to(device), ids)
        assert actual.dtype == torch.float32 and actual.device.type == device
        # float32 output: compare at float32 resolution here, at 1e-8 through the float64 state below
        assert relative_error(actual, expected) <= 1e-6
    assert state.num_prompts == 5 and sorted(state.prompt_ids) == list(range(10, 15))


@pytest.mark.parametrize("reward_type", REWARD_TYPES)
def test_persistent_state_matches_reference_at_float64(reward_type):
    reference = ReferencePersistent(0.05, reward_type)
    state = PersistentCovariance(6, lamb=0.05, reward_type=reward_type)
    for features, prompts in persistent_steps(seed=11, dim=6):
        expected = reference.step(features, prompts)
        state.update_and_score(features, prompts)
        # rescore from the float64 state: λI + S must equal upstream's corrected matrix
        saved = state.state_dict()
        for index, prompt in enumerate(saved["prompt_ids"]):
            corrected_inverse = torch.linalg.inv(saved["scatter"][index] + 0.05 * torch.eye(6, dtype=torch.float64))
            mask = torch.tensor([p == prompt for p in prompts])
            if not mask.any():
                continue
            ours = reference_bonus(features[mask] - saved["mean"][index], corrected_inverse, reward_type)
            assert relative_error(ours, expected[mask]) <= WELL_CONDITIONED_RTOL
            assert saved["count"][index].item() == reference.count[prompt]
            assert relative_error(saved["mean"][index], reference.mean[prompt]) <= 1e-12


def test_persistent_ill_conditioned_matches_reference():
    # Large common offset: upstream's uncentred accumulation is badly conditioned here.
    reference = ReferencePersistent(1e-2, "leverage")
    state = PersistentCovariance(8, lamb=1e-2)
    for features, prompts in persistent_steps(seed=12, dim=8, offset=20.0):
        expected = reference.step(features, prompts)
        assert relative_error(state.update_and_score(features, prompts), expected) <= ILL_CONDITIONED_RTOL


@pytest.mark.parametrize("device", DEVICES)
def test_persistent_state_dict_round_trip_resumes_exactly(device):
    steps = persistent_steps(seed=13, dim=5)
    uninterrupted = PersistentCovariance(5, lamb=0.1, reward_type="leave_one_out", device=device)
    first = PersistentCovariance(5, lamb=0.1, reward_type="leave_one_out", device=device)
    for features, prompts in steps[:2]:
        uninterrupted.update_and_score(features.to(device), prompts)
        first.update_and_score(features.to(device), prompts)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = PersistentCovariance(5, lamb=0.1, reward_type="leave_one_out", device=device)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.prompt_ids == first.prompt_ids
    for features, prompts in steps[2:]:
        expected = uninterrupted.update_and_score(features.to(device), prompts)
        torch.testing.assert_close(resumed.update_and_score(features.to(device), prompts), expected, rtol=0, atol=0)


def test_persistent_string_prompt_ids_and_state_validation():
    state = PersistentCovariance(3, lamb=0.1)
    out = state.update_and_score(torch.randn(4, 3), ["math/test/4", "math/test/9", "math/test/4", "math/test/9"])
    assert out.shape == (4,) and torch.isfinite(out).all()
    assert state.update_and_score(torch.zeros(0, 3), []).shape == (0,)
    saved = state.state_dict()
    with pytest.raises(ValueError, match="dim 3"):
        PersistentCovariance(4).load_state_dict(saved)
    with pytest.raises(ValueError, match="lacks keys"):
        PersistentCovariance(3).load_state_dict({"dim": 3})
    broken = dict(saved, count=saved["count"][:1])
    with pytest.raises(ValueError, match="do not match"):
        PersistentCovariance(3).load_state_dict(broken)
    with pytest.raises(ValueError, match="built for dim 3"):
        state.update_and_score(torch.randn(2, 4), [0, 0])
    with pytest.raises(ValueError, match="NaN"):
        state.update_and_score(torch.full((2, 3), float("nan")), [0, 0])
    with pytest.raises(ValueError, match="lamb"):
        PersistentCovariance(3, lamb=0)
    with pytest.raises(ValueError, match="reward_type"):
        PersistentCovariance(3, reward_type="bonus")


# --------------------------------------------------------------------------- combine_rewards


@pytest.mark.parametrize("device", DEVICES)
def test_combine_rewards_turn_off_rules_with_non_contiguous_groups(device):
    # groups: a = none correct, b = some correct, c = all correct; rows interleaved
    labels = ["a", "b", "c", "a", "b", "c", "b"]
    extrinsic = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0], device=device)
    intrinsic = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], device=device)

    def kept(**flags):
        result = combine_rewards(extrinsic, intrinsic, labels, beta=1.0, **flags)
        return result.intrinsic.cpu()

    none = {"turn_off_if_none_correct": False}
    torch.testing.assert_close(kept(**none), intrinsic.cpu())
    torch.testing.assert_close(kept(), torch.tensor([0, 0.2, 0.3, 0, 0.5, 0.6, 0.7]))
    torch.testing.assert_close(kept(**none, turn_off_if_some_correct=True), torch.tensor([0.1, 0, 0.3, 0.4, 0, 0.6, 0]))
    torch.testing.assert_close(kept(**none, turn_off_if_all_correct=True),
                               torch.tensor([0.1, 0.2, 0, 0.4, 0.5, 0, 0.7]))
    torch.testing.assert_close(
        kept(**none, turn_off_if_rollout_incorrect=True), torch.tensor([0, 0.2, 0.3, 0, 0, 0.6, 0.7])
    )
    everything = kept(turn_off_if_some_correct=True, turn_off_if_all_correct=True)
    assert torch.equal(everything, torch.zeros(7))

    result = combine_rewards(extrinsic, intrinsic, labels, alpha=2.0, beta=0.01)
    torch.testing.assert_close(result.total.cpu(), (2.0 * extrinsic.cpu() + 0.01 * kept()).float())
    assert result.group_status.tolist() == [GroupStatus.NONE_CORRECT, GroupStatus.SOME_CORRECT, GroupStatus.ALL_CORRECT]
    assert result.group_index.tolist() == [0, 1, 2, 0, 1, 2, 1]
    thirds = {"none_correct": 1 / 3, "some_correct": 1 / 3, "all_correct": 1 / 3}
    assert result.status_fractions() == pytest.approx(thirds)


def test_combine_rewards_non_binary_scores_count_correct_rollouts():
    # Upstream compared sums with the group size: 0.5 + 0.5 = 1 < 2 would be "some correct",
    # and −1 + 1 = 0 "none correct". Counting rollouts with score > 0 fixes both.
    result = combine_rewards(
        torch.tensor([0.5, 0.5, -1.0, 1.0]), torch.ones(4), ["x", "x", "y", "y"], beta=1.0,
        turn_off_if_all_correct=True,
    )
    assert result.group_status.tolist() == [GroupStatus.ALL_CORRECT, GroupStatus.SOME_CORRECT]
    assert result.intrinsic.tolist() == [0.0, 0.0, 1.0, 1.0]
    assert result.total.tolist() == [0.5, 0.5, 0.0, 2.0]


def test_combine_rewards_fast_ids_and_validation():
    ids = torch.tensor([1, 0, 1, 0])
    result = combine_rewards(torch.tensor([1.0, 0, 0, 0]), torch.ones(4), ids, beta=0.5, num_groups=2)
    assert result.group_status.tolist() == [GroupStatus.NONE_CORRECT, GroupStatus.SOME_CORRECT]
    assert result.total.tolist() == [1.5, 0.0, 0.5, 0.0]
    empty = combine_rewards(torch.zeros(0), torch.zeros(0), [], beta=1.0)
    assert empty.total.shape == (0,) and empty.status_fractions()["none_correct"] == 0.0
    with pytest.raises(ValueError, match="differ in shape"):
        combine_rewards(torch.zeros(3), torch.zeros(4), [0, 0, 0], beta=1.0)
    with pytest.raises(ValueError, match="extrinsic contains NaN"):
        combine_rewards(torch.tensor([float("nan")]), torch.zeros(1), [0], beta=1.0)
    with pytest.raises(ValueError, match="beta"):
        combine_rewards(torch.zeros(1), torch.zeros(1), [0], beta=float("inf"))
    with pytest.raises(ValueError, match="turn_off_if_some_correct"):
        combine_rewards(torch.zeros(1), torch.zeros(1), [0], beta=1.0, turn_off_if_some_correct=1)
    with pytest.raises(ValueError, match="3 entries but the batch has 2"):
        combine_rewards(torch.zeros(2), torch.zeros(2), [0, 0, 1], beta=1.0)


# --------------------------------------------------------------------------- devices


@pytest.mark.parametrize("device", DEVICES)
def test_projection_is_the_same_on_every_device_and_leaves_the_global_rng(device):
    before = torch.get_rng_state()
    on_device = sparse_projection(3584, 32, seed=42, device=device)
    assert torch.equal(torch.get_rng_state(), before)
    assert on_device.device.type == device and on_device.shape == (3584, 32)
    assert torch.equal(on_device.cpu(), sparse_projection(3584, 32, seed=42))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"in_dim": 0}, "in_dim"),
        ({"out_dim": -3}, "out_dim"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"density": 0.0}, "density"),
        ({"density": 1.5}, "density"),
        ({"dtype": torch.int32}, "dtype"),
    ],
)
def test_projection_rejects_bad_arguments(kwargs, message):
    arguments = {"in_dim": 64, "out_dim": 8, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=message):
        sparse_projection(arguments.pop("in_dim"), arguments.pop("out_dim"), **arguments)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on the GPU machine)")
@pytest.mark.parametrize("solver", ["kernel", "covariance"])
def test_cuda_fast_path_never_synchronises_with_the_host(solver):
    features, labels = make_groups([8] * 15 + [5], dim=32, seed=14)
    layout = group_layout(labels, device="cuda")
    ids, num_groups = group_ids(labels)
    features, ids = features.cuda(), ids.cuda()
    projection = sparse_projection(32, 16, seed=0, device="cuda", dtype=torch.float64)
    kwargs = {"normalization": "z_score", "reward_type": "leave_one_out", "solver": solver}
    expected = bonuses(features @ projection, labels, **kwargs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        from_layout = bonuses(features @ projection, layout, check_finite=False, **kwargs)
        from_ids = bonuses(
            features @ projection, ids, num_groups=num_groups, max_group_size=8, check_finite=False, **kwargs
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(from_layout, expected, rtol=0, atol=0)
    torch.testing.assert_close(from_ids, expected, rtol=0, atol=0)


def test_projection_seed_is_shared_by_both_backends_and_depends_on_step_only_when_randomized():
    from repexp.elliptical import projection_seed

    assert projection_seed(42, 3) == projection_seed(42, 3)
    assert projection_seed(42, 3) != projection_seed(42, 4) != projection_seed(43, 4)
    assert projection_seed(42, 3, randomize=False) == projection_seed(42, 99, randomize=False)
    assert 0 <= projection_seed(2**40, 7) < 2**63  # fits torch.Generator.manual_seed
