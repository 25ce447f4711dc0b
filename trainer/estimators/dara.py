"""DARA (arXiv 2610.00574): density-aware reward aggregation, RD-GDPO in its earlier code.

GDPO sums per-reward group z-scores, so a reward that varies in few groups (a sparse one) adds
little to the batch's advantage energy: under ideal group normalisation reward k's energy is
``B pi_k (G - 1)`` with ``pi_k`` the share of groups in which it carries signal. DARA weighs each
reward's z-scores by the inverse square root of that density, relative to the densest reward and
capped, then sums and normalises over the batch like GDPO.

Followed: zhaihaotian/DARA, the tool-calling stack (``compute_grpo_outcome_advantage``,
``compute_channel_densities`` and ``compute_dara_combined_advantage`` in
vendor/verl/verl/trainer/ppo/core_algos.py at 878c983, the token whitening of ``compute_advantage``
in ray_trainer.py at 5ef5a07, the positive calibration as tool_calling/tests/test_dara_three_rewards.py
states it at 0459102); the math stack's variant (math/rdgdpo/advantages.py at 0459102, estimator
``rdgdpo``) is ``normalise='responses'``. RD-GDPO is this estimator's earlier name, not another one.
"""

from __future__ import annotations

import math

import torch

from corrgrpo.trainer.estimators.groups import RewardGroups
from corrgrpo.trainer.estimators.parts import component_weight
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

__all__ = ["CALIBRATIONS", "dara_advantages", "density_weights"]

#: ``positive`` (DARA-Asym, the paper's main method): only positive z-scores are amplified;
#: ``symmetric`` (DARA-Sym): both signs are.
CALIBRATIONS = ("positive", "symmetric")


@register_estimator("dara")
@decomposed
def dara_advantages(
    groups: RewardGroups,
    *,
    calibration: str = "positive",
    w_max: float = 5.0,
    tau: float = 1e-8,
    eps: float = DEFAULT_EPS,
    normalise: str = "tokens",
    whiten_eps: float = 1e-8,
    singleton: str = "raw",
) -> Decomposition:
    """DARA: ``A = norm(sum_k s_k(A_ik))`` with density weights ``d_k = min(w_max, sqrt(pi_max / pi_k))``.

    ``A_ik = w_k z_ik`` is reward k's group z-score times its reward weight ``w_k``
    (:func:`~corrgrpo.trainer.estimators.verl_normalisation.group_z_scores`); ``pi_k`` is the share of
    groups with ``sum_i L_i |A_ik| > tau`` (``L_i`` the token counts given to
    ``compute_advantages``, 1 without them: the authors' token-level tensors); ``s_k(a) = d_k a``
    (symmetric) or ``a + (d_k - 1) max(a, 0)`` (positive). A reward with ``pi_k = 0`` gets
    ``w_max`` (its z-scores are 0, so the weight does nothing: the authors' tool-calling code).

    Parts: ``s_k(A_ik)`` through the batch normalisation (exact: it is affine). Group weight
    (symmetric only): ``d_k / (std_q r_k + eps)`` times the batch scale, ``[G, K]``.

    Options:
        calibration: ``positive`` (DARA-Asym, default) or ``symmetric`` (DARA-Sym).
        w_max: cap on the density weight (paper: 5), at least 1.
        tau: a group carries reward k's signal when its summed absolute advantage exceeds tau.
        eps: added to the group std of each reward (outside the root).
        normalise: ``tokens`` (verl's token whitening, default: a response counts once per
            token, once without token counts), ``responses`` (std + eps over responses: the math
            stack) or ``none``.
        whiten_eps: inside the root of the token whitening's variance (verl: 1e-8).
        singleton: ``raw`` (a group of one gets its reward over ``1 + eps``: verl's) or ``zero``.

    Metrics: ``density/<k>`` (``pi_k``), ``weight/<k>`` (``d_k``), ``active_groups/<k>`` per reward column k.
    """
    eps, tau, whiten_eps = check_eps(eps), check_eps(tau, "tau"), check_eps(whiten_eps, "whiten_eps")
    check_choice(calibration, CALIBRATIONS, "calibration")
    if not (isinstance(w_max, (int, float)) and math.isfinite(w_max) and w_max >= 1):
        raise ValueError(f"option w_max must be a finite number >= 1, got {w_max!r}")
    check_choice(normalise, NORMALISATIONS, "normalise")

    channel = group_z_scores(groups, eps, singleton) * groups.weights  # [N, K]
    active, density, weight = density_weights(groups, channel, tau, float(w_max))
    if calibration == "symmetric":
        calibrated = channel * weight
    else:
        calibrated = channel + (weight - 1.0) * channel.clamp(min=0.0)
    parts, scale = batch_normalised(calibrated, groups, normalise, eps=eps, whiten_eps=whiten_eps)
    group_weight = (component_weight(groups, eps) * weight * scale) if calibration == "symmetric" else None
    metrics: dict[str, float] = {}
    for k in range(groups.num_components):
        metrics[f"density/{k}"] = float(density[k])
        metrics[f"weight/{k}"] = float(weight[k])
        metrics[f"active_groups/{k}"] = float(active[k])
    return Decomposition(parts, group_weight, None, metrics)


def density_weights(
    groups: RewardGroups, channel: torch.Tensor, tau: float, w_max: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[K]`` each reward's active groups, density ``pi_k`` and capped density weight ``d_k``.

    A group is active for reward k when ``sum_i L_i |A_ik| > tau`` over its members (the
    authors' token-level advantages summed over tokens and rollouts; ``L_i`` the groups' token
    counts, 1 without them).
    """
    tokens = groups.token_counts
    energy = channel.abs() if tokens is None else channel.abs() * tokens.unsqueeze(1)
    active = (groups.group_sum(energy) > tau).sum(dim=0).to(channel.dtype)  # [K]
    density = active / max(groups.num_groups, 1)
    reference = density.max()
    weight = torch.where(
        density > 0, torch.sqrt(reference / density.clamp(min=1e-300)).clamp(max=w_max), w_max
    )
    return active, density, weight
