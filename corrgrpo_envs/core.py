"""The multi-reward environment API.

:class:`MultiRewardEnv` is a ``gymnasium.Env`` whose ``step`` returns a float32
vector reward of shape ``(K,)``, one named component per objective
(MO-Gymnasium's convention). Observations are conversations, actions are the
assistant's text.

A domain subclasses it and implements two hooks:

* ``_observe_task(task) -> obs``: the first observation of an episode;
* ``_act(action) -> StepOutcome``: score (and, for multi-turn domains, advance)
  one assistant message.

and, where it can, the two methods the evaluation, the reference policy and
the conformance tests use:

* ``reference_action(task_id) -> list[str]``: the reference's assistant
  message for each turn, in order (one element for a single-turn domain); the
  default raises ``NotImplementedError`` (a domain without references);
* ``metrics(records) -> dict[str, float]``: evaluation metrics from episode
  records (see :mod:`corrgrpo_envs.metrics`); the default is each component's
  mean and the mean weighted total.

The base class owns everything that must be the same for every domain: task
selection from the env's own seeded generator, validation of the action
(non-strings, empty, oversized and binary actions get the lowest reward and
``info["error"]`` instead of an exception), the reward vector's dtype, the
``info`` keys, and observations that are fresh objects on every call (a caller
may keep or change what ``reset`` and ``step`` return without touching the
env's state, as Gymnasium's ``check_env`` requires).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from corrgrpo_envs.metrics import EpisodeRecord, reward_means
from corrgrpo_envs.spaces import Conversation, UnicodeText
from corrgrpo_envs.tasks import Task, TaskSource

__all__ = [
    "MultiRewardEnv",
    "StepOutcome",
    "validate_action",
    "fresh_copy",
    "MAX_ACTION_CHARS",
]

#: Default cap on an action's length: far above any real answer, far below a DoS.
MAX_ACTION_CHARS = 200_000
#: ``str.translate`` table that drops the control characters other than newline, return and tab:
#: counting them by the length it removes is C-speed (a Python loop over 200,000 characters is 20 ms).
_DROP_CONTROLS = dict.fromkeys(i for i in range(32) if chr(i) not in "\n\r\t")


@dataclass
class StepOutcome:
    """What a domain's ``_act`` returns.

    ``rewards`` maps every reward name to its value (missing names are an
    error: a domain must say what each objective scored). ``observation`` is
    the next observation for multi-turn domains (``None``: unchanged).
    """

    rewards: Mapping[str, float]
    terminated: bool = True
    truncated: bool = False
    observation: dict | None = None
    info: dict[str, Any] = field(default_factory=dict)


def validate_action(action: Any, max_chars: int = MAX_ACTION_CHARS) -> str | None:
    """Return why ``action`` is not a usable assistant message, or ``None`` if it is.

    Rejected: non-strings, empty or whitespace-only text, text longer than
    ``max_chars``, and binary junk (NUL bytes, lone surrogates, or mostly
    control characters).
    """
    if not isinstance(action, str):
        return f"action must be a str, got {type(action).__name__}"
    if not action.strip():
        return "empty action"
    if len(action) > max_chars:
        return f"action too long ({len(action)} characters > {max_chars})"
    if "\x00" in action:
        return "binary action (contains NUL)"
    try:
        action.encode("utf-8")
    except UnicodeEncodeError:
        return "binary action (lone surrogates)"
    controls = len(action) - len(action.translate(_DROP_CONTROLS))
    if controls > max(8, len(action) // 10):
        return "binary action (mostly control characters)"
    return None


def fresh_copy(value: Any) -> Any:
    """A copy of a JSON-like value whose containers (dict, list, tuple, set, ndarray) are all new.

    Strings, numbers and other immutable leaves are shared (they cannot be
    changed in place); cheaper than ``copy.deepcopy`` on conversations.
    """
    if isinstance(value, dict):
        return {k: fresh_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [fresh_copy(v) for v in value]
    if isinstance(value, tuple):
        return tuple(fresh_copy(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return type(value)(fresh_copy(v) for v in value)
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


class MultiRewardEnv(gym.Env[dict, str]):
    """A Gymnasium env over conversations with a named vector reward.

    Args:
        tasks: the tasks of this env's split.
        reward_names: the K component names, in reward-vector order.
        reward_low: each component's lower bound (length K).
        reward_high: each component's upper bound (length K).
        reward_weights: the domain's default weights (length K); overridable.
        max_action_chars: actions longer than this are rejected with the lowest reward.

    Attributes:
        reward_space: ``Box(low, high, (K,), float32)``.
        reward_names, reward_weights: as above (weights a float32 array).
        task_ids: ids of the tasks in this env's split.
    """

    #: ``render()`` writes the conversation as text. Gymnasium's checker asks every env
    #: with render modes for a frame rate; a conversation has none, so it is nominal.
    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        tasks: TaskSource,
        reward_names: Sequence[str],
        reward_low: Sequence[float],
        reward_high: Sequence[float],
        reward_weights: Sequence[float] | None = None,
        max_action_chars: int = MAX_ACTION_CHARS,
        render_mode: str | None = None,
    ):
        k = len(reward_names)
        if len(set(reward_names)) != k:
            raise ValueError(f"reward names must be unique, got {list(reward_names)}")
        if len(reward_low) != k or len(reward_high) != k:
            raise ValueError("reward_low and reward_high must have one bound per reward name")
        if len(tasks) == 0:
            raise ValueError(f"data set {tasks.name!r} has no tasks in this split")
        weights = np.ones(k) if reward_weights is None else np.asarray(reward_weights, float)
        if weights.shape != (k,) or not np.all(np.isfinite(weights)):
            raise ValueError(
                f"reward_weights must be {k} finite numbers for {list(reward_names)}, got {reward_weights}"
            )
        self.tasks = tasks
        self.reward_names: tuple[str, ...] = tuple(reward_names)
        self.reward_space = spaces.Box(
            low=np.asarray(reward_low, np.float32),
            high=np.asarray(reward_high, np.float32),
            shape=(k,),
            dtype=np.float32,
        )
        self.reward_weights = weights.astype(np.float32)
        self.observation_space = Conversation()
        self.action_space = UnicodeText(max_length=max_action_chars)
        self.max_action_chars = max_action_chars
        self.render_mode = render_mode
        self.task: Task | None = None
        self._obs: dict | None = None
        self._done = True

    # ----------------------------------------------------------------- hooks
    def _observe_task(self, task: Task) -> dict:
        """The first observation of an episode on ``task``."""
        raise NotImplementedError

    def _act(self, action: str) -> StepOutcome:
        """Score (and for multi-turn domains, advance) one valid assistant message."""
        raise NotImplementedError

    def reference_action(self, task_id: str) -> list[str]:
        """The reference's assistant message for each turn of ``task_id``, in order.

        Single-turn domains return one element; multi-turn domains one message
        per turn, the last one ending the episode. Unknown ids raise ``KeyError``.
        A domain without reference answers keeps this default, which raises
        ``NotImplementedError`` (the conformance tests then play a sampled
        action; ``agents.ReferencePolicy`` cannot play such a domain).
        """
        raise NotImplementedError(f"{type(self).__name__} has no reference answers")

    def metrics(self, records: Sequence[EpisodeRecord]) -> dict[str, float]:
        """Evaluation metrics from one record per episode.

        Records are ``{"task_id", "reward_components", "info", "text"}`` as the
        evaluation's play loop produces them (``reward_components``: the
        episode's return per component). The default: each component's mean
        (keyed by its name) and the mean weighted total (``"total"``); ``{}``
        for no records.
        """
        return reward_means(records, self.reward_names, self.reward_weights)

    def _invalid_outcome(self, error: str) -> StepOutcome:
        """What an unusable action gets: the lowest reward, and the episode ends."""
        low = self.reward_space.low
        return StepOutcome(
            rewards={n: float(v) for n, v in zip(self.reward_names, low)},
            terminated=True,
            info={"error": error},
        )

    # ------------------------------------------------------------------- API
    @property
    def task_ids(self) -> list[str]:
        """Ids of the tasks in this env's split, in canonical order."""
        return self.tasks.ids

    @property
    def num_rewards(self) -> int:
        return len(self.reward_names)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict, dict[str, Any]]:
        """Start an episode on ``options["task_id"]`` or on a task drawn from the env's generator."""
        super().reset(seed=seed)
        options = options or {}
        if "task_id" in options and options["task_id"] is not None:
            task = self.tasks.get(str(options["task_id"]))
        else:
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        self.task = task
        self._obs = self._observe_task(task)
        self._done = False
        return fresh_copy(self._obs), {"task_id": task.id}

    def step(self, action: str) -> tuple[dict, np.ndarray, bool, bool, dict[str, Any]]:
        """Apply one assistant message; returns ``(obs, reward[K], terminated, truncated, info)``."""
        if self.task is None or self._obs is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode has ended; call reset() before step()")
        error = validate_action(action, self.max_action_chars)
        outcome = self._invalid_outcome(error) if error else self._act(action)
        missing = set(self.reward_names) - set(outcome.rewards)
        if missing:
            raise RuntimeError(f"{type(self).__name__} did not score {sorted(missing)}")
        reward = np.array([outcome.rewards[n] for n in self.reward_names], dtype=np.float32)
        if outcome.observation is not None:
            self._obs = outcome.observation
        self._done = outcome.terminated or outcome.truncated
        info = dict(outcome.info)
        info["task_id"] = self.task.id
        info["reward_components"] = {n: float(v) for n, v in zip(self.reward_names, reward)}
        return (
            fresh_copy(self._obs),
            reward,
            bool(outcome.terminated),
            bool(outcome.truncated),
            info,
        )

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self._obs is None:
            return None
        return "\n".join(f"[{m['role']}] {m['content']}" for m in self._obs["messages"])

    # --------------------------------------------------------------- helpers
    def reward_table(self) -> list[dict[str, Any]]:
        """One row per component: name, low, high, weight (for ``corrgrpo envs list``)."""
        return [
            {"name": n, "low": float(lo), "high": float(hi), "weight": float(w)}
            for n, lo, hi, w in zip(
                self.reward_names,
                self.reward_space.low,
                self.reward_space.high,
                self.reward_weights,
            )
        ]
