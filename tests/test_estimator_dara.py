"""DARA equals its authors' definition, re-derived loop by loop from their code.

Authors' code: zhaihaotian/DARA.

- tool-calling stack (the default): ``compute_channel_densities`` and
  ``compute_dara_combined_advantage`` in vendor/verl/verl/trainer/ppo/core_algos.py at
  878c983dcb3bf3f6841d380479b428965484fb1e (density = share of groups whose summed absolute token
  advantage exceeds 1e-8; ``w_k = min(w_max, sqrt(max pi / pi_k))``, ``w_max`` for a dead reward;
  symmetric combination ``sum_k w_k A_k``), ``compute_advantage`` in
  vendor/verl/verl/trainer/ppo/ray_trainer.py at 5ef5a0750ddf571516302f6815fac68b8dc0b811 (then
  ``masked_whiten`` over the response tokens), and the positive calibration
  ``A + (w - 1) max(A, 0)`` as tool_calling/tests/test_dara_three_rewards.py states it at
  0459102045705674a9ad07748708facb8c5dc0b2;
- math stack: ``compute_advantages`` (method ``rdgdpo``) in math/rdgdpo/advantages.py at
  0459102045705674a9ad07748708facb8c5dc0b2: the same density weights over response-level
  advantages, ``(x - mean) / (std + 1e-6)`` over responses, groups of at least two.

The authors have no reward weights: the reference multiplies each reward's z-scores by its weight
(the channel advantage ``w_k z_k``, as everywhere in this package), so weights of 1 are the
authors' definition itself.
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
    groups_in_order,
    grpo_outcome,
    masked_whiten,
    normalize_responses,
    token_mask,
)

BATCHES = list(edge_batches(3)) + [b._replace(name=f"{b.name}_k2", rewards=b.rewards[:, :2],
                                              weights=b.weights[:2]) for b in edge_batches(2)]


def authors_dara(rewards, ids, weights, lengths, *, calibration="positive", w_max=5.0,
                 normalise="tokens", singleton="raw", dead_weight=None):
    """``[N]`` advantages and ``[K]`` densities and weights, token by token as the authors compute them."""
    mask = token_mask(lengths)
    channels = [grpo_outcome(rewards[:, k], ids, mask, singleton=singleton) * weights[k]
                for k in range(rewards.shape[1])]
    groups = groups_in_order(ids)
    densities = []
    for channel in channels:
        active = 0
        for rows in groups.values():
            energy = 0.0
            for i in rows:
                for t in range(mask.shape[1]):
                    energy += abs(channel[i, t])
            if energy > 1e-8:
                active += 1
        densities.append(active / len(groups))
    reference = max(densities)
    dara_weights = [(w_max if dead_weight is None else dead_weight) if pi <= 0
                    else min(w_max, math.sqrt(reference / pi)) for pi in densities]
    combined = np.zeros_like(mask)
    for channel, w in zip(channels, dara_weights):
        for i in range(mask.shape[0]):
            for t in range(mask.shape[1]):
                a = channel[i, t]
                combined[i, t] += w * a if calibration == "symmetric" else a + (w - 1.0) * max(a, 0.0)
    if normalise == "tokens":
        return first_token(masked_whiten(combined, mask)), densities, dara_weights
    return normalize_responses(first_token(combined)), densities, dara_weights


def ours(batch, tokens=True, **options):
    """Our float64 advantages (the sum of the decomposition) and metrics, the token counts given
    to ``compute_advantages`` as the trainers give them."""
    result = compute_advantages(batch.rewards, batch.ids, "dara", batch.weights,
                                token_counts=batch.lengths if tokens else None, **options)
    return result.decomposition.parts.sum(dim=1).numpy(), result.metrics


def assert_equal(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.name)
@pytest.mark.parametrize("calibration", ["positive", "symmetric"])
def test_tool_calling_stack_token_whitening(batch, calibration):
    got, metrics = ours(batch, calibration=calibration)
    want, densities, weights = authors_dara(batch.rewards, batch.ids, batch.weights, batch.lengths,
                                            calibration=calibration)
    assert_equal(got, want)
    for k, (pi, w) in enumerate(zip(densities, weights)):
        assert metrics[f"density/{k}"] == pytest.approx(pi, rel=1e-12)
        assert metrics[f"weight/{k}"] == pytest.approx(w, rel=1e-12)


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.name)
def test_without_token_counts_each_response_is_one_token(batch):
    got, _ = ours(batch, tokens=False)
    want, _, _ = authors_dara(batch.rewards, batch.ids, batch.weights, np.ones(len(batch.ids), int))
    assert_equal(got, want)


@pytest.mark.parametrize("batch", [b for b in BATCHES if not b.name.startswith("sizes")],
                         ids=lambda b: b.name)
@pytest.mark.parametrize("calibration", ["positive", "symmetric"])
def test_math_stack_is_normalise_responses(batch, calibration):
    # the math stack has groups of two or more only and gives a dead reward weight 1, which
    # multiplies z-scores of 0: the advantages are the same
    got, _ = ours(batch, tokens=False, calibration=calibration, normalise="responses")
    want, _, _ = authors_dara(batch.rewards, batch.ids, batch.weights, np.ones(len(batch.ids), int),
                              calibration=calibration, normalise="responses", dead_weight=1.0)
    assert_equal(got, want)


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.name)
def test_singleton_zero_and_w_max_and_no_normalisation(batch):
    got, _ = ours(batch, singleton="zero", w_max=1.5)
    want, _, _ = authors_dara(batch.rewards, batch.ids, batch.weights, batch.lengths, singleton="zero",
                              w_max=1.5)
    assert_equal(got, want)


def test_a_sparse_reward_is_amplified_on_its_positive_side_only():
    batch = next(b for b in BATCHES if b.name == "sparse")
    _, metrics = ours(batch)
    assert metrics["density/0"] == pytest.approx(2 / 6)
    assert metrics["weight/0"] == pytest.approx(math.sqrt(3))
    assert metrics["density/1"] == 1.0 and metrics["weight/1"] == 1.0
    groups = group_rewards(batch.rewards, batch.ids, batch.weights)
    parts = get_estimator("dara").attribution(groups, normalise="none").parts
    z = (groups.centred / groups.per_response(groups.std + 1e-6)).numpy()
    np.testing.assert_allclose(parts[:, 0].numpy(), np.where(z[:, 0] > 0, math.sqrt(3) * z[:, 0], z[:, 0]))


def test_a_dead_reward_logs_w_max_and_adds_nothing():
    rewards = np.array([[1.0, 0.0], [0.0, 0.0], [2.0, 0.0], [1.0, 0.0]])
    result = compute_advantages(rewards, [0, 0, 1, 1], "dara")
    assert result.metrics["density/1"] == 0.0 and result.metrics["weight/1"] == 5.0
    assert (result.decomposition.parts[:, 1] == 0).all()


@pytest.mark.parametrize(("options", "match"), [
    ({"calibration": "both"}, "calibration must be one of 'positive', 'symmetric'"),
    ({"w_max": 0.5}, "w_max must be a finite number >= 1"),
    ({"normalise": "batch"}, "normalise must be one of 'tokens', 'responses', 'none'"),
    ({"singleton": "one"}, "singleton must be one of 'raw', 'zero'"),
    ({"tau": -1.0}, "tau must be a finite number >= 0"),
    ({"token_counts": [1, 2, 3]}, r"token_counts must have shape \[N\] = \[2\]"),
    ({"token_counts": [1, -2]}, "token_counts must be finite and >= 0"),
])
def test_options_are_checked(options, match):
    with pytest.raises(ValueError, match=match):
        compute_advantages(np.array([[0.0], [1.0]]), [0, 0], "dara", **options)


def test_a_response_without_tokens_enters_neither_the_density_nor_the_whitening():
    """verl's token tensors hold nothing for a response of no trained tokens; its own advantage
    multiplies no token, so only the others' are compared."""
    batch = next(b for b in BATCHES if b.name == "random0")
    lengths = batch.lengths.astype(float)
    lengths[0] = 0.0
    got, _ = ours(batch._replace(lengths=lengths))
    want, _, _ = authors_dara(batch.rewards, batch.ids, batch.weights, lengths)
    assert_equal(got[1:], want[1:])
    assert not np.allclose(got[1:], ours(batch)[0][1:], rtol=1e-6)  # the counts did matter


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6), st.integers(1, 4))
def test_where_every_reward_varies_in_every_group_dara_is_the_sum_of_z_scores(seed, size, k):
    """Every density is 1, so every weight is 1: DARA without normalisation is ``sum_k w_k z_k``."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(3 * size, k))
    ids = np.repeat(np.arange(3), size)
    weights = rng.uniform(0.5, 2.0, k)
    groups = group_rewards(rewards, ids, weights)
    parts = get_estimator("dara").attribution(groups, normalise="none").parts
    z = groups.centred / groups.per_response(groups.std + 1e-6) * groups.weights
    torch.testing.assert_close(parts, z, rtol=1e-12, atol=1e-12)
