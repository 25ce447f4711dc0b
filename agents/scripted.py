"""Scripted policies for tests and baselines: the reference answer, and random text."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from corrgrpo.agents.episode import Episode
from corrgrpo.agents.policy import Action, Policy, SamplingParams, check_batch
from corrgrpo.agents.toolcalls import ToolCall, render_hermes

__all__ = ["ReferencePolicy", "RandomPolicy"]


def _record(episodes: Sequence[Episode] | None, observations: Sequence[dict], actions: list[Action]) -> None:
    """Text-only policies keep the turns (and the conversation) on the episodes, no tokens."""
    if episodes is None:
        return
    for episode, obs, action in zip(episodes, observations, actions):
        episode.turns.append(action)
        episode.messages = list(obs["messages"]) + [{"role": "assistant", "content": action.text}]


class ReferencePolicy(Policy):
    """Plays each task's reference answer: ``env.unwrapped.reference_action(task_id)``.

    Args:
        env: a corrgrpo env, a ``GroupedVectorEnv`` (its ``call``), or a function
            ``task_id -> list[str]``.

    A reference is the assistant message of each turn, in order
    (:meth:`corrgrpo_envs.MultiRewardEnv.reference_action`): turn ``i`` plays item
    ``i`` (the last item again if the episode runs longer). ``i`` is the episode's
    number of turns, or the number of assistant messages in the observation when
    no episodes are given. The task of each observation comes from
    ``act(..., task_ids=[...])``, else from ``episodes[i].task_id``, else from a
    vector env's ``current_task_ids``.
    """

    def __init__(self, env: Any):
        self._reference: Callable[[str], Sequence[str]]
        if hasattr(env, "unwrapped") and hasattr(env.unwrapped, "reference_action"):
            self._reference = env.unwrapped.reference_action
        elif hasattr(env, "call") and hasattr(env, "current_task_ids"):
            self._reference = lambda task_id: env.call("reference_action", task_id)
        elif callable(env):
            self._reference = env
        else:
            raise ValueError("env must expose reference_action(task_id) or be a function of the task id")
        self._env = env
        self._cache: dict[str, list[str]] = {}

    def reference(self, task_id: str) -> list[str]:
        """The task's reference messages, one per turn (cached: they never change)."""
        if task_id not in self._cache:
            ref = self._reference(task_id)
            if isinstance(ref, str) or not isinstance(ref, (list, tuple)):
                raise TypeError(
                    f"reference_action({task_id!r}) must return list[str] (one message per turn), "
                    f"got {type(ref).__name__}"
                )
            if not ref or not all(isinstance(m, str) for m in ref):
                raise TypeError(
                    f"reference_action({task_id!r}) must return a non-empty list of str, got {ref!r:.200}"
                )
            self._cache[task_id] = list(ref)
        return self._cache[task_id]

    def _task_ids(self, n: int, task_ids: Sequence[str] | None, episodes: Sequence[Episode] | None) -> list[str]:
        if task_ids is not None:
            ids = list(task_ids)
        elif episodes is not None and all(e.task_id is not None for e in episodes):
            ids = [str(e.task_id) for e in episodes]
        elif hasattr(self._env, "current_task_ids") and len(self._env.current_task_ids) == n:
            ids = list(self._env.current_task_ids)
        elif n == 1 and getattr(getattr(self._env, "unwrapped", None), "task", None) is not None:
            ids = [self._env.unwrapped.task.id]
        else:
            raise ValueError("ReferencePolicy needs the task ids: pass task_ids= or episodes with task_id")
        if len(ids) != n:
            raise ValueError(f"got {len(ids)} task ids for {n} observations")
        return ids

    def act(
        self,
        observations: Sequence[dict],
        sampling: SamplingParams | None = None,
        episodes: Sequence[Episode] | None = None,
        task_ids: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> list[Action]:
        check_batch(observations, episodes)
        actions = []
        for i, task_id in enumerate(self._task_ids(len(observations), task_ids, episodes)):
            ref = self.reference(task_id)
            if episodes is not None:
                turn = episodes[i].num_turns
            else:
                turn = sum(m.get("role") == "assistant" for m in observations[i]["messages"])
            actions.append(Action(text=ref[min(turn, len(ref) - 1)], info={"task_id": task_id}))
        _record(episodes, observations, actions)
        return actions


_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 .,:;!?\n{}[]()\"'_-+=<>/`#"


class RandomPolicy(Policy):
    """Random text or random Hermes tool calls of the observation's tools; deterministic in ``seed``.

    Args:
        seed: seeds the policy's own generator.
        tool_call_prob: chance of answering with calls when the observation has tools.
        max_chars: longest random text.
    """

    def __init__(self, seed: int | None = 0, tool_call_prob: float = 0.5, max_chars: int = 64):
        if not 0.0 <= tool_call_prob <= 1.0:
            raise ValueError(f"tool_call_prob must be in [0, 1], got {tool_call_prob}")
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        self.rng = random.Random(seed)
        self.tool_call_prob = tool_call_prob
        self.max_chars = max_chars

    def _text(self) -> str:
        n = self.rng.randint(1, self.max_chars)
        return "".join(self.rng.choice(_ALPHABET) for _ in range(n))

    def _call(self, tool: dict) -> ToolCall:
        spec = tool.get("function", tool)
        name = str(spec.get("name", "tool"))
        props = (spec.get("parameters") or {}).get("properties") or {}
        args: dict[str, Any] = {}
        for key, schema in props.items():
            kind = schema.get("type") if isinstance(schema, dict) else None
            if kind in ("integer", "number"):
                args[key] = self.rng.randint(0, 100)
            elif kind == "boolean":
                args[key] = self.rng.random() < 0.5
            elif kind == "array":
                args[key] = [self._text()[:8]]
            else:
                args[key] = self._text()[:16].strip() or "x"
        return ToolCall(name=name, arguments=json.loads(json.dumps(args)))

    def act(
        self,
        observations: Sequence[dict],
        sampling: SamplingParams | None = None,
        episodes: Sequence[Episode] | None = None,
        **kwargs: Any,
    ) -> list[Action]:
        check_batch(observations, episodes)
        actions = []
        for obs in observations:
            tools = [t for t in obs.get("tools") or [] if isinstance(t, dict)]
            if tools and self.rng.random() < self.tool_call_prob:
                calls = [self._call(self.rng.choice(tools)) for _ in range(self.rng.randint(1, 2))]
                text = render_hermes(calls)
            else:
                text = self._text()
            actions.append(Action(text=text))
        _record(episodes, observations, actions)
        return actions
