"""Statistics for comparing estimators over seeds: intervals, paired t-tests, Holm, tiers.

Runs are paired by seed: two estimators trained with the same seed see the same task order and,
at the first step, the same samples, so their difference on a seed removes the seed's own luck.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from trainer.pareto import interval

__all__ = ["holm", "interval", "paired_difference", "tiers"]


def paired_difference(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float | None, float]:
    """Mean of ``x - y`` over seeds, the half-width of its 95 % t-interval and the paired
    t-test's two-sided p-value (1 when every difference is 0, NaN when they are all equal
    otherwise: the test is undefined without spread)."""
    from scipy import stats

    diffs = np.asarray(xs, np.float64) - np.asarray(ys, np.float64)
    mean, half = interval(diffs)
    if np.all(diffs == diffs[0]):
        return mean, half, 1.0 if diffs[0] == 0 else math.nan
    return mean, half, float(stats.ttest_rel(xs, ys).pvalue)


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values of a family of tests (NaN p-values are left out)."""
    finite = {k: p for k, p in pvalues.items() if math.isfinite(p)}
    order = sorted(finite, key=finite.get)
    m, running, out = len(order), 0.0, {}
    for i, key in enumerate(order):
        running = max(running, min(1.0, (m - i) * finite[key]))
        out[key] = running
    return out


def tiers(scores: Mapping[str, tuple[float, float | None]]) -> dict[str, int]:
    """Tier 1, 2, ... of each entry by ``(mean, 95 % half-width)``, higher is better.

    The best entry left opens a tier, and every entry left whose interval overlaps that
    entry's joins it: entries in one tier are indistinguishable from its best at this number
    of seeds. An entry without an interval (one seed) overlaps only equal means.
    """
    left = sorted(scores, key=lambda k: -scores[k][0])
    out: dict[str, int] = {}
    tier = 0
    while left:
        tier += 1
        best_mean, best_half = scores[left[0]]
        low = best_mean - (best_half or 0.0)
        members = [k for k in left if scores[k][0] + (scores[k][1] or 0.0) >= low]
        for k in members:
            out[k] = tier
        left = [k for k in left if k not in members]
    return out
