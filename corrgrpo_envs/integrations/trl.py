"""A corrgrpo env in Hugging Face TRL's ``GRPOTrainer``.

TRL scores completions with a list of reward functions and adds them up with
``GRPOConfig.reward_weights``. :func:`for_trl` turns an env into exactly that:
one reward function per component (named after it, so TRL logs
``rewards/<name>/mean``), the env's weights, and the prompts of a split as a
``datasets.Dataset`` with a chat ``prompt`` column and the ``task_id`` column the
reward functions read::

    from trl import GRPOConfig, GRPOTrainer
    from corrgrpo_envs.integrations.trl import for_trl

    setup = for_trl("corrgrpo/ScaleDominance-v0", split="train")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=setup.reward_funcs,
        args=GRPOConfig(..., reward_weights=setup.reward_weights),
        train_dataset=setup.dataset,
        processing_class=tokenizer,
    )

Each completion is scored as the env scores it: ``reset`` on its task, then one
``step`` with the completion's text. The K functions share one scorer, so a
batch is scored once, not K times. TRL's trainer generates one message per
prompt, so the adapter fits single-turn envs; on a multi-turn env a completion
gets the rewards of the first turn only (usually 0 until the episode ends).

Neither ``trl`` nor ``datasets`` is imported until :func:`prompt_dataset` runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = [
    "TRLSetup",
    "EnvScorer",
    "ComponentReward",
    "for_trl",
    "reward_functions",
    "prompt_rows",
    "prompt_dataset",
    "completion_text",
]


def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or (conversational) the last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content") or "")
    raise TypeError(f"a completion must be a str or a list of messages, got {type(completion).__name__}")


class EnvScorer:
    """Scores completions with one env instance; remembers the last batch's reward matrix.

    Args:
        env: a corrgrpo env (wrapped or not).
    """

    def __init__(self, env: gym.Env):
        self.env = env
        self.unwrapped = env.unwrapped
        self.reward_names: tuple[str, ...] = tuple(self.unwrapped.reward_names)
        self._last_key: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._last: np.ndarray | None = None

    def score(self, task_ids: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        """``[len(texts), K]`` float32: each text's reward vector on its task."""
        if len(task_ids) != len(texts):
            raise ValueError(f"{len(task_ids)} task ids for {len(texts)} completions")
        key = (tuple(str(t) for t in task_ids), tuple(texts))
        if key == self._last_key and self._last is not None:
            return self._last
        rows = np.zeros((len(texts), len(self.reward_names)), dtype=np.float32)
        for i, (task_id, text) in enumerate(zip(key[0], texts)):
            self.env.reset(options={"task_id": task_id})
            rows[i] = self.env.step(text)[1]
        self._last_key, self._last = key, rows
        return rows


class ComponentReward:
    """One reward component as a TRL reward function ``f(prompts, completions, task_id, **kw)``.

    ``__name__`` is the component's name (TRL logs ``rewards/<name>/mean``).
    """

    def __init__(self, scorer: EnvScorer, index: int):
        self.scorer = scorer
        self.index = int(index)
        self.__name__ = scorer.reward_names[self.index]

    def __call__(
        self,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] | None = None,
        task_id: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        if completions is None:
            raise ValueError(f"reward {self.__name__!r} needs the completions")
        if task_id is None:
            raise ValueError(
                f"reward {self.__name__!r} needs a 'task_id' column in the dataset "
                "(build it with corrgrpo_envs.integrations.trl.prompt_dataset)"
            )
        texts = [completion_text(c) for c in completions]
        return self.scorer.score(list(task_id), texts)[:, self.index].astype(float).tolist()

    def __repr__(self) -> str:
        return f"ComponentReward({self.__name__!r})"


def reward_functions(env: gym.Env) -> list[ComponentReward]:
    """The env's K components as K TRL reward functions, in ``reward_names`` order."""
    scorer = EnvScorer(env)
    return [ComponentReward(scorer, k) for k in range(len(scorer.reward_names))]


def prompt_rows(env: gym.Env, task_ids: Sequence[str] | None = None) -> dict[str, list[Any]]:
    """``{"prompt": [messages, ...], "task_id": [...]}`` for the env's tasks (default: all of its split).

    A prompt is the task's first observation's messages, reduced to ``role`` and
    ``content`` (what a chat template needs; the tool schemas of ``obs["tools"]``
    are left out).
    """
    u = env.unwrapped
    ids = list(u.task_ids if task_ids is None else task_ids)
    prompts = []
    for task_id in ids:
        obs, _ = env.reset(options={"task_id": task_id})
        prompts.append([{"role": m["role"], "content": m["content"]} for m in obs["messages"]])
    return {"prompt": prompts, "task_id": ids}


def prompt_dataset(env: gym.Env, task_ids: Sequence[str] | None = None) -> Any:
    """:func:`prompt_rows` as a ``datasets.Dataset`` (TRL's ``train_dataset``)."""
    try:
        from datasets import Dataset
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "prompt_dataset needs the 'datasets' package (TRL depends on it): pip install datasets",
            name=exc.name,
        ) from exc
    return Dataset.from_dict(prompt_rows(env, task_ids))


@dataclass
class TRLSetup:
    """What ``GRPOTrainer`` takes: ``train_dataset``, ``reward_funcs`` and ``GRPOConfig.reward_weights``."""

    dataset: Any
    reward_funcs: list[ComponentReward]
    reward_weights: list[float]
    env: gym.Env


def for_trl(
    env: str | Path | gym.Env,
    split: str | None = None,
    reward_weights: Sequence[float] | None = None,
    **env_kwargs: Any,
) -> TRLSetup:
    """An env (an id, an entry point, a YAML config, or a built env) ready for TRL's ``GRPOTrainer``.

    ``split`` and ``env_kwargs`` go to ``corrgrpo_envs.make`` (not allowed with a
    built env); ``reward_weights`` default to the env's own.
    """
    if isinstance(env, gym.Env):
        if split is not None or env_kwargs:
            raise ValueError("split and env keyword arguments need an env id, not a built env")
        built = env
    else:
        from corrgrpo_envs.registry import make

        kwargs = dict(env_kwargs)
        if split is not None:
            kwargs["split"] = split
        built = make(env, **kwargs)
    names = tuple(built.unwrapped.reward_names)
    weights = built.unwrapped.reward_weights if reward_weights is None else reward_weights
    weights = [float(w) for w in np.asarray(weights, dtype=np.float64).reshape(-1)]
    if len(weights) != len(names):
        raise ValueError(f"reward_weights has {len(weights)} entries for the {len(names)} rewards {list(names)}")
    return TRLSetup(
        dataset=prompt_dataset(built),
        reward_funcs=reward_functions(built),
        reward_weights=weights,
        env=built,
    )
