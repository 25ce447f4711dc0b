"""SAW equals its authors' code.

The reference below re-derives, one loop at a time, what ``compute_advantage`` computes in
Zhaolutuan/SAW ``verl/trainer/ppo/ray_trainer.py`` at commit
119951f63fa92f93d4d5878c2cc0791db98a7f06: branch ``gdpo-h`` (each reward's verl GRPO advantage,
weighted by SAW's share of the batch coefficients of variation, summed and whitened by
``masked_whiten`` over the response tokens) and branch ``grpo-h`` (the rewards weighted by
the same shares, summed, then verl's GRPO). The authors' code has two rewards and writes the
normaliser as ``* 2.0``; the reference writes it as ``* K``, the number of rewards, and
multiplies each reward's term by its reward weight (1 in the authors' runs), as the estimator
documents. Their CV shifted the correctness reward by 3 (``offsets``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo.trainer.estimators import compute_advantages
from corrgrpo.trainer.estimators.groups import group_rewards
from corrgrpo.trainer.estimators.reward_metrics import estimator_metrics
from corrgrpo.trainer.estimators.saw import cv_weights
from tests.verl_reference import (
    Batch,
    batches,
    grpo_outcome,
    masked_whiten,
    per_response,
    random_batch,
    token_matrix,
)

BATCHES = batches()


def saw_shares(rewards: np.ndarray, offsets) -> tuple[list[float], list[float]]:
    """Each reward's CV over the batch (torch's unbiased std, ``|mean| + 1e-8``) and its share
    ``K cv_k / (sum cv + 1e-8)``."""
    n, k = rewards.shape
    cvs = []
    for j in range(k):
        shifted = [float(rewards[i, j]) + offsets[j] for i in range(n)]
        mean = sum(shifted) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in shifted) / (n - 1))
        cvs.append(std / (abs(mean) + 1e-8))
    total = sum(cvs) + 1e-8
    return cvs, [k * cv / total for cv in cvs]


def saw_reference(batch: Batch, base: str, offsets=None, lengths=None) -> np.ndarray:
    """The authors' ``gdpo-h`` (base gdpo) or ``grpo-h`` (base grpo) per-response advantage."""
    rewards, index, w = batch.rewards, batch.index, batch.weights
    n, k = rewards.shape
    _, shares = saw_shares(rewards, offsets or [0.0] * k)
    if base == "grpo":
        combined = [sum(w[j] * shares[j] * rewards[i, j] for j in range(k)) for i in range(n)]
        return grpo_outcome(np.array(combined), index)
    per_reward = [grpo_outcome(rewards[:, j], index) for j in range(k)]
    combined = np.array([sum(w[j] * shares[j] * per_reward[j][i] for j in range(k)) for i in range(n)])
    lengths = np.ones(n) if lengths is None else lengths
    tokens, mask = token_matrix(combined, lengths)
    return per_response(masked_whiten(tokens, mask) * mask, lengths)


def _saw(batch: Batch, tokens: bool, **options):
    return compute_advantages(batch.rewards, batch.index, "saw", batch.weights,
                              token_counts=batch.lengths if tokens else None, **options)


def _assert_equal(result, want: np.ndarray) -> None:
    # the float64 sum of the parts to 1e-6 relative, and the float32 advantages to their rounding
    exact = result.decomposition.parts.sum(dim=1).numpy()
    np.testing.assert_allclose(exact, want, rtol=1e-6, atol=1e-9 * max(1.0, np.abs(want).max()))
    np.testing.assert_allclose(result.advantages.numpy(), want, rtol=1e-6, atol=1e-6 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("tokens", [True, False], ids=["token_counts", "no_token_counts"])
@pytest.mark.parametrize("batch", BATCHES, ids=[b.name for b in BATCHES])
def test_saw_on_gdpo_equals_the_authors_gdpo_h(batch, tokens):
    want = saw_reference(batch, "gdpo", lengths=batch.lengths if tokens else None)
    _assert_equal(_saw(batch, tokens), want)


@pytest.mark.parametrize("batch", BATCHES, ids=[b.name for b in BATCHES])
def test_saw_on_grpo_equals_the_authors_grpo_h(batch):
    want = saw_reference(batch, "grpo")
    _assert_equal(_saw(batch, True, base="grpo"), want)


def test_the_authors_toolrl_offsets():
    """Correctness in -3..3 shifted by 3 before its CV, format 0..1 not shifted (their run)."""
    rng = np.random.default_rng(7)
    rewards = np.stack([rng.integers(-3, 4, 32), rng.integers(0, 2, 32)], axis=1).astype(np.float64)
    batch = Batch("toolrl", rewards, np.repeat(np.arange(8), 4), np.ones(2),
                  rng.integers(5, 60, 32).astype(np.float64))
    for base in ("gdpo", "grpo"):
        want = saw_reference(batch, base, offsets=[3.0, 0.0], lengths=batch.lengths)
        _assert_equal(_saw(batch, True, base=base, offsets=[3, 0]), want)
    # the offset matters: without it the correctness CV divides by a mean near 0
    plain = _saw(batch, True).metrics
    shifted = _saw(batch, True, offsets=[3, 0]).metrics
    assert plain["cv/0"] > 3 * shifted["cv/0"]


@pytest.mark.parametrize("batch", BATCHES[:3], ids=[b.name for b in BATCHES[:3]])
def test_metrics_are_the_cvs_and_shares(batch):
    cvs, shares = saw_shares(batch.rewards, [0.0] * batch.rewards.shape[1])
    metrics = _saw(batch, True).metrics
    k = batch.rewards.shape[1]
    np.testing.assert_allclose([metrics[f"cv/{j}"] for j in range(k)], cvs, rtol=1e-9)
    np.testing.assert_allclose([metrics[f"weight/{j}"] for j in range(k)], shares, rtol=1e-9)
    assert sum(shares) == pytest.approx(k, rel=1e-6)
    names = ["a", "b", "c"][:k]
    logged = estimator_metrics(metrics, names)
    assert logged["estimator/weight/b"] == metrics["weight/1"]


def test_response_weighting_ignores_the_token_counts():
    batch = BATCHES[0]
    want = saw_reference(batch, "gdpo", lengths=None)
    _assert_equal(_saw(batch, True, batch_weighting="response"), want)
    assert not np.allclose(_saw(batch, True).advantages.numpy(), want, rtol=1e-3)


def test_a_group_of_one_keeps_its_raw_reward_or_gets_zero():
    rewards = np.array([[2.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 3.0]])
    ids = np.array([0, 1, 1, 2])
    raw = compute_advantages(rewards, ids, "saw", base="grpo")
    _, shares = saw_shares(rewards, [0.0, 0.0])
    # verl: mean 0, std 1 -> (s_0 * 2 + s_1 * 1) / (1 + 1e-6)
    assert raw.advantages[0].item() == pytest.approx((2 * shares[0] + shares[1]) / (1 + 1e-6), rel=1e-6)
    zero = compute_advantages(rewards, ids, "saw", base="grpo", singleton="zero")
    assert zero.advantages[0].item() == 0.0 and zero.advantages[3].item() == 0.0
    torch.testing.assert_close(zero.advantages[1:3], raw.advantages[1:3])


def test_a_reward_constant_over_the_batch_gets_no_weight():
    rewards = np.array([[1.0, 5.0], [0.0, 5.0], [1.0, 5.0], [0.0, 5.0]])
    cv, share = cv_weights(group_rewards(rewards, [0, 0, 1, 1]))
    assert cv[1].item() == 0.0 and share[1].item() == 0.0
    assert share[0].item() == pytest.approx(2.0, rel=1e-6)


def test_nan_rewards_are_left_out_of_the_cv():
    nan = float("nan")
    rewards = np.array([[1.0, nan], [0.0, 2.0], [1.0, 4.0], [0.0, nan]])
    cv, _ = cv_weights(group_rewards(rewards, [0, 0, 1, 1]))
    assert cv[1].item() == pytest.approx(math.sqrt(2.0) / 3.0, rel=1e-6)  # std of (2, 4) / 3
    assert torch.isfinite(compute_advantages(rewards, [0, 0, 1, 1], "saw").advantages).all()


@pytest.mark.parametrize(("options", "match"), [
    ({"base": "ppo"}, "base must be one of"),
    ({"offsets": [1.0]}, "offsets must be a list of 2"),
    ({"offsets": [1.0, float("inf")]}, "offsets must be a list of 2 finite"),
    ({"batch_weighting": "sequence"}, "batch_weighting must be one of"),
    ({"singleton": "mean"}, "singleton must be one of"),
    ({"cv_eps": -1.0}, "cv_eps must be a finite number"),
])
def test_bad_options_raise(options, match):
    with pytest.raises(ValueError, match=match):
        compute_advantages(np.ones((4, 2)), [0, 0, 1, 1], "saw", **options)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 100_000), st.booleans(), st.sampled_from(["gdpo", "grpo"]))
def test_saw_equals_the_authors_code_on_random_batches(seed, with_lengths, base):
    batch = random_batch(seed, with_lengths)
    if len(batch.index) < 2:  # the authors' CV needs two responses (torch.std of one is NaN)
        return
    want = saw_reference(batch, base, lengths=batch.lengths)
    _assert_equal(_saw(batch, True, base=base), want)
