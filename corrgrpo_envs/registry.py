"""Registering and making corrgrpo environments.

Environments are registered with Gymnasium itself (so ``gymnasium.make`` works
on them) and recorded here, so tools like ``corrgrpo envs list`` and the
conformance tests can find every multi-reward env, the user's included.

:func:`make` also takes an entry point, ``"package.module:attribute"``, where
the attribute is an env class or a factory returning an env: a YAML config
(``env: {id: mypkg.envs:MyEnv}``) or a ``GroupedVectorEnv`` worker can then build
an env that was never registered, as long as its module imports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym

from corrgrpo_envs.yaml_files import load_yaml
from corrgrpo_registry import Registry, is_entry_point, load_entry_point

__all__ = [
    "ENVS",
    "register",
    "make",
    "registered_ids",
    "load_env_config",
    "resolve_config_path",
    "is_entry_point",
    "load_entry_point",
    "is_openenv_id",
]

#: The multi-reward env ids (each with its ``description``), beside Gymnasium's own registry,
#: which builds them: this one lists them (``corrgrpo envs list``, the conformance tests).
ENVS: Registry[Any] = Registry("env id")

#: Where the project's YAML configs live when running from a checkout.
CONFIG_DIR = Path(__file__).resolve().parents[1] / "env_configs"


def register(id: str, entry_point: str | Any, description: str = "", **kwargs: Any) -> None:
    """Register a multi-reward env under ``id`` (e.g. ``"myorg/MyTask-v0"``).

    ``entry_point`` is a class, a factory, or a ``"module:attr"`` string (imported
    lazily on ``make``); ``kwargs`` are its default keyword arguments. Registering an id
    again replaces it, as ``gymnasium.register`` does (a re-run notebook cell re-registers).
    """
    if "/" not in id or not id.rsplit("-v", 1)[-1].isdigit():
        raise ValueError(f"env id must look like 'namespace/Name-vN', got {id!r}")
    ENVS.register(id, entry_point, override=True, description=description)
    gym.register(id=id, entry_point=entry_point, kwargs=kwargs, disable_env_checker=True)


def registered_ids() -> list[str]:
    """Ids of every multi-reward env registered through :func:`register`, sorted."""
    return ENVS.names()


def description(id: str) -> str:
    """The one-line description ``id`` was registered with ("" when none)."""
    return str(ENVS.metadata(id).get("description", ""))


def resolve_config_path(path: str | Path) -> Path:
    """A YAML path as given, else relative to the project's ``env_configs/`` folder."""
    p = Path(path).expanduser()
    if p.exists():
        return p
    for candidate in (CONFIG_DIR / p, CONFIG_DIR / p.name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"config {str(path)!r} not found (also looked in {CONFIG_DIR})")


def load_env_config(path: str | Path) -> dict[str, Any]:
    """The ``env:`` section of a YAML config (``id`` plus keyword arguments)."""
    resolved = resolve_config_path(path)
    data = load_yaml(resolved) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{resolved}: expected a mapping at the top level")
    section = data.get("env", data)
    if not isinstance(section, dict) or "id" not in section:
        raise ValueError(f"{resolved}: needs an 'env:' section with an 'id' key")
    return dict(section)


def _make_entry_point(entry_point: str, overrides: dict[str, Any]) -> gym.Env:
    """Build the env of an entry point through Gymnasium's ``make`` (same wrappers as an id)."""
    factory = load_entry_point(entry_point)
    if not callable(factory):
        raise TypeError(f"entry point {entry_point!r} is not a class or a factory: {factory!r}")
    spec = gym.envs.registration.EnvSpec(
        id=entry_point, entry_point=factory, kwargs={}, disable_env_checker=True
    )
    env = gym.make(spec, **overrides)
    if not isinstance(env.unwrapped, gym.Env):
        raise TypeError(f"entry point {entry_point!r} returned {type(env.unwrapped).__name__}, not an env")
    return env


def check_id(id_or_config: str | Path | list[str]) -> None:
    """Raise ``ValueError`` naming the problem when ``make(id_or_config)`` cannot find the env.

    Cheap (nothing is built): a registered id passes; an entry point must import and name
    an attribute; a YAML file must exist and hold an ``env.id`` that passes. Commands call
    it before loading a model, so a typo costs one error line, not a model load.
    """
    if is_openenv_id(id_or_config):
        return  # remote: the servers are asked when the env is built
    text = str(id_or_config)
    if text.endswith((".yaml", ".yml")):
        section = load_env_config(text)
        if "id" not in section:
            raise ValueError(f"{text}: the env section has no 'id'")
        check_id(section["id"] if isinstance(section["id"], list) else str(section["id"]))
        return
    if text in gym.registry:
        return
    if is_entry_point(text):
        try:
            load_entry_point(text)
        except ImportError as exc:
            raise ValueError(
                f"env entry point {text!r}: cannot import {exc.name or text.split(':')[0]!r} ({exc}); "
                "the module must be importable from the working directory or PYTHONPATH"
            ) from None
        except AttributeError as exc:
            raise ValueError(str(exc)) from None
        return
    raise ValueError(
        f"unknown env id {text!r}; registered: {', '.join(registered_ids())} "
        "(or give an entry point 'package.module:attribute')"
    )


def _make_openenv(url: str, overrides: dict[str, Any]) -> gym.Env:
    """An env served by OpenEnv server(s), through Gymnasium's ``make`` like any other id."""
    from corrgrpo_envs.integrations.openenv_client import OpenEnvEnv

    spec = gym.envs.registration.EnvSpec(
        id="openenv/Remote-v0", entry_point=OpenEnvEnv, kwargs={"url": url}, disable_env_checker=True
    )
    return gym.make(spec, **overrides)


def is_openenv_id(id_or_urls: Any) -> bool:
    """Whether ``id_or_urls`` names OpenEnv servers (``openenv://HOST:PORT``, comma-separated or a list)."""
    if isinstance(id_or_urls, (list, tuple)):
        return bool(id_or_urls) and all(str(u).startswith("openenv://") for u in id_or_urls)
    return str(id_or_urls).startswith("openenv://")


def make(id_or_config: str | Path | list[str], **overrides: Any) -> gym.Env:
    """Build an env from a registered id, an entry point or a YAML file's ``env:`` section.

    ``id_or_config`` is a registered id (``"corrgrpo/ToolCall-v0"``), an entry
    point ``"package.module:attribute"`` (an env class or a factory; the module
    is imported, the attribute called with the keyword arguments), or a YAML
    path whose ``env.id`` is either, or OpenEnv servers: ``"openenv://HOST:PORT"``
    (several separated by commas, or a list of them; extra ``openenv``). Keyword
    ``overrides`` replace the id's defaults or the file's values.
    """
    if is_openenv_id(id_or_config):
        urls = id_or_config if isinstance(id_or_config, (list, tuple)) else [str(id_or_config)]
        return _make_openenv(",".join(str(u) for u in urls), overrides)
    text = str(id_or_config)
    if text.endswith((".yaml", ".yml")):
        section = load_env_config(text)
        env_id = section.pop("id")
        if is_openenv_id(env_id):
            section.update(overrides)
            return make(env_id, **section)
        env_id = str(env_id)
        if env_id.endswith((".yaml", ".yml")):
            raise ValueError(f"{text}: env.id must be an env id or an entry point, not a config ({env_id!r})")
        section.update(overrides)
        return make(env_id, **section)
    if text in gym.registry:
        return gym.make(text, **overrides)
    if is_entry_point(text):
        return _make_entry_point(text, overrides)
    known = ", ".join(registered_ids())
    raise ValueError(
        f"unknown env id {text!r}; registered: {known} "
        "(or give an entry point 'package.module:attribute')"
    )
