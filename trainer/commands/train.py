"""``corrgrpo train CONFIG [section.key=value ...]``: train a policy."""

from __future__ import annotations

import argparse

from rich.console import Console

from trainer.commands import add_config_arguments, load_or_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "algorithm.estimator=grpo train.seed=3")


def run(args: argparse.Namespace) -> int:
    from trainer.config import load_config

    console = Console(stderr=True)
    cfg = load_or_report(load_config, args, console)
    if cfg is None:
        return 2
    from trainer.server_engine import RolloutServerError
    from trainer.trainer import Trainer

    try:
        return _train(cfg, console, Trainer)
    except RolloutServerError as exc:
        # the run stopped cleanly (its last checkpoint is intact); the server is the user's to fix
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        return 1


def _train(cfg, console: Console, trainer_cls) -> int:
    trainer = trainer_cls(cfg)
    if trainer.accelerator.is_main_process:
        console.print(
            f"[bold]corrgrpo[/bold] {cfg.env['id']} | model {cfg.model.name_or_path} | "
            f"estimator {cfg.algorithm.estimator} | loss {cfg.algorithm.loss} | "
            f"{cfg.algorithm.prompts_per_step} x {cfg.algorithm.group_size} rollouts/step | "
            f"{trainer.world} process(es) -> {trainer.output_dir}"
        )
    out = trainer.train()
    if trainer.accelerator.is_main_process:
        _summary(console, out)
    return 0


def _summary(console: Console, run_dir) -> None:
    from rich.table import Table

    from trainer.run_logger import read_metrics

    records = read_metrics(run_dir)
    if not records:
        return
    first, last = records[0], records[-1]
    table = Table(title=f"rewards: step {first['step']} -> step {last['step']}")
    table.add_column("component")
    table.add_column("first", justify="right")
    table.add_column("last", justify="right")
    for key in last:
        if key.startswith("reward/") and key.endswith("/mean"):
            table.add_row(key[7:-5], f"{first.get(key, float('nan')):.3f}", f"{last[key]:.3f}")
    console.print(table)
    console.print(f"metrics: {run_dir}/metrics.jsonl   plot: corrgrpo plot {run_dir}")
