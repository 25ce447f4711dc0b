"""Reading YAML config files strictly: safe types only, and no key set twice.

A key repeated in one mapping is almost always a mistake (the second silently wins
in plain ``yaml.safe_load``), so both the env registry and the trainer read their
files through :func:`load_yaml`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["DuplicateKeyError", "load_yaml"]


class DuplicateKeyError(ValueError):
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


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file safely; a key repeated in one mapping is a :class:`DuplicateKeyError`."""
    text = Path(path).read_text(encoding="utf-8")
    loader = _UniqueKeyLoader(text)
    loader.source = str(path)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
