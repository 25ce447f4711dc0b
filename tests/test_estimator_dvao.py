"""DVAO equals the definition in the DARA repository's code, re-derived loop by loop, and keeps the
paper's bound on the advantages.

Authors' code: zhaihaotian/DARA, ``compute_multi_reward_advantage`` (method ``dvao``) in
tool_calling/vendor/verl/verl/trainer/ppo/multi_reward_algos.py at
0459102045705674a9ad07748708facb8c5dc0b2 (the same in math/rdgdpo/advantages.py at that commit):
per group, ``D = sum_k w_k * population std_k``; if ``D > 1e-8`` the advantage is
``sum_k w_k (r_k - mean_k) / D``, else 0; base weights 0.5 each; no batch normalisation; the
per-token advantage is the response's. No code by DVAO's authors (arXiv 2605.25604) was found.

Our reward weights are DVAO's base weights. The authors reject negative ones; the reference
extends the denominator with ``|w_k|`` (a spread), as our estimator does.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo.trainer.estimators import compute_advantages, get_estimator, group_rewards
from tests.verl_reference_dara import edge_batches, groups_in_order

BATCHES = list(edge_batches(3)) + [b._replace(name=f"{b.name}_k2", rewards=b.rewards[:, :2],
                                              weights=b.weights[:2]) for b in edge_batches(2)]


def authors_dvao(rewards, ids, base_weights, *, ddof=0, eps=1e-8):
    """``[N]`` DVAO advantages, group by group as the authors compute them."""
    out = np.zeros(len(ids))
    for rows in groups_in_order(ids).values():
        n = len(rows)
        means, stds = [], []
        for k in range(rewards.shape[1]):
            column = [float(rewards[i, k]) for i in rows]
            mean = sum(column) / n
            means.append(mean)
            stds.append(math.sqrt(sum((v - mean) ** 2 for v in column) / (n - ddof)) if n > ddof else 0.0)
        denominator = sum(abs(w) * s for w, s in zip(base_weights, stds))
        if denominator > eps:
            for i in rows:
                out[i] = sum(w * (rewards[i, k] - means[k]) for k, w in enumerate(base_weights)) / denominator
    return out


def ours(batch, **options):
    groups = group_rewards(batch.rewards, batch.ids, batch.weights)
    decomposition = get_estimator("dvao").attribution(groups, **options)
    return decomposition.parts.sum(dim=1).numpy(), decomposition


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.name)
def test_equals_the_authors_definition(batch):
    got, decomposition = ours(batch)
    assert_equal(got, authors_dvao(batch.rewards, batch.ids, batch.weights))
    groups = group_rewards(batch.rewards, batch.ids, batch.weights)
    torch.testing.assert_close(decomposition.parts, groups.weighted * groups.per_response(
        decomposition.group_weight).unsqueeze(1))


def test_the_authors_half_weights_are_our_equal_weights():
    batch = next(b for b in BATCHES if b.name == "random1_k2")
    got, _ = ours(batch._replace(weights=np.ones(2)))
    assert_equal(got, authors_dvao(batch.rewards, batch.ids, [0.5, 0.5]))


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.name)
def test_sample_std_and_a_larger_eps(batch):
    got, _ = ours(batch, std="sample", eps=0.3)
    assert_equal(got, authors_dvao(batch.rewards, batch.ids, batch.weights, ddof=1, eps=0.3))


def test_a_constant_group_and_a_group_of_one_get_zero():
    rewards = np.array([[1.0, 2.0], [1.0, 2.0], [5.0, 0.0], [0.0, 1.0], [2.0, 3.0]])
    result = compute_advantages(rewards, [0, 0, 1, 2, 2], "dvao")
    assert result.advantages[:3].tolist() == [0.0, 0.0, 0.0]
    # group 2: both rewards are centred to -+1 with population std 1: A = (-+1 -+1) / (1 + 1)
    assert result.advantages[3:].tolist() == [-1.0, 1.0]
    assert result.metrics["zero_groups"] == pytest.approx(2 / 3)
    assert result.metrics["weight/0"] == pytest.approx(0.5)


def test_options_are_checked():
    for bad in ({"std": "biased"}, {"eps": -1.0}):
        with pytest.raises(ValueError):
            compute_advantages(np.array([[0.0], [1.0]]), [0, 0], "dvao", **bad)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 8), st.integers(1, 5))
def test_advantages_are_bounded_by_the_root_of_n_minus_one(seed, size, k):
    """With non-negative weights ``|A_i| <= sum_k w_k |c_ik| / D <= sqrt(n - 1)`` (population std)."""
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 4, size=(3 * size, k)) * rng.uniform(0.1, 100.0, k)
    weights = rng.uniform(0.0, 3.0, k)
    advantages = compute_advantages(rewards, np.repeat(np.arange(3), size), "dvao", weights).advantages
    assert float(advantages.abs().max()) <= math.sqrt(size - 1) * (1 + 1e-6)


def assert_equal(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
