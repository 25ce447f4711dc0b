"""The ``corrgrpo`` subcommands, one module each, and what they share.

Every command that reads a run config takes it the same way: ``CONFIG`` then dotted
``section.key=value`` overrides; a bad file or key, or an env id that cannot be found,
prints one ``error:`` line and exits with status 2 before any model is loaded; ``--help``
lists every setting of the command's config with its default. The training commands
(``train``, ``sft``) run through :func:`run_training`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["add_config_arguments", "env_settings_help", "load_or_report", "run_training", "settings_help"]


def add_config_arguments(
    parser: argparse.ArgumentParser,
    example: str,
    what: str = "YAML config",
    defaults: Any = None,
    env_moved: Mapping[str, str] | None = None,
) -> None:
    """``CONFIG`` (a path, or a file name in env_configs/) and its optional dotted overrides.

    ``defaults``: the command's config object with its defaults; ``--help`` then lists every
    setting with its type, default and description (:func:`settings_help`). ``env_moved``: the
    command's keys that belong elsewhere; given, ``--help`` also lists the ``env:`` keys of every
    env with a settings class but those (:func:`env_settings_help`).
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
        if env_moved is not None:
            parser.epilog += "\n\n" + env_settings_help(env_moved)


def _setting_lines(settings: list[Any], width: int, indent: str = "  ") -> list[str]:
    """``key  (type; allowed)  [default]`` and the description wrapped below, per setting."""
    import json
    import textwrap

    lines = []
    for s in settings:
        default = json.dumps(s.default, default=str)
        allowed = f"; allowed: {s.allowed}" if s.allowed else ""
        lines.append(f"{indent}{s.key}  ({s.type}{allowed})  [{default}]")
        text = s.description.replace("``", "`")
        lines.extend(textwrap.wrap(text, width=width, initial_indent=indent + "    ",
                                   subsequent_indent=indent + "    "))
    return lines


def _width(width: int | None) -> int:
    import shutil

    return width or min(shutil.get_terminal_size((100, 24)).columns, 100)


def settings_help(defaults: Any, width: int | None = None) -> str:
    """Every setting of a config object: ``key  type  [default]`` and its description below."""
    from corrgrpo_registry.settings import describe

    return "\n".join(["settings (every one optional; [default]):",
                      *_setting_lines(describe(defaults), _width(width))])


def env_settings_help(moved: Mapping[str, str], width: int | None = None) -> str:
    """The ``env:`` keys of every registered env that declares a settings class, by env id,
    without the keys that belong elsewhere (``moved``: ``env.split`` is ``train.split``)."""
    from corrgrpo_envs.registry import env_settings

    lines = ["env settings, by env.id (the keys of the env: section besides id and import; "
             "every one optional):"]
    for env_id, settings in env_settings().items():
        lines.append(f"  {env_id}:")
        lines += _setting_lines([s for s in settings if s.key not in moved], _width(width), "    ")
    return "\n".join(lines)


def load_or_report(load: Callable[[Any, list[str]], Any], args: argparse.Namespace, console: Any) -> Any:
    """``load(args.config, args.overrides)``, or None after printing the error for the user."""
    from rich.markup import escape

    from corrgrpo.trainer.config import ConfigError

    try:
        return load(args.config, args.overrides)  # env.id is resolved there, before any model loads
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
    from corrgrpo.trainer.run_lock import RunFolderInUse
    from corrgrpo.trainer.run_logger import TrackerStartError

    errors = {RunFolderInUse: 1, TrackerStartError: 1, **((errors() if callable(errors) else errors) or {})}
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
