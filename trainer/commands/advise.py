"""``corrgrpo advise RUN [RUN ...]``: known conditions in the runs' diagnostics, with advice.

A run is a corrgrpo run folder, a TRL output folder (or its ``trainer_state.json``) or a verl
file-logger ``.jsonl``.
"""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from trainer.advice import Thresholds

    t = Thresholds()
    parser.add_argument("runs", nargs="+", help="runs: corrgrpo run folders (metrics.jsonl), TRL output folders "
                        "or trainer_state.json files, verl file-logger .jsonl files")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--dominant-share", type=float, default=t.dominant_share,
                        help="a component's share of GRPO's covariance sum that counts as dominant")
    parser.add_argument("--duplicate-correlation", type=float, default=t.duplicate_correlation,
                        help="mean within-group correlation above which two components are near-duplicates")
    parser.add_argument("--update-norm-ratio", type=float, default=t.update_norm_ratio,
                        help="ratio of mean update norms between runs that is reported")


def run(args: argparse.Namespace) -> int:
    from trainer.advice import Thresholds, advise, where_to_read

    thresholds = Thresholds(dominant_share=args.dominant_share, duplicate_correlation=args.duplicate_correlation,
                            update_norm_ratio=args.update_norm_ratio)
    try:
        findings = advise(args.runs, thresholds)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    if args.json:
        print(json.dumps([f.to_dict() for f in findings], indent=2, default=float))
        return 0
    if not findings:
        print("no known condition found in " + ", ".join(args.runs))
        return 0
    # findings of one run with the same advice (e.g. several near-duplicate pairs) share one block
    blocks: dict[tuple[str, str, str], list[str]] = {}
    for f in findings:
        blocks.setdefault((f.run, f.advice, f.link), []).append(f"[{f.condition}] {f.run}: {f.summary}")
    for (_, advice, link), lines in blocks.items():
        print("\n".join(lines))
        print(f"    try: {advice}")
        print(f"    evidence: {where_to_read(link)}")
    return 0
