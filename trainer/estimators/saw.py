"""SAW (He et al., arXiv 2606.07705): each reward weighted by its coefficient of variation.

A reward the policy has already learnt gives nearly the same score to every response; what is
left of its spread is noise, which dilutes the rewards still being learnt (in GRPO's summed
reward) or holds a fixed share of the advantage (in GDPO). SAW measures how informative each
reward still is by its coefficient of variation over the whole batch and weighs it by its share:

    cv_k = std_i(r_ik + o_k) / (|mean_i(r_ik + o_k)| + eps_cv),   s_k = K cv_k / (sum_j cv_j + eps_cv)

(std unbiased, over the responses where reward k applies; ``o_k`` an offset that makes the
mean of a reward with negative values meaningful). ``base="gdpo"`` weighs GDPO's per-reward
group z-scores by ``s_k`` and whitens their sum over the batch's tokens; ``base="grpo"`` weighs
the rewards by ``s_k`` and runs GRPO on their sum. The reward weights ``w_k`` multiply ``s_k``.

Written after the authors' code: Zhaolutuan/SAW, ``verl/trainer/ppo/ray_trainer.py``,
``compute_advantage``'s ``gdpo-h`` and ``grpo-h`` branches, commit
119951f63fa92f93d4d5878c2cc0791db98a7f06. Their choices, followed by default: the batch CV
with the unbiased std and ``eps_cv = 1e-8`` outside the root, weights normalised to sum to
the number of rewards, verl's per-reward z-score (unbiased group std plus 1e-6; a group of one
keeps its raw reward over ``1 + 1e-6``) and verl's token-weighted ``masked_whiten``
(``rsqrt(var + 1e-8)``). Their ToolRL run shifted the correctness reward (range -3..3) by 3
before its CV and the format reward by 0: pass ``offsets=[3, 0]`` to reproduce it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
    SINGLETONS,
    batch_normalised,
    group_z_scores,
)

__all__ = ["BASES", "CV_EPS", "cv_weights", "saw_advantages"]

#: What SAW weighs: GDPO's per-reward advantages (``gdpo``) or GRPO's rewards (``grpo``).
BASES = ("gdpo", "grpo")

#: The authors' ``epsilon`` of the coefficient of variation and of the weights' normaliser.
CV_EPS = 1e-8


def cv_weights(
    groups: RewardGroups, offsets: Sequence[float] | None = None, cv_eps: float = CV_EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[K]`` each reward's coefficient of variation over the batch, and SAW's weights ``s_k``.

    The statistics use the responses where the reward applies (not NaN); a reward that applies
    to fewer than two responses has std 0, so cv 0. ``offsets`` ``[K]`` are added to the
    rewards first (default 0). The weights sum to ``K * sum cv / (sum cv + cv_eps)``.
    """
    rewards, present = groups.rewards, groups.present
    k = rewards.shape[1]
    shift = _offsets(offsets, k, rewards)
    x = torch.where(present, rewards + shift, 0.0)
    n = present.sum(dim=0).to(rewards.dtype)
    mean = x.sum(dim=0) / n.clamp(min=1.0)
    deviation = torch.where(present, x - mean, 0.0)
    std = (deviation.square().sum(dim=0) / (n - 1.0).clamp(min=1.0)).sqrt()
    cv = std / (mean.abs() + cv_eps)
    return cv, k * cv / (cv.sum() + cv_eps)


def _offsets(offsets: Sequence[float] | None, k: int, like: torch.Tensor) -> torch.Tensor:
    if offsets is None:
        return like.new_zeros(k)
    try:
        shift = torch.as_tensor([float(v) for v in offsets], dtype=like.dtype, device=like.device)
    except (TypeError, ValueError) as err:
        raise ValueError(f"option offsets must be a list of {k} numbers, got {offsets!r}") from err
    if shift.shape != (k,) or not torch.isfinite(shift).all():
        raise ValueError(f"option offsets must be a list of {k} finite numbers, got {offsets!r}")
    return shift


@register_estimator("saw")
@decomposed
def saw_advantages(
    groups: RewardGroups,
    *,
    base: str = "gdpo",
    offsets: Sequence[float] | None = None,
    eps: float = DEFAULT_EPS,
    cv_eps: float = CV_EPS,
    batch_weighting: str = "token",
    singleton: str = "raw",
) -> Decomposition:
    """SAW: rewards weighted by their share of the batch's coefficients of variation.

    ``base="gdpo"`` (the authors' ``gdpo-h``): ``A_i = whiten(sum_k w_k s_k z_ik)``, parts
    ``a_ik = (w_k s_k z_ik - m_k) / sqrt(v + 1e-8)`` with ``m_k`` the batch mean of column k
    and ``v`` the batch variance of the sum; group weight ``s_k / ((std_q r_k + eps) sqrt(v + 1e-8))``
    ``[G, K]`` (NaN where reward k is constant in the group).

    ``base="grpo"`` (``grpo-h``): GRPO on ``t_i = sum_k w_k s_k r_ik``: parts
    ``a_ik = w_k s_k (r_ik - mean_q r_k) / (std_q t + eps)``, group weight
    ``s_k / (std_q t + eps)`` ``[G, K]``.

    Options:
        base: ``gdpo`` (default) or ``grpo``, what the weights act on.
        offsets: ``[K]`` added to each reward before its CV (default 0; the authors' ToolRL
            run: ``[3, 0]``).
        eps: added to the group std (verl: 1e-6).
        cv_eps: added to ``|mean|`` in the CV and to the sum of the CVs (authors: 1e-8).
        batch_weighting: ``token`` (default, verl's ``masked_whiten``: a response counts once
            per trained token, when the caller gives the token counts) or ``response``; base gdpo.
        singleton: a group of one member gets ``raw``, its reward over ``1 + eps`` (verl,
            default), or ``zero``.

    Metrics: ``cv/<k>`` and ``weight/<k>`` (``s_k``) of each reward k.
    """
    eps, cv_eps = check_eps(eps), check_eps(cv_eps, "cv_eps")
    check_choice(base, BASES, "base")
    cv, share = cv_weights(groups, offsets, cv_eps)
    coefficient = groups.weights * share  # [K]
    metrics = {**{f"cv/{k}": float(v) for k, v in enumerate(cv)},
               **{f"weight/{k}": float(v) for k, v in enumerate(share)}}
    valid = groups.valid.unsqueeze(1)
    if base == "gdpo":
        z = group_z_scores(groups, eps, singleton)
        parts, scale = batch_normalised(z * coefficient, groups, "tokens", eps=eps, batch_weighting=batch_weighting)
        weight = torch.where(groups.active, share * scale / (groups.std + eps), math.nan)
        return Decomposition(torch.where(valid, parts, 0.0), weight, metrics=metrics)
    check_choice(batch_weighting, BATCH_WEIGHTINGS, "batch_weighting")  # no batch mean in GRPO
    check_choice(singleton, SINGLETONS, "singleton")
    c = groups.centred * coefficient  # [N, K] the centred parts of t
    std_t = (groups.group_sum(c.sum(dim=1).square()) / groups.dof).sqrt()  # [G]
    factor = 1.0 / (std_t + eps)
    parts = c * groups.per_response(factor).unsqueeze(1)
    weight = share * factor.unsqueeze(1)  # [G, K]
    if singleton == "raw":  # verl: a group of one has mean 0 and std 1
        alone = groups.counts == 1
        raw = torch.where(groups.present, groups.rewards, 0.0) * coefficient / (1.0 + eps)
        parts = torch.where(groups.per_response(alone).unsqueeze(1), raw, parts)
        weight = torch.where(alone.unsqueeze(1), math.nan, weight)
    return Decomposition(torch.where(valid, parts, 0.0), weight, metrics=metrics)
