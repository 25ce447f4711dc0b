"""The settings every multi-reward env takes: the part of each domain's settings class that
:class:`~corrgrpo_envs.core.MultiRewardEnv` itself reads.

Each domain declares its keyword arguments as a dataclass of :mod:`corrgrpo_registry.settings`
in its own ``settings.py`` (``corrgrpo_envs.toy.settings.ToySettings``, ...), derived from
:class:`EnvSettings`, and registers it beside the env (``register(id, entry_point,
settings=...)``): ``make`` and a run config's ``env:`` section are then checked against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from corrgrpo_envs.core import MAX_ACTION_CHARS
from corrgrpo_registry.settings import Range, num_field

__all__ = ["EnvSettings"]


@dataclass
class EnvSettings:
    """What every multi-reward env takes (the base of each domain's settings)."""

    max_action_chars: int = num_field(MAX_ACTION_CHARS, Range(low=1))
    """The longest action accepted; a longer one scores the lowest reward and ends the episode."""
    render_mode: Literal["ansi"] | None = None
    """Gymnasium's render mode: ``ansi`` (``render()`` returns the conversation as text) or
    null (no rendering)."""
