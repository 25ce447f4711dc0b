"""``corrgrpo eval CONFIG [--checkpoint DIR]``: a domain's metrics, written as JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from corrgrpo.trainer.commands import add_config_arguments, load_or_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "env.dataset=humaneval", what="YAML config of the run (env and model sections are used)")
    parser.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the config's model)")
    parser.add_argument("--split", default="eval", choices=["train", "eval", "all"])
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N tasks only")
    parser.add_argument("--sample", action="store_true", help="sample at the config's temperature instead of greedy")
    parser.add_argument(
        "--policy", default="model", choices=["model", "reference", "random"],
        help="'reference' plays the tasks' reference answers (checks the harness)",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", default=None, help="JSON output path (default: CHECKPOINT/eval-SPLIT-POLICY.json, or runs/NAME-eval/eval-SPLIT-POLICY.json without --checkpoint)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from corrgrpo.trainer.config import load_config

    console = Console(stderr=True)
    cfg = load_or_report(load_config, args, console)
    if cfg is None:  # one line, before torch is imported (a second of CPU and 200 MB)
        return 2
    from corrgrpo.trainer.evaluate import evaluate, write_evaluation
    from corrgrpo.trainer.threads import apply_threads
    from corrgrpo_envs.integrations.openenv_client import RemoteEnvError

    if args.checkpoint and not Path(args.checkpoint).is_dir():
        console.print(f"[red]error:[/red] --checkpoint {args.checkpoint}: no such folder", soft_wrap=True)
        return 2
    # the trainer's rule: torch's default (a thread per core) collapses tens of times when
    # another process holds a core, as it does in a test suite or beside a training run
    threads, source = apply_threads(cfg.rollout.torch_threads)
    console.print(f"corrgrpo eval {escape(cfg.env.id)} | {threads} torch thread(s) ({source})", soft_wrap=True)
    try:  # evaluate() closes its envs however it ends
        result = evaluate(
            cfg, checkpoint=args.checkpoint, split=args.split, limit=args.limit,
            greedy=not args.sample, policy_kind=args.policy, batch_size=args.batch_size,
        )
    except RemoteEnvError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        return 1
    base = Path(args.checkpoint) if args.checkpoint else Path("runs") / f"{cfg.name}-eval"
    try:
        out = write_evaluation(result, args.out or base / f"eval-{args.split}-{args.policy}.json")
    except ValueError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        return 1
    table = Table(title=escape(f"{result['env']} ({result['split']}, {result['tasks']} tasks, {args.policy})"))
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in _flatten(result["metrics"]).items():
        table.add_row(escape(key), f"{value:.4f}" if isinstance(value, float) else escape(str(value)))
    Console().print(table)
    console.print(f"written to {out}")
    return 0


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out
