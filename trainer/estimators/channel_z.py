"""Per-reward group z-scores as verl's GRPO outcome advantage computes them, one reward at a time.

DARA, RVPO and the GDPO training stack they are built on (zhaihaotian/DARA,
``compute_grpo_outcome_advantage`` in its vendored verl) z-score each reward in its group with
the sample standard deviation and eps outside the root, ``(r - mean) / (std + eps)``. They give a
group of ONE response mean 0 and std 1, so its z-score is its raw reward over ``1 + eps``; this
package's convention elsewhere is an advantage of 0 for a group of one. Both are offered
(``singleton``), the authors' by default in the estimators that follow them.
"""

from __future__ import annotations

import torch

from trainer.estimators.groups import RewardGroups
from trainer.estimators.parts import weighted_z

__all__ = ["SINGLETONS", "channel_z", "check_singleton"]

#: What a group of one response gets: ``raw`` its reward over ``1 + eps`` (verl's GRPO outcome
#: advantage, mean 0 and std 1), ``zero`` an advantage of 0 (this package's convention).
SINGLETONS = ("raw", "zero")


def check_singleton(singleton: str, estimator: str) -> str:
    """``singleton`` if it is one of :data:`SINGLETONS`, else ValueError naming ``estimator``."""
    if singleton not in SINGLETONS:
        raise ValueError(f"{estimator} option singleton must be 'raw' or 'zero', got {singleton!r}")
    return singleton


def channel_z(groups: RewardGroups, eps: float, singleton: str) -> torch.Tensor:
    """``[N, K]`` ``w_k z_ik``, each reward's group z-score ``(r - mean_q r) / (std_q r + eps)``.

    The std is the sample one (``n_q - 1``) and a reward constant in its group has z = 0. With
    ``singleton='raw'`` a response alone in its group gets ``w_k r_ik / (1 + eps)`` (0 where its
    reward is NaN); with ``'zero'`` it gets 0.
    """
    z = weighted_z(groups, eps)
    if singleton == "zero":
        return z
    alone = groups.per_response(groups.counts == 1).unsqueeze(1)
    raw = torch.where(groups.present, groups.rewards, 0.0) * groups.weights / (1.0 + eps)
    return torch.where(alone, raw, z)
