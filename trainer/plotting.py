"""Figures of training runs: each reward component over steps, what moved the policy
(each component's signed share of the advantages, the groups' effective weight, the
gradient norm before clipping and the parameter update norm), and correlation heatmaps."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from corrgrpo.trainer.run_logger import read_metrics

__all__ = ["plot_runs"]


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or len(y) < window:
        return y
    kernel = np.ones(window) / window
    head = [y[: i + 1].mean() for i in range(window - 1)]
    return np.concatenate([head, np.convolve(y, kernel, mode="valid")])


def plot_runs(
    run_dirs: Sequence[str | Path],
    out: str | Path,
    labels: Sequence[str] | None = None,
    smooth: int = 1,
) -> Path:
    """Overlay the runs' curves and draw each run's mean reward-correlation matrix; writes a PNG.

    Panels: the weighted total and each component's mean reward; each component's signed
    share of the advantages; the median effective group weight; ``grad_norm`` (before
    clipping) and ``update_norm`` (``||delta theta||``). A panel no run logged is left out.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [read_metrics(d) for d in run_dirs]
    labels = list(labels) if labels else [Path(d).name for d in run_dirs]
    if len(labels) != len(runs):
        raise ValueError(f"{len(labels)} labels for {len(runs)} runs")
    # components in reward-vector order (as the run recorded them), the weighted total first
    keys: list[str] = ["reward/weighted/mean"]
    all_names: list[str] = []
    for records in runs:
        names = records[-1].get("reward_names") or [
            k[7:-5] for k in records[-1] if k.startswith("reward/") and k.endswith("/mean")
        ]
        for name in names:
            if f"reward/{name}/mean" not in keys:
                keys.append(f"reward/{name}/mean")
                all_names.append(name)
    logged = {k for records in runs for r in records for k, v in r.items() if v is not None}
    extra = [f"advantage_share/{n}" for n in all_names] + ["group_weight/median"]
    extra += [f"group_weight/{n}/median" for n in all_names] + ["grad_norm", "update_norm"]
    keys += [k for k in extra if k in logged]
    n_curves = len(keys)
    # a correlation panel for each run that logged a matrix
    heat = [(records, label) for records, label in zip(runs, labels)
            if any(r.get("reward_correlation") for r in records)]
    n_heat = len(heat)
    cols = max(3, min(4, n_curves))
    rows_curves = -(-n_curves // cols)
    rows_heat = -(-n_heat // cols)
    fig, axes = plt.subplots(
        rows_curves + rows_heat, cols, figsize=(4.2 * cols, 3.4 * (rows_curves + rows_heat)),
        squeeze=False,
    )
    for ax in axes.ravel():
        ax.set_visible(False)
    for i, key in enumerate(keys):
        ax = axes[i // cols][i % cols]
        ax.set_visible(True)
        for idx, (records, label) in enumerate(zip(runs, labels)):
            steps = np.array([r["step"] for r in records if r.get(key) is not None])
            y = np.array([r[key] for r in records if r.get(key) is not None], dtype=float)
            if len(y):  # one colour per run in every panel, also where another run logged nothing
                ax.plot(steps, _smooth(y, smooth), label=label, color=f"C{idx % 10}")
        ax.set_title(key[7:-5] if key.startswith("reward/") else key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if keys:
        axes[0][0].legend(fontsize=8)
    for j, (records, label) in enumerate(heat):
        ax = axes[rows_curves + j // cols][j % cols]
        mats = [r["reward_correlation"] for r in records if r.get("reward_correlation")]
        ax.set_visible(True)
        m = np.array([[np.nan if v is None else v for v in row] for row in mats[-1]], float)
        names = records[-1].get("reward_names") or all_names
        im = ax.imshow(m, vmin=-1, vmax=1, cmap="coolwarm")
        ax.set_xticks(range(len(m)), names[: len(m)], rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(m)), names[: len(m)], fontsize=7)
        for a in range(len(m)):
            for b in range(len(m)):
                if np.isfinite(m[a, b]):
                    ax.text(b, a, f"{m[a, b]:.2f}", ha="center", va="center", fontsize=7)
        ax.set_title(f"correlation (last step): {label}", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
