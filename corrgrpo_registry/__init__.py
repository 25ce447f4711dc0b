"""Named registries of plug-ins, and ``package.module:attribute`` entry points.

One :class:`Registry` per kind of plug-in (advantage estimators, policy losses, rollout
engines, env ids): ``register`` (a decorator or a call, ``override=`` to replace; the object
or an entry point string imported on first use), ``get``
(a registered name, else an entry point ``package.module:attribute`` of any importable
module; an unknown name is a ValueError listing the known ones) and ``names``. Every
entry point of the project is parsed and imported here, by :func:`load_entry_point`.

Beside it, the package holds the project's one settings system (:mod:`corrgrpo_registry.settings`:
typed dataclass settings, ``build``, ``validate``, ``describe`` and the one ``ConfigError``) and
its one YAML reader (:mod:`corrgrpo_registry.yaml_files`, which alone imports PyYAML and which
this ``__init__`` does not import).

Standard library only, and a package of its own below ``corrgrpo_envs``, ``agents`` and
``trainer``: each of them can use it, and the estimator and loss modules, which import
nothing but torch and numpy, stay that way (importing anything under ``corrgrpo_envs``
would import Gymnasium through its ``__init__``).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "import_error_hint", "is_entry_point", "load_entry_point", "parse_entry_point"]

T = TypeVar("T")

#: ``package.module:attribute`` (dotted module path, then a dotted attribute path).
_ENTRY_POINT = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def is_entry_point(text: str) -> bool:
    """Whether ``text`` has the form ``package.module:attribute`` (dotted paths allowed)."""
    return bool(_ENTRY_POINT.match(text))


def parse_entry_point(text: str) -> tuple[str, str]:
    """``(module, attribute)`` of ``package.module:attribute``; ValueError for any other form."""
    if not is_entry_point(text):
        raise ValueError(f"entry point must look like 'package.module:attribute', got {text!r}")
    module, _, attribute = text.partition(":")
    return module, attribute


def load_entry_point(text: str) -> Any:
    """Import ``package.module`` and return its ``attribute`` (a dotted path inside it).

    Raises ValueError for a malformed ``text``, the ``ImportError`` of the import (a
    ``ModuleNotFoundError`` names the missing module in ``.name``, so a caller can say what
    to install), or AttributeError naming the module and the missing attribute.
    """
    module_name, attribute = parse_entry_point(text)
    obj: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(
                f"entry point {text!r}: module {module_name!r} has no attribute {attribute!r}"
            ) from None
    return obj


def import_error_hint(module: str, exc: ImportError) -> str:
    """What to do about ``exc``, raised by ``import module``: a sentence for an error message.

    A user's own module that is not found (``module`` itself, or a package above it) is a
    folder missing from ``sys.path``, not something to install: the hint names the file or
    folder Python looked for and where it looked (``sys.path``, the working directory first).
    A module that ``module`` imports and that is missing is a dependency: ``pip install`` it.
    """
    missing = exc.name or ""
    if not missing or not (module == missing or module.startswith(missing + ".")):
        top = missing.split(".")[0]
        return (f"{module} imports {missing}, which is not installed here: pip install {top}" if top
                else f"{module} raised {type(exc).__name__}: {exc}")
    parent, _, leaf = missing.rpartition(".")
    if parent:  # the package above imported: the file of this submodule is not in it
        folders = list(getattr(sys.modules.get(parent), "__path__", []))
        where = ", ".join(folders) if folders else "its folder"
        return f"package {parent} ({where}) has no {leaf}.py or {leaf}/"
    cwd = os.getcwd()
    folders = dict.fromkeys(os.path.abspath(p or os.curdir) for p in sys.path)  # in search order
    searched = [f"{f} (the working directory)" if f == cwd else f for f in folders if os.path.isdir(f)]
    absent = "" if cwd in folders else f"; the working directory {cwd} is not on it"
    return (f"no {missing}.py or {missing}/ in any folder on sys.path ({', '.join(searched)}{absent}): "
            "run from the folder that holds it, or add that folder to PYTHONPATH")


class Registry(Generic[T]):
    """Plug-ins of one kind, by name.

    Args:
        kind: what a plug-in is, for error messages (``"estimator"``, ``"loss"``, ...).
        entry_points: whether :meth:`get` falls back to ``package.module:attribute``.
    """

    def __init__(self, kind: str, *, entry_points: bool = True):
        self.kind = kind
        self.entry_points = entry_points
        self._items: dict[str, T] = {}
        self._metadata: dict[str, dict[str, Any]] = {}

    def register(
        self, name: str, obj: T | None = None, *, override: bool = False, **metadata: Any
    ) -> Any:
        """Record ``obj`` under ``name``; without ``obj``, a decorator that does so.

        ``obj`` may be an entry point string ``"package.module:attribute"``: it is imported on
        the first :meth:`get`, so a plug-in's dependencies load only when it is used, and its
        module needs no import anywhere to register it.

        ``metadata`` (a loss's default config, an env's description, ...) is kept beside it,
        for :meth:`metadata`. Raises ValueError when ``name`` is taken unless ``override``, or
        when ``name`` has the form of an entry point (lookups would never reach it).
        """

        def record(item: T) -> T:
            if ":" in name:
                raise ValueError(f"a {self.kind} name cannot contain ':' ({name!r}): it would "
                                 "read as an entry point package.module:attribute")
            if isinstance(item, str):
                parse_entry_point(item)  # a malformed string fails here, not at first use
            if name in self._items and not override:
                raise ValueError(f"a {self.kind} named {name!r} is already registered "
                                 "(register it with override=True to replace it)")
            self._items[name] = item
            self._metadata[name] = dict(metadata)
            return item

        return record if obj is None else record(obj)

    def get(self, name: str) -> T:
        """The plug-in registered under ``name``, else the attribute an entry point names.

        ValueError naming the kind and listing the registered names for an unknown name, or
        saying why an entry point cannot be loaded (the module does not import, the attribute
        is missing or is not callable).
        """
        if name in self._items:
            item = self._items[name]
            if isinstance(item, str):  # registered lazily: import on first use, then keep it
                item = self._items[name] = self._load(item)
            return item
        if self.entry_points and ":" in name:
            return self._load(name)
        alternative = " (or an entry point package.module:attribute)" if self.entry_points else ""
        raise ValueError(
            f"unknown {self.kind} {name!r}; available: {', '.join(self.names())}{alternative}"
        )

    def _load(self, spec: str) -> T:
        try:
            obj = load_entry_point(spec)
        except ImportError as exc:
            module = parse_entry_point(spec)[0]
            raise ValueError(f"{self.kind} entry point {spec!r}: cannot import {exc.name or module!r} "
                             f"({exc}); {import_error_hint(module, exc)}") from None
        except AttributeError as exc:
            raise ValueError(f"{self.kind} {exc}") from None
        if not callable(obj):
            raise ValueError(f"{self.kind} entry point {spec!r} is not callable: {obj!r}")
        return obj

    def metadata(self, name: str) -> Mapping[str, Any]:
        """What was registered beside ``name`` (empty for an entry point or an unknown name)."""
        return self._metadata.get(name, {})

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._items)

    def unregister(self, name: str) -> None:
        """Forget ``name`` (KeyError if it is not registered)."""
        del self._items[name]
        self._metadata.pop(name, None)

    def snapshot(self) -> Callable[[], None]:
        """A function that puts the registry back as it is now (for tests that register)."""
        items, metadata = dict(self._items), dict(self._metadata)

        def restore() -> None:
            self._items, self._metadata = dict(items), dict(metadata)

        return restore

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
