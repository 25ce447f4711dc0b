"""CorrGRPO (arXiv 2609.36820): normalise by the group's correlation sum, not its covariance sum.

CorrGRPO divides GRPO's numerator ``N_i = sum_k c_ik`` by ``sqrt(S_corr + eps)``, the square
root of the sum of the entries of the group's *correlation* matrix, which is invariant to each
component's scale; GDPO-Corr does the same with the batch correlation of GDPO's z-scores.
"""

from __future__ import annotations

import math

import torch

from corrgrpo.trainer.estimators.groups import ACTIVITY_RTOL, RewardGroups, _correlation_sum
from corrgrpo.trainer.estimators.parts import component_weight, scaled, weighted_z
from corrgrpo.trainer.estimators.registry import (
    DEFAULT_EPS,
    Decomposition,
    check_eps,
    decomposed,
    register_estimator,
)

__all__ = ["corrgrpo_advantages", "corrgrpo_denominator", "gdpo_corr_advantages"]


@register_estimator("corrgrpo")
@decomposed
def corrgrpo_advantages(
    groups: RewardGroups, *, eps: float = DEFAULT_EPS, min_denominator: float | None = None
) -> Decomposition:
    """CorrGRPO: ``A_i = N_i / sqrt(S_corr + eps)``.

    Parts ``a_ik = c_ik / sqrt(S_corr + eps)`` over the components active for it (0 for
    the others), group weight ``1 / sqrt(S_corr + eps)`` ``[G]``.

    ``N_i = sum_k c_ik`` is GRPO's numerator (weights included); ``S_corr =
    max(0, sum_kl C_kl)`` sums the group's Pearson correlation matrix over its
    active components (inactive rows/columns are 0, diagonal included).

    Options:
        eps: inside the square root (paper: 1e-6).
        min_denominator: optional floor on ``sqrt(S_corr + eps)`` that bounds the
            blow-up of near-cancelling groups; None (default) is paper-exact.
    """
    eps = check_eps(eps)
    weight = 1.0 / corrgrpo_denominator(groups.s_corr, eps, min_denominator)  # [G]
    parts = scaled(groups, torch.where(groups.corr_active, weight.unsqueeze(1), 0.0)).parts
    return Decomposition(parts, weight)


def corrgrpo_denominator(
    s_corr: torch.Tensor, eps: float, min_denominator: float | None
) -> torch.Tensor:
    """``[G]`` ``max(sqrt(S_corr + eps), min_denominator)`` from ``s_corr`` ``[G]``."""
    denominator = (s_corr + eps).sqrt()
    if min_denominator is not None:
        if not (
            isinstance(min_denominator, (int, float))
            and math.isfinite(min_denominator)
            and min_denominator > 0
        ):
            raise ValueError(f"min_denominator must be None or a number > 0, got {min_denominator!r}")
        denominator = denominator.clamp(min=float(min_denominator))
    return denominator


@register_estimator("gdpo_corr")
@decomposed
def gdpo_corr_advantages(groups: RewardGroups, *, eps: float = DEFAULT_EPS) -> Decomposition:
    """GDPO with correlation: ``(A_i - mean A) / sqrt(S + eps)``, ``A_i = sum_k w_k z_ik``.

    Parts ``a_ik = (w_k z_ik - mean w_k z_k) / sqrt(S + eps)``, group weight
    ``1 / ((std_q r_k + eps) sqrt(S + eps))`` ``[G, K]``.

    ``S = max(0, sum_kl C_kl)`` with C the batch correlation matrix ``[K, K]``
    of the weighted z columns ``w_k z_k`` (constant columns: zero rows and
    columns). Batch statistics use the responses with an applicable component.
    """
    eps = check_eps(eps)
    zw = weighted_z(groups, eps)  # [N, K]
    rows = zw[groups.valid]
    if rows.shape[0] < 2:
        return Decomposition(torch.zeros_like(zw), None)
    mean = rows.mean(dim=0)
    centred = rows - mean
    cov = centred.T @ centred / (rows.shape[0] - 1)  # [K, K]
    scale = rows.abs().amax(dim=0).clamp(min=1.0).square()
    s = _correlation_sum(cov, torch.diagonal(cov) > ACTIVITY_RTOL * scale)
    denominator = (s + eps).sqrt()
    return Decomposition((zw - mean) / denominator, component_weight(groups, eps) / denominator)


