"""Reading a run config: the YAML file (a path, or the name of a shipped config), dotted
command-line overrides, and where each key came from, so that an error names the file and line
or the override that set the bad value.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import corrgrpo
from corrgrpo_registry.settings import ConfigError
from corrgrpo_registry.yaml_files import load_yaml_text, load_yaml_with_lines

__all__ = [
    "CONFIG_DIR",
    "apply_overrides",
    "load_settings",
    "read_config_data",
    "read_config_source",
    "resolve_config_path",
]

#: Where the shipped YAML configs live: ``corrgrpo/env_configs``, in a checkout (a link to the
#: top-level ``env_configs/``) and in an installed wheel alike.
CONFIG_DIR = (Path(corrgrpo.__file__).parent / "env_configs").resolve()


def resolve_config_path(path: str | Path) -> Path:
    """A YAML path as given, else a shipped config by name (``quickstart.yaml``, or a path under
    ``env_configs/``). Raises FileNotFoundError saying where it looked."""
    p = Path(path).expanduser()
    if p.exists():
        return p
    for candidate in (CONFIG_DIR / p, CONFIG_DIR / p.name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"config {str(path)!r} not found (also looked in {CONFIG_DIR})")


def apply_overrides(
    data: dict[str, Any], overrides: list[str], origins: dict[str, str] | None = None
) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML) to a nested mapping.

    ``origins`` (dotted key -> where its value came from) gets ``override 'a.b.c=value'``, for
    the key and for every section the override creates, so that an error about a section that
    only an override names (a typo such as ``algoritm.x=1``) blames the override, not the file.
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        key, raw = item.split("=", 1)
        try:
            value = load_yaml_text(raw, f"override {item!r}", numbered=False) if raw != "" else None
        except ConfigError as exc:
            raise ConfigError(str(exc), key.strip()) from None
        parts = key.strip().split(".")
        node = data
        for depth, part in enumerate(parts[:-1]):
            if node.get(part) is None:
                node[part] = {}
                if origins is not None:
                    origins.setdefault(".".join(parts[: depth + 1]), f"override {item!r}")
            if not isinstance(node[part], dict):
                raise ConfigError(f"override {key!r}: {part!r} is not a section")
            node = node[part]
        node[parts[-1]] = value
        if origins is not None:
            origins[key.strip()] = f"override {item!r}"
    return data


def read_config_source(
    path: str | Path | None, overrides: list[str] | None = None, default_name: str = "run"
) -> tuple[dict[str, Any], dict[str, str]]:
    """A YAML config file (or nothing when ``path`` is None) as a mapping, overrides applied,
    and where each key came from (``file:line`` or ``override 'key=value'``), by dotted key.

    ``name`` defaults to the file's stem (``default_name`` without a file).
    """
    data: dict[str, Any] = {}
    origins: dict[str, str] = {}
    name = default_name
    if path is not None:
        resolved = resolve_config_path(path)
        data, lines = load_yaml_with_lines(resolved)
        data = data or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{resolved}: expected a mapping at the top level")
        name = resolved.stem
        origins = {key: f"{resolved}:{line}" for key, line in lines.items()}
        origins[""] = str(resolved)
    data.setdefault("name", name)
    return apply_overrides(data, overrides or [], origins), origins


def read_config_data(
    path: str | Path | None, overrides: list[str] | None = None, default_name: str = "run"
) -> dict[str, Any]:
    """:func:`read_config_source` without the origins."""
    return read_config_source(path, overrides, default_name)[0]


def _origin(key: str | None, origins: dict[str, str]) -> str | None:
    """Where ``key`` (or the nearest section above it) was set; the file when nowhere."""
    while key:
        key = key.split("[", 1)[0]
        if key in origins:
            return origins[key]
        key = key.rpartition(".")[0]
    return origins.get("")


Settings = TypeVar("Settings")


def load_settings(
    path: str | Path | None,
    overrides: list[str] | None,
    from_dict: Callable[[dict[str, Any]], Settings],
    default_name: str = "run",
) -> Settings:
    """Read a config file and overrides, and build it with ``from_dict``; an error names where
    the bad value came from: ``file:line: key: ...`` or ``override 'key=value': key: ...``."""
    data, origins = read_config_source(path, overrides, default_name)
    try:
        return from_dict(data)
    except ConfigError as exc:
        where = _origin(exc.key, origins)
        if where is None:
            raise
        raise ConfigError(f"{where}: {exc}", exc.key) from None

