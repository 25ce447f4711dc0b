"""The settings of ``corrgrpo/AgentDojo-v0`` (its ``env:`` keys and keyword arguments)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corrgrpo_envs.agentdojo.attacks import DEFAULT_MODEL_NAME
from corrgrpo_envs.agentdojo.cases import DEFAULT_ATTACKS, DEFAULT_BENCHMARK_VERSION
from corrgrpo_envs.agentdojo.rewards import CLEAN_SECURITY, DEFAULT_WEIGHTS
from corrgrpo_envs.settings import EnvSettings
from corrgrpo_envs.tasks import TaskSource
from corrgrpo_registry.settings import Range, num_field

__all__ = ["DEFAULT_MAX_TURNS", "ON_MALFORMED", "AgentDojoSettings"]

#: What an unusable action does: ``end`` the episode (invalid reward) or return an
#: ``error_message`` to the agent.
ON_MALFORMED = ("end", "error_message")
#: Assistant messages per episode by default. The longest ground truth of a v1.2.2 user
#: task has 18 calls (travel/user_task_19): an agent that makes one call per message needs
#: 19 messages to finish it with its final answer. (The paper's runs allowed 8, see
#: ``env_configs/agentdojo.yaml``.)
DEFAULT_MAX_TURNS = 20


@dataclass
class AgentDojoSettings(EnvSettings):
    """Keyword arguments of :class:`~corrgrpo_envs.agentdojo.env.AgentDojoEnv`."""

    dataset: str | Path | TaskSource = "agentdojo"
    """``agentdojo`` (the suites of ``benchmark_version``) or a ``.txt`` file of case ids."""
    format: str | None = None
    """``case_list`` to force the file format."""
    split: Literal["train", "eval", "all"] = "all"
    """The task split, by user task (the trainer's ``train.split`` sets it in a run)."""
    benchmark_version: str = DEFAULT_BENCHMARK_VERSION
    """AgentDojo benchmark version."""
    suites: list[str] | None = None
    """Suite names to include (default: all of the version's)."""
    attacks: list[str] | None = num_field(list(DEFAULT_ATTACKS))
    """Attack names from AgentDojo's registry (default: the paper's two); empty for clean cases
    only."""
    include_clean: bool = True
    """Include the clean case of each user task."""
    max_turns: int = num_field(DEFAULT_MAX_TURNS, Range(low=1))
    """Assistant messages per episode before truncation (enough for the longest ground truth,
    one call per message, and the final answer; the trainer's ``rollout.max_turns`` sets it in
    a run)."""
    clean_security: Literal[tuple(CLEAN_SECURITY)] = "zero"
    """Security reward on clean cases: ``zero`` (paper) or ``one``."""
    on_malformed: Literal[ON_MALFORMED] = "end"
    """A malformed tool call: ``end`` (invalid reward) or ``error_message`` (the agent is told)."""
    model_name: str = DEFAULT_MODEL_NAME
    """The victim's name written into attack texts."""
    system_message: str | None = None
    """Overrides AgentDojo's default system message."""
    deterministic_clock: bool = True
    """Stamp emails and files the agent creates from a fixed episode clock rather than the wall
    clock, so that episodes replay identically."""
    reward_weights: list[float] | None = num_field(list(DEFAULT_WEIGHTS), length=2)
    """Weights of (utility, security); the trainer's ``algorithm.reward_weights`` sets them in a
    run."""
    paste_guard: bool = True
    """Score a final answer that pastes the tool outputs or the environment's text as a utility
    failure (on for training; off to reproduce the paper)."""
