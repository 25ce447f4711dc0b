"""Building blocks the estimators share: parts of a group weight, batch whitening, z-scores."""

from __future__ import annotations

import math

import torch

from corrgrpo.trainer.estimators.groups import RewardGroups
from corrgrpo.trainer.estimators.registry import Decomposition

__all__ = ["component_weight", "scaled", "standardised", "weighted_z"]


def scaled(groups: RewardGroups, weight: torch.Tensor) -> Decomposition:
    """Parts ``c_ik * weight_q`` of a group weight ``[G]`` (or ``[G, K]``), and that weight."""
    factor = groups.per_response(weight)
    return Decomposition(groups.weighted * (factor.unsqueeze(1) if weight.dim() == 1 else factor), weight)


def standardised(x: torch.Tensor, valid: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns ``(x_ik - mean x_k) / (std t + eps)`` and ``1 / (std t + eps)`` (``t_i = sum_k x_ik``).

    ``x`` ``[N, K]``; the means and the (unbiased) std are over the ``valid`` rows. The
    parts sum to the whitened total ``(t_i - mean t) / (std t + eps)``. The other rows must
    be finite (they are 0 or finite z-scores; with ``eps = 0`` a z-score of a constant
    component is NaN, and the estimator reports a non-finite advantage).
    """
    total = x.sum(dim=1)[valid]
    count = total.numel()
    # column means as one product with the 0/1 mask: selecting the rows costs more
    mean = valid.to(x.dtype) @ x / max(count, 1)
    scale = 1.0 / ((total.std() if count > 1 else total.new_zeros(())) + eps)
    return (x - mean) * scale, scale


def weighted_z(groups: RewardGroups, eps: float) -> torch.Tensor:
    """``[N, K]`` ``w_k z_ik``: per-component group z-scores (0 for constant components)."""
    # centred values of constant components are 0, so their z is 0
    return groups.centred / groups.per_response(groups.std + eps) * groups.weights


def component_weight(groups: RewardGroups, eps: float) -> torch.Tensor:
    """``[G, K]`` ``1 / (std_q r_k + eps)``, NaN for a component constant in the group."""
    return torch.where(groups.active, 1.0 / (groups.std + eps), math.nan)

