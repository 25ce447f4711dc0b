"""The one reader of YAML config files: safe types only, no key set twice, bounded size.

A key repeated in one mapping is almost always a mistake (the second silently wins in plain
``yaml.safe_load``), and a config may come from anywhere: every problem with a file is one
:class:`~corrgrpo_registry.settings.ConfigError` naming the file and, where known, the line.
The env registry (an env's YAML file), the trainer (a run config) and ``corrgrpo sweep`` read
their files here.

This module imports PyYAML; the rest of ``corrgrpo_registry`` is standard library only (its
``__init__`` does not import this module).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from corrgrpo_registry.settings import ConfigError

__all__ = ["DuplicateKeyError", "MAX_YAML_BYTES", "key_lines", "load_yaml"]

#: The largest config file read (a config is a few kilobytes; a larger file is a mistake).
MAX_YAML_BYTES = 4 * 1024 * 1024


class DuplicateKeyError(ConfigError):
    """A YAML mapping sets the same key twice (the message names file, key and lines)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that rejects a key repeated in one mapping."""

    source = "<yaml>"

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(
                    f"{self.source}:{line}: duplicate key {key!r} (first set on line {seen[key]})"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _read_text(path: str | Path) -> str:
    """The file's text; :class:`ConfigError` when it is too large, not UTF-8 or not a file.

    A missing file stays a ``FileNotFoundError`` (callers look for the file elsewhere first).
    """
    p = Path(path)
    try:
        with p.open("rb") as handle:
            data = handle.read(MAX_YAML_BYTES + 1)
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a YAML file") from None
    if len(data) > MAX_YAML_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_YAML_BYTES // 2**20} MiB, too large for a config file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {exc.start})") from None


def _syntax_error(path: str | Path, exc: yaml.YAMLError) -> ConfigError:
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return ConfigError(f"{where}: not valid YAML: {problem}")


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file safely: a repeated key is a :class:`DuplicateKeyError`, invalid YAML
    or an unreadable file a :class:`ConfigError`, each naming the file (and the line)."""
    loader = _UniqueKeyLoader(_read_text(path))
    loader.source = str(path)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise _syntax_error(path, exc) from None
    finally:
        loader.dispose()


def key_lines(path: str | Path) -> dict[str, int]:
    """The line of every key of a YAML file's nested mappings, by dotted key (``optim.lr``)."""
    lines: dict[str, int] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
                lines[key] = key_node.start_mark.line + 1
                walk(value_node, key)

    try:
        walk(yaml.compose(_read_text(path), Loader=yaml.SafeLoader), "")
    except yaml.YAMLError as exc:
        raise _syntax_error(path, exc) from None
    return lines
