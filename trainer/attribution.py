"""How much each reward component contributes to a batch's advantages, for every estimator.

Every built-in estimator is linear in the (centred) weighted rewards once its
normalisers are fixed: ``A_i = sum_k a_ik``. ``a_ik`` is component k's part of
response i's advantage, and since the policy gradient is ``sum_i A_i grad log p_i``,
``sum_i a_ik grad log p_i`` is component k's part of the update. The parts are:

==============  ==============================================================
estimator       ``a_ik`` (``c_ik = w_k (r_ik - mean_q r_k)``)
==============  ==============================================================
grpo            ``c_ik / (std_q t + eps)`` (``scale: batch``: the batch std;
                ``none``: ``c_ik``)
dr_grpo         ``c_ik``
corrgrpo        ``c_ik / sqrt(S_corr + eps)`` over the components active for it
mo_grpo         ``c_ik / (std_q r_k + eps)`` (``w_k z_ik``)
gdpo            ``(w_k z_ik - mean w_k z_k) / (std A' + eps)``, ``A'`` the
                MO-GRPO advantage, means and std over the batch
gdpo_corr       ``(w_k z_ik - mean w_k z_k) / sqrt(S + eps)``
rloo            ``n_q / (n_q - 1) * c_ik``
reinforce_pp    ``(x_ik - mean x_k) / (std x + eps)``, ``x_ik = c_ik`` (group
                baseline) or ``w_k r_ik`` (``baseline: none``)
==============  ==============================================================

Each also has an *effective weight per group*: the factor its centred weighted
rewards are multiplied by (``[G]``, or ``[G, K]`` for the per-component
estimators; batch-level centring, as in GDPO, is not a factor and is left out).
GRPO's is ``1 / std_q t``, CorrGRPO's ``1 / sqrt(S_corr)`` (so ``c_q`` is the
ratio of the two), GDPO's ``1 / (std_q r_k * std A')`` per component.

An estimator plugged in by name or entry point can declare its parts: a function
``parts(groups, **options) -> (parts [N, K], group_weight [G] | [G, K] | None)``
registered with :func:`register_attribution`, or set as the estimator's
``attribution`` attribute. Without one, the advantage is split in proportion to
``c_ik``: ``a_ik = A_i c_ik / N_i`` (``N_i = sum_k c_ik``), exact for any
estimator of the form ``A_i = s_i N_i`` (a per-response or per-group scale of
the centred total); what that split cannot place (``A_i`` where ``N_i = 0``) is
the ``residual`` and the attribution is flagged as not exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trainer.advantages import (
    ACTIVITY_RTOL,
    DEFAULT_EPS,
    RewardGroups,
    _correlation_sum,
    _corrgrpo_denominator,
    get_estimator,
)

__all__ = ["Attribution", "attribute", "attribution_metrics", "register_attribution"]

PartsFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
_PARTS: dict[str, PartsFn] = {}

#: Quantiles of the per-group effective weight that are logged.
QUANTILES = {"p10": 10.0, "median": 50.0, "p90": 90.0}


@dataclass(frozen=True)
class Attribution:
    """Each component's part of each advantage.

    Attributes:
        parts: ``[N, K]`` float64, ``a_ik``.
        residual: ``[N]`` float64, what the parts do not hold (0 when ``exact``).
        group_weight: ``[G]`` or ``[G, K]`` effective weight of each group (NaN for a group
            without reward variance, or where a component is constant), or None when the
            estimator does not say.
        exact: the estimator declared its decomposition.
    """

    parts: torch.Tensor
    residual: torch.Tensor
    group_weight: torch.Tensor | None
    exact: bool

    @property
    def advantages(self) -> torch.Tensor:
        """``[N]`` the advantages the parts recompose: ``sum_k a_ik + residual_i``."""
        return self.parts.sum(dim=1) + self.residual

    def signed_shares(self) -> tuple[torch.Tensor, float]:
        """``[K]`` ``sum_i sign(A_i) a_ik / sum_i |A_i|`` and the residual's share.

        Together they sum to 1 (0 when every advantage is 0): component k's part of
        the size of the advantages, negative where it pushes against the result.
        """
        adv = self.advantages
        sign = torch.sign(adv)
        total = float(adv.abs().sum())
        if total == 0.0:
            return torch.zeros(self.parts.shape[1], dtype=torch.float64), 0.0
        return (sign[:, None] * self.parts).sum(dim=0) / total, float((sign * self.residual).sum()) / total

    def abs_shares(self) -> tuple[torch.Tensor, float]:
        """``[K]`` ``sum_i |a_ik|`` over all absolute parts (residual included) and the residual's share."""
        absolute = self.parts.abs().sum(dim=0)
        residual = float(self.residual.abs().sum())
        total = float(absolute.sum()) + residual
        if total == 0.0:
            return torch.zeros_like(absolute), 0.0
        return absolute / total, residual / total


def register_attribution(name: str) -> Callable[[PartsFn], PartsFn]:
    """Decorator: ``parts(groups, **options)`` is the decomposition of estimator ``name``."""

    def decorator(fn: PartsFn) -> PartsFn:
        _PARTS[name] = fn
        return fn

    return decorator


def attribute(groups: RewardGroups, estimator: str, options: dict[str, Any] | None = None,
              advantages: torch.Tensor | None = None) -> Attribution:
    """Each component's part of the advantages of ``estimator`` on ``groups``.

    ``advantages`` (the estimator's output, ``[N]``) is needed only for an estimator
    without a declared decomposition (computed here when not given).
    """
    options = dict(options or {})
    fn = _PARTS.get(estimator) or getattr(_registered(estimator), "attribution", None)
    valid = groups.valid[:, None]
    if fn is not None:
        parts, weight = fn(groups, **options)
        parts = torch.where(valid, parts.to(torch.float64), 0.0)
        if weight is not None and weight.dim() == 1:  # undefined where nothing varies (1/eps for GRPO)
            weight = torch.where(groups.active.any(dim=1), weight.to(torch.float64), float("nan"))
        return Attribution(parts, torch.zeros_like(parts[:, 0]), weight, exact=True)
    if advantages is None:
        advantages = get_estimator(estimator)(groups, **options)
    adv = torch.where(groups.valid, advantages.to(torch.float64), 0.0)
    numerator = groups.numerator
    scale = groups.weighted.abs().sum(dim=1).clamp(min=1.0)
    placed = numerator.abs() > ACTIVITY_RTOL * scale
    ratio = torch.where(placed, adv / torch.where(placed, numerator, 1.0), 0.0)
    parts = torch.where(valid, groups.weighted * ratio[:, None], 0.0)
    return Attribution(parts, adv - parts.sum(dim=1), None, exact=False)


def _registered(name: str) -> Any:
    try:
        return get_estimator(name)
    except ValueError:
        return None


def attribution_metrics(attribution: Attribution, names: Sequence[str]) -> dict[str, Any]:
    """Flat per-step metrics: signed and absolute shares, the group weights' quantiles.

    ``advantage_share/<name>`` (signed) and ``advantage_share/<name>/abs`` sum to 1 over
    the components (with ``advantage_share/residual`` when the split is not exact);
    ``group_weight/<quantile>`` (or ``group_weight/<name>/<quantile>`` per component).
    """
    out: dict[str, Any] = {"attribution/exact": 1.0 if attribution.exact else 0.0}
    signed, signed_residual = attribution.signed_shares()
    absolute, abs_residual = attribution.abs_shares()
    for k, name in enumerate(names):
        out[f"advantage_share/{name}"] = float(signed[k])
        out[f"advantage_share/{name}/abs"] = float(absolute[k])
    if not attribution.exact:
        out["advantage_share/residual"] = signed_residual
        out["advantage_share/residual/abs"] = abs_residual
    weight = attribution.group_weight
    if weight is not None:
        w = weight.detach().to(torch.float64).cpu().numpy()
        columns = [("", w.ravel())] if w.ndim == 1 else [(f"{n}/", w[:, k]) for k, n in enumerate(names)]
        for prefix, values in columns:
            finite = values[np.isfinite(values)]
            if finite.size:
                for label, q in QUANTILES.items():
                    out[f"group_weight/{prefix}{label}"] = float(np.percentile(finite, q))
    return out


# --------------------------------------------------------------------------- #
# The built-in estimators' decompositions
# --------------------------------------------------------------------------- #
def _by_group(groups: RewardGroups, weight: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` the centred weighted rewards times each group's weight (``[G]`` or ``[G, K]``)."""
    w = groups.per_response(weight)
    return groups.weighted * (w[:, None] if w.dim() == 1 else w)


def _valid_stats(x: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Column means ``[K]`` of ``x`` ``[N, K]`` and the std of its row sums over the valid rows."""
    rows = x[valid]
    if rows.shape[0] == 0:
        return x.new_zeros(x.shape[1]), x.new_zeros(())
    total = rows.sum(dim=1)
    return rows.mean(dim=0), (total.std() if total.numel() > 1 else total.new_zeros(()))


def _component_weight(groups: RewardGroups, eps: float) -> torch.Tensor:
    """``[G, K]`` ``1 / (std_q r_k + eps)``, NaN for a component constant in the group."""
    return torch.where(groups.active, 1.0 / (groups.std + eps), float("nan"))


@register_attribution("grpo")
def _grpo_parts(groups: RewardGroups, *, scale: str = "group", eps: float = DEFAULT_EPS):
    if scale == "group":
        weight = 1.0 / (groups.s_cov.sqrt() + eps)
    elif scale == "batch":
        vals = groups.numerator[groups.valid]
        std = vals.std() if vals.numel() > 1 else vals.new_zeros(())
        weight = torch.full_like(groups.counts, 1.0) / (std + eps)
    else:
        weight = torch.ones_like(groups.counts)
    return _by_group(groups, weight), weight


@register_attribution("dr_grpo")
def _dr_grpo_parts(groups: RewardGroups):
    return _grpo_parts(groups, scale="none")


@register_attribution("corrgrpo")
def _corrgrpo_parts(groups: RewardGroups, *, eps: float = DEFAULT_EPS, min_denominator: float | None = None):
    weight = 1.0 / _corrgrpo_denominator(groups.s_corr, eps, min_denominator)
    active = groups.per_response(groups.corr_active.to(groups.weighted.dtype))
    return _by_group(groups, weight) * active, weight


@register_attribution("mo_grpo")
def _mo_grpo_parts(groups: RewardGroups, *, eps: float = DEFAULT_EPS):
    return groups.weighted / groups.per_response(groups.std + eps), _component_weight(groups, eps)


@register_attribution("gdpo")
def _gdpo_parts(groups: RewardGroups, *, eps: float = DEFAULT_EPS):
    zw, _ = _mo_grpo_parts(groups, eps=eps)
    mean, std = _valid_stats(zw, groups.valid)
    return (zw - mean) / (std + eps), _component_weight(groups, eps) / (std + eps)


@register_attribution("gdpo_corr")
def _gdpo_corr_parts(groups: RewardGroups, *, eps: float = DEFAULT_EPS):
    zw, _ = _mo_grpo_parts(groups, eps=eps)
    rows = zw[groups.valid]
    if rows.shape[0] < 2:
        return torch.zeros_like(zw), None
    centred = rows - rows.mean(dim=0)
    cov = centred.T @ centred / (rows.shape[0] - 1)
    scale = rows.abs().amax(dim=0).clamp(min=1.0).square()
    s = _correlation_sum(cov, torch.diagonal(cov) > ACTIVITY_RTOL * scale)
    denominator = (s + eps).sqrt()
    return (zw - rows.mean(dim=0)) / denominator, _component_weight(groups, eps) / denominator


@register_attribution("rloo")
def _rloo_parts(groups: RewardGroups):
    n = groups.counts
    weight = torch.where(n > 1, n / (n - 1.0).clamp(min=1.0), 0.0)
    return _by_group(groups, weight), weight


@register_attribution("reinforce_pp")
def _reinforce_pp_parts(groups: RewardGroups, *, baseline: str = "group", eps: float = DEFAULT_EPS):
    if baseline == "group":
        x = groups.weighted
    else:
        x = torch.where(groups.present, groups.rewards, 0.0) * groups.weights
    mean, std = _valid_stats(x, groups.valid)
    return (x - mean) / (std + eps), torch.full_like(groups.counts, 1.0) / (std + eps)
