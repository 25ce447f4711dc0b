"""GRPO's family: one scalar reward ``t_i = sum_k w_k r_ik`` per response, centred in its group.

GRPO divides by the group std of ``t`` (``sqrt(S_cov)``, the square root of the sum of ALL
entries of the group's covariance matrix, so a component with a large spread dominates it);
Dr. GRPO does not divide; RLOO uses the leave-one-out baseline; REINFORCE++ whitens over the
batch.
"""

from __future__ import annotations

import torch

from corrgrpo.trainer.estimators.groups import RewardGroups
from corrgrpo.trainer.estimators.parts import scaled, standardised
from corrgrpo.trainer.estimators.registry import (
    DEFAULT_EPS,
    Decomposition,
    check_eps,
    decomposed,
    register_estimator,
)

__all__ = ["dr_grpo_advantages", "grpo_advantages", "reinforce_pp_advantages", "rloo_advantages"]


@register_estimator("grpo")
@decomposed
def grpo_advantages(
    groups: RewardGroups, *, scale: str = "group", eps: float = DEFAULT_EPS
) -> Decomposition:
    """GRPO: ``A_i = (t_i - mean_q t) / (std_q t + eps)`` with ``t_i = sum_k w_k r_ik``.

    Parts ``a_ik = c_ik / (std_q t + eps)``, group weight ``1 / (std_q t + eps)`` ``[G]``.

    Options:
        scale: ``group`` (std of t within the group), ``batch`` (std of
            ``t - mean_q t`` over the batch) or ``none`` (no division, Dr. GRPO).
        eps: added to the std.

    ``t_i - mean_q t = N_i = sum_k c_ik`` and ``std_q t = sqrt(S_cov)`` where
    ``S_cov`` sums all entries of the group covariance matrix.
    """
    eps = check_eps(eps)
    if scale == "group":
        return scaled(groups, 1.0 / (groups.s_cov.sqrt() + eps))
    if scale == "batch":
        vals = groups.numerator[groups.valid]
        std = vals.std() if vals.numel() > 1 else vals.new_zeros(())
        return scaled(groups, torch.full_like(groups.counts, 1.0) / (std + eps))
    if scale == "none":
        return scaled(groups, torch.ones_like(groups.counts))
    raise ValueError(f"grpo option scale must be 'group', 'batch' or 'none', got {scale!r}")


@register_estimator("dr_grpo")
@decomposed
def dr_grpo_advantages(groups: RewardGroups) -> Decomposition:
    """Dr. GRPO: ``A_i = t_i - mean_q t`` (GRPO with ``scale='none'``).

    Parts ``a_ik = c_ik``, group weight 1 ``[G]``.
    """
    return Decomposition(groups.weighted, torch.ones_like(groups.counts))


@register_estimator("rloo")
@decomposed
def rloo_advantages(groups: RewardGroups) -> Decomposition:
    """RLOO: ``A_i = t_i - mean_{j != i} t_j``, the leave-one-out baseline.

    With ``n_q`` members this is ``n_q / (n_q - 1) * (t_i - mean_q t)``: parts
    ``a_ik = n_q / (n_q - 1) * c_ik``, group weight ``n_q / (n_q - 1)`` ``[G]``; a group
    of one member has advantage 0.
    """
    n = groups.counts
    return scaled(groups, torch.where(n > 1, n / (n - 1.0).clamp(min=1.0), 0.0))


@register_estimator("reinforce_pp")
@decomposed
def reinforce_pp_advantages(
    groups: RewardGroups, *, baseline: str = "group", eps: float = DEFAULT_EPS
) -> Decomposition:
    """REINFORCE++: the return (minus an optional group-mean baseline), whitened over the batch.

    Parts ``a_ik = (x_ik - mean x_k) / (std x + eps)`` with ``x_ik = c_ik`` (group
    baseline) or ``w_k r_ik`` (none), group weight ``1 / (std x + eps)`` ``[G]``.

    Options:
        baseline: ``group`` subtracts the group mean of ``t`` first (REINFORCE++-baseline);
            ``none`` whitens the raw weighted totals ``t_i = sum_k w_k r_ik``.
        eps: added to the batch standard deviation.

    Whitening is ``(x - mean) / (std + eps)`` over the responses with an applicable component.
    """
    eps = check_eps(eps)
    if baseline == "group":
        x = groups.weighted
    elif baseline == "none":
        x = torch.where(groups.present, groups.rewards, 0.0) * groups.weights
    else:
        raise ValueError(f"reinforce_pp option baseline must be 'group' or 'none', got {baseline!r}")
    parts, scale = standardised(x, groups.valid, eps)
    return Decomposition(parts, torch.full_like(groups.counts, 1.0) * scale)


