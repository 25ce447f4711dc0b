"""``corrgrpo train CONFIG [section.key=value ...]``: train a policy."""

from __future__ import annotations

import argparse
from contextlib import suppress

from rich.console import Console

from corrgrpo.trainer.commands import add_config_arguments, run_training


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from corrgrpo.trainer.config import MOVED_KEYS, Config

    add_config_arguments(parser, "algorithm.estimator=grpo train.seed=3", defaults=Config(),
                         env_moved=MOVED_KEYS)


def run(args: argparse.Namespace) -> int:
    from corrgrpo.trainer.config import load_config

    built: list = []

    def build(cfg):
        from corrgrpo.trainer.trainer import Trainer

        built.append(Trainer(cfg))
        return built[-1]

    def errors() -> dict[type[Exception], int]:
        # a server that stays down stops the run cleanly (its last checkpoint is intact): exit 1
        from corrgrpo.trainer.server_engine import RolloutServerError
        from corrgrpo_envs.integrations.openenv_client import RemoteEnvError

        return {RolloutServerError: 1, RemoteEnvError: 1}

    # the config is read and checked before torch and transformers are imported: a typo costs a line
    try:
        return run_training(args, load_config, build, _banner, _summary, errors)
    finally:
        for trainer in built:  # train() closes its envs when it ends; an error ends it early
            with suppress(Exception):
                trainer.venv.close()


def _banner(cfg, trainer) -> str:
    from rich.markup import escape

    # escaped: the whole line is the user's text (ids, paths) but for the bold name
    return "[bold]corrgrpo[/bold] " + escape(
        f"{cfg.env.id} | model {cfg.model.name_or_path} | "
        f"estimator {cfg.algorithm.estimator} | loss {cfg.algorithm.loss} | "
        f"{cfg.algorithm.prompts_per_step} x {cfg.algorithm.group_size} rollouts/step | "
        f"{trainer.world} process(es) x {trainer.torch_threads} torch thread(s) "
        f"({trainer.torch_threads_source}) -> {trainer.output_dir}"
    )


def _summary(console: Console, run_dir) -> None:
    from rich.table import Table

    from corrgrpo.trainer.run_logger import read_metrics

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
