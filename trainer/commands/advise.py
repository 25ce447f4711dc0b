"""``corrgrpo advise RUN [RUN ...]``: known conditions in the runs' diagnostics, with advice.

A run is a corrgrpo run folder, a TRL output folder (its ``trainer_state.json`` or TensorBoard
events) or a verl file-logger ``.jsonl``.
"""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from corrgrpo.trainer.advice import Thresholds

    t = Thresholds()
    parser.add_argument("runs", nargs="+", help="runs: corrgrpo run folders (metrics.jsonl), TRL output folders "
                        "(trainer_state.json or TensorBoard events under runs/) or trainer_state.json files, verl "
                        "file-logger .jsonl files")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--dominant-share", type=float, default=t.dominant_share,
                        help="a component's share of GRPO's covariance sum that counts as dominant in a step")
    parser.add_argument("--dominant-steps", type=float, default=t.dominant_steps,
                        help="the share of the steps in which one component must be dominant")
    parser.add_argument("--duplicate-correlation", type=float, default=t.duplicate_correlation,
                        help="mean within-group correlation above which two components are near-duplicates")
    parser.add_argument("--falling", type=float, default=t.falling,
                        help="a reward's fall (last fifth of the steps against the first) that is reported, as a "
                        "share of its range in the run")
    parser.add_argument("--update-norm-ratio", type=float, default=t.update_norm_ratio,
                        help="ratio of mean update norms between runs that is reported")


def run(args: argparse.Namespace) -> int:
    from corrgrpo.trainer.advice import Thresholds, examine
    from corrgrpo.trainer.advice.report import render

    thresholds = Thresholds(dominant_share=args.dominant_share, dominant_steps=args.dominant_steps,
                            duplicate_correlation=args.duplicate_correlation, falling=args.falling,
                            update_norm_ratio=args.update_norm_ratio)
    try:
        report = examine(args.runs, thresholds)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    if args.json:
        print(json.dumps([f.to_dict() for f in report.findings], indent=2, default=float))
        return 0
    print(render(report))
    return 0
