"""A served corrgrpo env in TRL's ``GRPOTrainer`` through TRL's own environment integration.

TRL's ``environment_factory`` builds one environment object per rollout, calls its
``reset(**row)`` with the dataset row before generation, exposes its public methods as
tools, and passes the objects to the reward functions as ``environments``.
:class:`OpenEnvRollout` is that object for an OpenEnv server (``corrgrpo serve``): one
WebSocket session (the ``openenv`` package's ``GenericEnvClient``), reset to the row's
``task_id``; its one tool, ``submit_answer``, steps the session with the answer.
:func:`for_trl_openenv` gives the rest: one reward function per component, named after
it (TRL logs ``rewards/<name>/mean``), reading ``metadata["reward_components"]`` of the
rollout's step (stepping with the completion's text when the model did not call the
tool), the server's weights for ``GRPOConfig.reward_weights`` (so
``multi_objective_aggregation`` works unchanged), and the split's prompts::

    from trl import GRPOConfig, GRPOTrainer
    from corrgrpo_envs.integrations.trl_openenv import for_trl_openenv

    setup = for_trl_openenv("openenv://127.0.0.1:8000", split="train")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=setup.reward_funcs,
        args=GRPOConfig(..., reward_weights=setup.reward_weights),
        train_dataset=setup.dataset,
        processing_class=tokenizer,        # its chat template must render tool calls
        environment_factory=setup.environment_factory,
    )

Neither ``trl`` nor ``datasets`` is imported here (``datasets`` when the dataset is built).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corrgrpo_envs.integrations.openenv_client import RemoteRewardError, auth_headers, parse_urls
from corrgrpo_envs.integrations.trl import completion_text, prompt_dataset

__all__ = ["OpenEnvRollout", "component_reward_functions", "for_trl_openenv", "TRLOpenEnvSetup"]


class OpenEnvRollout:
    """One TRL rollout's environment: an OpenEnv session on a served corrgrpo env.

    Args:
        url: the server, ``openenv://HOST:PORT`` (or ``http://``).
        reward_names: the components every step must carry.
        timeout_s: seconds to wait for the server's answer.
    """

    def __init__(self, url: str, reward_names: Sequence[str], timeout_s: float = 60.0):
        from openenv.core import GenericEnvClient

        self._url = parse_urls(url)[0]
        self._names = tuple(reward_names)
        # the shared token ($CORRGRPO_OPENENV_TOKEN), as OpenEnvEnv sends it
        self._client = GenericEnvClient(
            base_url=self._url, message_timeout_s=timeout_s, headers=auth_headers()
        ).sync()
        self._client.connect()
        self._task_id: str | None = None
        self._components: dict[str, float] | None = None

    def reset(self, task_id: str | None = None, **row: Any) -> None:
        """Start the rollout's episode on the row's task (TRL passes the dataset row)."""
        self._client.reset(task_id=task_id)
        self._task_id = task_id
        self._components = None
        return None

    def submit_answer(self, answer: str) -> str:
        """Submit your final answer; it is scored once.

        Args:
            answer: The complete final answer.
        """
        if self._components is not None:
            return "An answer was already submitted."
        self._step(answer)
        return "Answer submitted."

    def _step(self, text: str) -> dict[str, float]:
        result = self._client.step({"message": text})
        parts = (result.metadata or {}).get("reward_components")
        where = f"OpenEnv server {self._url}, task {self._task_id}"
        if not isinstance(parts, Mapping):
            raise RemoteRewardError(f"{where}: the step carries no metadata['reward_components']")
        missing = [n for n in self._names if n not in parts]
        if missing:
            raise RemoteRewardError(f"{where}: metadata['reward_components'] is missing {missing}")
        self._components = {n: float(parts[n]) for n in self._names}
        return self._components

    def _score(self, completion: Any) -> dict[str, float]:
        """The rollout's components: from the submitted answer, else from the completion's text."""
        if self._components is None:
            self._step(completion_text(completion) or " ")
        assert self._components is not None
        return self._components

    def __del__(self) -> None:
        # At interpreter shutdown the sync client's close would start its event-loop thread,
        # which never returns then: leave the socket to the OS.
        if sys.is_finalizing():
            return
        try:
            self._client.close()
        except Exception:
            pass


def component_reward_functions(names: Sequence[str]) -> list[Callable[..., list[float]]]:
    """One TRL reward function per component, reading it from each rollout's environment."""

    def make(name: str) -> Callable[..., list[float]]:
        def reward(completions: Sequence[Any], environments: Sequence[OpenEnvRollout] | None = None,
                   **kwargs: Any) -> list[float]:
            if environments is None:
                raise ValueError("these reward functions need GRPOTrainer(environment_factory=...)")
            return [env._score(c)[name] for c, env in zip(completions, environments)]

        reward.__name__ = name
        return reward

    return [make(n) for n in names]


@dataclass
class TRLOpenEnvSetup:
    """What ``GRPOTrainer`` takes for a served env."""

    dataset: Any
    reward_funcs: list[Callable[..., list[float]]]
    reward_weights: list[float]
    environment_factory: Callable[[], OpenEnvRollout]
    reward_names: tuple[str, ...]


def for_trl_openenv(
    url: str, split: str = "train", reward_weights: Sequence[float] | None = None, timeout_s: float = 60.0
) -> TRLOpenEnvSetup:
    """The dataset, reward functions, weights and environment factory for a ``corrgrpo serve`` server."""
    from corrgrpo_envs.registry import make

    env = make(url, split=split)
    try:
        u = env.unwrapped
        names = tuple(u.reward_names)
        weights = [float(w) for w in (u.reward_weights if reward_weights is None else reward_weights)]
        if len(weights) != len(names):
            raise ValueError(f"reward_weights has {len(weights)} entries for the {len(names)} rewards {list(names)}")
        dataset = prompt_dataset(env)
    finally:
        env.close()
    return TRLOpenEnvSetup(
        dataset=dataset,
        reward_funcs=component_reward_functions(names),
        reward_weights=weights,
        environment_factory=functools.partial(OpenEnvRollout, url, names, timeout_s),
        reward_names=names,
    )
