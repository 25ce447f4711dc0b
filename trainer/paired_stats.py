"""Statistics for comparing estimators over seeds: intervals, paired t-tests, Holm, tiers.

Runs are paired by seed: two estimators trained with the same seed see the same task order and,
at the first step, the same samples, so their difference on a seed removes the seed's own luck.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from corrgrpo.trainer.pareto import interval

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

    Entries are taken in order of their means: the best one left opens a tier, and the next
    ones join it as long as their interval reaches the opener's (their upper end is at least
    its lower end): entries in one tier are indistinguishable from its best at this number of
    seeds. The first that falls short opens the next tier, so a tier never skips a higher
    mean for a lower, noisier one. An entry without an interval (one seed) has width 0.
    """
    order = sorted(scores, key=lambda k: -scores[k][0])
    out: dict[str, int] = {}
    tier, low = 0, math.inf
    for key in order:
        mean, half = scores[key]
        if tier == 0 or mean + (half or 0.0) < low:
            tier += 1
            low = mean - (half or 0.0)
        out[key] = tier
    return out
