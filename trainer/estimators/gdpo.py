"""Per-reward normalisation: MO-GRPO's sum of per-component group z-scores, and GDPO's batch
standardisation of it. Each reward counts on its own scale, whatever its range."""

from __future__ import annotations

from corrgrpo.trainer.estimators.groups import RewardGroups
from corrgrpo.trainer.estimators.parts import component_weight, standardised, weighted_z
from corrgrpo.trainer.estimators.registry import (
    DEFAULT_EPS,
    Decomposition,
    check_eps,
    decomposed,
    register_estimator,
)

__all__ = ["gdpo_advantages", "mo_grpo_advantages"]


@register_estimator("mo_grpo")
@decomposed
def mo_grpo_advantages(groups: RewardGroups, *, eps: float = DEFAULT_EPS) -> Decomposition:
    """MO-GRPO: ``A_i = sum_k w_k z_ik``, ``z_ik = (r_ik - mean_q r_k) / (std_q r_k + eps)``.

    Parts ``a_ik = w_k z_ik``, group weight ``1 / (std_q r_k + eps)`` ``[G, K]``. A
    constant component has z = 0.
    """
    eps = check_eps(eps)
    return Decomposition(weighted_z(groups, eps), component_weight(groups, eps))


@register_estimator("gdpo")
@decomposed
def gdpo_advantages(groups: RewardGroups, *, eps: float = DEFAULT_EPS) -> Decomposition:
    """GDPO: MO-GRPO's ``sum_k w_k z_ik``, then standardised over the batch.

    Parts ``a_ik = (w_k z_ik - mean w_k z_k) / (std A' + eps)`` with ``A'`` the MO-GRPO
    advantage, group weight ``1 / ((std_q r_k + eps) (std A' + eps))`` ``[G, K]``. The
    batch means and std use the responses with at least one applicable component.
    """
    eps = check_eps(eps)
    parts, scale = standardised(weighted_z(groups, eps), groups.valid, eps)
    return Decomposition(parts, component_weight(groups, eps) * scale)


