"""verl's normalisations, shared by SAW, GD²PO, DARA and RVPO: the group z-score with its
``singleton`` choice, and the one batch normalisation (``tokens`` / ``responses`` / ``none``)
with the token counts read from the groups."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from corrgrpo.trainer.estimators import group_rewards
from corrgrpo.trainer.estimators.registry import check_choice
from corrgrpo.trainer.estimators.verl_normalisation import (
    batch_counts,
    batch_normalised,
    group_z_scores,
)
from tests.verl_reference_dara import first_token, grpo_outcome, masked_whiten, token_mask

REWARDS = np.array([[1.0, 4.0], [3.0, 4.0], [2.0, 0.5], [5.0, np.nan], [0.0, 1.0], [2.0, 3.0]])
IDS = np.array([0, 0, 1, 2, 2, 2])  # group 1 is one response
LENGTHS = np.array([3.0, 1.0, 4.0, 2.0, 5.0, 2.0])


def test_group_z_scores_follow_verl_and_give_a_group_of_one_its_raw_reward():
    groups = group_rewards(REWARDS, IDS)
    z = group_z_scores(groups, 1e-6).numpy()
    pair = 1.0 / (math.sqrt(2.0) + 1e-6)  # (1, 3): mean 2, sample std sqrt 2
    np.testing.assert_allclose(z[:2, 0], [-pair, pair], rtol=1e-12)
    assert (z[:2, 1] == 0).all()  # constant in its group: exactly 0
    np.testing.assert_allclose(z[2], [2.0 / (1 + 1e-6), 0.5 / (1 + 1e-6)], rtol=1e-15)
    assert z[3, 1] == 0.0  # NaN reward
    # reward 0 has no NaN: it is verl's GRPO outcome advantage itself
    want = first_token(grpo_outcome(REWARDS[:, 0], IDS, token_mask(np.ones(6, int))))
    np.testing.assert_allclose(z[:, 0], want, rtol=1e-12)
    zero = group_z_scores(groups, 1e-6, "zero").numpy()
    assert (zero[2] == 0).all() and (zero[[0, 1, 3, 4, 5]] == z[[0, 1, 3, 4, 5]]).all()


def test_token_whitening_is_verls_masked_whiten_over_the_tokens_given_to_the_groups():
    groups = group_rewards(REWARDS, IDS, token_counts=LENGTHS)
    x = group_z_scores(groups, 1e-6)
    parts, scale = batch_normalised(x, groups, "tokens", eps=1e-6)
    mask = token_mask(LENGTHS.astype(int))
    total = x.sum(dim=1).numpy()
    want = first_token(masked_whiten(total[:, None] * mask, mask))
    np.testing.assert_allclose(parts.sum(dim=1).numpy(), want, rtol=1e-12)
    torch.testing.assert_close(batch_counts(groups), torch.tensor(LENGTHS))
    # responses counted once: the same whitening over responses, with or without token counts
    once, _ = batch_normalised(x, groups, "tokens", eps=1e-6, batch_weighting="response")
    ones = first_token(masked_whiten(total[:, None], np.ones((6, 1))))
    np.testing.assert_allclose(once.sum(dim=1).numpy(), ones, rtol=1e-12)
    plain, _ = batch_normalised(x, group_rewards(REWARDS, IDS), "tokens", eps=1e-6)
    torch.testing.assert_close(plain, once, rtol=0, atol=0)
    assert float(scale) == pytest.approx(float(want[0] / (total[0] - (LENGTHS @ total) / LENGTHS.sum())))


def test_responses_standardise_once_each_and_none_leaves_the_parts():
    groups = group_rewards(REWARDS, IDS, token_counts=LENGTHS)
    x = group_z_scores(groups, 1e-6)
    parts, _ = batch_normalised(x, groups, "responses", eps=1e-6)
    total = x.sum(dim=1).numpy()
    np.testing.assert_allclose(parts.sum(dim=1).numpy(),
                               (total - total.mean()) / (total.std(ddof=1) + 1e-6), rtol=1e-12)
    same, scale = batch_normalised(x, groups, "none", eps=1e-6)
    assert same is x and float(scale) == 1.0


def test_kept_responses_alone_enter_the_statistics():
    groups = group_rewards(REWARDS, IDS, token_counts=LENGTHS)
    x = group_z_scores(groups, 1e-6)
    kept = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    parts, _ = batch_normalised(x, groups, "tokens", eps=1e-6, kept=kept)
    rows = kept.bool().numpy()
    mask = token_mask(LENGTHS.astype(int)) * rows[:, None]
    want = first_token(masked_whiten(x.sum(dim=1).numpy()[:, None] * mask, mask))
    np.testing.assert_allclose(parts.sum(dim=1).numpy()[rows], want[rows], rtol=1e-12)
    parts, _ = batch_normalised(x, groups, "responses", eps=1e-6, kept=kept)
    total = x.sum(dim=1).numpy()[rows]
    np.testing.assert_allclose(parts.sum(dim=1).numpy()[rows],
                               (total - total.mean()) / (total.std(ddof=1) + 1e-6), rtol=1e-12)


def test_nothing_to_whiten_gives_zeros():
    groups = group_rewards(np.array([[1.0], [1.0]]), [0, 0])
    x = torch.tensor([[0.5], [0.5]], dtype=torch.float64)
    parts, scale = batch_normalised(x, groups, "tokens", eps=1e-6, whiten_eps=0.0)  # rsqrt(0)
    assert (parts == 0).all() and float(scale) == 0.0
    parts, scale = batch_normalised(x, groups, "tokens", eps=1e-6, kept=torch.zeros(2, dtype=torch.float64))
    assert (parts == 0).all() and float(scale) == 0.0


def test_choices_are_checked_by_name():
    groups = group_rewards(REWARDS, IDS)
    with pytest.raises(ValueError, match="option normalise must be one of 'tokens', 'responses', 'none', got 'batch'"):
        batch_normalised(group_z_scores(groups, 1e-6), groups, "batch", eps=1e-6)
    with pytest.raises(ValueError, match="option singleton must be one of 'raw', 'zero'"):
        group_z_scores(groups, 1e-6, "one")
    with pytest.raises(ValueError, match="option batch_weighting must be one of 'token', 'response'"):
        batch_counts(groups, "sequence")
    assert check_choice("raw", ("raw", "zero"), "singleton") == "raw"
