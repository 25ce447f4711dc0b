"""The two normalisations of verl's GRPO code, for the estimators whose authors built on verl
(SAW, GD²PO): its per-reward group z-score and its token-weighted batch whitening.

verl's ``compute_grpo_outcome_advantage`` gives a group of one member a mean of 0 and a std
of 1, so that response keeps its raw score over ``1 + eps`` instead of the 0 every other
estimator here gives it; :func:`group_z_scores` follows it by default (``singleton="raw"``).
verl's ``masked_whiten`` averages over the batch's tokens, so a response counts as many times
as it has trained tokens, its variance is unbiased over tokens and ``eps`` sits inside the root;
:func:`whitened` computes that from one value per response and its token count.
"""

from __future__ import annotations

import torch

from trainer.estimators.groups import RewardGroups

__all__ = [
    "BATCH_WEIGHTINGS", "SINGLETONS", "WHITEN_EPS", "batch_counts", "check_choice", "group_z_scores", "whitened",
]

#: verl's ``masked_whiten``: ``(x - mean) * rsqrt(var + 1e-8)``.
WHITEN_EPS = 1e-8

#: What a group of one member gets: ``raw`` (verl: its reward over ``1 + eps``) or ``zero``.
SINGLETONS = ("raw", "zero")

#: How a response counts in a batch mean: once per trained token (verl) or once.
BATCH_WEIGHTINGS = ("token", "response")


def check_choice(value: str, choices: tuple[str, ...], name: str) -> str:
    """``value`` if it is one of ``choices``, else ValueError naming the option."""
    if value not in choices:
        raise ValueError(f"option {name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def group_z_scores(groups: RewardGroups, eps: float, singleton: str = "raw") -> torch.Tensor:
    """``[N, K]`` unweighted per-reward group z-scores ``(r_ik - mean_q r_k) / (std_q r_k + eps)``.

    The std is unbiased; a reward constant in its group scores exactly 0; a NaN reward scores 0.
    A group of one member: ``r_ik / (1 + eps)`` with ``singleton="raw"`` (verl), 0 with ``"zero"``.
    """
    check_choice(singleton, SINGLETONS, "singleton")
    z = groups.centred / groups.per_response(groups.std + eps)
    if singleton == "zero":
        return z
    alone = groups.per_response(groups.counts == 1).unsqueeze(1)
    raw = torch.where(groups.present, groups.rewards, 0.0) / (1.0 + eps)
    return torch.where(alone, raw, z)


def batch_counts(groups: RewardGroups, batch_weighting: str) -> torch.Tensor:
    """``[N]`` how many times each response counts in a batch mean: its trained tokens
    (``token``, when the caller gave them; else 1) or 1 (``response``); 0 for a response
    with no applicable reward."""
    check_choice(batch_weighting, BATCH_WEIGHTINGS, "batch_weighting")
    valid = groups.valid.to(torch.float64)
    if batch_weighting == "token" and groups.token_counts is not None:
        return groups.token_counts * valid
    return valid


def whitened(x: torch.Tensor, counts: torch.Tensor, eps: float = WHITEN_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns ``(x_ik - m_k) * s`` with ``s = 1 / sqrt(v + eps)``, and ``s``.

    ``x`` ``[N, K]`` one value per response and component; ``counts`` ``[N]`` the weight of each
    response in the batch statistics (its token count; 0 leaves it out). ``m_k`` is the weighted
    mean of column k and ``v`` the weighted variance of the totals ``t_i = sum_k x_ik`` with
    ``T = sum_i counts_i`` and Bessel's ``T / (T - 1)`` (0 when ``T <= 1``), so the parts sum to
    verl's ``masked_whiten`` of ``t``. With ``T = 0`` nothing is whitened: all parts are 0.
    """
    total = float(counts.sum())
    if total <= 0:
        return torch.zeros_like(x), x.new_zeros(())
    mean = counts @ x / total  # [K]
    t = x.sum(dim=1)
    spread = float(counts @ (t - t.new_tensor(float(mean.sum()))).square())
    var = spread / (total - 1.0) if total > 1.0 else 0.0
    scale = x.new_tensor(var + eps).rsqrt()
    return (x - mean) * scale, scale
