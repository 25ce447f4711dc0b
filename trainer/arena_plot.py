"""The arena's Pareto plot: each regime's held-out rewards, one point per estimator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from corrgrpo.trainer.arena import START
from corrgrpo.trainer.paired_stats import interval
from corrgrpo.trainer.pareto import non_dominated

__all__ = ["plot_pareto"]


def plot_pareto(result: dict[str, Any], out: Path) -> Path:
    """One panel per regime: each estimator's held-out rewards in % of range, 95 % intervals.

    Two rewards: one against the other. More: the first reward against the mean of the others.
    Filled markers are non-dominated among the estimators; a black cross is the starting model.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(result["regimes"])
    cols = min(3, len(regimes))
    rows = -(-len(regimes) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols, 4.4 * rows), squeeze=False)
    for ax in axes.ravel()[len(regimes):]:
        ax.set_visible(False)
    for ax, regime in zip(axes.ravel(), regimes):
        entry = result["regimes"][regime]
        names, low, high = entry["rewards"], np.array(entry["low"]), np.array(entry["high"])
        span = np.where(high > low, high - low, 1.0)
        estimators = list(entry["estimators"])
        points = []
        for e in estimators:
            per_seed = np.array([entry["estimators"][e]["held_out"][n]["values"] for n in names]).T
            pct = 100.0 * (per_seed - low) / span
            xs = pct[:, 0]
            ys = pct[:, 1] if len(names) == 2 else pct[:, 1:].mean(axis=1)
            points.append((interval(xs.tolist()), interval(ys.tolist())))
        means = np.array([[x[0], y[0]] for x, y in points])
        keep = non_dominated(means)
        for i, (e, ((x, xh), (y, yh))) in enumerate(zip(estimators, points)):
            color = f"C{i % 10}"
            ax.errorbar(x, y, xerr=xh or 0, yerr=yh or 0, fmt="o" if i < 10 else "s", color=color,
                        capsize=2, mfc=color if keep[i] else "white", label=e)
        if entry.get("start"):  # where training began
            pct = [100.0 * (entry["start"]["held_out"][n]["mean"] - lo) / sp for n, lo, sp in zip(names, low, span)]
            ax.plot(pct[0], pct[1] if len(names) == 2 else float(np.mean(pct[1:])), "kx", markersize=8, label=START)
        ax.set_xlabel(f"{names[0]} (held-out, % of range)")
        ax.set_ylabel(f"{names[1]} (held-out, % of range)" if len(names) == 2
                      else f"mean of {', '.join(names[1:])} (% of range)", fontsize=8)
        ax.set_title(regime)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6, ncol=2, title="filled: non-dominated", title_fontsize=6)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
