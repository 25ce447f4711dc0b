"""The settings of ``corrgrpo/ScaleDominance-v0`` (its ``env:`` keys and keyword arguments)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corrgrpo_envs.settings import EnvSettings
from corrgrpo_envs.tasks import TaskSource
from corrgrpo_envs.toy.datasets import PROMPT_TEMPLATE
from corrgrpo_envs.toy.rewards import REWARD_SETS
from corrgrpo_registry.settings import Range, num_field

__all__ = ["RegimeSettings", "ToySettings"]

#: The regimes of ``corrgrpo/Regime-v0`` (kept here as literals: settings load without the env).
REGIME_NAMES = ("scale", "redundant", "tradeoff", "sparse", "mixed")


@dataclass
class ToySettings(EnvSettings):
    """Keyword arguments of :class:`~corrgrpo_envs.toy.env.ScaleDominanceEnv`."""

    num_tasks: int = num_field(64, Range(low=1))
    """Number of built-in prompts (ids ``prompt-0000`` ...)."""
    letter: str = "a"
    """The target letter of the two 0/1 rewards (one alphabetic character)."""
    max_digits: int = num_field(32, Range(low=1))
    """Cap (and upper bound) of the digit count."""
    scales: list[float] | Literal["unit"] = num_field([1.0, 1.0, 1.0], length=3)
    """A positive factor per component, or ``unit`` for every range [0, 1] (``unit`` needs the
    capped ``default`` reward set)."""
    reward_weights: list[float] | None = num_field(None, length=3)
    """Weights of the three components (default all 1; the trainer's ``algorithm.reward_weights``
    sets them in a run)."""
    prompt_template: str = PROMPT_TEMPLATE
    """The built-in prompt, with ``{k}`` for the task number."""
    dataset: str | Path | TaskSource = "short-strings"
    """Where the prompts come from: ``short-strings``, a ``.txt`` file with one prompt per line,
    or a ``.jsonl`` of ``{"id", "prompt"}``."""
    format: str | None = None
    """The file format when it cannot be detected from the name."""
    split: Literal["train", "eval", "all"] = "all"
    """The task split (the trainer's ``train.split`` sets it in a run)."""
    rewards: Literal[REWARD_SETS] = "default"
    """``default``, or ``anchor`` (the TRL anchor's ``digits`` uncapped, ``has_a``, ``has_b``;
    ``letter`` and ``max_digits`` do not apply to it)."""


@dataclass
class RegimeSettings(EnvSettings):
    """Keyword arguments of :class:`~corrgrpo_envs.toy.regimes.RegimeEnv`."""

    regime: Literal[REGIME_NAMES] = "scale"
    """The reward set: ``scale`` (one reward with a 100x larger range), ``redundant`` (two
    near-duplicate rewards), ``tradeoff`` (two rewards that trade off), ``sparse`` (a rare
    all-or-nothing reward beside a dense one) or ``mixed`` (seven rewards of mixed scales)."""
    num_tasks: int = num_field(64, Range(low=1))
    """Number of built-in prompts (ids ``prompt-0000`` ...)."""
    reward_weights: list[float] | None = num_field(None)
    """Weights of the components (default all 1; the trainer's ``algorithm.reward_weights``
    sets them in a run)."""
    prompt_template: str = PROMPT_TEMPLATE
    """The built-in prompt, with ``{k}`` for the task number."""
    dataset: str | Path | TaskSource = "short-strings"
    """Where the prompts come from: ``short-strings``, a ``.txt`` file with one prompt per line,
    or a ``.jsonl`` of ``{"id", "prompt"}``."""
    format: str | None = None
    """The file format when it cannot be detected from the name."""
    split: Literal["train", "eval", "all"] = "all"
    """The task split (the trainer's ``train.split`` sets it in a run)."""
