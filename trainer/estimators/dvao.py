"""DVAO (arXiv 2605.25604): rewards combined with weights that follow their in-group spread.

``A_i = sum_k w_k (r_ik - mean_q r_k) / sum_k w_k sigma_qk``: each reward's z-score enters with
weight ``w_k sigma_qk / sum_l w_l sigma_ql``, so a reward that varies more in this group counts
more in it, one that is constant not at all, and ``|A_i| <= sqrt(n_q - 1)`` (population std):
the advantages stay bounded however many rewards there are. No batch normalisation.

Followed: zhaihaotian/DARA, ``compute_multi_reward_advantage`` (method ``dvao``) in
tool_calling/vendor/verl/verl/trainer/ppo/multi_reward_algos.py at 0459102 (the same definition in
math/rdgdpo/advantages.py at 0459102): population std, no eps added, a group whose denominator is
not above 1e-8 gets advantage 0. No code by DVAO's own authors was found.
"""

from __future__ import annotations

import torch

from corrgrpo.trainer.estimators.groups import RewardGroups
from corrgrpo.trainer.estimators.parts import scaled
from corrgrpo.trainer.estimators.registry import (
    Decomposition,
    check_choice,
    check_eps,
    decomposed,
    register_estimator,
)

__all__ = ["dvao_advantages"]


@register_estimator("dvao")
@decomposed
def dvao_advantages(groups: RewardGroups, *, std: str = "population", eps: float = 1e-8) -> Decomposition:
    """DVAO: ``A_i = sum_k c_ik / D_q``, ``D_q = sum_k |w_k| sigma_qk`` (0 where ``D_q <= eps``).

    ``c_ik = w_k (r_ik - mean_q r_k)``; the reward weights are DVAO's base weights (the
    authors': 0.5 each, the same as any equal weights, since DVAO is unchanged by scaling all
    of them). A negative weight flips its reward's centred values but not its spread: the
    authors allow no negative weight, and ``|w_k|`` keeps the denominator a spread.

    Parts ``c_ik / D_q``, group weight ``1 / D_q`` ``[G]`` (exact: linear per group).

    Options:
        std: ``population`` (divide by ``n_q``: the authors') or ``sample`` (by ``n_q - 1``).
        eps: a group gets advantage 0 unless ``D_q > eps`` (the authors' 1e-8); nothing is added.

    Metrics: ``weight/<k>``, the mean over groups of reward k's effective weight
    ``w_k sigma_qk / D_q``, and ``zero_groups``, the share of groups with ``D_q <= eps``.
    """
    check_choice(std, ("population", "sample"), "std")
    eps = check_eps(eps)
    if std == "sample":
        sigma = groups.std
    else:  # the sample variance's sum of squares over n_q: a NaN adds 0 but counts, as elsewhere
        sigma = (groups.std.square() * groups.dof.unsqueeze(1) / groups.counts.unsqueeze(1)).sqrt()
    spread = sigma * groups.weights.abs()  # [G, K]
    denominator = spread.sum(dim=1)
    live = denominator > eps
    weight = torch.where(live, 1.0 / torch.where(live, denominator, 1.0), 0.0)
    share = spread * weight.unsqueeze(1) * torch.sign(groups.weights)
    metrics = {f"weight/{k}": float(share[live, k].mean()) if live.any() else 0.0
               for k in range(groups.num_components)}
    metrics["zero_groups"] = float((~live).double().mean())
    return Decomposition(scaled(groups, weight).parts, weight, None, metrics)
