"""RDPO (arXiv 2605.13641): quantile-normalised rewards, whitened across rewards, then GDPO's sum.

GDPO z-scores each reward in its group, which lets a rare success on a binary reward take an
advantage of ``sqrt(n - 1)`` and a skewed or heavy-tailed reward dominate its prompt, and it adds
correlated rewards as if they were independent (two copies of a reward count twice). RDPO
replaces the z-score by a magnitude-aware quantile score and whitens the scores of the rewards
that vary together (Mahalanobis) before summing them.

No code was found (no public repository has it; the paper is a LongCat-Flash technical report).
This module implements the paper's description of its two steps, as its abstract and introduction
give it (a magnitude-aware quantile normalisation per prompt, robust to binary rewards, ties, skew
and outliers; Mahalanobis whitening within each active reward subspace before aggregation; GDPO's
pipeline otherwise); its method section's equations were not at hand, so every detail below is a
choice, stated here and in docs/advantages.md:

1. Quantile score, per group and reward, over the members the reward applies to: the mid-rank
   ``rho`` (ties share the mean of their ranks) gives the quantile level ``u = (rho - 1/2) / n``
   and the score ``Phi^-1(u)`` (``quantile='normal'``; ``'uniform'``: ``2u - 1``), centred on its
   group mean so that a group's scores sum to 0. A rank ignores by how much rewards differ; the
   "magnitude-aware" factor (``magnitude=True``) multiplies the scores by the group's range of the
   reward over its range in the batch (in [0, 1]), so a group whose rewards barely differ gets a
   small advantage. Scores of a reward constant in the group (or of weight 0) are 0.
2. Mahalanobis (ZCA) whitening in each group's active subspace (the rewards that vary in it):
   ``y = Sigma^(-1/2) x`` with the symmetric inverse root, which keeps each whitened score nearest
   its reward (so the parts stay per reward). ``Sigma`` is pooled over the groups with the same
   active subspace (``covariance='pooled'``: a group of a few responses cannot estimate a K x K
   covariance; ``'group'``: each group's own). Directions of (relative) variance below ``rtol``
   are left out, so a duplicated reward adds no direction of its own (two copies weigh sqrt 2,
   not 2 as in GDPO); ``ridge`` is added to the eigenvalues.
3. ``A_i = sum_k w_k y_ik``, then standardised over the batch as GDPO does
   (``normalise='responses'``, ``(A - mean) / (std + eps)``), or not (``'none'``).
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
from corrgrpo.trainer.estimators.verl_normalisation import batch_normalised

__all__ = ["mid_ranks", "quantile_scores", "rdpo_advantages", "whitened"]


@register_estimator("rdpo")
@decomposed
def rdpo_advantages(
    groups: RewardGroups,
    *,
    quantile: str = "normal",
    magnitude: bool = True,
    covariance: str = "pooled",
    rtol: float = 1e-10,
    ridge: float = 0.0,
    normalise: str = "responses",
    eps: float = DEFAULT_EPS,
) -> Decomposition:
    """RDPO: ``A = norm(sum_k w_k y_ik)``, ``y = Sigma^(-1/2) x`` of the quantile scores ``x``.

    Implemented from the paper's text (no code was available); the module docstring states each
    choice. Parts ``w_k y_ik`` through the batch standardisation (exact once the ranks and the
    whitening matrices are fixed); no group weight (the rank transform is not linear).

    Options:
        quantile: ``normal`` (``Phi^-1(u)``, default) or ``uniform`` (``2u - 1``).
        magnitude: scale a group's scores by its share of the reward's batch range.
        covariance: ``pooled`` over the groups with the same active rewards, or ``group``.
        rtol: eigen-directions with variance <= rtol times the largest are dropped.
        ridge: added to the covariance's eigenvalues before the inverse root (>= 0).
        normalise: ``responses`` (``(A - mean) / (std + eps)``, default) or ``none``.
        eps: added to the batch std.

    Metrics: ``active_sets`` (distinct non-empty active subspaces whitened) and
    ``dropped_directions`` (their directions of no variance: redundant rewards).
    """
    eps, rtol, ridge = check_eps(eps), check_eps(rtol, "rtol"), check_eps(ridge, "ridge")
    check_choice(quantile, ("normal", "uniform"), "quantile")
    check_choice(covariance, ("pooled", "group"), "covariance")
    check_choice(normalise, ("responses", "none"), "normalise")  # GDPO's; no token whitening in the paper
    scores, active = quantile_scores(groups, quantile, bool(magnitude))
    y, metrics = whitened(groups, scores, active, covariance, rtol, ridge)
    parts, _ = batch_normalised(y * groups.weights, groups, normalise, eps=eps)
    return Decomposition(parts, None, None, metrics)


def mid_ranks(groups: RewardGroups) -> torch.Tensor:
    """``[N, K]`` each reward's 1-based mid-rank among the members of its group it applies to.

    Tied values share the mean of their ranks; 0 where the reward is NaN. One sort per reward:
    by value, then (stably) by group, so each group's values are a sorted run.
    """
    ranks = torch.zeros_like(groups.rewards)
    for k in range(groups.num_components):
        rows = torch.nonzero(groups.present[:, k]).squeeze(1)
        if rows.numel() == 0:
            continue
        values, group = groups.rewards[rows, k], groups.index[rows]
        by_value = torch.argsort(values, stable=True)
        order = by_value[torch.argsort(group[by_value], stable=True)]
        v, g = values[order], group[order]
        first = torch.ones_like(g, dtype=torch.bool)
        new_group = first.clone()
        new_group[1:] = g[1:] != g[:-1]
        new_run = new_group.clone()
        new_run[1:] |= v[1:] != v[:-1]
        position = torch.arange(v.numel(), device=v.device)
        run = torch.cumsum(new_run, 0) - 1
        run_start = position[new_run][run]
        run_length = torch.bincount(run)[run].to(v.dtype)
        group_start = position[new_group][torch.cumsum(new_group, 0) - 1]
        ranks[rows[order], k] = (run_start - group_start).to(v.dtype) + (run_length + 1.0) / 2.0
    return ranks


def quantile_scores(groups: RewardGroups, quantile: str, magnitude: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` group-centred quantile scores and ``[G, K]`` which rewards are active per group.

    A reward is active in a group when it varies there and has a non-zero weight; its scores
    elsewhere are 0.
    """
    present = groups.present.to(groups.rewards.dtype)
    members = groups.group_sum(present)  # [G, K] members each reward applies to
    n = groups.per_response(members).clamp(min=1.0)
    level = (mid_ranks(groups) - 0.5) / n
    level = torch.where(groups.present, level, 0.5)
    score = torch.special.ndtri(level) if quantile == "normal" else 2.0 * level - 1.0
    score = score * present
    score = score - groups.per_response(groups.group_sum(score) / members.clamp(min=1.0))
    active = groups.active & (groups.weights != 0)
    if magnitude:
        score = score * groups.per_response(_range_share(groups))
    return score * groups.per_response(active.to(score.dtype)) * present, active


def _range_share(groups: RewardGroups) -> torch.Tensor:
    """``[G, K]`` each group's range of each reward over the reward's range in the batch."""
    n, k = groups.rewards.shape
    index = groups.index.unsqueeze(1).expand(n, k)
    high = torch.where(groups.present, groups.rewards, -math.inf)
    low = torch.where(groups.present, groups.rewards, math.inf)
    group_high = groups.rewards.new_full((groups.num_groups, k), -math.inf).scatter_reduce_(
        0, index, high, reduce="amax")
    group_low = groups.rewards.new_full((groups.num_groups, k), math.inf).scatter_reduce_(
        0, index, low, reduce="amin")
    group_range = torch.where(group_high >= group_low, group_high - group_low, 0.0)
    batch_range = (high.amax(dim=0) - low.amin(dim=0)).nan_to_num(0.0, posinf=0.0, neginf=0.0)
    return torch.where(batch_range > 0, group_range / torch.where(batch_range > 0, batch_range, 1.0), 0.0)


def whitened(
    groups: RewardGroups, scores: torch.Tensor, active: torch.Tensor, covariance: str, rtol: float,
    ridge: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``[N, K]`` ``Sigma^(-1/2) x`` per active subspace, and the whitening's metrics.

    The covariance of a subspace's scores is ``sum x x^T / sum_q (n_q - 1)`` over its groups' responses
    (the scores are group-centred). Rewards outside the subspace have scores and covariance rows of
    0, so the symmetric inverse root of the full ``[K, K]`` matrix, without its directions of no
    variance, is the subspace's.
    """
    n, k = scores.shape
    if covariance == "pooled":
        _, pattern = torch.unique(active.to(torch.int8), dim=0, return_inverse=True)  # [G]
    else:
        pattern = torch.arange(groups.num_groups, device=scores.device)
    count = int(pattern.max()) + 1 if pattern.numel() else 0
    dof = scores.new_zeros(count).index_add_(0, pattern, (groups.counts - 1.0).clamp(min=0.0))
    row_pattern = pattern.index_select(0, groups.index)
    outer = (scores.unsqueeze(2) * scores.unsqueeze(1)).reshape(n, k * k)
    sigma = scores.new_zeros(count, k * k).index_add_(0, row_pattern, outer).reshape(count, k, k)
    sigma = sigma / dof.clamp(min=1.0).reshape(count, 1, 1)
    values, vectors = torch.linalg.eigh(sigma)  # ascending
    largest = values[:, -1:].clamp(min=0.0)
    keep = values > rtol * largest
    inverse_root = torch.where(keep, (values.clamp(min=0.0) + ridge).rsqrt(), 0.0)
    whitening = vectors @ torch.diag_embed(inverse_root) @ vectors.transpose(1, 2)
    y = torch.einsum("ik,ikl->il", scores, whitening.index_select(0, row_pattern))
    # eigh mixes round-off into the rewards outside the subspace: they are exactly 0 there
    y = y * groups.per_response(active.to(y.dtype))
    sizes = active.sum(dim=1)  # [G]
    used = torch.zeros(count, dtype=torch.bool, device=scores.device)
    used[pattern[sizes > 0]] = True
    size_of = scores.new_zeros(count).scatter_reduce_(0, pattern, sizes.to(scores.dtype), "amax")
    metrics = {
        "active_sets": float(used.sum()),
        "dropped_directions": float((size_of - keep.sum(dim=1).to(scores.dtype))[used].sum()),
    }
    return y, metrics
