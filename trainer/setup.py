"""Building an RL run's own parts from its config: environment, rewards, reference model, loss.

Each function reads the config sections it needs and returns one part; the
trainer calls them in order. The trainer owns the task split, the turn limit
and the reward weights: :func:`env_kwargs` hands the split (and the turn limit,
to envs that take one) to the environment, and :func:`reward_setup` reads the
reward names and default weights from the vector env, not from a separate env.
The model, optimizer and run folder every command shares come from
:class:`corrgrpo.trainer.run_context.RunContext`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from corrgrpo.agents.policy import SamplingParams
from corrgrpo.trainer.config import Config
from corrgrpo.trainer.estimators.reward_weights import RewardWeights, resolve_reward_weights
from corrgrpo.trainer.losses import LossConfig, get_loss, resolve_loss_config
from corrgrpo_envs.registry import resolve
from corrgrpo_envs.vector import GroupedVectorEnv
from corrgrpo_registry.settings import written

__all__ = [
    "build_loss",
    "build_reference",
    "build_vector_env",
    "env_kwargs",
    "make_after_import",
    "reward_setup",
    "sampling_params",
]


def env_kwargs(cfg: Config, split: str | None = None) -> dict[str, Any]:
    """Keyword arguments of every env: the env's settings (``cfg.env``), the trainer's split and
    turn limit.

    ``split`` defaults to ``train.split``; ``rollout.max_turns`` goes to envs that take a
    ``max_turns`` setting (a field of their settings class, else a constructor parameter), so
    the env's own limit is the trainer's.
    """
    kwargs = cfg.env.kwargs()
    kwargs["split"] = split or cfg.train.split
    try:
        takes_max_turns = resolve(cfg.env.id).accepts("max_turns")
    except (ValueError, ImportError, AttributeError, TypeError, FileNotFoundError):
        takes_max_turns = False  # making the env reports it, in its own words
    if takes_max_turns:
        kwargs["max_turns"] = cfg.rollout.max_turns
    return kwargs


def make_after_import(modules: tuple[str, ...], env_id: str, **kwargs: Any) -> gym.Env:
    """``corrgrpo_envs.make(env_id, **kwargs)`` after importing ``modules``: how a spawned
    reward worker process, which has not imported ``env.import``'s modules, finds the id."""
    import corrgrpo_envs
    from corrgrpo_envs.registry import import_env_modules

    import_env_modules(list(modules))
    return corrgrpo_envs.make(env_id, **kwargs)


def build_vector_env(
    cfg: Config, num_groups: int, group_size: int, split: str | None = None
) -> GroupedVectorEnv:
    """``num_groups`` x ``group_size`` envs of ``env.id`` on the split (default ``train.split``)."""
    spec: Any = cfg.env.id
    if cfg.env.imports and cfg.rollout.reward_executor == "process":
        spec = functools.partial(make_after_import, cfg.env.imports, spec)  # picklable: module-level
    return GroupedVectorEnv(
        spec,
        num_groups=num_groups,
        group_size=group_size,
        workers=cfg.rollout.reward_workers,
        executor=cfg.rollout.reward_executor,
        **env_kwargs(cfg, split),
    )


def reward_setup(cfg: Config, venv: GroupedVectorEnv) -> tuple[list[str], RewardWeights]:
    """The reward names and their weights over steps (``overlong`` appended if shaped).

    Weights are ``algorithm.reward_weights`` (constants or schedules) or, by default, the env's.
    """
    a = cfg.algorithm
    names = list(venv.reward_names)
    weights = resolve_reward_weights(a.reward_weights, names, np.asarray(venv.reward_weights, np.float64))
    if a.overlong_buffer is not None:
        weights = RewardWeights([*names, "overlong"], [*weights.entries, float(a.overlong_weight)])
        names.append("overlong")
    return names, weights


def build_reference(model: torch.nn.Module, cfg: Config, device: torch.device) -> torch.nn.Module | None:
    """A frozen copy of the initial model for the KL term, or None without one."""
    if cfg.algorithm.kl_beta <= 0:
        return None
    return copy.deepcopy(model).eval().requires_grad_(False).to(device)


def build_loss(cfg: Config) -> tuple[Callable[..., Any], LossConfig]:
    """The loss function and its config: its defaults, ``loss_options``, the KL weight,
    ``loss_agg_mode``, and Dr. GRPO's normaliser (``max_new_tokens * max_turns`` unless given).
    """
    a, r = cfg.algorithm, cfg.rollout
    options = written(a.loss_options) if dataclasses.is_dataclass(a.loss_options) else dict(a.loss_options)
    fixed: dict[str, Any] = {"kl_beta": a.kl_beta}
    if "max_completion_length" not in options:
        fixed["max_completion_length"] = r.max_new_tokens * r.max_turns
    loss_cfg = resolve_loss_config(a.loss, options, agg_mode=a.loss_agg_mode, **fixed)
    return get_loss(a.loss), loss_cfg


def sampling_params(cfg: Config, greedy: bool = False) -> SamplingParams:
    """How each turn is sampled (``greedy``: temperature 0, no nucleus)."""
    r = cfg.rollout
    return SamplingParams(
        temperature=0.0 if greedy else r.temperature,
        top_p=1.0 if greedy else r.top_p,
        max_new_tokens=r.max_new_tokens,
        stop=tuple(r.stop),
    )
