"""``corrgrpo sft``'s configuration: its sections, their settings and how a YAML file is read.

Apart from :mod:`corrgrpo.trainer.sft` (torch, transformers), so that a config is read and checked,
and a bad one reported in one line, before either is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from corrgrpo.trainer.config import (
    ConfigError,
    ModelConfig,
    OptimizerConfig,
    RunConfig,
    load_settings,
)
from corrgrpo_envs.settings import EnvSection
from corrgrpo_registry.settings import Range, build, num_field, read_field, validate

__all__ = [
    "SFTConfig",
    "SFTDataConfig",
    "SFTTrainConfig",
    "SFT_MOVED_KEYS",
    "load_sft_config",
    "sft_config_from_dict",
]


@dataclass
class SFTDataConfig:
    source: Literal["env", "file"] = "env"
    """``env``: the reference answers of the ``env`` section's tasks, played through the env;
    ``file``: the conversations in ``data.files``."""
    train_split: Literal["train", "eval", "all"] = "train"
    """Env split to learn from (``source: env``)."""
    eval_split: Literal["train", "eval", "all"] | None = "eval"
    """Env split for the held-out loss (``source: env``); null: hold out ``eval_fraction`` of
    the training examples instead."""
    files: list[str] = field(default_factory=list)
    """JSON / JSON-lines files of conversations (``source: file``): OpenAI-style
    ``{messages, tools}`` records or RLLA SFT ``{instruction, input, output}`` records."""
    eval_files: list[str] = field(default_factory=list)
    """Files for the held-out loss (``source: file``); empty: hold out ``eval_fraction``."""
    eval_fraction: float = num_field(0.05, Range(low=0, high=1, high_open=True))
    """Share of the examples held out for evaluation when there is no eval split or file."""
    max_examples: int | None = num_field(None, Range(low=1, note="(or null: all)"))
    """Use at most this many training examples (the first ones)."""
    max_eval_examples: int | None = num_field(256, Range(low=1, note="(or null: all)"))
    """Evaluate on at most this many held-out examples."""
    max_length: int | None = num_field(2048, Range(low=1, note="(or null: no cut)"))
    """Cut examples longer than this many tokens (the count is logged)."""
    max_turns: int = num_field(8, Range(low=1))
    """Upper bound on assistant turns when playing multi-turn envs (``source: env``)."""


@dataclass
class SFTTrainConfig(RunConfig):
    """``corrgrpo sft``'s ``train``: the shared run settings and how batches are formed."""

    batch_size: int = num_field(16, Range(low=1))
    """Examples per optimizer step, over all processes (must divide by the number of processes)."""
    micro_batch_tokens: int = num_field(4096, Range(low=1))
    """Most tokens per forward pass on one process, padding included (an example longer than
    this gets a pass of its own); gradient accumulation covers the rest of the batch."""
    packing: Literal["auto", "packed", "padded"] = "auto"
    """``packed``: examples concatenated padding-free in one row, position ids restarting at each
    (attention stays inside each example; cheap with FlashAttention's variable-length kernels,
    quadratic in the row length otherwise); ``padded``: length-bucketed rows (longest first,
    little padding); ``auto``: packed under FlashAttention, padded otherwise."""
    eval_every: int = num_field(0, Range(low=0))
    """Evaluate every N steps (0: before the first and after the last step only)."""
    torch_threads: int | None = num_field(None, Range(low=1, note="(or null: automatic)"))
    """Torch threads per process (default: this process's share of the cores; see
    ``corrgrpo.trainer.threads``)."""


@dataclass
class SFTConfig:
    env: EnvSection | None = read_field(lambda value, key, moved: _read_env(value, moved), lambda: None)
    """The environment (``source: env``): ``id`` plus its keyword arguments, as in ``corrgrpo train``
    (read into the env's settings class)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    optim: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=2e-5))
    train: SFTTrainConfig = field(default_factory=lambda: SFTTrainConfig(steps=100))
    name: str = "sft"
    """Name of the run (default: the config file's stem)."""

    def check_rules(self) -> None:
        """The rules that relate settings (run by :func:`corrgrpo_registry.settings.validate`)."""
        if self.data.source == "env" and self.env is None:
            raise ConfigError("env: needs an 'id' key (data.source=env)", "env")
        if self.data.source == "file" and not self.data.files:
            raise ConfigError("data.files: [] is not allowed with data.source=file; allowed: one or more "
                              "JSON / JSON-lines files", "data.files")


#: ``env`` keys that belong to the ``data`` section in sft.
SFT_MOVED_KEYS: dict[str, str] = {
    "env.split": "data.train_split / data.eval_split",
    "env.max_turns": "data.max_turns",
}


def _read_env(value: Any, moved: dict[str, str]) -> EnvSection | None:
    """The ``env:`` section as its env's settings (None without an ``id``: ``data.source: file``)."""
    from corrgrpo_envs.registry import read_env_section

    return read_env_section(value, moved)


def sft_config_from_dict(data: dict[str, Any]) -> SFTConfig:
    """Build and validate an :class:`SFTConfig` from a plain mapping."""
    return validate(build(SFTConfig, data, moved=SFT_MOVED_KEYS))


def load_sft_config(path: str | Path | None, overrides: list[str] | None = None) -> SFTConfig:
    """Read a YAML config (or the defaults when ``path`` is None) and apply dotted overrides."""
    return load_settings(path, overrides, sft_config_from_dict, default_name="sft")
