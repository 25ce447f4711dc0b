"""The settings every multi-reward env takes, and what a run config's ``env:`` section adds.

Each domain declares its keyword arguments once, as a dataclass of
:mod:`corrgrpo_registry.settings` in its own ``settings.py`` (``corrgrpo_envs.toy.settings.ToySettings``,
...), derived from :class:`EnvSettings`, and registers it beside the env (``register(id,
entry_point, settings=...)``). The env's constructor reads its settings through
:meth:`EnvSettings.read` (a settings object, or keyword arguments checked against the class), so
each setting's name, default and allowed values live in the dataclass alone; ``make`` and a run
config's ``env:`` section are checked against it too.

A run config's ``env:`` section becomes one settings object (``Config.env``): the env's own
class, or :class:`EnvOptions` for an env registered without one, with the section's ``id`` and
``import`` beside the fields (:class:`EnvSection`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from corrgrpo_envs.core import MAX_ACTION_CHARS
from corrgrpo_registry.settings import Range, build, num_field, validate

__all__ = ["EnvOptions", "EnvSection", "EnvSettings", "with_section"]

_Settings = TypeVar("_Settings", bound="EnvSettings")


class EnvSection:
    """What an ``env:`` section adds to an env's settings: the id that chose them and the modules
    imported first (not keyword arguments of the env, so not dataclass fields).

    Attributes:
        id: the section's ``env.id`` (a registered id, an entry point, a YAML file, or OpenEnv
            servers comma-separated).
        imports: the modules of ``env.import``, imported before the id was resolved.
        given: the keys the section wrote (what :meth:`section` gives back).
    """

    id: str = ""
    imports: tuple[str, ...] = ()
    given: tuple[str, ...] = ()

    def bind(self, id: str, imports: tuple[str, ...] = (), given: tuple[str, ...] = ()) -> Any:
        """Set the section's id, imports and written keys; returns ``self``."""
        self.id, self.imports, self.given = id, tuple(imports), tuple(given)
        return self

    def kwargs(self) -> dict[str, Any]:
        """The env's keyword arguments: every field of the settings."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def section(self) -> dict[str, Any]:
        """The ``env:`` section as written: ``id``, ``import`` (when given) and the written keys."""
        out: dict[str, Any] = {"id": self.id}
        if self.imports:
            out["import"] = list(self.imports)
        kwargs = self.kwargs()
        out.update({k: kwargs[k] for k in self.given if k in kwargs})
        return out


@dataclass
class EnvSettings(EnvSection):
    """What every multi-reward env takes (the base of each domain's settings)."""

    max_action_chars: int = num_field(MAX_ACTION_CHARS, Range(low=1))
    """The longest action accepted; a longer one scores the lowest reward and ends the episode."""
    render_mode: Literal["ansi"] | None = None
    """Gymnasium's render mode: ``ansi`` (``render()`` returns the conversation as text) or
    null (no rendering)."""

    @classmethod
    def read(cls: type[_Settings], settings: _Settings | None = None, kwargs: Mapping[str, Any] | None = None
             ) -> _Settings:
        """The settings an env's constructor was given: ``settings`` itself, or keyword arguments
        (over ``settings`` when both are given) built and checked against this class.

        Raises :class:`~corrgrpo_registry.settings.ConfigError` naming a key that is unknown, of
        the wrong type or out of range; TypeError for a settings object of another class.
        """
        if settings is not None and not isinstance(settings, cls):
            # most likely an older call that passed its first setting by position
            raise TypeError(f"settings must be a {cls.__name__}, got {type(settings).__name__} "
                            f"{settings!r:.60}: give the settings by keyword (e.g. dataset=...) "
                            f"or as a {cls.__name__}")
        if settings is not None and not kwargs:
            return validate(settings)
        base = settings.kwargs() if settings is not None else {}
        return validate(build(cls, {**base, **dict(kwargs or {})}))


@dataclass
class EnvOptions(EnvSection):
    """The settings of an env registered without a settings class: its keyword arguments as
    written, passed on unchecked (the env's own constructor checks them)."""

    options: dict[str, Any] = field(default_factory=dict)
    """The keyword arguments."""

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments as written."""
        return dict(self.options)

    def section(self) -> dict[str, Any]:
        """``id``, ``import`` (when given) and the keyword arguments."""
        out: dict[str, Any] = {"id": self.id}
        if self.imports:
            out["import"] = list(self.imports)
        return {**out, **self.options}


@functools.cache
def with_section(settings: type) -> type:
    """``settings`` itself when it carries a section (an :class:`EnvSettings`), else a subclass that
    adds one: a user may register any dataclass as an env's settings."""
    if issubclass(settings, EnvSection):
        return settings
    return type(settings.__name__, (settings, EnvSection), {"__module__": settings.__module__,
                                                           "__doc__": settings.__doc__})

