"""The settings of an env served by OpenEnv (``env.id: openenv://HOST:PORT``): its ``env:`` keys
and the keyword arguments of :class:`~corrgrpo_envs.integrations.openenv_client.OpenEnvEnv`.

Kept apart from the client so that checking a config imports neither httpx nor OpenEnv.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from corrgrpo_envs.settings import EnvSettings
from corrgrpo_registry.settings import ConfigError, Range, num_field, type_name

__all__ = ["OpenEnvSettings", "DEFAULT_MAX_OBSERVATION_BYTES"]

#: Default cap on one answer of a server (an observation, a task listing): far above a
#: conversation, far below what would exhaust a trainer's memory over P*G sessions.
DEFAULT_MAX_OBSERVATION_BYTES = 8 << 20

_SECONDS = Range(low=0, low_open=True)

ActionFormat = Literal["text", "mcp"]


@dataclass
class OpenEnvSettings(EnvSettings):
    """Keyword arguments of :class:`~corrgrpo_envs.integrations.openenv_client.OpenEnvEnv`."""

    url: str | list[str] = ""
    """The servers: ``openenv://HOST:PORT``, several separated by commas, or a list (a config
    gives them as ``env.id``, and the resolver passes them here)."""
    split: str = "all"
    """The servers' task split, from their task listing (the trainer's ``train.split`` sets it)."""
    reward_names: list[str] | None = None
    """The reward components to expect, when the servers' schema does not name them (else they
    are learned once from a first episode)."""
    reward_low: list[float] | None = None
    """Lower bound of each component (``.inf`` and ``-.inf`` allowed: unbounded)."""
    reward_high: list[float] | None = None
    """Upper bound of each component."""
    reward_weights: list[float] | None = None
    """Weights of the components (default: the servers', else all 1; the trainer's
    ``algorithm.reward_weights`` sets them in a run)."""
    action_field: str | None = None
    """The action's text field (default: the action schema's one required string field)."""
    action_format: ActionFormat = "text"
    """``text`` (the policy's text in ``action_field``) or ``mcp`` (an MCP tool env: the tool call
    written in the text becomes a ``call_tool`` action, and the server's ``list_tools`` fill the
    observation's ``tools``)."""
    observation_field: str | None = None
    """The observation field shown to the policy (default: the first text field)."""
    max_turns: int | None = num_field(None, Range(low=1))
    """Turns per episode (the trainer's ``rollout.max_turns`` sets it in a run)."""
    num_tasks: int = num_field(64, Range(low=1))
    """Tasks of a server that lists none: ``seed-<i>``, each reset with its seed ``i``."""
    timeout_s: float = num_field(60.0, _SECONDS)
    """Overall deadline of one reset or step, however slowly the answer comes."""
    connect_timeout_s: float = num_field(10.0, _SECONDS)
    """Overall deadline to read a server's description or open a session."""
    retries: int = num_field(2, Range(low=0))
    """Other servers an episode may move to after a fault."""
    down_s: float = num_field(30.0, Range(low=0))
    """How long a failed server is left out."""
    max_observation_bytes: int = num_field(DEFAULT_MAX_OBSERVATION_BYTES, Range(low=1024))
    """The largest answer accepted from a server (an observation, a task listing)."""
    token: str | None = None
    """The servers' shared token (default: the ``CORRGRPO_OPENENV_TOKEN`` variable), sent as
    ``Authorization: Bearer`` on every request and WebSocket handshake."""

    def check_rules(self) -> None:
        """The action format of a settings object built directly (keyword arguments and a config's
        keys are checked against the ``Literal`` as they are read; a dataclass does not check it)."""
        if self.action_format not in typing.get_args(ActionFormat):
            raise ConfigError(f"action_format: {self.action_format!r} is not allowed; allowed values: "
                              f"{type_name(ActionFormat)}", "action_format")

