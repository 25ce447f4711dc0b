"""RDPO has the properties the paper (arXiv 2605.13641) states for its two steps.

No code was published, so there is no authors' definition to equal: these tests check what the
paper claims and what our reading of it (trainer/estimators/rdpo.py) promises, on the shared edge
cases: the quantile step depends only on the order of a reward within its group (invariant to any
increasing transform, magnitude factor off) and, with the magnitude factor, on its positive affine
scale; ties get one score; whitened scores have identity covariance in each active subspace;
a duplicated reward adds no direction of its own; a rare binary success is bounded more tightly than by a z-score.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo.trainer.estimators import compute_advantages, get_estimator, group_rewards
from corrgrpo.trainer.estimators.rdpo import mid_ranks, quantile_scores, whitened
from tests.verl_reference_dara import edge_batches, groups_in_order

BATCHES = list(edge_batches(3))


def advantages(rewards, ids, weights=None, **options) -> np.ndarray:
    groups = group_rewards(rewards, ids, weights)
    return get_estimator("rdpo").attribution(groups, **options).parts.sum(dim=1).numpy()


def loop_mid_ranks(rewards, ids):
    """``[N, K]`` 1-based mid-ranks within each group over the non-NaN values, 0 for NaN."""
    out = np.zeros_like(rewards)
    for rows in groups_in_order(ids).values():
        for k in range(rewards.shape[1]):
            present = [i for i in rows if not math.isnan(rewards[i, k])]
            for i in present:
                below = sum(1 for j in present if rewards[j, k] < rewards[i, k])
                equal = sum(1 for j in present if rewards[j, k] == rewards[i, k])
                out[i, k] = below + (equal + 1) / 2
    return out


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.name)
def test_mid_ranks_equal_a_loop(batch):
    rewards = batch.rewards.copy()
    rewards[::5, 0] = np.nan
    got = mid_ranks(group_rewards(rewards, batch.ids)).numpy()
    np.testing.assert_array_equal(got, loop_mid_ranks(rewards, batch.ids))


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.name)
def test_the_quantile_step_ignores_increasing_transforms(batch):
    transformed = np.stack([np.exp(batch.rewards[:, 0]), batch.rewards[:, 1] ** 3,
                            np.arctan(batch.rewards[:, 2]) - 7.0], axis=1)
    plain = advantages(batch.rewards, batch.ids, batch.weights, magnitude=False)
    np.testing.assert_allclose(advantages(transformed, batch.ids, batch.weights, magnitude=False), plain,
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.name)
def test_the_magnitude_factor_keeps_positive_affine_invariance(batch):
    scaled = batch.rewards * np.array([1e-3, 7.0, 250.0]) + np.array([5.0, -1e4, 0.5])
    np.testing.assert_allclose(advantages(scaled, batch.ids, batch.weights),
                               advantages(batch.rewards, batch.ids, batch.weights), rtol=1e-7, atol=1e-9)


def test_the_magnitude_factor_shrinks_a_group_whose_rewards_barely_differ():
    rewards = np.array([[0.0], [1.0], [0.0], [1.0], [0.0], [0.1], [0.0], [0.1]])
    ids = np.repeat([0, 1], 4)
    aware = advantages(rewards, ids, normalise="none")
    np.testing.assert_allclose(aware[4:] * 10, aware[:4], rtol=1e-12)
    blind = advantages(rewards, ids, normalise="none", magnitude=False)
    np.testing.assert_allclose(blind[4:], blind[:4], rtol=1e-12)


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.name)
@pytest.mark.parametrize("covariance", ["pooled", "group"])
def test_whitened_scores_have_identity_covariance_in_each_active_subspace(batch, covariance):
    groups = group_rewards(batch.rewards, batch.ids, batch.weights)
    scores, active = quantile_scores(groups, "normal", True)
    y, _ = whitened(groups, scores, active, covariance, 1e-10, 0.0)
    keys = ([tuple(row) for row in active.tolist()] if covariance == "pooled"
            else list(range(groups.num_groups)))
    for key in set(keys):
        members = [q for q in range(groups.num_groups) if keys[q] == key]
        rows = torch.isin(groups.index, torch.tensor(members))
        dims = active[members[0]].nonzero().squeeze(1)
        if dims.numel() == 0:
            assert (y[rows] == 0).all()
            continue
        dof = float((groups.counts[members] - 1).sum())
        block = y[rows][:, dims]
        cov = block.T @ block / dof
        rank = int(torch.linalg.matrix_rank(scores[rows][:, dims]))
        if rank == dims.numel():  # full rank: the identity; otherwise a projection of that rank
            torch.testing.assert_close(cov, torch.eye(dims.numel(), dtype=cov.dtype), rtol=0, atol=1e-9)
        else:
            torch.testing.assert_close(cov @ cov, cov, rtol=0, atol=1e-9)
            assert float(torch.trace(cov)) == pytest.approx(rank)
        assert (y[rows][:, [d for d in range(y.shape[1]) if d not in dims.tolist()]] == 0).all()


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.name)
def test_group_baseline_ties_constants_and_singletons(batch):
    raw = advantages(batch.rewards, batch.ids, batch.weights, normalise="none")
    for rows in groups_in_order(batch.ids).values():
        assert abs(raw[rows].sum()) <= 1e-9 * max(1.0, np.abs(raw).max())  # scores sum to 0 per group
        for i in rows:
            for j in rows:
                if np.array_equal(batch.rewards[i], batch.rewards[j]):
                    assert raw[i] == pytest.approx(raw[j], abs=1e-12)
        if len(rows) == 1 or np.ptp(batch.rewards[rows], axis=0).max() == 0:
            assert (raw[rows] == 0).all()


def test_a_constant_reward_adds_nothing():
    batch = next(b for b in BATCHES if b.name == "constant")
    groups = group_rewards(batch.rewards, batch.ids)
    parts = get_estimator("rdpo").attribution(groups, normalise="none").parts
    assert (parts[:4, 1] == 0).all() and (parts[4:8] == 0).all()


def test_a_duplicated_reward_adds_no_direction_of_its_own():
    """Its copy lies in the same direction: dropped, so two copies weigh sqrt 2 (MO-GRPO: 2)."""
    batch = next(b for b in BATCHES if b.name == "random0")
    r = batch.rewards[:, :1]
    twice = np.concatenate([r, r], axis=1)
    np.testing.assert_allclose(advantages(twice, batch.ids, normalise="none"),
                               math.sqrt(2) * advantages(r, batch.ids, normalise="none"), rtol=1e-9)
    mo_grpo = [compute_advantages(x, batch.ids, "mo_grpo").advantages for x in (twice, r)]
    torch.testing.assert_close(mo_grpo[0], 2 * mo_grpo[1])
    result = compute_advantages(twice, batch.ids, "rdpo")
    assert result.metrics == {"active_sets": 1.0, "dropped_directions": 1.0}
    torch.testing.assert_close(result.advantages, compute_advantages(r, batch.ids, "rdpo").advantages,
                               rtol=1e-5, atol=1e-6)


def test_a_reward_of_weight_zero_is_left_out_of_the_whitening():
    batch = next(b for b in BATCHES if b.name == "random1")
    weights = np.array([1.0, 0.0, 2.0])
    np.testing.assert_allclose(advantages(batch.rewards, batch.ids, weights),
                               advantages(batch.rewards[:, [0, 2]], batch.ids, weights[[0, 2]]),
                               rtol=1e-9, atol=1e-12)


def test_a_rare_success_is_bounded_more_tightly_than_by_z_scores():
    """One success in 16 against 8 in 16: its advantage's lead is smaller than GDPO's z-scores give."""
    rewards = np.zeros((32, 1))
    rewards[0] = 1.0
    rewards[16:24] = 1.0
    ids = np.repeat([0, 1], 16)
    rdpo = advantages(rewards, ids, normalise="none")
    z = compute_advantages(rewards, ids, "mo_grpo").advantages.double().numpy()
    lead = abs(rdpo[:16]).max() / abs(rdpo[16:]).max()
    assert lead < abs(z[:16]).max() / abs(z[16:]).max()
    # the lone success's score before whitening: Phi^-1(1 - 1/32), centred on the group mean
    scores, _ = quantile_scores(group_rewards(rewards, ids), "normal", True)
    low, high = torch.special.ndtri(torch.tensor([7.5 / 16, 15.5 / 16], dtype=torch.float64))
    assert float(scores[0, 0]) == pytest.approx(float(high - (high + 15 * low) / 16), rel=1e-12)


def test_options_are_checked():
    for bad in ({"quantile": "beta"}, {"covariance": "batch"}, {"normalise": "tokens"}, {"rtol": -1.0},
                {"ridge": -1.0}):
        with pytest.raises(ValueError):
            compute_advantages(np.array([[0.0], [1.0]]), [0, 0], "rdpo", **bad)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6), st.integers(1, 4), st.sampled_from(["normal", "uniform"]))
def test_random_batches_whiten_to_identity_and_keep_the_group_baseline(seed, size, k, quantile):
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 4, size=(4 * size, k)).astype(float)
    ids = rng.permutation(np.repeat(np.arange(4), size))
    groups = group_rewards(rewards, ids)
    scores, active = quantile_scores(groups, quantile, True)
    y, _ = whitened(groups, scores, active, "pooled", 1e-10, 0.0)
    sums = groups.group_sum(y)
    assert float(sums.abs().max()) <= 1e-9
    if bool(active.all()) and int(torch.linalg.matrix_rank(scores)) == k:
        cov = y.T @ y / float((groups.counts - 1).sum())
        torch.testing.assert_close(cov, torch.eye(k, dtype=cov.dtype), rtol=0, atol=1e-9)
