"""``corrgrpo sft CONFIG [section.key=value ...]``: supervised fine-tuning (a warm start)."""

from __future__ import annotations

import argparse

from rich.console import Console

from corrgrpo.trainer.commands import add_config_arguments, run_training


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from corrgrpo.trainer.sft_config import SFT_MOVED_KEYS, SFTConfig

    add_config_arguments(parser, "optim.lr=1e-4 train.steps=200 model.lora.r=16", defaults=SFTConfig(),
                         env_moved=SFT_MOVED_KEYS)


def run(args: argparse.Namespace) -> int:
    from corrgrpo.trainer.sft_config import load_sft_config

    def build(cfg):
        from corrgrpo.trainer.sft import SFTTrainer

        return SFTTrainer(cfg)

    def errors() -> dict[type[Exception], int]:
        # the env's references are read (and its envs closed) before training starts;
        # a server that fails or refuses them ends the command with one error line: exit 1
        from corrgrpo.trainer.sft_data import SFTDataError
        from corrgrpo_envs.integrations.openenv_client import RemoteEnvError

        return {SFTDataError: 2, FileNotFoundError: 2, RemoteEnvError: 1}

    # the config is read and checked before torch and transformers are imported
    return run_training(args, load_sft_config, build, _banner, _summary, errors)


def _banner(cfg, trainer) -> str:
    from rich.markup import escape

    source = cfg.env.id if cfg.env is not None and cfg.data.source == "env" else ", ".join(cfg.data.files)
    lora = f" | LoRA r={cfg.model.lora.r}" if cfg.model.lora.r > 0 else ""
    # escaped: the whole line is the user's text (ids, paths) but for the bold name
    return "[bold]corrgrpo sft[/bold] " + escape(
        f"{source} | model {cfg.model.name_or_path}{lora} | "
        f"{len(trainer.train_examples)} examples ({len(trainer.eval_examples)} held out) | "
        f"{cfg.train.batch_size} per step | {trainer.world} process(es) x {trainer.torch_threads} torch thread(s) "
        f"({trainer.torch_threads_source}) -> {trainer.output_dir}"
    )


def _summary(console: Console, run_dir) -> None:
    from corrgrpo.trainer.run_logger import read_metrics

    records = read_metrics(run_dir)
    steps = [r for r in records if r["step"] > 0]
    evals = [r for r in records if "eval/loss" in r]
    if steps:
        console.print(
            f"train loss: step 1 {steps[0]['loss']:.4f} -> step {steps[-1]['step']} {steps[-1]['loss']:.4f}",
            soft_wrap=True,
        )
    if len(evals) >= 2:
        console.print(
            f"held-out loss: {evals[0]['eval/loss']:.4f} -> {evals[-1]['eval/loss']:.4f}, token accuracy "
            f"{evals[0]['eval/token_accuracy']:.3f} -> {evals[-1]['eval/token_accuracy']:.3f}",
            soft_wrap=True,
        )
    console.print(
        f"model: {run_dir}/model   RL from it: corrgrpo train CONFIG model.name_or_path={run_dir}/model",
        soft_wrap=True,
    )
