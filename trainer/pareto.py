"""A Pareto front of several trained weightings: means with intervals over seeds, the
non-dominated set, the hypervolume and a figure.

Components are compared in percent of their range: ``100 (x - low) / (high - low)`` with the
env's reward bounds, so every axis runs from 0 (the lower bound) to 100 (the upper bound) and
all are maximised. The hypervolume is pymoo's ``HV`` indicator on the front's mean points,
with the reference point at 0 % in every component (every reward at its lower bound): the
share of the [0, 100]^K box that the front dominates, in percent^K (divide by 100^K for a
fraction). A point at the lower bound of some component adds nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["hypervolume", "interval", "non_dominated", "percent_of_range", "plot_front"]


def percent_of_range(values: np.ndarray, low: Sequence[float], high: Sequence[float]) -> np.ndarray:
    """``100 (values - low) / (high - low)`` per component (last axis)."""
    low_, high_ = np.asarray(low, np.float64), np.asarray(high, np.float64)
    span = np.where(high_ > low_, high_ - low_, 1.0)
    return 100.0 * (np.asarray(values, np.float64) - low_) / span


def interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float | None]:
    """Mean and the half-width of the two-sided t-interval over ``values`` (None for one value)."""
    from scipy import stats

    x = np.asarray(values, np.float64)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, None
    return mean, float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def non_dominated(points: np.ndarray) -> np.ndarray:
    """``[M]`` bool: no other point is >= in every component and > in one (all maximised)."""
    p = np.asarray(points, np.float64)
    keep = np.ones(len(p), dtype=bool)
    for i in range(len(p)):
        others = np.delete(p, i, axis=0)
        dominated = np.all(others >= p[i], axis=1) & np.any(others > p[i], axis=1)
        keep[i] = not dominated.any()
    return keep


def hypervolume(points_percent: np.ndarray) -> float:
    """pymoo's hypervolume of maximised points in percent, reference point 0 % everywhere."""
    from pymoo.indicators.hv import HV

    p = np.asarray(points_percent, np.float64)
    if p.size == 0:
        return 0.0
    return float(HV(ref_point=np.zeros(p.shape[1]))(-p))


def plot_front(front: dict[str, Any], out: str | Path) -> Path:
    """The front in percent of range: one panel for 2 components, every pair for more."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = front["names"]
    pairs = [(a, b) for a in range(len(names)) for b in range(a + 1, len(names))] or [(0, 0)]
    cols = min(3, len(pairs))
    rows = -(-len(pairs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 4.2 * rows), squeeze=False)
    for ax in axes.ravel()[len(pairs):]:
        ax.set_visible(False)
    estimators = sorted({p["estimator"] for p in front["points"]})
    colors = {e: f"C{i}" for i, e in enumerate(estimators)}
    for ax, (a, b) in zip(axes.ravel(), pairs):
        for point in front["points"]:
            pa, pb = point["percent"][names[a]], point["percent"][names[b]]
            ax.errorbar(pa["mean"], pb["mean"], xerr=pa["ci95"] or 0, yerr=pb["ci95"] or 0,
                        fmt="o", color=colors[point["estimator"]], alpha=0.8, capsize=2,
                        mfc=colors[point["estimator"]] if point["non_dominated"] else "white")
            ax.annotate(str(point["weighting"]), (pa["mean"], pb["mean"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_xlim(-5, 105)  # intervals over few seeds can exceed the range: the axes do not
        ax.set_ylim(-5, 105)
        ax.set_xlabel(f"{names[a]} (% of range)")
        ax.set_ylabel(f"{names[b]} (% of range)")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker="o", ls="", color=colors[e], label=e) for e in estimators]
    axes[0][0].legend(handles=handles, fontsize=8, title="filled: non-dominated", title_fontsize=7)
    fig.suptitle(f"{front.get('config', '')}: final greedy eval means, 95 % intervals over seeds", fontsize=9)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
