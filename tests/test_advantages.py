"""Tests of corrgrpo.trainer.estimators: the paper's worked example, the consequences of
the CorrGRPO definition, properties, the baselines against hand-computed values,
NaN handling and input validation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo.trainer import estimators as adv
from corrgrpo.trainer.estimators import (
    AdvantageResult,
    available_estimators,
    compute_advantages,
    get_estimator,
    group_rewards,
    register_estimator,
)
from corrgrpo.trainer.estimators import groups as estimator_groups

EPS = 1e-6
PROPERTY_SETTINGS = settings(max_examples=60, deadline=None)


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def one_group(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.long)


def helmert(n: int, k: int) -> np.ndarray:
    """``[n, k]`` centred orthonormal columns (k < n)."""
    cols = []
    for j in range(1, k + 1):
        v = np.zeros(n)
        v[:j] = 1.0
        v[j] = -j
        cols.append(v / np.linalg.norm(v))
    return np.stack(cols, axis=1)


def numerator(rewards: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """``N_i`` of a single group without NaN."""
    s = rewards * (1.0 if weights is None else weights)
    return (s - s.mean(axis=0)).sum(axis=1)


def loop_reference(
    rewards: np.ndarray, group_ids: np.ndarray, weights: np.ndarray, estimator: str
) -> np.ndarray:
    """Per-group numpy reference of grpo / corrgrpo / mo_grpo / gdpo written from docs/method.md."""
    out = np.zeros(len(rewards))
    for gid in np.unique(group_ids):
        rows = np.nonzero(group_ids == gid)[0]
        s = rewards[rows] * weights
        n = len(rows)
        mean = np.array(
            [np.nanmean(col) if (~np.isnan(col)).any() else 0.0 for col in s.T]
        ).reshape(1, -1)
        c = np.nan_to_num(s - mean, nan=0.0)
        cov = c.T @ c / max(n - 1, 1)
        scale = np.maximum(1.0, np.nan_to_num(np.abs(s), nan=0.0).max(axis=0)) ** 2
        active = np.diag(cov) > 1e-12 * scale
        c = c * active  # a constant component centres to exactly 0
        cov = c.T @ c / max(n - 1, 1)
        num = c.sum(axis=1)
        if estimator in ("mo_grpo", "gdpo"):
            std = np.sqrt((c**2).sum(axis=0) / max(n - 1, 1)) / np.abs(weights)
            out[rows] = (np.where(active, c / weights / (std + EPS), 0.0) * weights).sum(axis=1)
        elif estimator == "grpo":
            out[rows] = num / (math.sqrt(max(cov.sum(), 0.0)) + EPS)
        else:
            total = 0.0
            for a in range(cov.shape[0]):
                for b in range(cov.shape[0]):
                    if active[a] and active[b]:
                        total += cov[a, b] / math.sqrt(cov[a, a] * cov[b, b])
            out[rows] = num / math.sqrt(max(total, 0.0) + EPS)
    valid = ~np.isnan(rewards).all(axis=1)
    if estimator == "gdpo":
        std = out[valid].std(ddof=1) if valid.sum() > 1 else 0.0
        out = (out - out[valid].mean()) / (std + EPS)
    out[~valid] = 0.0
    return out


@st.composite
def batches(draw: st.DrawFn, nan: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random batches: 1-5 groups of 1-6 responses, 1-4 components, shuffled ids.

    Components are a mix of continuous values with different scales, binary
    values and constants, so ties, constant components and correlations occur.
    """
    seed = draw(st.integers(0, 2**32 - 1))
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    k = draw(st.integers(1, 4))
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    cols = []
    for _ in range(k):
        kind = rng.integers(3)
        if kind == 0:
            cols.append(rng.normal(size=n) * 10.0 ** rng.uniform(-2, 2))
        elif kind == 1:
            cols.append(rng.integers(0, 2, size=n).astype(float))
        else:
            cols.append(np.full(n, rng.uniform(-5, 5)))
    rewards = np.stack(cols, axis=1)
    if nan:
        rewards[rng.random((n, k)) < 0.2] = np.nan
    ids = np.repeat(rng.choice(100, size=len(sizes), replace=False), sizes)
    perm = rng.permutation(n)
    weights = rng.uniform(0.1, 3.0, size=k)
    return rewards[perm], ids[perm], weights


# --------------------------------------------------------------------------- #
# the paper's worked example (Figure 2)
# --------------------------------------------------------------------------- #
PAPER_COV = np.array(
    [[0.17493, 0.1707, 0.1728], [0.1707, 0.17493, 0.1728], [0.1728, 0.1728, 14.1696]]
)


def paper_rewards(seed: int = 0) -> np.ndarray:
    """A 4 x 3 data set whose sample covariance is the paper's matrix."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(4, 3))
    q, _ = np.linalg.qr(x - x.mean(axis=0))  # centred orthonormal columns
    return 5.0 + math.sqrt(3.0) * q @ np.linalg.cholesky(PAPER_COV).T


@pytest.mark.parametrize("seed", [0, 1])
def test_paper_worked_example(seed: int) -> None:
    rewards = paper_rewards(seed)
    np.testing.assert_allclose(np.cov(rewards, rowvar=False), PAPER_COV, atol=1e-12)
    n_i = numerator(rewards)
    grpo = compute_advantages(rewards, one_group(4), "grpo")
    corr = compute_advantages(rewards, one_group(4), "corrgrpo")
    stats = corr.stats

    assert stats.s_cov.item() == pytest.approx(15.5520, abs=1e-4)
    grpo_multiplier = grpo.advantages.double().numpy() / n_i
    corr_multiplier = corr.advantages.double().numpy() / n_i
    np.testing.assert_allclose(grpo_multiplier, 0.2536, atol=5e-5)
    np.testing.assert_allclose(corr_multiplier, 0.4307, atol=5e-5)
    assert stats.c_q.item() == pytest.approx(0.4307 / 0.2536, rel=2e-4)

    rho = stats.mean_correlation.numpy()
    assert rho[0, 1] == pytest.approx(0.9756, abs=3e-4)  # the paper rounds Cov(r1, r2)
    assert rho[0, 2] == pytest.approx(0.1098, abs=1e-4)
    assert rho[1, 2] == pytest.approx(0.1098, abs=1e-4)
    assert stats.s_corr.item() == pytest.approx(5.3904, abs=1e-3)
    assert stats.k_eff.item() == pytest.approx(9 / 5.3907, rel=1e-3)

    variance_share = PAPER_COV[2, 2] / stats.s_cov.item()
    assert variance_share == pytest.approx(0.911, abs=5e-4)
    # r3's row of the covariance matrix, its variance and both covariances
    assert stats.cov_share[0, 2].item() == pytest.approx((14.1696 + 2 * 0.1728) / 15.55206)
    assert stats.cov_share.sum().item() == pytest.approx(1.0)
    assert rho[0, 1] / rho[0, 2] == pytest.approx(8.89, abs=5e-3)


# --------------------------------------------------------------------------- #
# consequences of the CorrGRPO definition (docs/method.md)
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("estimator", ["corrgrpo", "grpo", "gdpo", "mo_grpo", "gdpo_corr"])
def test_group_of_size_one_gets_zero(estimator: str) -> None:
    rewards = torch.tensor([[1.0, 5.0], [2.0, 3.0], [0.5, -1.0]])
    result = compute_advantages(rewards, torch.tensor([0, 1, 2]), estimator)
    assert torch.equal(result.advantages, torch.zeros(3))
    assert result.stats.zero_variance.all()
    assert result.stats.zero_variance_fraction == 1.0


def test_all_components_constant_gives_zero_despite_round_off() -> None:
    # means of such values are not exact in float64; the tolerance keeps them inactive
    rewards = torch.tensor(
        [[0.1, 1e8 + 0.1, 0.3], [0.1, 1e8 + 0.1, 0.3], [0.1, 1e8 + 0.1, 0.3]], dtype=torch.float64
    )
    result = compute_advantages(rewards, one_group(3), weights=torch.tensor([0.7, 1.3, 3.0]))
    assert torch.equal(result.advantages, torch.zeros(3))
    assert not group_rewards(rewards, one_group(3)).active.any()
    assert result.stats.zero_variance.tolist() == [True]


def test_one_active_component_gives_its_centred_value() -> None:
    rewards = torch.tensor([[0.0, 2.0, 7.0], [1.0, 2.0, 7.0], [1.0, 2.0, 7.0], [0.0, 2.0, 7.0]])
    result = compute_advantages(rewards, one_group(4), weights=torch.tensor([3.0, 1.0, 1.0]))
    expected = torch.tensor([-1.5, 1.5, 1.5, -1.5]) / math.sqrt(1 + EPS)
    torch.testing.assert_close(result.advantages, expected)
    assert result.stats.k_eff.item() == pytest.approx(1.0)


@pytest.mark.parametrize("k", [2, 3, 5])
def test_uncorrelated_components_divide_by_sqrt_k(k: int) -> None:
    scales = np.array([1.0, 10.0, 0.01, 3.0, 100.0])[:k]
    rewards = helmert(8, k) * scales + 1.0
    result = compute_advantages(rewards, one_group(8))
    expected = numerator(rewards) / math.sqrt(k + EPS)
    np.testing.assert_allclose(result.advantages.numpy(), expected, rtol=1e-6, atol=1e-12)
    assert result.stats.s_corr.item() == pytest.approx(k)
    assert result.stats.k_eff.item() == pytest.approx(k)


@pytest.mark.parametrize("k", [2, 4])
def test_perfectly_correlated_components_divide_by_k(k: int) -> None:
    base = np.array([0.0, 1.0, 3.0, -2.0, 0.5])
    rewards = np.stack([base * (i + 1) ** 2 + i for i in range(k)], axis=1)
    result = compute_advantages(rewards, one_group(5))
    np.testing.assert_allclose(
        result.advantages.numpy(), numerator(rewards) / math.sqrt(k * k + EPS), rtol=1e-6
    )
    assert result.stats.k_eff.item() == pytest.approx(1.0)


def test_duplicating_components_leaves_advantages_unchanged() -> None:
    """Duplicating a component adds c_k to the numerator and a row/column of
    correlations to S: A is unchanged when the duplicated component is the only
    active one, or when every component is duplicated (2 N_i / sqrt(4 S))."""
    rng = np.random.default_rng(3)
    rewards = rng.normal(size=(6, 3)) * [1.0, 20.0, 0.1]
    a = compute_advantages(rewards, one_group(6)).advantages
    both = compute_advantages(np.concatenate([rewards, rewards], axis=1), one_group(6))
    torch.testing.assert_close(both.advantages, a, rtol=1e-5, atol=1e-6)

    single = np.stack([rewards[:, 1], np.full(6, 2.0)], axis=1)
    a = compute_advantages(single, one_group(6)).advantages
    dup = compute_advantages(np.concatenate([single, single[:, :1]], axis=1), one_group(6))
    torch.testing.assert_close(dup.advantages, a, rtol=1e-5, atol=1e-6)


def test_scaling_a_component_changes_numerator_not_denominator() -> None:
    rng = np.random.default_rng(4)
    rewards = rng.normal(size=(8, 3))
    scaled = rewards * [1.0, 1.0, 50.0]
    base = compute_advantages(rewards, one_group(8))
    big = compute_advantages(scaled, one_group(8))
    assert big.stats.s_corr.item() == pytest.approx(base.stats.s_corr.item())
    denominator = math.sqrt(base.stats.s_corr.item() + EPS)
    np.testing.assert_allclose(big.advantages.numpy(), numerator(scaled) / denominator, rtol=1e-6)
    assert not np.allclose(big.advantages.numpy(), base.advantages.numpy())


def test_cancelling_components_are_reported_and_floor_bounds_them() -> None:
    x = np.array([0.0, 1.0, 2.0, 3.0])
    rewards = np.stack([x, -x, np.array([0.0, 0.0, 1.0, 0.0])], axis=1)
    weights = [1.0, 0.5, 0.0]  # N_i = x/2 centred, non-zero, while S_corr of r1, r2 is 0
    exact = compute_advantages(rewards, one_group(4), weights=weights)
    expected_numerator = 0.5 * (x - x.mean())
    np.testing.assert_allclose(
        exact.advantages.numpy(), expected_numerator / math.sqrt(EPS), rtol=1e-4
    )
    assert exact.stats.near_cancelling.tolist() == [True]
    assert exact.stats.num_near_cancelling == 1
    assert math.isnan(exact.stats.k_eff.item())
    assert exact.stats.to_dict()["k_eff"] == [None]
    floored = compute_advantages(rewards, one_group(4), weights=weights, min_denominator=1.0)
    np.testing.assert_allclose(floored.advantages.numpy(), expected_numerator, rtol=1e-6)
    assert floored.stats.c_q.item() == pytest.approx(math.sqrt(5 / 3) * 0.5 + EPS, rel=1e-6)


# --------------------------------------------------------------------------- #
# properties
# --------------------------------------------------------------------------- #
@PROPERTY_SETTINGS
@given(batches(nan=True))
def test_corrgrpo_is_grpo_times_positive_group_constant(batch) -> None:
    rewards, ids, weights = batch
    corr = compute_advantages(rewards, ids, "corrgrpo", weights=weights)
    grpo = compute_advantages(rewards, ids, "grpo", weights=weights)
    c_q = torch.where(corr.stats.zero_variance, 1.0, corr.stats.c_q)  # NaN: both are 0
    assert (c_q > 0).all()
    row = torch.searchsorted(corr.stats.group_keys, torch.from_numpy(ids))
    torch.testing.assert_close(
        corr.advantages.double(), c_q[row] * grpo.advantages.double(), rtol=1e-5, atol=1e-6
    )


@PROPERTY_SETTINGS
@given(batches(), st.integers(0, 3), st.floats(1e-3, 1e3))
def test_denominator_invariant_to_scaling_one_component(batch, column, factor) -> None:
    rewards, ids, weights = batch
    column %= rewards.shape[1]
    scaled = rewards.copy()
    scaled[:, column] *= factor
    a = compute_advantages(rewards, ids, weights=weights).stats
    b = compute_advantages(scaled, ids, weights=weights).stats
    torch.testing.assert_close(a.s_corr, b.s_corr, rtol=1e-7, atol=1e-7)
    assert torch.equal(a.zero_variance, b.zero_variance)


@PROPERTY_SETTINGS
@given(batches(nan=True), st.sampled_from(["corrgrpo", "grpo", "gdpo", "mo_grpo", "gdpo_corr"]))
def test_shuffling_rows_permutes_advantages(batch, estimator) -> None:
    rewards, ids, weights = batch
    perm = np.random.default_rng(len(ids)).permutation(len(ids))
    a = compute_advantages(rewards, ids, estimator, weights=weights)
    b = compute_advantages(rewards[perm], ids[perm], estimator, weights=weights)
    torch.testing.assert_close(b.advantages, a.advantages[perm], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.stats.s_corr, b.stats.s_corr)


@PROPERTY_SETTINGS
@given(batches(nan=True), st.sampled_from(["corrgrpo", "grpo", "mo_grpo", "gdpo"]), st.booleans())
def test_matches_per_group_loop_reference(batch, estimator, counting) -> None:
    rewards, ids, weights = batch
    factor = estimator_groups.DENSE_ID_RANGE_FACTOR
    try:  # both ways of mapping group ids to rows (counting pass, sort) must agree
        estimator_groups.DENSE_ID_RANGE_FACTOR = factor if counting else -10**6
        result = compute_advantages(rewards, ids - 50, estimator, weights=weights)
    finally:
        estimator_groups.DENSE_ID_RANGE_FACTOR = factor
    expected = loop_reference(rewards, ids, weights, estimator)
    np.testing.assert_allclose(result.advantages.numpy(), expected, rtol=1e-5, atol=1e-5)


@PROPERTY_SETTINGS
@given(batches(nan=True))
def test_sums_equal_the_explicit_covariance_and_correlation_matrices(batch) -> None:
    rewards, ids, weights = batch
    groups = group_rewards(rewards, ids, weights)
    cov, corr = groups.covariance(), groups.correlation()
    torch.testing.assert_close(groups.s_cov, cov.sum(dim=(1, 2)).clamp(min=0), atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(groups.s_corr, corr.sum(dim=(1, 2)).clamp(min=0), atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(groups.var, torch.diagonal(cov, dim1=1, dim2=2))
    assert groups.group_keys.tolist() == sorted(set(ids.tolist()))
    # the one-matmul batch mean of the correlation matrices
    stats = compute_advantages(rewards, ids, weights=weights).stats
    both = (groups.active.unsqueeze(2) & groups.active.unsqueeze(1)).double().sum(dim=0)
    expected = torch.where(both > 0, corr.sum(dim=0) / both.clamp(min=1), math.nan)  # undefined: NaN
    torch.testing.assert_close(stats.mean_correlation, expected, equal_nan=True)


# --------------------------------------------------------------------------- #
# the gradient direction within a group is GRPO's
# --------------------------------------------------------------------------- #
def test_autograd_gradient_is_c_q_times_grpo() -> None:
    torch.manual_seed(0)
    policy = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    obs = torch.randn(6, 4)
    actions = torch.tensor([0, 1, 2, 1, 0, 2])
    rewards = torch.tensor(
        [[1, 0.2, 30.0], [0, 0.4, -12.0], [1, 0.1, 5.0], [0, 0.9, 40.0], [1, 0.3, -8.0], [0, 0.3, 1.0]],
        dtype=torch.float64,
    )

    def gradient(estimator: str) -> tuple[list[torch.Tensor], AdvantageResult]:
        result = compute_advantages(rewards, one_group(6), estimator)
        policy.zero_grad()
        logp = torch.log_softmax(policy(obs), dim=-1).gather(1, actions[:, None]).squeeze(1)
        (result.advantages * logp).sum().backward()
        return [p.grad.clone() for p in policy.parameters()], result

    grads_corr, corr = gradient("corrgrpo")
    grads_grpo, _ = gradient("grpo")
    c_q = corr.stats.c_q.item()
    assert c_q > 1.0  # the large-scale third component shrinks GRPO's step
    for g_corr, g_grpo in zip(grads_corr, grads_grpo):
        torch.testing.assert_close(g_corr, c_q * g_grpo, rtol=1e-4, atol=1e-7)


# --------------------------------------------------------------------------- #
# baselines against hand-computed values
# --------------------------------------------------------------------------- #
# group 5: z1 = (+, -) / sqrt2, z2 = (-, +) / sqrt2; group 2: r1 constant, z2 = (+, -) / sqrt2
BASE_REWARDS = torch.tensor([[1.0, 0.0], [1.0, 5.0], [0.0, 10.0], [1.0, 3.0]])
BASE_IDS = torch.tensor([5, 2, 5, 2])
BASE_WEIGHTS = torch.tensor([1.0, 2.0])
H = 1 / math.sqrt(2)


def test_mo_grpo_hand_computed() -> None:
    result = compute_advantages(BASE_REWARDS, BASE_IDS, "mo_grpo", weights=BASE_WEIGHTS)
    torch.testing.assert_close(result.advantages, torch.tensor([-H, 2 * H, H, -2 * H]))


def test_gdpo_hand_computed() -> None:
    result = compute_advantages(BASE_REWARDS, BASE_IDS, "gdpo", weights=BASE_WEIGHTS)
    std = math.sqrt(10 * H * H / 3)  # unbiased std of (-H, 2H, H, -2H)
    expected = torch.tensor([-H, 2 * H, H, -2 * H]) / std
    torch.testing.assert_close(result.advantages, expected)
    assert expected[1].item() == pytest.approx(1.0954, abs=1e-4)


def test_gdpo_corr_hand_computed() -> None:
    # weighted z columns: (H, 0, -H, 0) and 2 * (-H, H, H, -H); variances 1/3, 8/3,
    # covariance -2/3, correlation -1/sqrt2: S = 2 - sqrt2
    result = compute_advantages(BASE_REWARDS, BASE_IDS, "gdpo_corr", weights=BASE_WEIGHTS)
    expected = torch.tensor([-H, 2 * H, H, -2 * H]) / math.sqrt(2 - math.sqrt(2))
    torch.testing.assert_close(result.advantages, expected)
    assert expected[0].item() == pytest.approx(-math.cos(math.pi / 8), abs=1e-6)


def test_grpo_scales_and_dr_grpo() -> None:
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [3.0, 1.0], [1.0, 1.0]])
    ids = torch.tensor([0, 0, 1, 1])
    t_centred = torch.tensor([0.5, -0.5, 1.0, -1.0])
    group = compute_advantages(rewards, ids, "grpo").advantages
    torch.testing.assert_close(group, torch.tensor([H, -H, H, -H]), rtol=1e-5, atol=1e-6)
    batch = compute_advantages(rewards, ids, "grpo", scale="batch").advantages
    torch.testing.assert_close(batch, t_centred / t_centred.std())
    none = compute_advantages(rewards, ids, "grpo", scale="none").advantages
    torch.testing.assert_close(none, t_centred)
    torch.testing.assert_close(compute_advantages(rewards, ids, "dr_grpo").advantages, t_centred)


# --------------------------------------------------------------------------- #
# NaN handling
# --------------------------------------------------------------------------- #
def test_nan_left_out_of_mean_and_centred_to_zero() -> None:
    nan = float("nan")
    rewards = torch.tensor([[1.0, nan], [3.0, 2.0], [5.0, 4.0]])
    # c1 = (-2, 0, 2), c2 = (0, -1, 1): var 4 and 1, cov 1, rho 1/2
    n_i = torch.tensor([-2.0, -1.0, 3.0])
    corr = compute_advantages(rewards, one_group(3))
    torch.testing.assert_close(corr.advantages, n_i / math.sqrt(3 + EPS))
    grpo = compute_advantages(rewards, one_group(3), "grpo")
    torch.testing.assert_close(grpo.advantages, n_i / (math.sqrt(7) + EPS))
    assert corr.stats.s_cov.item() == pytest.approx(7.0)


@pytest.mark.parametrize("estimator", available_estimators())
def test_all_nan_response_gets_zero(estimator: str) -> None:
    nan = float("nan")
    rewards = torch.tensor([[1.0, 2.0], [nan, nan], [0.0, 5.0], [3.0, nan], [2.0, 1.0]])
    ids = torch.tensor([0, 0, 0, 1, 1])
    result = compute_advantages(rewards, ids, estimator)
    assert result.advantages[1].item() == 0.0
    assert torch.isfinite(result.advantages).all()
    assert result.advantages.abs().sum() > 0


def test_component_all_nan_in_a_group_is_inactive() -> None:
    nan = float("nan")
    rewards = torch.tensor([[1.0, nan], [0.0, nan], [1.0, 2.0], [0.0, 1.0]])
    result = compute_advantages(rewards, torch.tensor([0, 0, 1, 1]))
    groups = group_rewards(rewards, torch.tensor([0, 0, 1, 1]))
    assert groups.active.tolist() == [[True, False], [True, True]]
    torch.testing.assert_close(result.advantages[:2], torch.tensor([0.5, -0.5]) / math.sqrt(1 + EPS))


# --------------------------------------------------------------------------- #
# API: inputs, outputs, registry
# --------------------------------------------------------------------------- #
def test_accepts_numpy_and_float32_returns_float32_and_stats() -> None:
    rewards = np.array([[1.0, 2.0], [0.0, 3.0], [2.0, 2.0], [1.0, 0.0]], dtype=np.float32)
    result = compute_advantages(rewards, np.array([9, 4, 9, 4], dtype=np.int32))
    assert result.advantages.dtype == torch.float32 and result.advantages.shape == (4,)
    assert result.stats.group_keys.tolist() == [4, 9]
    assert result.stats.cov_share.shape == (2, 2)
    assert result.stats.mean_correlation.shape == (2, 2)
    torch.testing.assert_close(
        result.stats.cov_share.sum(dim=1), torch.ones(2, dtype=torch.float64)
    )
    logged = result.stats.to_dict()
    json.dumps(logged, allow_nan=False)
    assert logged["group_keys"] == [4, 9]
    assert isinstance(logged["zero_variance_fraction"], float)
    assert set(result.stats.to_dict(per_group=False)) == {
        "mean_correlation",
        "zero_variance_fraction",
        "num_near_cancelling",
        "mean_cov_share",
        "active_fraction",
    }


def test_batch_stats() -> None:
    rewards = torch.tensor(
        [[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [2.0, 2.0]]
    )
    stats = compute_advantages(rewards, torch.tensor([0, 0, 1, 1, 2, 2])).stats
    assert stats.zero_variance.tolist() == [False, False, True]
    assert stats.zero_variance_fraction == pytest.approx(1 / 3)
    # correlation +1 in group 0, -1 in group 1 (which cancels: near-cancelling)
    assert stats.mean_correlation[0, 1].item() == pytest.approx(0.0)
    assert stats.near_cancelling.tolist() == [False, True, False]
    assert stats.k_eff[0].item() == pytest.approx(1.0)
    assert stats.k_eff[1:].isnan().all() and stats.c_q[2].isnan()
    logged = stats.to_dict()
    assert logged["k_eff"][1:] == [None, None] and logged["c_q"][2] is None
    json.dumps(logged, allow_nan=False)
    assert stats.mean_cov_share.tolist() == pytest.approx([0.5, 0.5])


def test_a_correlation_no_group_defines_is_missing_not_zero() -> None:
    # component 1 never varies within a group: its correlations are undefined, logged as None
    rewards = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [2.0, 0.0, 2.0], [0.0, 0.0, 0.0]])
    stats = compute_advantages(rewards, torch.tensor([0, 0, 1, 1])).stats
    logged = stats.to_dict(per_group=False)["mean_correlation"]
    assert logged[0][0] == pytest.approx(1.0) and logged[0][2] == pytest.approx(0.0)  # -1 and +1 groups
    assert logged[0][1] is None and logged[1][2] is None and logged[1][1] is None


def test_available_estimators_and_custom_registration() -> None:
    assert {"grpo", "dr_grpo", "corrgrpo", "gdpo", "mo_grpo", "gdpo_corr"} <= set(
        available_estimators()
    )

    @register_estimator("test_half_dr_grpo")
    def half(groups, *, factor: float = 0.5):
        return factor * groups.weighted.sum(dim=1)

    try:
        assert "test_half_dr_grpo" in available_estimators()
        assert get_estimator("test_half_dr_grpo") is half
        result = compute_advantages(
            torch.tensor([[1.0], [3.0]]), one_group(2), "test_half_dr_grpo", factor=1.0
        )
        torch.testing.assert_close(result.advantages, torch.tensor([-1.0, 1.0]))
        with pytest.raises(ValueError, match="already registered"):
            register_estimator("test_half_dr_grpo")(half)
    finally:
        adv.ESTIMATORS.unregister("test_half_dr_grpo")


GOOD = torch.tensor([[1.0, 2.0], [0.0, 1.0]])
IDS = torch.tensor([0, 0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rewards": torch.tensor([1.0, 2.0])}, r"rewards must be 2-D"),
        ({"rewards": torch.zeros(0, 2), "group_ids": torch.zeros(0, dtype=torch.long)}, "at least one"),
        ({"rewards": torch.tensor([[1.0, float("inf")], [0.0, 1.0]])}, r"inf \(first at row 0, component 1\)"),
        ({"rewards": torch.tensor([[True], [False]])}, "real numbers"),
        ({"group_ids": torch.tensor([0, 0, 1])}, r"group_ids must have shape \[N\] = \[2\]"),
        ({"group_ids": torch.tensor([[0, 0]])}, "group_ids must have shape"),
        ({"group_ids": torch.tensor([0.0, 0.0])}, "group_ids must have an integer dtype"),
        ({"weights": torch.tensor([1.0, 2.0, 3.0])}, r"weights must have shape \[K\] = \[2\]"),
        ({"weights": torch.tensor([1.0, float("nan")])}, "weights must be finite"),
        ({"weights": [1.0, float("inf")]}, "weights must be finite"),
        ({"estimator": "ppo"}, r"unknown estimator 'ppo'; available: corrgrpo, .*dr_grpo, .*gdpo, .*grpo"),
        ({"estimator": "grpo", "scale": "token"}, "scale must be 'group', 'batch' or 'none'"),
        ({"estimator": "grpo", "clip": 1.0}, "unknown option.*clip.*accepted: scale, eps"),
        ({"estimator": "dr_grpo", "eps": 1.0}, "accepted: none"),
        ({"eps": -1.0}, "eps must be a finite number >= 0"),
        ({"min_denominator": 0.0}, "min_denominator must be None or a number > 0"),
        ({"rewards": "abc"}, "rewards must be"),
    ],
)
def test_bad_input_raises_value_error(kwargs: dict, match: str) -> None:
    call = {"rewards": GOOD, "group_ids": IDS, **kwargs}
    with pytest.raises(ValueError, match=match):
        compute_advantages(**call)


def test_an_estimator_object_that_cannot_be_hashed_still_has_its_options_checked() -> None:
    class Scaled:  # defines __eq__ without __hash__, as a dataclass does
        def __eq__(self, other: object) -> bool:
            return isinstance(other, Scaled)

        def __call__(self, groups, *, factor: float = 1.0):
            return factor * groups.numerator

    register_estimator("test_unhashable")(Scaled())
    try:
        result = compute_advantages(torch.tensor([[1.0], [3.0]]), one_group(2), "test_unhashable", factor=2.0)
        torch.testing.assert_close(result.advantages, torch.tensor([-2.0, 2.0]))
        with pytest.raises(ValueError, match="accepted: factor"):
            compute_advantages(torch.tensor([[1.0], [3.0]]), one_group(2), "test_unhashable", scale=2.0)
    finally:
        adv.ESTIMATORS.unregister("test_unhashable")
