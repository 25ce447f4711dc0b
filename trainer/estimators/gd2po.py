"""GD²PO (Liu et al., arXiv 2606.16771): drop responses whose per-reward advantages conflict.

GDPO sums each reward's group z-score ``a_ik``; a response that one reward pushes up and another
pushes down gets the two cancelled into a small, uninformative advantage. GD²PO drops such a
response from the update and weighs each prompt by the share of its responses it kept:

- ``hard``: drop a response when some ``a_ik > 1e-8`` and some ``a_ik < -1e-8``;
- ``snr``: drop it only when, in addition, its net signal is weak:
  ``|sum_k a_ik| / (sum_k |a_ik| + eps_snr) < tau``.

The kept responses' ``rho_q S_i`` (``S_i = sum_k a_ik``, ``rho_q`` the share of group q kept)
are whitened over the kept responses' tokens; a dropped response gets advantage 0.

Written after the authors' code: Qwen-Applications/GD2PO, ``tool-calling/verl/trainer/ppo/
ray_trainer.py`` (``compute_advantage``'s ``GDPO_Filter_GroupRatio`` branch, GD²PO-Hard, and
``_compute_gdpo_ratio_conflict_advantages``, GD²PO-SNR), commit
f1ad765bc9a330e6cf387f95e9c1e5a6c4bb2d02. They put the keep weight ``rho_q`` into the advantage
before whitening and apply no loss weight. The port in zhaihaotian/DARA
(``tool_calling/vendor/verl/verl/trainer/ppo/multi_reward_algos.py``, ``gd2po_hard``, commit
0459102045705674a9ad07748708facb8c5dc0b2) whitens the kept ``S_i`` alone and multiplies each
response's clipped policy term by ``rho_q`` in the loss instead (``compute_policy_loss``'s
``query_weight``, same denominators): ``keep_weight="loss"`` follows it, with ``rho_q`` as the
decomposition's loss weight.
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
    BATCH_WEIGHTINGS,
    batch_normalised,
    group_z_scores,
)

__all__ = ["KEEP_WEIGHTS", "SIGN_EPS", "SNR_EPS", "VARIANTS", "conflict_filter", "gd2po_advantages"]

#: ``hard`` drops every response with conflicting signs; ``snr`` only those with a weak net signal.
VARIANTS = ("hard", "snr")

#: Where the per-prompt keep weight goes: into the advantage before whitening (GD²PO's code) or
#: onto the loss (DARA's port).
KEEP_WEIGHTS = ("advantage", "loss")

#: Both versions' threshold for an advantage to count as positive or negative.
SIGN_EPS = 1e-8

#: The SNR ratio's ``eps`` of the authors' tool-calling runs (their safe-alignment config: 1e-6).
SNR_EPS = 1e-8


def conflict_filter(
    signals: torch.Tensor, variant: str, tau: float, snr_eps: float = SNR_EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N]`` bool: which responses have conflicting signs, and which are kept.

    ``signals`` ``[N, K]`` each reward's advantage of each response (times its token count in
    GD²PO's code, which tests the summed token advantages).
    """
    check_choice(variant, VARIANTS, "variant")
    conflict = (signals > SIGN_EPS).any(dim=1) & (signals < -SIGN_EPS).any(dim=1)
    if variant == "hard":
        return conflict, ~conflict
    net = signals.sum(dim=1) / (signals.abs().sum(dim=1) + max(snr_eps, 1e-12))
    return conflict, ~(conflict & (net.abs() < tau))


@register_estimator("gd2po")
@decomposed
def gd2po_advantages(
    groups: RewardGroups,
    *,
    variant: str = "hard",
    tau: float = 0.8,
    keep_weight: str = "advantage",
    eps: float = DEFAULT_EPS,
    snr_eps: float = SNR_EPS,
    batch_weighting: str = "token",
    singleton: str = "raw",
) -> Decomposition:
    """GD²PO: GDPO without the responses whose per-reward advantages conflict in sign.

    With ``a_ik = w_k z_ik`` (verl's per-reward group z-score times the reward weight),
    ``keep_i`` the filter and ``rho_q`` the share of group q kept:
    ``A_i = keep_i (rho_q S_i - m) / sqrt(v + 1e-8)``, ``S_i = sum_k a_ik``, ``m`` and ``v`` the
    token-weighted mean and (unbiased) variance of ``rho_q S_i`` over the kept responses. Parts
    ``keep_i (rho_q a_ik - m_k) / sqrt(v + 1e-8)``; group weight
    ``rho_q / ((std_q r_k + eps) sqrt(v + 1e-8))`` ``[G, K]`` (NaN where reward k is constant).
    With ``keep_weight="loss"`` (DARA's port) ``rho_q`` leaves the advantage and becomes the
    loss weight of each response of group q.

    Options:
        variant: ``hard`` (default) or ``snr`` (the paper's GD²PO-Hard and GD²PO-SNR).
        tau: the SNR threshold in [0, 1] (the authors' scripts: 0.8).
        keep_weight: ``advantage`` (GD²PO's code, default) or ``loss`` (DARA's port).
        eps: added to the group std (verl: 1e-6).
        snr_eps: added to ``sum_k |a_ik|`` in the SNR ratio (authors' tool calling: 1e-8).
        batch_weighting: ``token`` (default; a response counts once per trained token in the
            whitening and its sign test reads its summed token advantages, as verl's
            ``masked_whiten``) or ``response``.
        singleton: a group of one member gets ``raw``, its reward over ``1 + eps`` (verl,
            default), or ``zero``.

    Metrics: ``conflict_ratio`` (share of responses with conflicting signs), ``keep_ratio``
    (share kept), ``group_keep_ratio_mean`` and ``group_keep_ratio_min`` (of ``rho_q`` over
    the responses, as the authors log it).
    """
    eps = check_eps(eps)
    snr_eps = check_eps(snr_eps, "snr_eps")
    check_choice(keep_weight, KEEP_WEIGHTS, "keep_weight")
    if not (isinstance(tau, (int, float)) and 0.0 <= tau <= 1.0):
        raise ValueError(f"option tau must be a number in [0, 1], got {tau!r}")
    check_choice(batch_weighting, BATCH_WEIGHTINGS, "batch_weighting")
    advantages = group_z_scores(groups, eps, singleton) * groups.weights  # [N, K] a_ik
    tokens = groups.token_counts if batch_weighting == "token" else None
    if tokens is None:
        signals = advantages
    elif keep_weight == "advantage":  # GD²PO sums each reward's token advantages: L_i a_ik
        signals = advantages * tokens.unsqueeze(1)
    else:  # DARA tests each token's advantage: a_ik, or 0 without tokens
        signals = advantages * (tokens > 0).to(advantages.dtype).unsqueeze(1)
    conflict, keep = conflict_filter(signals, variant, float(tau), snr_eps)
    kept = keep.to(advantages.dtype)
    rho = groups.group_sum(kept) / groups.counts  # [G]
    rho_i = groups.per_response(rho)
    # GD²PO scales by rho_q BEFORE whitening ("so whiten won't erase the ratio"); DARA after, in the loss
    factor = rho if keep_weight == "advantage" else torch.ones_like(rho)
    scaled = advantages * (groups.per_response(factor) * kept).unsqueeze(1)
    parts, scale = batch_normalised(scaled, groups, "tokens", eps=eps, batch_weighting=batch_weighting, kept=kept)
    parts = torch.where((keep & groups.valid).unsqueeze(1), parts, 0.0)
    weight = torch.where(groups.active, (factor * scale).unsqueeze(1) / (groups.std + eps), math.nan)
    metrics = {
        "conflict_ratio": float(conflict.to(torch.float64).mean()),
        "keep_ratio": float(kept.mean()),
        "group_keep_ratio_mean": float(rho_i.mean()),
        "group_keep_ratio_min": float(rho.min()),
    }
    loss_weight = rho_i if keep_weight == "loss" else None
    return Decomposition(parts, weight, loss_weight, metrics)
