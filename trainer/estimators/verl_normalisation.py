"""The normalisations of verl's GRPO code, shared by the estimators whose authors built on verl
(SAW, GD²PO, DARA, RVPO): its per-reward group z-score and its batch normalisations.

- :func:`group_z_scores`: each reward's group z-score ``(r - mean_q r) / (std_q r + eps)``,
  sample std, eps outside the root (verl's ``compute_grpo_outcome_advantage``). verl gives a
  group of ONE member mean 0 and std 1, so that response keeps its raw reward over ``1 + eps``
  instead of the 0 every other estimator here gives it: ``singleton="raw"`` follows verl,
  ``"zero"`` this package's convention.
- :func:`batch_normalised`: the final normalisation of a combined advantage over the batch.
  ``tokens`` is verl's ``masked_whiten`` over the response tokens: every token carries its
  response's advantage, so a response counts once per trained token; the mean and the sample
  variance (Bessel over tokens) are over all tokens and ``eps`` sits inside the root.
  ``responses`` is ``(x - mean) / (std + eps)`` over responses (the DARA repository's math stack,
  and this package's GDPO); ``none`` leaves the advantage as it is.

Token counts come from one place, :attr:`RewardGroups.token_counts` (``compute_advantages(...,
token_counts=...)``); :func:`batch_counts` turns them into each response's weight in a batch
mean. Without them every response counts once, so ``tokens`` whitens over responses.

Every batch normalisation is affine in the combined advantage, so it splits into per-reward parts
exactly: part k is ``(x_ik - mean x_k) * scale``, the means weighted as the normalisation weighs
responses.
"""

from __future__ import annotations

import torch

from corrgrpo.trainer.estimators.groups import RewardGroups
from corrgrpo.trainer.estimators.parts import standardised
from corrgrpo.trainer.estimators.registry import check_choice

__all__ = [
    "BATCH_WEIGHTINGS",
    "NORMALISATIONS",
    "SINGLETONS",
    "WHITEN_EPS",
    "batch_counts",
    "batch_normalised",
    "group_z_scores",
    "whitened",
]

#: verl's ``masked_whiten``: ``(x - mean) * rsqrt(var + 1e-8)``.
WHITEN_EPS = 1e-8

#: What a group of one member gets: ``raw`` (verl: its reward over ``1 + eps``) or ``zero``.
SINGLETONS = ("raw", "zero")

#: How a response counts in the token whitening's batch mean: once per trained token (verl) or once.
BATCH_WEIGHTINGS = ("token", "response")

#: The final batch normalisations (module docstring).
NORMALISATIONS = ("tokens", "responses", "none")


def group_z_scores(groups: RewardGroups, eps: float, singleton: str = "raw") -> torch.Tensor:
    """``[N, K]`` unweighted per-reward group z-scores ``(r_ik - mean_q r_k) / (std_q r_k + eps)``.

    The std is unbiased; a reward constant in its group scores exactly 0; a NaN reward scores 0.
    A group of one member: ``r_ik / (1 + eps)`` with ``singleton="raw"`` (verl), 0 with ``"zero"``.
    Multiply by ``groups.weights`` for each reward's advantage ``w_k z_ik``.
    """
    check_choice(singleton, SINGLETONS, "singleton")
    z = groups.centred / groups.per_response(groups.std + eps)
    if singleton == "zero":
        return z
    alone = groups.per_response(groups.counts == 1).unsqueeze(1)
    raw = torch.where(groups.present, groups.rewards, 0.0) / (1.0 + eps)
    return torch.where(alone, raw, z)


def batch_counts(groups: RewardGroups, batch_weighting: str = "token") -> torch.Tensor:
    """``[N]`` how many times each response counts in a batch mean: its trained tokens
    (``token``, when the caller gave them; else 1) or 1 (``response``); 0 for a response
    with no applicable reward."""
    check_choice(batch_weighting, BATCH_WEIGHTINGS, "batch_weighting")
    valid = groups.valid.to(torch.float64)
    if batch_weighting == "token" and groups.token_counts is not None:
        return groups.token_counts * valid
    return valid


def batch_normalised(
    x: torch.Tensor,
    groups: RewardGroups,
    normalise: str,
    *,
    eps: float,
    whiten_eps: float = WHITEN_EPS,
    batch_weighting: str = "token",
    kept: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Parts ``[N, K]`` of the batch-normalised total ``t_i = sum_k x_ik``, and the factor ``scale`` ``[]``.

    The batch statistics are over the responses with a reward (``groups.valid``), and of those
    only the ``kept`` ones (``[N]`` 0/1, e.g. GD²PO's filter) when given. ``tokens`` weighs each
    response by :func:`batch_counts` (``batch_weighting``) and whitens with ``whiten_eps`` inside
    the root; ``responses`` counts each response once and adds ``eps`` to the std. A response
    outside the statistics is still shifted by the mean and scaled: the caller masks it.
    """
    check_choice(normalise, NORMALISATIONS, "normalise")
    counts = batch_counts(groups, batch_weighting)
    if kept is not None:
        counts = counts * kept
    if normalise == "none":
        return x, x.new_ones(())
    if normalise == "responses":
        return standardised(x, groups.valid if kept is None else groups.valid & (kept > 0), eps)
    return whitened(x, counts, whiten_eps)


def whitened(x: torch.Tensor, counts: torch.Tensor, eps: float = WHITEN_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``masked_whiten`` of the totals ``t_i = sum_k x_ik``, split into columns, and its factor ``s``.

    Columns ``(x_ik - m_k) * s`` with ``s = 1 / sqrt(v + eps)``: ``m_k`` is the ``counts``-weighted
    mean of column k and ``v`` the weighted variance of ``t`` with ``T = sum_i counts_i`` and
    Bessel's ``T / (T - 1)`` (0 when ``T <= 1``: one token alone has nothing to whiten). With
    ``T = 0``, or ``eps = 0`` on a constant batch, nothing is whitened: the parts and ``s`` are 0.
    """
    total = float(counts.sum())
    if total <= 0:
        return torch.zeros_like(x), x.new_zeros(())
    mean = counts @ x / total  # [K]; the mean of the total is their sum
    t = x.sum(dim=1)
    spread = float(counts @ (t - t.new_tensor(float(mean.sum()))).square())
    var = spread / (total - 1.0) if total > 1.0 else 0.0
    if var + eps <= 0:  # eps = 0 on a constant batch: rsqrt(0) is inf
        return torch.zeros_like(x), x.new_zeros(())
    scale = x.new_tensor(var + eps).rsqrt()
    return (x - mean) * scale, scale

