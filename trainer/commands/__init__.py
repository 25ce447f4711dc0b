"""The ``corrgrpo`` subcommands, one module each, and what they share.

Every command that reads a run config takes it the same way: ``CONFIG`` then dotted
``section.key=value`` overrides; a bad file or key, or an env id that cannot be found,
prints one ``error:`` line and exits with status 2 before any model is loaded.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["add_config_arguments", "load_or_report"]


def add_config_arguments(parser: argparse.ArgumentParser, example: str, what: str = "YAML config") -> None:
    """``CONFIG`` (a path, or a file name in env_configs/) and its dotted overrides."""
    parser.add_argument("config", help=f"{what} (a path, or a file name in env_configs/)")
    parser.add_argument("overrides", nargs="*", help=f"dotted overrides, e.g. {example}")


def load_or_report(load: Callable[[Any, list[str]], Any], args: argparse.Namespace, console: Any) -> Any:
    """``load(args.config, args.overrides)``, or None after printing the error for the user."""
    from corrgrpo_envs.registry import check_id
    from trainer.config import ConfigError

    try:
        cfg = load(args.config, args.overrides)
        env = getattr(cfg, "env", None)
        if isinstance(env, dict) and env.get("id"):
            check_id(env["id"])  # before any model is loaded: a typo costs one line
        return cfg
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        return None
