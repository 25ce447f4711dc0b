"""Multi-reward group advantage estimators: GRPO, Dr. GRPO, CorrGRPO, GDPO, MO-GRPO, RLOO, REINFORCE++.

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
  in float64 without a Python loop over groups: ``index_add_`` over a dense
  group index. Only O(N K) work is needed: the sum of a group's covariance
  matrix is the variance of ``N_i``, the sum of its correlation matrix is the
  variance of ``sum_k c_ik / std_q(c_k)``, and a covariance row sum is
  ``Cov(c_k, N)``. Estimators are small pure tensor functions of the resulting
  :class:`RewardGroups`. The returned advantages are float32.
- Each built-in estimator is written once, as its :class:`Decomposition`: the
  part ``a_ik`` of each reward component in each advantage (every one is linear
  in the centred weighted rewards once its normalisers are fixed), and
  :func:`decomposed` makes the estimator ``A_i = sum_k a_ik`` of it. So the
  advantages and their attribution (``trainer.attribution``) cannot drift apart.
- NaN marks a component that does not apply to a response. It is left out of
  its component's group mean and its centred value is 0, so it adds nothing to
  the numerator nor to the (co)variances; the (co)variances still divide by
  ``n_q - 1`` with ``n_q`` the number of members of the group.
- Values are centred on a member of their group before the mean is taken, so a
  component that is constant in a group centres to exactly 0 whatever its offset
  (1e7 or 0), and one that varies is never lost to the round-off of a large
  offset. GRPO, Dr. GRPO, MO-GRPO, GDPO, RLOO and REINFORCE++ use their formulas
  as written: a component is active when its variance is > 0. CorrGRPO (and the
  correlation diagnostics) divide by per-component standard deviations, which
  would turn float noise into unit-variance signal, so there a component counts
  only when its variance exceeds :data:`ACTIVITY_RTOL` times the square of its
  largest CENTRED value (at least 1): judged on centred values, an offset cannot
  hide variation. A response whose components are all NaN gets advantage 0 and
  takes no part in batch-level normalisation.
- Estimators are looked up by name in a registry; :func:`register_estimator`
  plugs in a new one (a plain advantage function, or one made by
  :func:`decomposed`), and an entry point ``package.module:function`` names one
  without registering it.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
import torch

from corrgrpo_registry import Registry

__all__ = [
    "ACTIVITY_RTOL",
    "NEAR_CANCELLING_S_CORR",
    "AdvantageResult",
    "AdvantageStats",
    "Decomposition",
    "RewardGroups",
    "ESTIMATORS",
    "available_estimators",
    "compute_advantages",
    "check_estimator",
    "corrgrpo_advantages",
    "decomposed",
    "diagnose",
    "dr_grpo_advantages",
    "gdpo_advantages",
    "gdpo_corr_advantages",
    "get_estimator",
    "grpo_advantages",
    "group_rewards",
    "mo_grpo_advantages",
    "register_estimator",
    "reinforce_pp_advantages",
    "rloo_advantages",
]

#: For CorrGRPO, a component is constant (inactive) in a group when its variance is
#: <= ACTIVITY_RTOL * max(1, max_i |c_ik|)^2 with c the CENTRED weighted values: float
#: round-off of a constant component must not make it active (docs/method.md, CorrGRPO step 2).
ACTIVITY_RTOL = 1e-12

#: A group with at least one active component is "near-cancelling" when its
#: correlation sum S_corr is below this value. Then CorrGRPO's multiplier
#: 1/sqrt(S_corr + eps) exceeds ~31.6, i.e. more than 31x the multiplier of a
#: group with a single active component (S_corr = 1): the components nearly
#: cancel (e.g. two anti-correlated ones) and the advantages blow up.
NEAR_CANCELLING_S_CORR = 1e-3

DEFAULT_EPS = 1e-6

#: Group ids within a range of at most this many times N (plus 1024) are mapped
#: to rows with a counting pass; otherwise with a sort (``torch.unique``).
DENSE_ID_RANGE_FACTOR = 4

Estimator = Callable[..., torch.Tensor]

#: The estimators by name (``algorithm.estimator``); an entry point ``package.module:function``
#: of any importable module works without registering.
ESTIMATORS: Registry[Estimator] = Registry("estimator")


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
        centred: ``[N, K]`` unweighted rewards minus their group mean; 0 for NaN
            and (exactly) for components constant in the group.
        weighted: ``[N, K]`` ``centred * weights`` (``c_ik`` of docs/method.md).
        var: ``[G, K]`` unbiased variance of the weighted components.
        std: ``[G, K]`` unbiased standard deviation of the unweighted components.
        active: ``[G, K]`` bool, the component varies within the group (variance > 0).
        corr_active: ``[G, K]`` bool, the component varies beyond CorrGRPO's tolerance
            (:data:`ACTIVITY_RTOL`, judged on the centred values); the correlation
            statistics use only these.
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
    )


def _correlation_sum(cov: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """``max(0, sum_kl C_kl)`` of the correlation matrix of a covariance matrix ``[K, K]``.

    ``active`` ``[K]``: rows and columns of inactive components are 0 (diagonal
    included), so the correlation matrix stays PSD.
    """
    u = torch.where(active, torch.diagonal(cov).clamp(min=_TINY).rsqrt(), 0.0)
    return (cov * u.unsqueeze(1) * u.unsqueeze(0)).sum().clamp(min=0.0)


# --------------------------------------------------------------------------- #
# Registry
# --------------------------------------------------------------------------- #
class Decomposition(NamedTuple):
    """An estimator's advantages split by reward component: ``A_i = sum_k parts[i, k]``.

    Attributes:
        parts: ``[N, K]`` float64, ``a_ik``: component k's part of response i's advantage.
        group_weight: the effective weight of each group, the factor its centred weighted
            rewards are multiplied by: ``[G]``, or ``[G, K]`` for an estimator that weighs
            each component on its own (NaN where a component is constant); batch-level
            centring is not a factor and is left out. None when the estimator does not say.
    """

    parts: torch.Tensor
    group_weight: torch.Tensor | None = None


#: ``decompose(groups, *, **options) -> Decomposition`` (a plain ``(parts, group_weight)`` tuple works).
DecompositionFn = Callable[..., Decomposition]


def decomposed(decompose: DecompositionFn) -> Estimator:
    """The estimator ``A_i = sum_k a_ik`` of a decomposition ``decompose(groups, **options)``.

    Written once, an estimator yields both its advantages and its attribution: the returned
    function has ``decompose``'s options (keyword-only parameters) and docstring, and keeps
    ``decompose`` as its ``attribution`` attribute, where ``trainer.attribution`` finds it.
    Put it under :func:`register_estimator`::

        @register_estimator("half_dr_grpo")
        @decomposed
        def half_dr_grpo(groups, *, factor: float = 0.5) -> Decomposition:
            return Decomposition(factor * groups.weighted, torch.full_like(groups.counts, factor))
    """

    @functools.wraps(decompose)
    def advantages(groups: RewardGroups, **options: Any) -> torch.Tensor:
        parts, _ = decompose(groups, **options)
        return parts.sum(dim=1)

    advantages.attribution = decompose  # type: ignore[attr-defined]
    return advantages


def register_estimator(name: str, *, override: bool = False) -> Callable[[Estimator], Estimator]:
    """Decorator registering ``fn(groups: RewardGroups, *, **options) -> Tensor [N]``.

    Options of an estimator are its keyword-only parameters; ``compute_advantages``
    rejects any other option. Raises ValueError when ``name`` is taken unless
    ``override`` is true. A plain function gets the proportional attribution
    (``trainer.attribution``); one made by :func:`decomposed` its exact parts.
    """
    return ESTIMATORS.register(name, override=override)


def available_estimators() -> list[str]:
    """Names of the registered estimators, sorted."""
    return ESTIMATORS.names()


def get_estimator(name: str) -> Estimator:
    """The estimator registered under ``name``, or the function of an entry point ``pkg.mod:fn``.

    ValueError listing the known ones for an unknown name, or saying why an entry point
    cannot be loaded.
    """
    return ESTIMATORS.get(name)


def check_estimator(name: str, options: dict[str, Any] | None = None) -> None:
    """Raise ValueError unless ``name`` resolves and accepts ``options`` (a 2-response dry run)."""
    compute_advantages(
        torch.tensor([[0.0], [1.0]], dtype=torch.float64),
        torch.tensor([0, 0]),
        estimator=name,
        **(options or {}),
    )


def _option_names(fn: Estimator) -> tuple[str, ...]:
    """``fn``'s keyword-only parameters, cached: reading a signature costs more than some estimators."""
    try:
        return _keyword_only(fn)
    except TypeError:  # an unhashable callable object: read it every time
        return _keyword_only.__wrapped__(fn)


@functools.lru_cache(maxsize=256)
def _keyword_only(fn: Estimator) -> tuple[str, ...]:
    params = inspect.signature(fn).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def _check_eps(eps: float, name: str = "eps") -> float:
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {eps!r}")
    return float(eps)


# --------------------------------------------------------------------------- #
# Estimators: small pure tensor functions of RewardGroups, each written as its parts
# --------------------------------------------------------------------------- #
def _scaled(groups: RewardGroups, weight: torch.Tensor) -> Decomposition:
    """Parts ``c_ik * weight_q`` of a group weight ``[G]`` (or ``[G, K]``), and that weight."""
    factor = groups.per_response(weight)
    return Decomposition(groups.weighted * (factor.unsqueeze(1) if weight.dim() == 1 else factor), weight)


def _standardised(x: torch.Tensor, valid: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns ``(x_ik - mean x_k) / (std t + eps)`` and ``1 / (std t + eps)`` (``t_i = sum_k x_ik``).

    ``x`` ``[N, K]``; the means and the (unbiased) std are over the ``valid`` rows. The
    parts sum to the whitened total ``(t_i - mean t) / (std t + eps)``. The other rows must
    be finite (they are 0 or finite z-scores; with ``eps = 0`` a z-score of a constant
    component is NaN, and the estimator reports a non-finite advantage).
    """
    total = x.sum(dim=1)[valid]
    count = total.numel()
    # column means as one product with the 0/1 mask: selecting the rows costs more
    mean = valid.to(x.dtype) @ x / max(count, 1)
    scale = 1.0 / ((total.std() if count > 1 else total.new_zeros(())) + eps)
    return (x - mean) * scale, scale


def _weighted_z(groups: RewardGroups, eps: float) -> torch.Tensor:
    """``[N, K]`` ``w_k z_ik``: per-component group z-scores (0 for constant components)."""
    # centred values of constant components are 0, so their z is 0
    return groups.centred / groups.per_response(groups.std + eps) * groups.weights


def _component_weight(groups: RewardGroups, eps: float) -> torch.Tensor:
    """``[G, K]`` ``1 / (std_q r_k + eps)``, NaN for a component constant in the group."""
    return torch.where(groups.active, 1.0 / (groups.std + eps), math.nan)


@register_estimator("grpo")
@decomposed
def grpo_advantages(
    groups: RewardGroups, *, scale: str = "group", eps: float = DEFAULT_EPS
) -> Decomposition:
    """GRPO: ``A_i = (t_i - mean_q t) / (std_q t + eps)`` with ``t_i = sum_k w_k r_ik``.

    Parts ``a_ik = c_ik / (std_q t + eps)``, group weight ``1 / (std_q t + eps)`` ``[G]``.

    Options:
        scale: ``group`` (std of t within the group), ``batch`` (std of
            ``t - mean_q t`` over the batch) or ``none`` (no division, Dr. GRPO).
        eps: added to the std.

    ``t_i - mean_q t = N_i = sum_k c_ik`` and ``std_q t = sqrt(S_cov)`` where
    ``S_cov`` sums all entries of the group covariance matrix.
    """
    eps = _check_eps(eps)
    if scale == "group":
        return _scaled(groups, 1.0 / (groups.s_cov.sqrt() + eps))
    if scale == "batch":
        vals = groups.numerator[groups.valid]
        std = vals.std() if vals.numel() > 1 else vals.new_zeros(())
        return _scaled(groups, torch.full_like(groups.counts, 1.0) / (std + eps))
    if scale == "none":
        return _scaled(groups, torch.ones_like(groups.counts))
    raise ValueError(f"grpo option scale must be 'group', 'batch' or 'none', got {scale!r}")


@register_estimator("dr_grpo")
@decomposed
def dr_grpo_advantages(groups: RewardGroups) -> Decomposition:
    """Dr. GRPO: ``A_i = t_i - mean_q t`` (GRPO with ``scale='none'``).

    Parts ``a_ik = c_ik``, group weight 1 ``[G]``.
    """
    return Decomposition(groups.weighted, torch.ones_like(groups.counts))


@register_estimator("corrgrpo")
@decomposed
def corrgrpo_advantages(
    groups: RewardGroups, *, eps: float = DEFAULT_EPS, min_denominator: float | None = None
) -> Decomposition:
    """CorrGRPO: ``A_i = N_i / sqrt(S_corr + eps)``.

    Parts ``a_ik = c_ik / sqrt(S_corr + eps)`` over the components active for it (0 for
    the others), group weight ``1 / sqrt(S_corr + eps)`` ``[G]``.

    ``N_i = sum_k c_ik`` is GRPO's numerator (weights included); ``S_corr =
    max(0, sum_kl C_kl)`` sums the group's Pearson correlation matrix over its
    active components (inactive rows/columns are 0, diagonal included).

    Options:
        eps: inside the square root (paper: 1e-6).
        min_denominator: optional floor on ``sqrt(S_corr + eps)`` that bounds the
            blow-up of near-cancelling groups; None (default) is paper-exact.
    """
    eps = _check_eps(eps)
    weight = 1.0 / _corrgrpo_denominator(groups.s_corr, eps, min_denominator)  # [G]
    parts, _ = _scaled(groups, torch.where(groups.corr_active, weight.unsqueeze(1), 0.0))
    return Decomposition(parts, weight)


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


@register_estimator("mo_grpo")
@decomposed
def mo_grpo_advantages(groups: RewardGroups, *, eps: float = DEFAULT_EPS) -> Decomposition:
    """MO-GRPO: ``A_i = sum_k w_k z_ik``, ``z_ik = (r_ik - mean_q r_k) / (std_q r_k + eps)``.

    Parts ``a_ik = w_k z_ik``, group weight ``1 / (std_q r_k + eps)`` ``[G, K]``. A
    constant component has z = 0.
    """
    eps = _check_eps(eps)
    return Decomposition(_weighted_z(groups, eps), _component_weight(groups, eps))


@register_estimator("gdpo")
@decomposed
def gdpo_advantages(groups: RewardGroups, *, eps: float = DEFAULT_EPS) -> Decomposition:
    """GDPO: MO-GRPO's ``sum_k w_k z_ik``, then standardised over the batch.

    Parts ``a_ik = (w_k z_ik - mean w_k z_k) / (std A' + eps)`` with ``A'`` the MO-GRPO
    advantage, group weight ``1 / ((std_q r_k + eps) (std A' + eps))`` ``[G, K]``. The
    batch means and std use the responses with at least one applicable component.
    """
    eps = _check_eps(eps)
    parts, scale = _standardised(_weighted_z(groups, eps), groups.valid, eps)
    return Decomposition(parts, _component_weight(groups, eps) * scale)


@register_estimator("gdpo_corr")
@decomposed
def gdpo_corr_advantages(groups: RewardGroups, *, eps: float = DEFAULT_EPS) -> Decomposition:
    """GDPO with correlation: ``(A_i - mean A) / sqrt(S + eps)``, ``A_i = sum_k w_k z_ik``.

    Parts ``a_ik = (w_k z_ik - mean w_k z_k) / sqrt(S + eps)``, group weight
    ``1 / ((std_q r_k + eps) sqrt(S + eps))`` ``[G, K]``.

    ``S = max(0, sum_kl C_kl)`` with C the batch correlation matrix ``[K, K]``
    of the weighted z columns ``w_k z_k`` (constant columns: zero rows and
    columns). Batch statistics use the responses with an applicable component.
    """
    eps = _check_eps(eps)
    zw = _weighted_z(groups, eps)  # [N, K]
    rows = zw[groups.valid]
    if rows.shape[0] < 2:
        return Decomposition(torch.zeros_like(zw), None)
    mean = rows.mean(dim=0)
    centred = rows - mean
    cov = centred.T @ centred / (rows.shape[0] - 1)  # [K, K]
    scale = rows.abs().amax(dim=0).clamp(min=1.0).square()
    s = _correlation_sum(cov, torch.diagonal(cov) > ACTIVITY_RTOL * scale)
    denominator = (s + eps).sqrt()
    return Decomposition((zw - mean) / denominator, _component_weight(groups, eps) / denominator)


@register_estimator("rloo")
@decomposed
def rloo_advantages(groups: RewardGroups) -> Decomposition:
    """RLOO: ``A_i = t_i - mean_{j != i} t_j``, the leave-one-out baseline.

    With ``n_q`` members this is ``n_q / (n_q - 1) * (t_i - mean_q t)``: parts
    ``a_ik = n_q / (n_q - 1) * c_ik``, group weight ``n_q / (n_q - 1)`` ``[G]``; a group
    of one member has advantage 0.
    """
    n = groups.counts
    return _scaled(groups, torch.where(n > 1, n / (n - 1.0).clamp(min=1.0), 0.0))


@register_estimator("reinforce_pp")
@decomposed
def reinforce_pp_advantages(
    groups: RewardGroups, *, baseline: str = "group", eps: float = DEFAULT_EPS
) -> Decomposition:
    """REINFORCE++: the return (minus an optional group-mean baseline), whitened over the batch.

    Parts ``a_ik = (x_ik - mean x_k) / (std x + eps)`` with ``x_ik = c_ik`` (group
    baseline) or ``w_k r_ik`` (none), group weight ``1 / (std x + eps)`` ``[G]``.

    Options:
        baseline: ``group`` subtracts the group mean of ``t`` first (REINFORCE++-baseline);
            ``none`` whitens the raw weighted totals ``t_i = sum_k w_k r_ik``.
        eps: added to the batch standard deviation.

    Whitening is ``(x - mean) / (std + eps)`` over the responses with an applicable component.
    """
    eps = _check_eps(eps)
    if baseline == "group":
        x = groups.weighted
    elif baseline == "none":
        x = torch.where(groups.present, groups.rewards, 0.0) * groups.weights
    else:
        raise ValueError(f"reinforce_pp option baseline must be 'group' or 'none', got {baseline!r}")
    parts, scale = _standardised(x, groups.valid, eps)
    return Decomposition(parts, torch.full_like(groups.counts, 1.0) * scale)


# --------------------------------------------------------------------------- #
# Diagnostics
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class AdvantageStats:
    """Diagnostics of a batch, the same for every estimator (docs/method.md).

    Per group (row g is group ``group_keys[g]``): ``s_cov``, ``s_corr``,
    ``c_q``, ``k_eff``, ``zero_variance``, ``near_cancelling`` ``[G]`` and
    ``cov_share`` ``[G, K]``. Per batch: ``mean_correlation`` ``[K, K]``,
    ``zero_variance_fraction``, ``num_near_cancelling``, ``mean_cov_share`` ``[K]`` and
    ``active_fraction`` ``[K]``.

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
    - ``active_fraction``: the share of groups in which each component varies.
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
    active_fraction: torch.Tensor | None = None

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
        if self.active_fraction is not None:
            out["active_fraction"] = _plain(self.active_fraction)
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
    active, dtype = groups.corr_active, groups.var.dtype
    s_cov, s_corr = groups.s_cov, groups.s_corr  # [G]
    c_q = (s_cov.sqrt() + eps) / _corrgrpo_denominator(s_corr, eps, min_denominator)
    # share of S_cov: covariance row sums sum_l Cov(c_k, c_l) = Cov(c_k, N), over S_cov;
    # undefined (0) where S_cov is round-off (e.g. components that cancel)
    row_sums = groups.group_sum(groups.weighted * groups.numerator.unsqueeze(1)) / groups.dof[:, None]
    has_cov = s_cov > ACTIVITY_RTOL * groups.var.sum(dim=1).clamp(min=1.0)
    cov_share = torch.where(has_cov[:, None], row_sums / torch.where(has_cov, s_cov, 1.0)[:, None], 0.0)
    k_active = active.sum(dim=1).to(dtype)
    zero_variance = ~groups.active.any(dim=1)
    near_cancelling = (k_active > 0) & (s_corr < NEAR_CANCELLING_S_CORR)
    defined = (k_active > 0) & ~near_cancelling
    k_eff = torch.where(defined, k_active.square() / torch.where(defined, s_corr, 1.0), math.nan)
    c_q = torch.where(zero_variance, math.nan, c_q)

    # sum over groups of the correlation matrices: one [K, N] x [N, K] product of
    # the standardised components, each group's rows scaled by 1 / (n_q - 1)
    z = groups.weighted * groups.per_response(groups.inv_std)
    corr_sum = (z * groups.per_response(1.0 / groups.dof).unsqueeze(1)).T @ z
    activef = active.to(dtype)
    n_both = activef.T @ activef  # [K, K] groups where both components vary
    mean_correlation = torch.where(n_both > 0, corr_sum / n_both.clamp(min=1.0), 0.0)
    if has_cov.any():
        mean_cov_share = cov_share[has_cov].mean(dim=0)
    else:
        mean_cov_share = s_cov.new_zeros(groups.num_components)
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
        zero_variance_fraction=float(zero_variance.to(dtype).mean()),
        num_near_cancelling=int(near_cancelling.sum()),
        mean_cov_share=mean_cov_share,
        active_fraction=groups.active.to(dtype).mean(dim=0),
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
        groups: the batch's group statistics (float64), e.g. for ``trainer.attribution``.
        decomposition: the estimator's parts when it is written as one (:func:`decomposed`),
            the same ones its advantages were summed from; None otherwise.
    """

    advantages: torch.Tensor
    stats: AdvantageStats
    groups: RewardGroups | None = None
    decomposition: Decomposition | None = None


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
            ``dr_grpo``, ``corrgrpo``, ``gdpo``, ``mo_grpo``, ``gdpo_corr``,
            ``rloo``, ``reinforce_pp`` or a registered one) or an entry point
            ``package.module:function``.
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
    decomposition = None
    if getattr(fn, "__wrapped__", None) is getattr(fn, "attribution", False):  # made by decomposed()
        decomposition = Decomposition(*fn.attribution(groups, **options))  # type: ignore[attr-defined]
        advantages = decomposition.parts.sum(dim=1)  # what fn(groups) computes, kept for attribution
    else:
        advantages = fn(groups, **options)
    if advantages.shape != groups.index.shape:
        raise ValueError(
            f"estimator {estimator!r} returned shape {tuple(advantages.shape)}, "
            f"expected {tuple(groups.index.shape)}"
        )
    advantages = torch.where(groups.valid, advantages, 0.0)
    if not torch.isfinite(advantages).all():
        row = int(torch.nonzero(~torch.isfinite(advantages))[0])
        raise ValueError(
            f"estimator {estimator!r} returned a non-finite advantage "
            f"({float(advantages[row])}) for response {row}"
        )
    diag_options: dict[str, Any] = {}
    if estimator == "corrgrpo":
        diag_options = {k: v for k, v in options.items() if k in ("eps", "min_denominator")}
    stats = diagnose(groups, **diag_options)
    return AdvantageResult(advantages=advantages.to(torch.float32), stats=stats, groups=groups,
                           decomposition=decomposition)
