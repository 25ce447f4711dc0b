"""Multi-reward group advantage estimators: GRPO, Dr. GRPO, CorrGRPO, GDPO, MO-GRPO.

Every estimator turns a batch of vector rewards ``[N, K]`` and the group id of
each response ``[N]`` into one scalar advantage per response ``[N]``. The math is
documented in ``docs/advantages.md``; in short, for a group q with centred
weighted components ``c_ik`` and ``N_i = sum_k c_ik``:

- GRPO divides ``N_i`` by ``sqrt(S_cov)``, the square root of the sum of ALL
  entries of the group's covariance matrix (``var_q(sum_k s_k)``), so a
  component with a large spread dominates it;
- CorrGRPO divides ``N_i`` by ``sqrt(S_corr + eps)``, the sum of the entries of
  the group's *correlation* matrix, which is invariant to each component's scale.

Implementation notes:

- All group statistics are computed once per call by :func:`group_rewards`
  (one ``torch.unique``, ``index_add_`` over the sorted group index, no Python
  loop over groups) in float64; estimators are small pure tensor functions that
  read the resulting :class:`RewardGroups`. The returned advantages are float32.
- NaN marks a component that does not apply to a response. It is left out of
  its component's group mean and its centred value is 0, so it adds nothing to
  the numerator nor to the (co)variances; the (co)variances still divide by
  ``n_q - 1`` with ``n_q`` the number of members of the group.
- A component is constant in a group when its variance is within float
  round-off of 0 (:data:`ACTIVITY_RTOL`); its centred values are then exactly 0. A response whose
  components are all NaN gets advantage 0 and takes no part in batch-level
  normalisation.
- Estimators are looked up by name in a registry; :func:`register_estimator`
  plugs in a new one.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "ACTIVITY_RTOL",
    "NEAR_CANCELLING_S_CORR",
    "AdvantageResult",
    "AdvantageStats",
    "RewardGroups",
    "available_estimators",
    "compute_advantages",
    "corrgrpo_advantages",
    "diagnose",
    "dr_grpo_advantages",
    "gdpo_advantages",
    "gdpo_corr_advantages",
    "get_estimator",
    "grpo_advantages",
    "group_rewards",
    "mo_grpo_advantages",
    "register_estimator",
]

#: A component is constant (inactive) in a group when its variance is
#: <= ACTIVITY_RTOL * max(1, max_i |s_ik|)^2: float round-off of a constant
#: component must not make it active (method.md, CorrGRPO step 3).
ACTIVITY_RTOL = 1e-12

#: A group with at least one active component is "near-cancelling" when its
#: correlation sum S_corr is below this value. Then CorrGRPO's multiplier
#: 1/sqrt(S_corr + eps) exceeds ~31.6, i.e. more than 31x the multiplier of a
#: group with a single active component (S_corr = 1): the components nearly
#: cancel (e.g. two anti-correlated ones) and the advantages blow up.
NEAR_CANCELLING_S_CORR = 1e-3

DEFAULT_EPS = 1e-6

#: The padded [G, max group size, K] layout is used while it holds at most this
#: many times N slots (equal group sizes: exactly N); beyond, scatter over rows.
PADDED_LAYOUT_MAX_FILL = 4.0

Estimator = Callable[..., torch.Tensor]
_ESTIMATORS: dict[str, Estimator] = {}


# --------------------------------------------------------------------------- #
# Grouped statistics shared by every estimator
# --------------------------------------------------------------------------- #
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
        centred: ``[N, K]`` unweighted rewards minus their group mean, NaN -> 0.
        weighted: ``[N, K]`` ``centred * weights`` (``c_ik`` of method.md).
        cov: ``[G, K, K]`` unbiased covariance of the weighted components.
        active: ``[G, K]`` bool, the weighted component varies within the group.
        std: ``[G, K]`` unbiased standard deviation of the unweighted components.
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
    cov: torch.Tensor
    active: torch.Tensor
    std: torch.Tensor

    @property
    def num_groups(self) -> int:
        return int(self.group_keys.shape[0])

    @property
    def num_components(self) -> int:
        return int(self.rewards.shape[1])


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


def _active_mask(variance: torch.Tensor, abs_max: torch.Tensor) -> torch.Tensor:
    """``[..]`` bool: variance above the round-off tolerance of method.md."""
    return variance > ACTIVITY_RTOL * torch.clamp(abs_max, min=1.0).square()


def _padded_statistics(
    filled: torch.Tensor,
    present: torch.Tensor,
    w: torch.Tensor,
    order: torch.Tensor,
    sorted_index: torch.Tensor,
    group_sizes: torch.Tensor,
    max_size: int,
    dof: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """Group statistics through a zero-padded ``[G, max_size, K]`` layout (batched matmul).

    Padding slots count as "not present", exactly like NaN entries.
    """
    n, k = filled.shape
    num_groups = group_sizes.shape[0]
    starts = torch.cumsum(group_sizes, 0) - group_sizes
    slot_sorted = sorted_index * max_size + (
        torch.arange(n, device=filled.device) - starts[sorted_index]
    )
    slot = torch.empty_like(slot_sorted).index_put_((order,), slot_sorted)  # [N] original order
    padded = filled.new_zeros(num_groups * max_size, k).index_put_((slot,), filled)
    mask = filled.new_zeros(num_groups * max_size, k).index_put_((slot,), present.to(filled.dtype))
    padded = padded.view(num_groups, max_size, k)
    mask = mask.view(num_groups, max_size, k)
    mean = padded.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # [G, K]
    centred_p = (padded - mean.unsqueeze(1)) * mask
    weighted_p = centred_p * w
    cov = torch.bmm(weighted_p.transpose(1, 2), weighted_p) / dof[:, None, None]
    var_raw = centred_p.square().sum(dim=1) / dof[:, None]
    abs_max = (padded * w).abs().amax(dim=1)
    centred = centred_p.view(-1, k)[slot]
    return centred, centred * w, cov, var_raw, abs_max


def _scattered_statistics(
    filled: torch.Tensor,
    present: torch.Tensor,
    w: torch.Tensor,
    index: torch.Tensor,
    num_groups: int,
    dof: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """Group statistics through ``index_add_`` / ``scatter_reduce`` over ``[N, ...]`` rows."""
    n, k = filled.shape
    presentf = present.to(filled.dtype)
    sums = filled.new_zeros(num_groups, 2 * k).index_add_(0, index, torch.cat([filled, presentf], 1))
    mean = sums[:, :k] / sums[:, k:].clamp(min=1.0)
    centred = (filled - mean[index]) * presentf
    weighted = centred * w
    outer = (weighted.unsqueeze(2) * weighted.unsqueeze(1)).reshape(n, k * k)
    cov = filled.new_zeros(num_groups, k * k).index_add_(0, index, outer)
    cov = (cov / dof[:, None]).reshape(num_groups, k, k)
    var_raw = filled.new_zeros(num_groups, k).index_add_(0, index, centred.square()) / dof[:, None]
    abs_max = filled.new_zeros(num_groups, k).scatter_reduce(
        0, index[:, None].expand(n, k), (filled * w).abs(), reduce="amax", include_self=True
    )
    return centred, weighted, cov, var_raw, abs_max


def group_rewards(rewards: Any, group_ids: Any, weights: Any = None) -> RewardGroups:
    """Validate a batch and compute its group statistics (vectorised, float64).

    Args:
        rewards: ``[N, K]`` float, NaN = not applicable. Tensor, numpy array or nested lists.
        group_ids: ``[N]`` integer group id of each response, any order.
        weights: ``[K]`` finite reward weights, default ones.

    Returns:
        The :class:`RewardGroups` every estimator reads.
    """
    r, g, w = _validate(rewards, group_ids, weights)
    n, k = r.shape
    # one sort gives the groups, their sizes and each response's slot in its group
    if bool((g[1:] >= g[:-1]).all()):  # already sorted (contiguous groups): skip the sort
        sorted_ids, order = g, torch.arange(n, device=g.device)
    else:
        sorted_ids, order = torch.sort(g, stable=True)
    group_keys, sorted_index, group_sizes = torch.unique_consecutive(
        sorted_ids, return_inverse=True, return_counts=True
    )
    num_groups = group_keys.shape[0]
    index = torch.empty_like(sorted_index).index_put_((order,), sorted_index)
    counts = group_sizes.to(torch.float64)
    dof = (counts - 1.0).clamp(min=1.0)  # a group of size 1 has zero (co)variance

    present = ~torch.isnan(r)
    filled = torch.where(present, r, 0.0)
    max_size = int(group_sizes.max())
    if num_groups * max_size <= PADDED_LAYOUT_MAX_FILL * n:
        stats = _padded_statistics(filled, present, w, order, sorted_index, group_sizes, max_size, dof)
    else:  # very uneven group sizes: scatter into [G, ...] instead of padding
        stats = _scattered_statistics(filled, present, w, index, num_groups, dof)
    centred, weighted, cov, var_raw, abs_max = stats
    active = _active_mask(torch.diagonal(cov, dim1=1, dim2=2), abs_max)
    # a constant component centres to exactly 0: drop the round-off of its mean
    # (it would otherwise leak into the numerator, e.g. 1e-8 / sqrt(eps) = 1e-5)
    activef = active.to(r.dtype)
    keep = activef[index]
    centred, weighted = centred * keep, weighted * keep
    cov = cov * activef.unsqueeze(2) * activef.unsqueeze(1)
    var_raw = var_raw * activef
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
        cov=cov,
        active=active,
        std=var_raw.sqrt(),
    )


def _correlation(cov: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Pearson correlation matrices with zero rows/columns for inactive components.

    Args:
        cov: ``[..., K, K]`` covariance matrices.
        active: ``[..., K]`` bool; rows and columns of inactive components are 0
            (diagonal included), so the correlation matrix stays PSD.

    Returns:
        ``[..., K, K]`` correlation matrices.
    """
    diag = torch.diagonal(cov, dim1=-2, dim2=-1)
    u = torch.where(active, diag.clamp(min=torch.finfo(cov.dtype).tiny).rsqrt(), 0.0)
    return cov * u.unsqueeze(-1) * u.unsqueeze(-2)


def _correlation_sum(cov: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """``[...]`` ``max(0, sum_kl C_kl)`` of the correlation matrices of ``cov`` ``[..., K, K]``."""
    return _correlation(cov, active).sum(dim=(-2, -1)).clamp(min=0.0)


def _masked_standardise(x: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the entries where ``mask`` is true (unbiased std)."""
    vals = x[mask]
    if vals.numel() == 0:
        return torch.zeros_like(x)
    mean = vals.mean()
    std = vals.std() if vals.numel() > 1 else vals.new_zeros(())
    return (x - mean) / (std + eps)


# --------------------------------------------------------------------------- #
# Registry
# --------------------------------------------------------------------------- #
def register_estimator(name: str, *, override: bool = False) -> Callable[[Estimator], Estimator]:
    """Decorator registering ``fn(groups: RewardGroups, *, **options) -> Tensor [N]``.

    Options of an estimator are its keyword-only parameters; ``compute_advantages``
    rejects any other option. Raises ValueError when ``name`` is taken unless
    ``override`` is true.
    """

    def decorator(fn: Estimator) -> Estimator:
        if name in _ESTIMATORS and not override:
            raise ValueError(f"estimator {name!r} is already registered")
        _ESTIMATORS[name] = fn
        return fn

    return decorator


def available_estimators() -> list[str]:
    """Names of the registered estimators, sorted."""
    return sorted(_ESTIMATORS)


def get_estimator(name: str) -> Estimator:
    """The estimator function registered under ``name``; ValueError listing the known ones."""
    try:
        return _ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown estimator {name!r}; available: {', '.join(available_estimators())}"
        ) from None


def _option_names(fn: Estimator) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


def _check_eps(eps: float, name: str = "eps") -> float:
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {eps!r}")
    return float(eps)


# --------------------------------------------------------------------------- #
# Estimators: small pure tensor functions of RewardGroups
# --------------------------------------------------------------------------- #
@register_estimator("grpo")
def grpo_advantages(
    groups: RewardGroups, *, scale: str = "group", eps: float = DEFAULT_EPS
) -> torch.Tensor:
    """GRPO: ``A_i = (t_i - mean_q t) / (std_q t + eps)`` with ``t_i = sum_k w_k r_ik``.

    Shapes: ``groups`` of N responses, G groups -> ``[N]`` float64.

    Options:
        scale: ``group`` (std of t within the group), ``batch`` (std of
            ``t - mean_q t`` over the batch) or ``none`` (no division, Dr. GRPO).
        eps: added to the std.

    ``t_i - mean_q t = N_i = sum_k c_ik`` and ``std_q t = sqrt(S_cov)`` where
    ``S_cov`` sums all entries of the group covariance matrix.
    """
    eps = _check_eps(eps)
    numerator = groups.weighted.sum(dim=1)  # [N]
    if scale == "group":
        s_cov = groups.cov.sum(dim=(1, 2)).clamp(min=0.0)  # [G]
        return numerator / (s_cov.sqrt() + eps)[groups.index]
    if scale == "batch":
        vals = numerator[groups.valid]
        std = vals.std() if vals.numel() > 1 else vals.new_zeros(())
        return numerator / (std + eps)
    if scale == "none":
        return numerator
    raise ValueError(f"grpo option scale must be 'group', 'batch' or 'none', got {scale!r}")


@register_estimator("dr_grpo")
def dr_grpo_advantages(groups: RewardGroups) -> torch.Tensor:
    """Dr. GRPO: ``A_i = t_i - mean_q t`` (GRPO with ``scale='none'``). ``[N]`` float64."""
    return grpo_advantages(groups, scale="none")


@register_estimator("corrgrpo")
def corrgrpo_advantages(
    groups: RewardGroups, *, eps: float = DEFAULT_EPS, min_denominator: float | None = None
) -> torch.Tensor:
    """CorrGRPO: ``A_i = N_i / sqrt(S_corr + eps)``.

    Shapes: ``groups`` of N responses, G groups, K components -> ``[N]`` float64.

    ``N_i = sum_k c_ik`` is GRPO's numerator (weights included); ``S_corr =
    max(0, sum_kl C_kl)`` sums the group's Pearson correlation matrix over its
    active components (inactive rows/columns are 0, diagonal included).

    Options:
        eps: inside the square root (paper: 1e-6).
        min_denominator: optional floor on ``sqrt(S_corr + eps)`` that bounds the
            blow-up of near-cancelling groups; None (default) is paper-exact.
    """
    eps = _check_eps(eps)
    s_corr = _correlation_sum(groups.cov, groups.active)  # [G]
    denominator = _corrgrpo_denominator(s_corr, eps, min_denominator)
    return groups.weighted.sum(dim=1) / denominator[groups.index]


def _corrgrpo_denominator(
    s_corr: torch.Tensor, eps: float, min_denominator: float | None
) -> torch.Tensor:
    """``[G]`` ``max(sqrt(S_corr + eps), min_denominator)`` from ``s_corr`` ``[G]``."""
    denominator = (s_corr + eps).sqrt()
    if min_denominator is not None:
        if not (
            isinstance(min_denominator, (int, float))
            and math.isfinite(min_denominator)
            and min_denominator > 0
        ):
            raise ValueError(f"min_denominator must be None or a number > 0, got {min_denominator!r}")
        denominator = denominator.clamp(min=float(min_denominator))
    return denominator


def _weighted_z(groups: RewardGroups, eps: float) -> torch.Tensor:
    """``[N, K]`` ``w_k z_ik``: per-component group z-scores (0 for constant components)."""
    std = groups.std[groups.index]  # [N, K]
    z = groups.centred / (std + eps)
    return torch.where(groups.active[groups.index], z, 0.0) * groups.weights


@register_estimator("mo_grpo")
def mo_grpo_advantages(groups: RewardGroups, *, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """MO-GRPO: ``A_i = sum_k w_k z_ik``, ``z_ik = (r_ik - mean_q r_k) / (std_q r_k + eps)``.

    Shapes: ``groups`` of N responses -> ``[N]`` float64. A constant component has z = 0.
    """
    return _weighted_z(groups, _check_eps(eps)).sum(dim=1)


@register_estimator("gdpo")
def gdpo_advantages(groups: RewardGroups, *, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """GDPO: MO-GRPO's ``sum_k w_k z_ik``, then standardised over the batch.

    Shapes: ``groups`` of N responses -> ``[N]`` float64. The batch step
    ``(A - mean) / (std + eps)`` uses the responses with at least one
    applicable component.
    """
    eps = _check_eps(eps)
    return _masked_standardise(_weighted_z(groups, eps).sum(dim=1), groups.valid, eps)


@register_estimator("gdpo_corr")
def gdpo_corr_advantages(groups: RewardGroups, *, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """GDPO with correlation: ``(A_i - mean A) / sqrt(S + eps)``, ``A_i = sum_k w_k z_ik``.

    Shapes: ``groups`` of N responses, K components -> ``[N]`` float64.

    ``S = max(0, sum_kl C_kl)`` with C the batch correlation matrix ``[K, K]``
    of the weighted z columns ``w_k z_k`` (constant columns: zero rows and
    columns). Batch statistics use the responses with an applicable component.
    """
    eps = _check_eps(eps)
    zw = _weighted_z(groups, eps)  # [N, K]
    rows = zw[groups.valid]
    advantage = zw.sum(dim=1)
    if rows.shape[0] < 2:
        return torch.zeros_like(advantage)
    centred = rows - rows.mean(dim=0)
    cov = centred.T @ centred / (rows.shape[0] - 1)  # [K, K]
    active = _active_mask(torch.diagonal(cov), rows.abs().amax(dim=0))
    s = _correlation_sum(cov, active)
    return (advantage - advantage[groups.valid].mean()) / (s + eps).sqrt()


# --------------------------------------------------------------------------- #
# Diagnostics
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class AdvantageStats:
    """Diagnostics of a batch, the same for every estimator (method.md).

    Per group (row g is group ``group_keys[g]``): ``s_cov``, ``s_corr``,
    ``c_q``, ``k_eff``, ``zero_variance``, ``near_cancelling`` ``[G]`` and
    ``cov_share`` ``[G, K]``. Per batch: ``mean_correlation`` ``[K, K]``,
    ``zero_variance_fraction``, ``num_near_cancelling`` and ``mean_cov_share`` ``[K]``.

    - ``s_cov``: GRPO's variance sum, the sum of all covariance entries.
    - ``s_corr``: CorrGRPO's correlation sum over active components.
    - ``c_q``: CorrGRPO's multiplier over GRPO's (group scale), so that
      ``A_corrgrpo = c_q * A_grpo`` within the group; NaN for a zero-variance
      group (both give 0 there, c_q is undefined).
    - ``cov_share``: row sums of the covariance matrix divided by ``s_cov``
      (sums to 1; 0 where ``s_cov`` is 0). A share may be negative.
    - ``k_eff``: ``K_active^2 / s_corr`` (K for independent, 1 for identical
      components); NaN when no component is active or the group is near-cancelling.
    - ``zero_variance``: no component varies within the group (all advantages 0).
    - ``near_cancelling``: some component is active but ``s_corr <
      NEAR_CANCELLING_S_CORR``.
    - ``mean_correlation``: entry (k, l) averages the correlation over the
      groups where both k and l are active (0 where there are none).
    - ``mean_cov_share``: mean of ``cov_share`` over groups with ``s_cov > 0``.
    """

    group_keys: torch.Tensor
    s_cov: torch.Tensor
    s_corr: torch.Tensor
    c_q: torch.Tensor
    cov_share: torch.Tensor
    k_eff: torch.Tensor
    zero_variance: torch.Tensor
    near_cancelling: torch.Tensor
    mean_correlation: torch.Tensor
    zero_variance_fraction: float
    num_near_cancelling: int
    mean_cov_share: torch.Tensor

    def to_dict(self, per_group: bool = True) -> dict[str, Any]:
        """Plain python floats/ints/lists for logging (strict JSON: NaN -> None).

        ``per_group=False`` keeps only the batch-level entries.
        """
        out: dict[str, Any] = {
            "mean_correlation": _plain(self.mean_correlation),
            "zero_variance_fraction": float(self.zero_variance_fraction),
            "num_near_cancelling": int(self.num_near_cancelling),
            "mean_cov_share": _plain(self.mean_cov_share),
        }
        if per_group:
            out.update(
                group_keys=self.group_keys.tolist(),
                s_cov=_plain(self.s_cov),
                s_corr=_plain(self.s_corr),
                c_q=_plain(self.c_q),
                cov_share=_plain(self.cov_share),
                k_eff=_plain(self.k_eff),
                zero_variance=self.zero_variance.tolist(),
                near_cancelling=self.near_cancelling.tolist(),
            )
        return out


def _plain(t: torch.Tensor) -> Any:
    """Nested python floats with NaN replaced by None."""
    values = t.tolist()

    def clean(v: Any) -> Any:
        if isinstance(v, list):
            return [clean(x) for x in v]
        return None if isinstance(v, float) and math.isnan(v) else v

    return clean(values)


def diagnose(
    groups: RewardGroups, *, eps: float = DEFAULT_EPS, min_denominator: float | None = None
) -> AdvantageStats:
    """Compute :class:`AdvantageStats` of a batch (vectorised, float64).

    ``eps`` and ``min_denominator`` are those of GRPO/CorrGRPO used for ``c_q``.
    """
    cov, active = groups.cov, groups.active
    s_cov = cov.sum(dim=(1, 2)).clamp(min=0.0)  # [G]
    corr = _correlation(cov, active)  # [G, K, K]
    s_corr = corr.sum(dim=(1, 2)).clamp(min=0.0)  # [G]
    c_q = (s_cov.sqrt() + eps) / _corrgrpo_denominator(s_corr, eps, min_denominator)
    has_cov = s_cov > 0
    cov_share = torch.where(
        has_cov[:, None], cov.sum(dim=2) / torch.where(has_cov, s_cov, 1.0)[:, None], 0.0
    )
    k_active = active.sum(dim=1).to(cov.dtype)
    zero_variance = k_active == 0
    near_cancelling = ~zero_variance & (s_corr < NEAR_CANCELLING_S_CORR)
    defined = ~zero_variance & ~near_cancelling
    k_eff = torch.where(defined, k_active.square() / torch.where(defined, s_corr, 1.0), math.nan)
    c_q = torch.where(zero_variance, math.nan, c_q)

    both = (active.unsqueeze(2) & active.unsqueeze(1)).to(cov.dtype)
    n_both = both.sum(dim=0)
    mean_correlation = torch.where(n_both > 0, corr.sum(dim=0) / n_both.clamp(min=1.0), 0.0)
    if has_cov.any():
        mean_cov_share = cov_share[has_cov].mean(dim=0)
    else:
        mean_cov_share = cov.new_zeros(groups.num_components)
    return AdvantageStats(
        group_keys=groups.group_keys,
        s_cov=s_cov,
        s_corr=s_corr,
        c_q=c_q,
        cov_share=cov_share,
        k_eff=k_eff,
        zero_variance=zero_variance,
        near_cancelling=near_cancelling,
        mean_correlation=mean_correlation,
        zero_variance_fraction=float(zero_variance.to(cov.dtype).mean()),
        num_near_cancelling=int(near_cancelling.sum()),
        mean_cov_share=mean_cov_share,
    )


# --------------------------------------------------------------------------- #
# Entry point
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class AdvantageResult:
    """Output of :func:`compute_advantages`.

    Attributes:
        advantages: ``[N]`` float32, one per response, in the input order.
        stats: diagnostics of the batch (:class:`AdvantageStats`).
    """

    advantages: torch.Tensor
    stats: AdvantageStats


def compute_advantages(
    rewards: Any,
    group_ids: Any,
    estimator: str = "corrgrpo",
    weights: Any = None,
    **options: Any,
) -> AdvantageResult:
    """Compute per-response advantages from vector rewards.

    Args:
        rewards: ``[N, K]`` float tensor or array; NaN = component not applicable.
        group_ids: ``[N]`` integer group id per response (any order, groups need
            not be contiguous).
        estimator: a name from :func:`available_estimators` (``grpo``,
            ``dr_grpo``, ``corrgrpo``, ``gdpo``, ``mo_grpo``, ``gdpo_corr`` or a
            registered one).
        weights: ``[K]`` finite reward weights, default ones.
        **options: the estimator's options (e.g. ``scale`` for grpo, ``eps``,
            ``min_denominator`` for corrgrpo).

    Returns:
        :class:`AdvantageResult` with float32 advantages ``[N]`` on the rewards'
        device and the batch diagnostics.

    Raises:
        ValueError: bad shapes or dtypes, non-finite weights, inf rewards, an
            unknown estimator or option.
    """
    fn = get_estimator(estimator)
    allowed = _option_names(fn)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for estimator {estimator!r}; "
            f"accepted: {', '.join(allowed) if allowed else 'none'}"
        )
    groups = group_rewards(rewards, group_ids, weights)
    advantages = fn(groups, **options)
    if advantages.shape != groups.index.shape:
        raise ValueError(
            f"estimator {estimator!r} returned shape {tuple(advantages.shape)}, "
            f"expected {tuple(groups.index.shape)}"
        )
    advantages = torch.where(groups.valid, advantages, 0.0)
    diag_options: dict[str, Any] = {}
    if estimator == "corrgrpo":
        diag_options = {k: v for k, v in options.items() if k in ("eps", "min_denominator")}
    stats = diagnose(groups, **diag_options)
    return AdvantageResult(advantages=advantages.to(torch.float32), stats=stats)
