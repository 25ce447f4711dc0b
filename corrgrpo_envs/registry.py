"""Registering, resolving and making corrgrpo environments.

Environments are registered with Gymnasium itself (so ``gymnasium.make`` works
on them) and recorded here, so tools like ``corrgrpo envs list`` and the
conformance tests can find every multi-reward env, the user's included.

Every env id is understood in one place, :func:`resolve`: a registered id
(``corrgrpo/ToolCall-v0``), an entry point ``package.module:attribute`` (an env class
or a factory that was never registered, as long as its module imports), a YAML file
whose ``env:`` section names one of those, or OpenEnv servers ``openenv://HOST:PORT``
(several comma-separated, or a list). :func:`make`, the env checker, the trainer and the
integrations all build or inspect envs through the :class:`ResolvedEnv` it returns.

An env registered with a settings class (``register(id, entry_point, settings=...)``, a
dataclass of :mod:`corrgrpo_registry.settings`) has its keyword arguments checked like every
other setting: an unknown key, a value of the wrong type or out of range is a
:class:`~corrgrpo_registry.settings.ConfigError` naming the key. Other envs get their keyword
arguments as they are, as Gymnasium gives them.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym

from corrgrpo_envs.integrations import OPENENV_SCHEME
from corrgrpo_envs.settings import EnvOptions, EnvSection, with_section
from corrgrpo_registry import (
    Registry,
    import_error_hint,
    is_entry_point,
    load_entry_point,
    parse_entry_point,
)
from corrgrpo_registry.settings import (
    ConfigError,
    Setting,
    build,
    check_moved,
    describe,
    env_constructor_kwargs,
    validate,
)
from corrgrpo_registry.yaml_files import load_yaml

__all__ = [
    "ENVS",
    "OPENENV_SCHEME",
    "ResolvedEnv",
    "register",
    "resolve",
    "check_id",
    "make",
    "registered_ids",
    "load_env_config",
    "env_settings",
    "import_env_modules",
    "read_env_section",
    "is_entry_point",
    "load_entry_point",
]

#: The multi-reward env ids (each with its ``description`` and ``settings`` class), beside
#: Gymnasium's own registry, which builds them: this one lists them (``corrgrpo envs list``,
#: the conformance tests).
ENVS: Registry[Any] = Registry("env id")

_OPENENV_ENTRY_POINT = "corrgrpo_envs.integrations.openenv_client:OpenEnvEnv"
_OPENENV_SETTINGS = "corrgrpo_envs.integrations.openenv_settings:OpenEnvSettings"

Kind = Literal["registered", "entry_point", "yaml", "openenv"]


def register(
    id: str,
    entry_point: str | Any,
    description: str = "",
    settings: str | type | None = None,
    **kwargs: Any,
) -> None:
    """Register a multi-reward env under ``id`` (e.g. ``"myorg/MyTask-v0"``).

    ``entry_point`` is a class, a factory, or a ``"module:attr"`` string (imported
    lazily on ``make``); ``kwargs`` are its default keyword arguments. ``settings``: the
    dataclass of its keyword arguments (or a ``"module:attr"`` string naming it), whose
    fields, types and ranges every ``make`` and every run config is checked against;
    without one the keyword arguments go to the env unchecked. Registering an id again
    replaces it, as ``gymnasium.register`` does (a re-run notebook cell re-registers).
    """
    if "/" not in id or not id.rsplit("-v", 1)[-1].isdigit():
        raise ValueError(f"env id must look like 'namespace/Name-vN', got {id!r}")
    if isinstance(settings, str):
        parse_entry_point(settings)  # a malformed string fails here, not at first use
    elif settings is not None and not dataclasses.is_dataclass(settings):
        raise TypeError(f"{id}: settings must be a dataclass (or 'module:Class'), got {settings!r}")
    ENVS.register(id, entry_point, override=True, description=description, settings=settings)
    gym.register(id=id, entry_point=entry_point, kwargs=kwargs, disable_env_checker=True)


def registered_ids() -> list[str]:
    """Ids of every multi-reward env registered through :func:`register`, sorted."""
    return ENVS.names()


def env_settings(prefix: str = "env") -> dict[str, list[Setting]]:
    """The settings of every registered env that declares a settings class, by id, each key
    under ``prefix`` (what ``corrgrpo train --help`` and the configuration reference list)."""
    from corrgrpo_envs.settings import EnvSettings

    common = {f"{prefix}.{f.name}" if prefix else f.name for f in dataclasses.fields(EnvSettings)}
    out: dict[str, list[Setting]] = {}
    for env_id in [*registered_ids(), "openenv://HOST:PORT"]:
        settings = resolve(env_id).settings_class()
        if settings is not None:  # an env's own settings first, those every env takes after them
            out[env_id] = sorted(describe(settings(), prefix), key=lambda s: s.key in common)
    return out


def description(id: str) -> str:
    """The one-line description ``id`` was registered with ("" when none)."""
    return str(ENVS.metadata(id).get("description", ""))


def _config_path(path: str | Path) -> Path:
    """An explicit YAML path (the trainer's config module finds the shipped ones by name)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"config {str(path)!r} not found")
    return p


def load_env_config(path: str | Path) -> dict[str, Any]:
    """The ``env:`` section of a YAML config file (``id`` plus keyword arguments)."""
    resolved = _config_path(path)
    data = load_yaml(resolved) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{resolved}: expected a mapping at the top level")
    section = data.get("env", data)
    if not isinstance(section, dict) or "id" not in section:
        raise ConfigError(f"{resolved}: needs an 'env:' section with an 'id' key", "env.id")
    return dict(section)


def _load(what: Any) -> Any:
    """A registered object itself, or the attribute its ``module:attr`` string names."""
    return load_entry_point(what) if isinstance(what, str) else what


@dataclass(frozen=True)
class ResolvedEnv:
    """What an env id names, found without building the env.

    Attributes:
        kind: ``registered`` (an id of Gymnasium's registry), ``entry_point``
            (``package.module:attribute``), ``yaml`` (a config file's ``env:`` section) or
            ``openenv`` (OpenEnv servers).
        id: the id the env is built under: the registered id, the entry point, the servers'
            addresses (comma-separated), or, for a YAML file, the id its section names.
        entry_point: the env class or factory, or the ``module:attr`` string naming it (see
            :meth:`factory`).
        kwargs: default keyword arguments: the registered defaults, the OpenEnv ``url``, or
            the YAML section's values.
        settings: the settings dataclass of the keyword arguments, or its ``module:attr``
            string (see :meth:`settings_class`); None when the env declares none.
        section: a YAML file's ``env:`` section as written (None for other kinds).
        path: the YAML file (None for other kinds).
        urls: the OpenEnv servers' base URLs (empty for other kinds).
        target: for a YAML file, what its ``env.id`` resolves to.
    """

    kind: Kind
    id: str
    entry_point: Any = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    settings: Any = None
    section: Mapping[str, Any] | None = None
    path: Path | None = None
    urls: tuple[str, ...] = ()
    target: ResolvedEnv | None = None

    def factory(self) -> Callable[..., Any]:
        """The env class or factory (importing its module when it was registered lazily)."""
        return _load(self.entry_point)

    def settings_class(self) -> type | None:
        """The settings dataclass of the env's keyword arguments, or None without one."""
        return None if self.settings is None else _load(self.settings)

    def accepts(self, name: str) -> bool:
        """Whether the env takes the keyword argument ``name``: a field of its settings, else
        a parameter of its class or factory (False when that cannot be inspected)."""
        settings = self.settings_class()
        if settings is not None:
            return name in {f.name for f in dataclasses.fields(settings)}
        try:
            return name in inspect.signature(self.factory()).parameters
        except (ImportError, AttributeError, TypeError, ValueError):
            return False

    def build_settings(
        self, kwargs: Mapping[str, Any], prefix: str = "", moved: Mapping[str, str] | None = None
    ) -> Any:
        """The env's settings from keyword arguments, checked (keys under ``prefix``, e.g.
        ``env``; ``moved``: keys that belong elsewhere), or None for an env without settings.

        Raises :class:`~corrgrpo_registry.settings.ConfigError` naming the key.
        """
        settings = self.settings_class()
        if settings is None:
            return None
        return validate(build(settings, dict(kwargs), prefix, moved=moved), prefix)

    def make(self, **overrides: Any) -> gym.Env:
        """Build the env through Gymnasium's ``make``, ``overrides`` over the defaults."""
        if self.target is not None:
            return self.target.make(**{**self.kwargs, **overrides})
        kwargs = overrides
        try:
            settings = self.build_settings({**self.kwargs, **overrides})
        except ConfigError as exc:
            raise ConfigError(f"{self.id}: {exc}", exc.key) from None
        if settings is not None:
            kwargs = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
        if self.kind == "registered":
            return gym.make(self.id, **kwargs)
        spec = gym.envs.registration.EnvSpec(
            id="openenv/Remote-v0" if self.kind == "openenv" else self.id,
            entry_point=self.factory(),
            kwargs=dict(self.kwargs),
            disable_env_checker=True,
        )
        env = gym.make(spec, **kwargs)
        if not isinstance(env.unwrapped, gym.Env):
            raise TypeError(f"entry point {self.id!r} returned {type(env.unwrapped).__name__}, not an env")
        return env


def _unknown(text: str) -> ValueError:
    return ValueError(
        f"unknown env id {text!r}; registered: {', '.join(registered_ids())} "
        "(or give an entry point 'package.module:attribute')"
    )


def _resolve_openenv(addresses: str) -> ResolvedEnv:
    from corrgrpo_envs.integrations.openenv_client import parse_urls

    return ResolvedEnv(
        "openenv",
        addresses,
        entry_point=_OPENENV_ENTRY_POINT,
        kwargs={"url": addresses},
        settings=_OPENENV_SETTINGS,
        urls=tuple(parse_urls(addresses)),
    )


def import_env_modules(modules: Any, where: str = "") -> list[str]:
    """Import the modules of an ``env.import`` (a module name or a list of them), in order, so that
    the env ids their import registers resolve; returns the names. A value that is not a list of
    dotted module names, or a module that fails to import, is a
    :class:`~corrgrpo_registry.settings.ConfigError` naming ``env.import`` (after ``where``, e.g.
    the YAML file that names it)."""
    if modules is None:
        return []
    prefix = f"{where}: " if where else ""
    names = [modules] if isinstance(modules, str) else modules
    if not isinstance(names, list) or not all(
        isinstance(m, str) and m and all(part.isidentifier() for part in m.split(".")) for m in names
    ):
        raise ConfigError(
            f"{prefix}env.import: expected a list of module names such as [mypkg.envs], got {modules!r}",
            "env.import",
        )
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(
                f"{prefix}env.import: cannot import {name!r} ({exc}); {import_error_hint(name, exc)}",
                "env.import",
            ) from None
        except Exception as exc:  # the user's module raised while it ran
            raise ConfigError(
                f"{prefix}env.import: importing {name!r} raised {type(exc).__name__}: {exc}", "env.import"
            ) from None
    return list(names)


def _resolve_yaml(text: str) -> ResolvedEnv:
    path = _config_path(text)
    section = load_env_config(path)
    import_env_modules(section.get("import"), str(path))
    env_id = section["id"]
    if not isinstance(env_id, (str, list)):
        raise ConfigError(f"{path}: env.id must be an env id, an entry point or openenv://HOST:PORT, "
                          f"got {env_id!r}", "env.id")
    if isinstance(env_id, str) and env_id.endswith((".yaml", ".yml")):
        raise ConfigError(f"{path}: env.id must be an env id or an entry point, not a config ({env_id!r})",
                          "env.id")
    try:
        target = resolve(env_id)
    except ConfigError:
        raise
    except ValueError as exc:  # an unknown id or a bad address: say which file names it
        raise ConfigError(f"{path}: env.id: {exc}", "env.id") from None
    kwargs = env_constructor_kwargs(section)
    return dataclasses.replace(target, kind="yaml", kwargs=kwargs, section=section, path=path,
                               target=target)


def _resolve_entry_point(text: str) -> ResolvedEnv:
    factory = load_entry_point(text)  # ImportError / AttributeError naming the module or attribute
    if not callable(factory):
        raise TypeError(f"entry point {text!r} is not a class or a factory: {factory!r}")
    return ResolvedEnv("entry_point", text, entry_point=factory)


def resolve(id_or_config: str | Path | Sequence[str]) -> ResolvedEnv:
    """What ``id_or_config`` names, without building it (the one place env ids are read).

    ``id_or_config`` is a registered id, an entry point ``package.module:attribute`` (its
    module is imported), a YAML file (its path) whose ``env.id`` is one of the others, or OpenEnv servers ``openenv://HOST:PORT`` (comma-separated, or a list).

    Raises:
        ValueError: an unknown id (listing the registered ones), a malformed address, or a
            list that is not of OpenEnv addresses; a bad YAML file is a ``ConfigError``.
        FileNotFoundError: a YAML file that does not exist.
        ImportError / AttributeError / TypeError: an entry point whose module does not import,
            whose attribute is missing, or is not a class or a factory.
    """
    if isinstance(id_or_config, (list, tuple)):
        items = [str(u) for u in id_or_config]
        if not items or not all(u.startswith(OPENENV_SCHEME) for u in items):
            raise ValueError(f"a list must hold {OPENENV_SCHEME}HOST:PORT addresses (OpenEnv servers), "
                             f"got {list(id_or_config)!r}")
        return _resolve_openenv(",".join(items))
    text = str(id_or_config)
    if text.startswith(OPENENV_SCHEME):
        return _resolve_openenv(text)
    if text.endswith((".yaml", ".yml")):
        return _resolve_yaml(text)
    if text in gym.registry:
        spec = gym.spec(text)
        return ResolvedEnv("registered", text, entry_point=spec.entry_point, kwargs=dict(spec.kwargs),
                           settings=ENVS.metadata(text).get("settings"))
    if is_entry_point(text):
        return _resolve_entry_point(text)
    raise _unknown(text)


def check_id(id_or_config: str | Path | list[str]) -> None:
    """Raise ``ValueError`` naming the problem when ``make(id_or_config)`` cannot find the env.

    Cheap (nothing is built): :func:`resolve`, its errors as one ``ValueError`` line. Commands
    call it before loading a model, so a typo costs one error line, not a model load.
    """
    text = str(id_or_config)
    try:
        resolve(id_or_config)
    except ImportError as exc:
        module = text.split(":")[0]
        raise ValueError(
            f"env entry point {text!r}: cannot import {exc.name or module!r} ({exc}); "
            f"{import_error_hint(module, exc)}"
        ) from None
    except (AttributeError, TypeError) as exc:
        raise ValueError(str(exc)) from None


def make(id_or_config: str | Path | list[str] | EnvSection, **overrides: Any) -> gym.Env:
    """Build an env from a registered id, an entry point, a YAML file or OpenEnv servers.

    ``id_or_config`` is anything :func:`resolve` reads: a registered id
    (``"corrgrpo/ToolCall-v0"``), an entry point ``"package.module:attribute"`` (an env
    class or a factory, called with the keyword arguments), a YAML file's path whose ``env.id``
    is either, or OpenEnv servers ``"openenv://HOST:PORT"`` (several separated by commas,
    or a list of them; extra ``openenv``), or a run config's env settings (``Config.env``, see
    :func:`read_env_section`: its id, with its keyword arguments). Keyword ``overrides`` replace
    the id's defaults, the file's or the settings' values (e.g. ``split="eval"``); for an env
    with a settings class they are checked against it.
    """
    if isinstance(id_or_config, EnvSection):
        return resolve(id_or_config.id).make(**{**id_or_config.kwargs(), **overrides})
    return resolve(id_or_config).make(**overrides)


def _resolve_section_id(env_id: Any) -> ResolvedEnv:
    """:func:`resolve` of an ``env.id``, its errors as one ``env.id`` ConfigError (an unknown id,
    a module that does not import, a bad address)."""
    try:
        return resolve(env_id)
    except ConfigError:
        raise
    except ImportError as exc:
        module = str(env_id).split(":")[0]
        raise ConfigError(
            f"env.id: entry point {env_id!r}: cannot import {exc.name or module!r} ({exc}); "
            f"{import_error_hint(module, exc)}",
            "env.id",
        ) from None
    except (ValueError, AttributeError, TypeError, FileNotFoundError) as exc:
        raise ConfigError(f"env.id: {exc}", "env.id") from None


def read_env_section(
    section: Any, moved: Mapping[str, str] | None = None, needs_id: str | None = None
) -> EnvSection | None:
    """A run config's ``env:`` section as the env's settings object, checked once.

    The modules of ``import`` are imported first (:func:`import_env_modules`), then ``id`` is
    resolved (:func:`resolve`; a list of ``openenv://HOST:PORT`` ids becomes one id, the servers
    comma-separated) and the other keys are built into the env's settings class (keys under
    ``env.``; ``moved``: keys that belong to another section), or into :class:`EnvOptions`,
    unchecked, for an env registered without one. The object carries ``id`` and ``import``
    (:class:`EnvSection`). Without an ``id``: an error saying why one is needed (``needs_id``),
    or None when none is. Raises :class:`~corrgrpo_registry.settings.ConfigError` naming the key.
    """
    moved = moved or {}
    if section is None:
        section = {}
    if isinstance(section, EnvSection):  # already read (a Python caller's own object)
        return section
    if not isinstance(section, Mapping):
        raise ConfigError(f"env: expected a mapping, got {section!r}", "env")
    imports = tuple(import_env_modules(section.get("import")))
    for key in section:
        check_moved(f"env.{key}", moved)
    env_id = section.get("id")
    if env_id is None:
        if needs_id:
            raise ConfigError(f"env: needs an 'id' key ({needs_id})", "env")
        return None
    if not isinstance(env_id, (str, list)):
        raise ConfigError(
            f"env.id: expected an env id, an entry point or openenv://HOST:PORT, got {env_id!r}", "env.id"
        )
    resolved = _resolve_section_id(env_id)
    given = env_constructor_kwargs(section)
    settings_class = resolved.settings_class()
    if settings_class is None:
        out: EnvSection = EnvOptions(options=given)
    else:
        out = validate(build(with_section(settings_class), {**resolved.kwargs, **given}, "env", moved=moved),
                       "env")
    return out.bind(resolved.id if isinstance(env_id, list) else env_id, imports, tuple(given))
