"""The rules of a run config beyond each field's own type and range: keys written in the wrong
section, the reward weights and gates, the estimator, loss and rollout engine and their options.

The estimator's and the loss's options are read here into the classes that declare them: an
estimator's keyword-only parameters (:func:`corrgrpo.trainer.estimators.registry.options_class`)
and a loss's ``LossConfig`` (:mod:`corrgrpo.trainer.losses`), so an unknown or ill-typed option
is an error naming ``algorithm.estimator_options.<key>`` or ``algorithm.loss_options.<key>``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corrgrpo_registry.settings import ConfigError, check_moved, read_options, written

if TYPE_CHECKING:
    from corrgrpo.trainer.config_sections import AlgorithmConfig, Config

__all__ = [
    "MOVED_KEYS",
    "check_plugins",
    "check_rewards",
    "read_estimator_options",
    "read_loss_options",
]

#: Keys written in the wrong section -> where they belong.
MOVED_KEYS: dict[str, str] = {
    "env.split": "train.split",
    "env.max_turns": "rollout.max_turns",
    "env.reward_weights": "algorithm.reward_weights",
    "algorithm.clip_low": "algorithm.loss_options.clip_low",
    "algorithm.clip_high": "algorithm.loss_options.clip_high",
    "algorithm.dual_clip": "algorithm.loss_options.dual_clip",
    "algorithm.loss_options.kl_beta": "algorithm.kl_beta",
    "algorithm.loss_options.agg_mode": "algorithm.loss_agg_mode",
    "train.max_turns": "rollout.max_turns",
    "rollout.split": "train.split",
}


def _as_written(options: Any) -> dict[str, Any]:
    """Options as a mapping of the keys written: a plain mapping, or an object already read."""
    if dataclasses.is_dataclass(options):
        return written(options)
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"expected a mapping, got {options!r}")
    return dict(options)


def read_estimator_options(estimator: str, options: Any) -> Any:
    """``options`` as estimator ``estimator``'s options object (its keyword-only parameters),
    checked: an unknown key or a value of the wrong type is a :class:`ConfigError` naming
    ``algorithm.estimator_options.<key>``; a value the estimator itself refuses (a dry run on two
    responses) one naming ``algorithm.estimator_options``."""
    from corrgrpo.trainer.estimators import check_estimator, get_estimator
    from corrgrpo.trainer.estimators.registry import options_class

    key = "algorithm.estimator_options"
    try:
        fn = get_estimator(estimator)
    except ValueError as exc:
        raise ConfigError(f"algorithm.estimator: {exc}", "algorithm.estimator") from None
    try:
        given = _as_written(options)
    except TypeError as exc:
        raise ConfigError(f"{key}: {exc}", key) from None
    try:
        typed = read_options(options_class(fn), given, key)
    except TypeError as exc:  # a keyword-only parameter without a default, not given
        raise ConfigError(f"{key}: estimator {estimator!r} needs its options: {exc}", key) from None
    try:
        check_estimator(estimator, dict(typed))
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}", key) from None
    return typed


def read_loss_options(loss: str, options: Any) -> Any:
    """``options`` as loss ``loss``'s ``LossConfig`` (its registered defaults, the options over
    them), checked: an unknown key, one that belongs elsewhere (``kl_beta``, ``agg_mode``) or a
    value out of range is a :class:`ConfigError` naming ``algorithm.loss_options.<key>``."""
    from corrgrpo.trainer.losses import LossConfigError, default_config

    key = "algorithm.loss_options"
    try:
        defaults = default_config(loss)
    except ValueError as exc:
        raise ConfigError(f"algorithm.loss: {exc}", "algorithm.loss") from None
    try:
        given = _as_written(options)
    except TypeError as exc:
        raise ConfigError(f"{key}: {exc}", key) from None
    for name in given:
        check_moved(f"{key}.{name}", MOVED_KEYS)
    try:
        return read_options(type(defaults), given, key, base=defaults, moved=MOVED_KEYS)
    except LossConfigError as exc:  # LossConfig checks its own ranges as it is made
        full = f"{key}.{exc.key}"
        raise ConfigError(f"{full}: {str(exc).split(': ', 1)[-1]}", full) from None


def check_rewards(cfg: Config) -> None:
    """Reward weights and gates are well formed (their names are checked against the env later)."""
    from corrgrpo.trainer.estimators.reward_gates import check_reward_gates
    from corrgrpo.trainer.estimators.reward_weights import check_reward_weights

    for key, check, value in (("algorithm.reward_weights", check_reward_weights, cfg.algorithm.reward_weights),
                              ("algorithm.reward_gates", check_reward_gates, cfg.algorithm.reward_gates)):
        try:
            check(value)
        except ValueError as exc:
            raise ConfigError(str(exc), key) from None


def _read_options(a: AlgorithmConfig) -> None:
    """The estimator's and the loss's options, read into their declared classes."""
    if a.loss == "sft":  # registered beside the RL losses, but it reads no reward at all
        raise ConfigError("algorithm.loss: 'sft' is the cross-entropy of `corrgrpo sft` (it ignores "
                          "the rewards); a training run needs a policy-gradient loss such as 'grpo'",
                          "algorithm.loss")
    a.estimator_options = read_estimator_options(a.estimator, a.estimator_options)
    a.loss_options = read_loss_options(a.loss, a.loss_options)


def check_plugins(cfg: Config) -> None:
    """The estimator, loss and rollout engine exist and take the given options (the options are
    read into their declared classes here, once)."""
    from corrgrpo.trainer.engines import available_engines

    a = cfg.algorithm
    _read_options(a)
    if ":" in cfg.rollout.backend:  # an entry point package.module:Class: it must load
        from corrgrpo.trainer.engines import ENGINES

        try:
            ENGINES.get(cfg.rollout.backend)
        except ValueError as exc:
            raise ConfigError(f"rollout.backend: {exc}", "rollout.backend") from None
    elif cfg.rollout.backend not in available_engines():
        raise ConfigError(
            f"rollout.backend: {cfg.rollout.backend!r} is not allowed; allowed values: one of "
            + ", ".join(repr(n) for n in available_engines()),
            "rollout.backend",
        )
    for i, url in enumerate(cfg.rollout.server.urls):
        if not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"rollout.server.urls[{i}]: {url!r} is not allowed; allowed: an http:// or https:// "
                "API root such as http://127.0.0.1:8000/v1",
                f"rollout.server.urls[{i}]",
            )
    if cfg.rollout.server.weight_sync == "nccl" and not cfg.rollout.server.nccl_address:
        raise ConfigError(
            "rollout.server.nccl_address: null is not allowed with rollout.server.weight_sync=nccl; "
            "allowed: the trainer's address the servers can reach",
            "rollout.server.nccl_address",
        )
    if cfg.rollout.backend == "server" and not cfg.rollout.server.urls:
        raise ConfigError(
            "rollout.server.urls: [] is not allowed with rollout.backend=server; allowed: one or more "
            "server URLs (scripts/vllm_serve.sh prints them)",
            "rollout.server.urls",
        )
    if cfg.rollout.overlap and a.tis_cap is None:
        raise ConfigError(
            "algorithm.tis_cap: null is not allowed with rollout.overlap=true; allowed: a cap >= 1 "
            "such as 2.0 (overlapped rollouts come from the previous step's weights)",
            "algorithm.tis_cap",
        )
    if a.overlong_buffer is not None and a.overlong_buffer > cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"algorithm.overlong_buffer: {a.overlong_buffer} is out of range; allowed: <= "
            f"rollout.max_new_tokens ({cfg.rollout.max_new_tokens})",
            "algorithm.overlong_buffer",
        )


