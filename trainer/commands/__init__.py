"""The ``corrgrpo`` subcommands, one module each, and what they share.

Every command that reads a run config takes it the same way: ``CONFIG`` then dotted
``section.key=value`` overrides; a bad file or key prints one ``error:`` line and
exits with status 2.
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
    from trainer.config import ConfigError

    try:
        return load(args.config, args.overrides)
    except (ConfigError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return None
