"""Group statistics shared by every estimator: :class:`RewardGroups` and :func:`group_rewards`.

All group statistics of a batch are computed once, in float64, without a Python loop over
groups (``index_add_`` over a dense group index). Only O(N K) work is needed: the sum of a
group's covariance matrix is the variance of ``N_i = sum_k c_ik``, the sum of its correlation
matrix is the variance of ``sum_k c_ik / std_q(c_k)``, and a covariance row sum is
``Cov(c_k, N)``.

- NaN marks a component that does not apply to a response. It is left out of its
  component's group mean and its centred value is 0, so it adds nothing to the numerator
  nor to the (co)variances; the (co)variances still divide by ``n_q - 1`` with ``n_q`` the
  number of members of the group.
- Values are centred on a member of their group before the mean is taken, so a component
  that is constant in a group centres to exactly 0 whatever its offset (1e7 or 0), and one
  that varies is never lost to the round-off of a large offset. A component is active when
  its variance is > 0; for the correlation statistics (CorrGRPO), which divide by
  per-component standard deviations and would turn float noise into unit-variance signal, a
  component counts only when its variance exceeds :data:`ACTIVITY_RTOL` times the square of
  its largest CENTRED value (at least 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

__all__ = ["ACTIVITY_RTOL", "DENSE_ID_RANGE_FACTOR", "RewardGroups", "group_rewards"]

#: For CorrGRPO, a component is constant (inactive) in a group when its variance is
#: <= ACTIVITY_RTOL * max(1, max_i |c_ik|)^2 with c the CENTRED weighted values: float
#: round-off of a constant component must not make it active (docs/method.md, CorrGRPO step 2).
ACTIVITY_RTOL = 1e-12

#: Group ids within a range of at most this many times N (plus 1024) are mapped
#: to rows with a counting pass; otherwise with a sort (``torch.unique``).
DENSE_ID_RANGE_FACTOR = 4


@dataclass(frozen=True)
class RewardGroups:
    """Group statistics of one batch, float64, computed once by :func:`group_rewards`.

    Shapes: N responses, K components, G groups.

    Attributes:
        index: ``[N]`` int64, the group row (0..G-1) of each response.
        group_keys: ``[G]`` the sorted unique group ids; row g is group ``group_keys[g]``.
        counts: ``[G]`` float64, members per group ``n_q``.
        rewards: ``[N, K]`` float64 raw rewards, NaN where not applicable.
        weights: ``[K]`` float64 reward weights.
        present: ``[N, K]`` bool, not NaN.
        valid: ``[N]`` bool, the response has at least one non-NaN component.
        centred: ``[N, K]`` unweighted rewards minus their group mean; 0 for NaN
            and (exactly) for components constant in the group.
        weighted: ``[N, K]`` ``centred * weights`` (``c_ik`` of docs/method.md).
        var: ``[G, K]`` unbiased variance of the weighted components.
        std: ``[G, K]`` unbiased standard deviation of the unweighted components.
        active: ``[G, K]`` bool, the component varies within the group (variance > 0).
        corr_active: ``[G, K]`` bool, the component varies beyond CorrGRPO's tolerance
            (:data:`ACTIVITY_RTOL`, judged on the centred values); the correlation
            statistics use only these.
        token_counts: ``[N]`` float64, the number of trained tokens of each response, for
            estimators whose batch means weigh a response by its tokens (as verl's
            ``masked_whiten`` does); None when the caller does not know them.
    """

    index: torch.Tensor
    group_keys: torch.Tensor
    counts: torch.Tensor
    rewards: torch.Tensor
    weights: torch.Tensor
    present: torch.Tensor
    valid: torch.Tensor
    centred: torch.Tensor
    weighted: torch.Tensor
    var: torch.Tensor
    std: torch.Tensor
    active: torch.Tensor
    corr_active: torch.Tensor
    token_counts: torch.Tensor | None = None

    @property
    def num_groups(self) -> int:
        return int(self.group_keys.shape[0])

    @property
    def num_components(self) -> int:
        return int(self.rewards.shape[1])

    def group_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Per-group sums ``[G, ...]`` of per-response ``values`` ``[N, ...]``."""
        out = values.new_zeros((self.num_groups, *values.shape[1:]))
        return out.index_add_(0, self.index, values)

    def per_response(self, values: torch.Tensor) -> torch.Tensor:
        """Broadcast per-group ``values`` ``[G, ...]`` to the responses ``[N, ...]``."""
        return values.index_select(0, self.index)

    @cached_property
    def dof(self) -> torch.Tensor:
        """``[G]`` ``max(n_q - 1, 1)``: a group of size 1 has zero (co)variance."""
        return (self.counts - 1.0).clamp(min=1.0)

    @cached_property
    def numerator(self) -> torch.Tensor:
        """``[N]`` ``N_i = sum_k c_ik = t_i - mean_q t`` (GRPO's and CorrGRPO's numerator)."""
        return self.weighted.sum(dim=1)

    @cached_property
    def corr_numerator(self) -> torch.Tensor:
        """``[N]`` CorrGRPO's numerator: ``N_i`` without components inactive for it."""
        return (self.weighted * self.per_response(self.corr_active.to(self.weighted.dtype))).sum(dim=1)

    @cached_property
    def inv_std(self) -> torch.Tensor:
        """``[G, K]`` ``1 / std_q(c_k)`` for components active for CorrGRPO, else 0."""
        return torch.where(self.corr_active, self.var.clamp(min=_TINY).rsqrt(), 0.0)

    @cached_property
    def s_cov(self) -> torch.Tensor:
        """``[G]`` GRPO's variance sum: all entries of the covariance matrix, ``var_q(N)``."""
        return self.group_sum(self.numerator.square()) / self.dof

    @cached_property
    def s_corr(self) -> torch.Tensor:
        """``[G]`` sum of all entries of the correlation matrix over ``corr_active`` components.

        ``sum_kl C_kl = var_q(sum_k c_k / std_q(c_k))``, hence >= 0.
        """
        standardised = (self.weighted * self.per_response(self.inv_std)).sum(dim=1)
        return self.group_sum(standardised.square()) / self.dof

    def covariance(self) -> torch.Tensor:
        """``[G, K, K]`` covariance matrices of the weighted components (O(N K^2), on demand)."""
        n, k = self.weighted.shape
        outer = (self.weighted.unsqueeze(2) * self.weighted.unsqueeze(1)).reshape(n, k * k)
        return (self.group_sum(outer) / self.dof[:, None]).reshape(-1, k, k)

    def correlation(self) -> torch.Tensor:
        """``[G, K, K]`` correlation matrices; rows/columns of constant components are 0."""
        u = self.inv_std
        return self.covariance() * u.unsqueeze(2) * u.unsqueeze(1)


_TINY = torch.finfo(torch.float64).tiny


def _as_tensor(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    try:
        return torch.as_tensor(np.asarray(x))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a tensor or array, got {type(x).__name__}") from err


def _validate(
    rewards: Any, group_ids: Any, weights: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check and convert the inputs; raise ValueError naming the problem."""
    r = _as_tensor(rewards, "rewards")
    if r.dim() != 2:
        raise ValueError(f"rewards must be 2-D [N, K], got shape {tuple(r.shape)}")
    if r.dtype == torch.bool or r.is_complex() or not (r.is_floating_point() or _is_int(r)):
        raise ValueError(f"rewards must be real numbers, got dtype {r.dtype}")
    n, k = r.shape
    if n == 0 or k == 0:
        raise ValueError(f"rewards must have at least one row and one column, got {tuple(r.shape)}")
    r = r.to(torch.float64)
    if torch.isinf(r).any():
        i, j = (int(v) for v in torch.nonzero(torch.isinf(r))[0])
        raise ValueError(f"rewards contain inf (first at row {i}, component {j})")

    g = _as_tensor(group_ids, "group_ids")
    if not _is_int(g):
        raise ValueError(f"group_ids must have an integer dtype, got {g.dtype}")
    if g.dim() != 1 or g.shape[0] != n:
        raise ValueError(
            f"group_ids must have shape [N] = [{n}] to match rewards, got {tuple(g.shape)}"
        )
    g = g.to(device=r.device, dtype=torch.int64)

    if weights is None:
        w = torch.ones(k, dtype=torch.float64, device=r.device)
    else:
        w = _as_tensor(weights, "weights")
        if w.dtype == torch.bool or w.is_complex():
            raise ValueError(f"weights must be real numbers, got dtype {w.dtype}")
        w = w.to(device=r.device, dtype=torch.float64)
        if w.dim() != 1 or w.shape[0] != k:
            raise ValueError(
                f"weights must have shape [K] = [{k}] to match rewards, got {tuple(w.shape)}"
            )
        if not torch.isfinite(w).all():
            raise ValueError(f"weights must be finite, got {w.tolist()}")
    return r, g, w


def _is_int(t: torch.Tensor) -> bool:
    return t.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _group_index(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sorted unique ids ``[G]``, each response's group row ``[N]`` and group sizes ``[G]``."""
    n = g.shape[0]
    lo, hi = (int(v) for v in torch.aminmax(g))
    if hi - lo < DENSE_ID_RANGE_FACTOR * n + 1024:  # counting pass, no sort
        shifted = g - lo
        sizes_all = torch.bincount(shifted, minlength=hi - lo + 1)
        seen = sizes_all > 0
        keys = torch.nonzero(seen).squeeze(1)
        row_of_id = torch.cumsum(seen, 0) - 1
        return keys + lo, row_of_id.index_select(0, shifted), sizes_all.index_select(0, keys)
    keys, index, sizes = torch.unique(g, sorted=True, return_inverse=True, return_counts=True)
    return keys, index, sizes


def group_rewards(
    rewards: Any, group_ids: Any, weights: Any = None, token_counts: Any = None
) -> RewardGroups:
    """Validate a batch and compute its group statistics (vectorised, float64).

    Args:
        rewards: ``[N, K]`` float, NaN = not applicable. Tensor, numpy array or nested lists.
        group_ids: ``[N]`` integer group id of each response, any order.
        weights: ``[K]`` finite reward weights, default ones.
        token_counts: ``[N]`` finite numbers >= 0 of trained tokens per response, or None.

    Returns:
        The :class:`RewardGroups` every estimator reads.
    """
    r, g, w = _validate(rewards, group_ids, weights)
    tokens = None if token_counts is None else _validate_token_counts(token_counts, r)
    n, k = r.shape
    group_keys, index, sizes = _group_index(g)
    num_groups = group_keys.shape[0]
    counts = sizes.to(r.dtype)
    dof = (counts - 1.0).clamp(min=1.0)

    present = ~torch.isnan(r)
    presentf = present.to(r.dtype)
    # centre on a member's value first (the group minimum: an exact member value), so that a
    # constant component is exactly 0 and a large offset adds no round-off to the mean
    reference = r.new_full((num_groups, k), math.inf).scatter_reduce_(
        0, index.unsqueeze(1).expand(n, k), torch.where(present, r, math.inf), reduce="amin"
    )
    shifted = torch.where(present, r - reference.index_select(0, index), 0.0)
    # one index_add_ for the sums and counts of present values: [N, 2K] -> [G, 2K]
    sums = r.new_zeros(num_groups, 2 * k).index_add_(0, index, torch.cat([shifted, presentf], 1))
    mean = sums[:, :k] / sums[:, k:].clamp(min=1.0)
    centred = (shifted - mean.index_select(0, index)) * presentf
    weighted = centred * w
    squares = r.new_zeros(num_groups, 2 * k).index_add_(
        0, index, torch.cat([weighted, centred], 1).square()
    )
    var = squares[:, :k] / dof[:, None]
    active = var > 0
    abs_max = r.new_zeros(num_groups, k).scatter_reduce_(
        0, index.unsqueeze(1).expand(n, k), weighted.abs(), reduce="amax"
    )
    corr_active = var > ACTIVITY_RTOL * abs_max.clamp(min=1.0).square()
    return RewardGroups(
        index=index,
        group_keys=group_keys,
        counts=counts,
        rewards=r,
        weights=w,
        present=present,
        valid=present.any(dim=1),
        centred=centred,
        weighted=weighted,
        var=var,
        std=(squares[:, k:] / dof[:, None]).sqrt(),
        active=active,
        corr_active=corr_active,
        token_counts=tokens,
    )


def _validate_token_counts(token_counts: Any, r: torch.Tensor) -> torch.Tensor:
    """``token_counts`` as ``[N]`` float64 on the rewards' device; ValueError naming the problem."""
    t = _as_tensor(token_counts, "token_counts")
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"token_counts must be real numbers, got dtype {t.dtype}")
    n = r.shape[0]
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(f"token_counts must have shape [N] = [{n}] to match rewards, got {tuple(t.shape)}")
    t = t.to(device=r.device, dtype=torch.float64)
    if not (torch.isfinite(t).all() and (t >= 0).all()):
        raise ValueError("token_counts must be finite and >= 0")
    return t


def _correlation_sum(cov: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """``max(0, sum_kl C_kl)`` of the correlation matrix of a covariance matrix ``[K, K]``.

    ``active`` ``[K]``: rows and columns of inactive components are 0 (diagonal
    included), so the correlation matrix stays PSD.
    """
    u = torch.where(active, torch.diagonal(cov).clamp(min=_TINY).rsqrt(), 0.0)
    return (cov * u.unsqueeze(1) * u.unsqueeze(0)).sum().clamp(min=0.0)

