"""The ``corrgrpo`` subcommands, one module each, and what they share.

Every command that reads a run config takes it the same way: ``CONFIG`` then dotted
``section.key=value`` overrides; a bad file or key, or an env id that cannot be found,
prints one ``error:`` line and exits with status 2 before any model is loaded; ``--help``
lists every setting of the command's config with its default. The training commands
(``train``, ``sft``) run through :func:`run_training`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["add_config_arguments", "load_or_report", "run_training", "settings_help"]


def add_config_arguments(
    parser: argparse.ArgumentParser, example: str, what: str = "YAML config", defaults: Any = None
) -> None:
    """``CONFIG`` (a path, or a file name in env_configs/) and its optional dotted overrides.

    ``defaults``: the command's config object with its defaults; ``--help`` then lists every
    setting with its type, default and description (:func:`settings_help`).
    """
    parser.add_argument("config", metavar="CONFIG", help=f"{what} (a path, or a file name in env_configs/)")
    optional = parser.add_argument_group("optional overrides")
    optional.add_argument(
        "overrides", nargs="*", default=[], metavar="KEY=VALUE",
        help=f"set any setting below (values are YAML), e.g. {example}",
    )
    if defaults is not None:
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.epilog = settings_help(defaults)


def settings_help(defaults: Any, width: int | None = None) -> str:
    """Every setting of a config object: ``key  type  [default]`` and its description below."""
    import json
    import shutil
    import textwrap

    from trainer.settings import describe

    width = width or min(shutil.get_terminal_size((100, 24)).columns, 100)
    lines = ["settings (every one optional; [default]):"]
    for s in describe(defaults):
        default = json.dumps(s.default, default=str)
        allowed = f"; allowed: {s.allowed}" if s.allowed else ""
        lines.append(f"  {s.key}  ({s.type}{allowed})  [{default}]")
        text = s.description.replace("``", "`")
        lines.extend(textwrap.wrap(text, width=width, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def load_or_report(load: Callable[[Any, list[str]], Any], args: argparse.Namespace, console: Any) -> Any:
    """``load(args.config, args.overrides)``, or None after printing the error for the user."""
    from rich.markup import escape

    from corrgrpo_envs.registry import check_id
    from trainer.config import ConfigError

    try:
        cfg = load(args.config, args.overrides)
        env = getattr(cfg, "env", None)
        if isinstance(env, dict) and env.get("id"):
            check_id(env["id"])  # before any model is loaded: a typo costs one line
        return cfg
    except (ConfigError, FileNotFoundError, ValueError) as exc:  # escaped: it quotes the user's values
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        return None


def run_training(
    args: argparse.Namespace,
    load: Callable[[Any, list[str]], Any],
    build: Callable[[Any], Any],
    banner: Callable[[Any, Any], str],
    summary: Callable[[Any, Any], None],
    errors: dict[type[Exception], int] | Callable[[], dict[type[Exception], int]] | None = None,
) -> int:
    """What a training command does: read the config (one ``error:`` line when it is bad), build
    the trainer, print ``banner(cfg, trainer)``, train, print ``summary(console, run_dir)``.

    ``errors``: exceptions that end the run with one ``error:`` line and the given exit status
    (e.g. bad data, a rollout server that stays down: the last checkpoint is intact), or a
    function that returns them: it is called once the config is read, so that a bad config is
    reported before the modules defining them (torch, transformers) are imported.
    """
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True)
    cfg = load_or_report(load, args, console)
    if cfg is None:
        return 2
    from trainer.run_lock import RunFolderInUse

    errors = {RunFolderInUse: 1, **((errors() if callable(errors) else errors) or {})}
    known = tuple(errors)
    try:
        trainer = build(cfg)
        if trainer.accelerator.is_main_process:
            console.print(banner(cfg, trainer), soft_wrap=True)
        out = trainer.train()
    except known as exc:  # escaped: a message may quote what a server sent
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        return next(code for kind, code in errors.items() if isinstance(exc, kind))
    if trainer.accelerator.is_main_process:
        summary(console, out)
    return 0
