"""RVPO equals the definition in the DARA repository's code, re-derived loop by loop, and its soft
minimum has the paper's properties.

Authors' code: zhaihaotian/DARA, ``compute_multi_reward_advantage`` (method ``rvpo``) in
vendor/verl/verl/trainer/ppo/multi_reward_algos.py at 54024d0e62c3ee77deda8cf28f2c40416ea4d46b:
verl's per-reward GRPO outcome advantages (sample std, ``std + 1e-6``, a group of one taking mean 0
and std 1), ``-(logsumexp(-k Z) - log 2) / k`` over the two rewards with k = 1 (constant rewards
still in), then ``masked_whiten`` over the response tokens. The paper (arXiv 2605.05750) states the
soft minimum for M rewards with ``log M``; the reference uses ``log M`` and runs K = 2 (the code's
case) and K = 3. The reference multiplies each reward's z-scores by its weight and leaves a reward
of weight 0 out of the soft minimum (the authors have no weights).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo.trainer.estimators import compute_advantages, get_estimator, group_rewards
from tests.verl_reference_dara import (
    edge_batches,
    first_token,
    grpo_outcome,
    masked_whiten,
    normalize_responses,
    token_mask,
)

BATCHES = list(edge_batches(3)) + [b._replace(name=f"{b.name}_k2", rewards=b.rewards[:, :2],
                                              weights=b.weights[:2]) for b in edge_batches(2)]


def authors_rvpo(rewards, ids, weights, lengths, *, k=1.0, normalise="tokens", singleton="raw"):
    """``[N]`` advantages and the two logged means, token by token as the authors compute them."""
    mask = token_mask(lengths)
    channels = [grpo_outcome(rewards[:, j], ids, mask, singleton=singleton) * weights[j]
                for j in range(rewards.shape[1]) if weights[j] != 0]
    m = len(channels)
    combined = np.zeros_like(mask)
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            total = sum(math.exp(-k * channel[i, t]) for channel in channels)
            combined[i, t] = -(math.log(total) - math.log(m)) / k
    aggregate = [sum(combined[i, t] * mask[i, t] for t in range(mask.shape[1])) / lengths[i]
                 for i in range(mask.shape[0])]
    channel_mean = [sum(sum(c[i, t] for c in channels) / m * mask[i, t] for t in range(mask.shape[1]))
                    / lengths[i] for i in range(mask.shape[0])]
    means = (float(np.mean(aggregate)), float(np.mean(np.subtract(channel_mean, aggregate))))
    if normalise == "tokens":
        return first_token(masked_whiten(combined, mask)), means
    if normalise == "responses":
        return normalize_responses(first_token(combined)), means
    return first_token(combined), means


def ours(batch, tokens=True, **options):
    """Our float64 advantages and metrics, the token counts given to ``compute_advantages``."""
    result = compute_advantages(batch.rewards, batch.ids, "rvpo", batch.weights,
                                token_counts=batch.lengths if tokens else None, **options)
    return result.decomposition.parts.sum(dim=1).numpy(), result.metrics


def assert_equal(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.name)
@pytest.mark.parametrize("k", [1.0, 0.25, 4.0])
def test_equals_the_authors_token_whitened_soft_minimum(batch, k):
    got, metrics = ours(batch, k=k)
    want, (aggregate, penalty) = authors_rvpo(batch.rewards, batch.ids, batch.weights, batch.lengths, k=k)
    assert_equal(got, want)
    assert metrics["aggregate_mean"] == pytest.approx(aggregate, rel=1e-9, abs=1e-12)
    assert metrics["variance_penalty_mean"] == pytest.approx(penalty, rel=1e-9, abs=1e-12)
    assert metrics["variance_penalty_mean"] >= 0


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.name)
@pytest.mark.parametrize("normalise", ["responses", "none"])
def test_other_normalisations_and_singleton_zero(batch, normalise):
    ones = np.ones(len(batch.ids), int)
    got, _ = ours(batch, tokens=False, normalise=normalise, singleton="zero")
    want, _ = authors_rvpo(batch.rewards, batch.ids, batch.weights, ones, normalise=normalise,
                           singleton="zero")
    assert_equal(got, want)
    got, _ = ours(batch, tokens=False)
    want, _ = authors_rvpo(batch.rewards, batch.ids, batch.weights, ones)
    assert_equal(got, want)


def test_a_reward_of_weight_zero_is_left_out():
    batch = next(b for b in BATCHES if b.name == "random0")
    weights = np.array([1.0, 0.0, 2.0])
    with_zero = compute_advantages(batch.rewards, batch.ids, "rvpo", weights)
    dropped = compute_advantages(batch.rewards[:, [0, 2]], batch.ids, "rvpo", weights[[0, 2]])
    torch.testing.assert_close(with_zero.advantages, dropped.advantages, rtol=1e-6, atol=1e-6)
    assert (with_zero.decomposition.parts[:, 1] == 0).all()


@pytest.mark.parametrize(("options", "match"), [
    ({"k": 0.0}, "k must be a finite number > 0"),
    ({"k": math.inf}, "k must be a finite number > 0"),
    ({"normalise": "batch"}, "normalise must be one of 'tokens', 'responses', 'none'"),
    ({"singleton": "one"}, "singleton must be one of 'raw', 'zero'"),
    ({"whiten_eps": -1.0}, "whiten_eps must be a finite number >= 0"),
])
def test_options_are_checked(options, match):
    with pytest.raises(ValueError, match=match):
        compute_advantages(np.array([[0.0], [1.0]]), [0, 0], "rvpo", **options)


def _soft_minimum_parts(seed: int, m: int, k: float):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(12, m)) * rng.uniform(0.2, 5.0, m)
    groups = group_rewards(rewards, np.repeat(np.arange(3), 4), rng.uniform(0.5, 2.0, m))
    parts = get_estimator("rvpo").attribution(groups, k=k, normalise="none").parts
    z = groups.centred / groups.per_response(groups.std + 1e-6) * groups.weights
    return parts, z


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.floats(0.05, 20.0))
def test_the_soft_minimum_lies_between_the_minimum_and_the_mean(seed, m, k):
    parts, z = _soft_minimum_parts(seed, m, k)
    soft = parts.sum(dim=1)
    assert (soft >= z.min(dim=1).values - 1e-12).all()
    assert (soft <= z.mean(dim=1) + 1e-12).all()
    assert (soft <= z.min(dim=1).values + math.log(m) / k + 1e-12).all()  # log M / k from the minimum


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 5))
def test_k_interpolates_between_the_mean_and_the_minimum(seed, m):
    parts, z = _soft_minimum_parts(seed, m, 1e-6)
    torch.testing.assert_close(parts.sum(dim=1), z.mean(dim=1), rtol=0, atol=1e-4)
    parts, z = _soft_minimum_parts(seed, m, 1e4)
    torch.testing.assert_close(parts.sum(dim=1), z.min(dim=1).values, rtol=0, atol=math.log(m) / 1e4 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.1, 5.0))
def test_the_parts_are_softmin_weighted_z_scores_plus_their_share_of_the_gap(seed, k):
    parts, z = _soft_minimum_parts(seed, 3, k)
    share = torch.softmax(-k * z, dim=1)
    gap = parts.sum(dim=1) - (share * z).sum(dim=1)
    assert (gap >= -1e-12).all()  # log M - H(p) >= 0
    torch.testing.assert_close(parts, share * (z + gap.unsqueeze(1)), rtol=1e-12, atol=1e-12)
