"""Training configuration: what a run config holds, how it is read and how it is checked.

A run is described by a YAML file (see ``env_configs/``) with the sections
``env``, ``model``, ``algorithm``, ``rollout``, ``optim`` and ``train``, and
may be overridden on the command line with dotted keys::

    corrgrpo train env_configs/quickstart.yaml algorithm.estimator=grpo train.seed=3

Every setting has exactly one home: the trainer owns the task split
(``train.split``), the turn limit (``rollout.max_turns``) and the reward weights
(``algorithm.reward_weights``) and hands them to the environment; writing them
under ``env:`` is an error that names the right key. Unknown keys, values of the
wrong type, numbers out of range (non-finite ones included), duplicated YAML keys
and options an estimator or loss does not take are errors that name the key (and
file and line) and what is allowed.

Each setting is declared once: the sections in :mod:`corrgrpo.trainer.config_sections`, the
``env:`` keys in the env's settings class (``Config.env`` is that class's object, chosen by
``env.id``), the estimator's options as its keyword-only parameters and the loss's as its
``LossConfig``. This module is the public face: reading (:mod:`corrgrpo.trainer.config_files`)
and the rules between settings (:mod:`corrgrpo.trainer.config_rules`) live beside it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from corrgrpo.trainer.config_files import (
    CONFIG_DIR,
    apply_overrides,
    load_settings,
    read_config_data,
    read_config_source,
    resolve_config_path,
)
from corrgrpo.trainer.config_rules import MOVED_KEYS, read_estimator_options, read_loss_options
from corrgrpo.trainer.config_sections import (
    DEFAULT_ENV_ID,
    LOSS_AGG_MODES,
    TRACKERS,
    AlgorithmConfig,
    Config,
    ModelConfig,
    OptimConfig,
    OptimizerConfig,
    RolloutConfig,
    RolloutServerConfig,
    RunConfig,
    TrainConfig,
)
from corrgrpo_envs.registry import import_env_modules, read_env_section
from corrgrpo_envs.settings import EnvOptions, EnvSection, EnvSettings
from corrgrpo_registry.settings import ConfigError, Range, build, num_field, validate, written

__all__ = [
    "Config",
    "ModelConfig",
    "AlgorithmConfig",
    "RolloutConfig",
    "RolloutServerConfig",
    "OptimizerConfig",
    "OptimConfig",
    "RunConfig",
    "TrainConfig",
    "ConfigError",
    "CONFIG_DIR",
    "DEFAULT_ENV_ID",
    "EnvOptions",
    "EnvSection",
    "EnvSettings",
    "LOSS_AGG_MODES",
    "MOVED_KEYS",
    "TRACKERS",
    "Range",
    "num_field",
    "load_config",
    "load_settings",
    "read_config_data",
    "read_config_source",
    "resolve_config_path",
    "config_from_dict",
    "apply_overrides",
    "config_to_dict",
    "import_env_modules",
    "read_env_section",
    "read_estimator_options",
    "read_loss_options",
]


def config_from_dict(data: dict[str, Any]) -> Config:
    """Build and validate a :class:`Config` from a plain mapping."""
    return validate(build(Config, data, moved=MOVED_KEYS))


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain data (for saving next to a run; :func:`config_from_dict` reads it
    back): the ``env:`` section and the options as written."""
    data = dataclasses.asdict(cfg)
    data["env"] = cfg.env.section()
    for name in ("estimator_options", "loss_options"):
        options = getattr(cfg.algorithm, name)
        data["algorithm"][name] = written(options) if dataclasses.is_dataclass(options) else dict(options)
    return data


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or the defaults when ``path`` is None) and apply overrides."""
    return load_settings(path, overrides, config_from_dict)
