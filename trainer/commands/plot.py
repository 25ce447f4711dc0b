"""``corrgrpo plot RUN_DIR [RUN_DIR ...]``: reward curves and correlation heatmaps as PNG."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="run folders (each with a metrics.jsonl)")
    parser.add_argument("--out", default=None, help="PNG path (default: <first run>/plot.png)")
    parser.add_argument("--labels", nargs="*", default=None, help="legend labels, one per run")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window in steps")


def run(args: argparse.Namespace) -> int:
    from corrgrpo.trainer.plotting import plot_runs

    out = Path(args.out) if args.out else Path(args.runs[0]) / "plot.png"
    plot_runs(args.runs, out, labels=args.labels, smooth=args.smooth)
    print(out)
    return 0
