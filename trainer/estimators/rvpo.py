"""RVPO (arXiv 2605.05750): a soft minimum of the per-reward z-scores, a smooth variance penalty.

Summing per-reward z-scores (GDPO) lets a large success on one reward hide a failure on another.
RVPO aggregates them with ``-1/k log(1/M sum_j exp(-k z_j))``: the mean for ``k -> 0``, the
minimum for ``k -> inf``, and to second order the mean minus ``k/2`` times the variance across
rewards, so a response must do well on every reward.

Followed: zhaihaotian/DARA, ``compute_multi_reward_advantage`` (method ``rvpo``) in
vendor/verl/verl/trainer/ppo/multi_reward_algos.py at 54024d0: verl's per-reward GRPO z-scores, the
soft minimum with k = 1 over the two rewards (its ``log 2`` is ``log M`` for M rewards), then
verl's token whitening. No code by the paper's authors was found.
"""

from __future__ import annotations

import math

import torch

from corrgrpo.trainer.estimators.groups import RewardGroups
from corrgrpo.trainer.estimators.registry import (
    DEFAULT_EPS,
    Decomposition,
    check_choice,
    check_eps,
    decomposed,
    register_estimator,
)
from corrgrpo.trainer.estimators.verl_normalisation import (
    NORMALISATIONS,
    batch_normalised,
    group_z_scores,
)

__all__ = ["rvpo_advantages", "soft_minimum"]


@register_estimator("rvpo")
@decomposed
def rvpo_advantages(
    groups: RewardGroups,
    *,
    k: float = 1.0,
    eps: float = DEFAULT_EPS,
    normalise: str = "tokens",
    whiten_eps: float = 1e-8,
    singleton: str = "raw",
) -> Decomposition:
    """RVPO: ``A = norm(m_i)``, ``m_i = -1/k log(1/M sum_j exp(-k A_ij))``.

    ``A_ij = w_j z_ij`` is reward j's weighted group z-score
    (:func:`~corrgrpo.trainer.estimators.verl_normalisation.group_z_scores`); the soft minimum runs over the M rewards
    of non-zero weight (a reward of weight 0 is not optimised, so it is left out; a reward
    constant in a group is in, with z = 0, as in the authors' code).

    Parts (exact; the soft minimum is not linear, so this is one exact split among many):
    with ``p_ij = softmax_j(-k A_ij)``, ``m_i = sum_j p_ij A_ij + g_i`` where
    ``g_i = (log M - H(p_i)) / k >= 0`` is the soft minimum's gap to the softmin-weighted mean;
    part j is ``p_ij (A_ij + g_i)``: each reward's softmin-weighted z-score plus its softmin share
    of the gap. They then go through the batch normalisation (affine, exact). No group weight.

    Options:
        k: risk coefficient (> 0; the DARA repository and the paper's tool-calling runs: 1).
        eps: added to the group std of each reward (outside the root).
        normalise: ``tokens`` (verl's token whitening, default: a response counts once per
            token given to ``compute_advantages``, once without them), ``responses`` or ``none``.
        whiten_eps: inside the root of the token whitening's variance (verl: 1e-8).
        singleton: ``raw`` (a group of one gets its reward over ``1 + eps``: verl's) or ``zero``.

    Metrics: ``aggregate_mean`` (mean soft minimum) and ``variance_penalty_mean`` (mean of
    ``mean_j A_ij - m_i``, >= 0), over the responses with a reward.
    """
    eps, whiten_eps = check_eps(eps), check_eps(whiten_eps, "whiten_eps")
    if not (isinstance(k, (int, float)) and math.isfinite(k) and k > 0):
        raise ValueError(f"option k must be a finite number > 0, got {k!r}")
    check_choice(normalise, NORMALISATIONS, "normalise")

    channel = group_z_scores(groups, eps, singleton) * groups.weights
    included = groups.weights != 0
    parts = torch.zeros_like(channel)
    if included.any():
        z = channel[:, included]
        minimum, share = soft_minimum(z, float(k))
        gap = minimum - (share * z).sum(dim=1)
        parts[:, included] = share * (z + gap.unsqueeze(1))
        valid = groups.valid
        metrics = {
            "aggregate_mean": float(minimum[valid].mean()) if valid.any() else 0.0,
            "variance_penalty_mean": float((z.mean(dim=1) - minimum)[valid].mean()) if valid.any() else 0.0,
        }
    else:
        metrics = {"aggregate_mean": 0.0, "variance_penalty_mean": 0.0}
    parts, _ = batch_normalised(parts, groups, normalise, eps=eps, whiten_eps=whiten_eps)
    return Decomposition(parts, None, None, metrics)


def soft_minimum(z: torch.Tensor, k: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N]`` ``-1/k log(1/M sum_j exp(-k z_ij))`` of ``z`` ``[N, M]`` and its softmin weights ``[N, M]``."""
    scaled = -k * z
    minimum = -(torch.logsumexp(scaled, dim=1) - math.log(z.shape[1])) / k
    return minimum, torch.softmax(scaled, dim=1)
