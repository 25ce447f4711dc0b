"""The settings of ``corrgrpo/ToolCall-v0`` (its ``env:`` keys and keyword arguments)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from corrgrpo_envs.settings import EnvSettings
from corrgrpo_envs.tasks import TaskSource
from corrgrpo_envs.toolcall.prompts import PROMPT_FORMATS
from corrgrpo_envs.toolcall.rewards import RULE_SETS
from corrgrpo_registry.settings import Range, num_field

__all__ = ["REFERENCE_ANSWERS", "ToolCallSettings"]

#: ``short``: a one-line ``<think>`` and the expected calls/reply (every data set has them);
#: ``dataset``: the data set's own ground-truth answer where it ships one (RLLA SFT's reasoning
#: and calls), else ``short``.
REFERENCE_ANSWERS = ("short", "dataset")


@dataclass
class ToolCallSettings(EnvSettings):
    """Keyword arguments of :class:`~corrgrpo_envs.toolcall.env.ToolCallEnv`."""

    dataset: str | Path | TaskSource | list[str | Path | TaskSource] = "generated"
    """``generated``, ``rlla_test``, ``rlla_sft``, ``api_bank``, ``api_bank_l1`` ..
    ``api_bank_l3``, a path (RLLA ``.jsonl``/``.parquet``, RLLA SFT ``.json``, API-Bank
    ``.json``, a BFCL data folder or question file), or a list of these."""
    format: str | None = None
    """The file format when it cannot be detected (``rlla_jsonl``, ``rlla_parquet``,
    ``rlla_sft``, ``api_bank``, ``bfcl``)."""
    split: Literal["train", "eval", "all"] = "all"
    """The task split (the trainer's ``train.split`` sets it in a run)."""
    num_tasks: int = num_field(1000, Range(low=1))
    """Size of the generated data set."""
    seed: int = num_field(0, Range(low=0))
    """Seed of the generated data set."""
    dataset_options: dict[str, Any] | None = None
    """Extra loader options (e.g. ``{categories: [...]}`` for BFCL)."""
    reward_weights: list[float] | None = num_field(None, length=4)
    """Weights of the four rewards (default all 1; the trainer's ``algorithm.reward_weights``
    sets them in a run)."""
    rules: Literal[RULE_SETS] = "paper"
    """The reward rule set: ``paper`` (RLLA / ToolRL's rules) or ``strict`` (unmatched predicted
    calls cost reward, so hedging with several candidate calls does not pay)."""
    prompt_format: Literal[PROMPT_FORMATS] = "source"
    """``source`` (each data set's prompts as shipped) or ``house`` (every data set in one RLLA
    layout): train and evaluate in the same words."""
    reference_answers: Literal[REFERENCE_ANSWERS] = "short"
    """What the reference answer (the SFT target) is: ``short`` (a one-line ``<think>`` and the
    expected calls or reply) or ``dataset`` (the data set's own answer where it ships one, else
    ``short``)."""
