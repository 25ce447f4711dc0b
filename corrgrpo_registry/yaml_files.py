"""The one reader of YAML config files: safe types only, no key set twice, bounded cost.

A key repeated in one mapping is almost always a mistake (the second silently wins in plain
``yaml.safe_load``), and a config may come from anywhere: every problem with a file is one
:class:`~corrgrpo_registry.settings.ConfigError` naming the file and, where known, the line.
The env registry (an env's YAML file), the trainer (a run config and its overrides) and
``corrgrpo sweep`` (its weights file, YAML or JSON) read their files here.

Any text costs a bounded amount of time and memory to read, or is refused with one such error:
at most :data:`MAX_YAML_BYTES` bytes (PyYAML reads about 1 MB/s of blank lines or comments, and
50,000 nodes a second), at most :data:`MAX_YAML_NODES` nodes with every alias counted at the
size of what it names and a string as one node per KiB (nested aliases, the "billion laughs",
would otherwise make a few hundred bytes a tree of billions of nodes for whatever walks the
data), no alias inside what it names (a tree without end), and at most :data:`MAX_YAML_DEPTH`
levels of nesting (the composer recurses once per level). All are checked while composing,
before any value is built.

This module imports PyYAML; the rest of ``corrgrpo_registry`` is standard library only (its
``__init__`` does not import this module).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from corrgrpo_registry.settings import ConfigError

__all__ = ["DuplicateKeyError", "MAX_YAML_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_NODES", "key_lines",
           "load_json", "load_yaml", "load_yaml_text", "load_yaml_with_lines"]

#: The largest config file read (the largest shipped config is 2 KB; a larger file is a mistake).
MAX_YAML_BYTES = 128 * 1024
#: The most nodes one YAML text may hold, every alias counted at the size of the node it names
#: (a shipped config holds at most a few hundred).
MAX_YAML_NODES = 5_000
#: The deepest nesting of sequences and mappings in one YAML text (a config nests a few levels).
MAX_YAML_DEPTH = 64


class DuplicateKeyError(ConfigError):
    """A YAML mapping sets the same key twice (the message names file, key and lines)."""


class _BoundedLoader(yaml.SafeLoader):
    """A safe YAML loader that rejects a key repeated in one mapping, and refuses a text that
    expands past :data:`MAX_YAML_NODES` nodes, nests past :data:`MAX_YAML_DEPTH` levels or
    holds an alias inside the node it names, each while composing (before any value is built)."""

    def __init__(self, text: str, source: str, numbered: bool = True):
        super().__init__(text)
        self.source = source
        self.numbered = numbered  # errors name the line (a file) or only the source (one value)
        self._nodes = 0  # composed so far, aliases at their expanded size
        self._depth = 0
        self._sizes: dict[str, int] = {}  # anchor -> expanded size of its (complete) node

    def _refuse(self, mark: Any, why: str) -> ConfigError:
        return ConfigError(f"{_where(self.source, mark, self.numbered)}: {why}")

    def _count(self, nodes: int, mark: Any) -> None:
        self._nodes += nodes
        if self._nodes > MAX_YAML_NODES:
            raise self._refuse(mark, f"more than {MAX_YAML_NODES:,} YAML nodes (an alias counts as "
                                     "everything it names, a string one per KiB); a config holds "
                                     "a few hundred")

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            size = self._sizes.get(event.anchor)
            if size is None and event.anchor in self.anchors:
                raise self._refuse(event.start_mark, f"alias *{event.anchor} is inside the node it names")
            node = super().compose_node(parent, index)  # an undefined alias raises there
            self._count(size or 1, event.start_mark)
            return node
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise self._refuse(event.start_mark, f"nested more than {MAX_YAML_DEPTH} levels deep")
        before = self._nodes
        # A long string weighs one node per KiB: aliased many times it is that many copies
        # for whatever writes the data out.
        weight = 1 + len(event.value) // 1024 if isinstance(event, yaml.ScalarEvent) else 1
        self._count(weight, event.start_mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        if event.anchor is not None:
            self._sizes[event.anchor] = self._nodes - before
        return node

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
        raise ConfigError(f"{path}: larger than {MAX_YAML_BYTES // 1024} KiB, too large for a config file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {exc.start})") from None


def _where(source: str | Path, mark: Any, numbered: bool = True) -> str:
    return f"{source}:{mark.line + 1}" if mark is not None and numbered else str(source)


def _syntax_error(source: str | Path, exc: yaml.YAMLError, numbered: bool = True) -> ConfigError:
    where = _where(source, getattr(exc, "problem_mark", None), numbered)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return ConfigError(f"{where}: not valid YAML: {problem}")


def _compose(text: str, source: str, numbered: bool = True) -> tuple[_BoundedLoader, yaml.Node | None]:
    """The text's node graph (None for an empty document), composed under the bounds."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{source}: longer than {MAX_YAML_BYTES // 1024} KiB, too large for a config")
    loader = _BoundedLoader(text, source, numbered)
    try:
        return loader, loader.get_single_node()
    except yaml.YAMLError as exc:
        loader.dispose()
        raise _syntax_error(source, exc, numbered) from None


def _construct(loader: _BoundedLoader, node: yaml.Node | None) -> Any:
    try:
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise _syntax_error(loader.source, exc, loader.numbered) from None
    finally:
        loader.dispose()


def _lines(node: yaml.Node | None) -> dict[str, int]:
    """The line of every key of the nested mappings under ``node``, by dotted key; a mapping
    reached again through an alias is not walked again (its keys keep their first path)."""
    lines: dict[str, int] = {}
    walked: set[int] = set()
    stack: list[tuple[Any, str]] = [(node, "")]
    while stack:
        current, prefix = stack.pop()
        if not isinstance(current, yaml.MappingNode) or id(current) in walked:
            continue
        walked.add(id(current))
        for key_node, value_node in reversed(current.value):
            key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            stack.append((value_node, key))
        for key_node, _ in current.value:
            key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            lines.setdefault(key, key_node.start_mark.line + 1)
    return lines


def load_yaml_text(text: str, source: str = "<yaml>", numbered: bool = True) -> Any:
    """Parse YAML text safely, under the bounds above; every problem is one :class:`ConfigError`
    naming ``source`` (and the line, unless ``numbered`` is false: a one-line value), a repeated
    key a :class:`DuplicateKeyError`."""
    return _construct(*_compose(text, source, numbered))


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file safely: a repeated key is a :class:`DuplicateKeyError`, invalid YAML,
    a text past the bounds or an unreadable file a :class:`ConfigError`, each naming the file
    (and the line)."""
    return load_yaml_text(_read_text(path), str(path))


def load_yaml_with_lines(path: str | Path) -> tuple[Any, dict[str, int]]:
    """:func:`load_yaml` and :func:`key_lines` of one file, read and composed once."""
    loader, node = _compose(_read_text(path), str(path))
    lines = _lines(node)
    return _construct(loader, node), lines


def key_lines(path: str | Path) -> dict[str, int]:
    """The line of every key of a YAML file's nested mappings, by dotted key (``optim.lr``)."""
    loader, node = _compose(_read_text(path), str(path))
    loader.dispose()
    return _lines(node)


def load_json(path: str | Path) -> Any:
    """A JSON file's value, read under the same size bound; every problem is one
    :class:`ConfigError` naming the file (JSON has no aliases: its size bounds its nodes)."""
    text = _read_text(path)
    try:
        return json.loads(text)
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
