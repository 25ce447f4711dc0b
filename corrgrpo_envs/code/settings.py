"""The settings of ``corrgrpo/Code-v0`` (its ``env:`` keys and keyword arguments)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corrgrpo_envs.code.judge_pool import JUDGE_CPU_SECONDS
from corrgrpo_envs.settings import EnvSettings
from corrgrpo_registry.settings import Range, num_field
from corrgrpo_sandbox import Sandbox

__all__ = ["EFFICIENCY_MODES", "CodeSettings"]

#: How the efficiency reward gets each reference's runtime: ``lazy`` (measured on first use and
#: cached), ``cached`` (precomputed times only, else 0) or ``off``.
EFFICIENCY_MODES = ("lazy", "cached", "off")

_POSITIVE = Range(low=0, low_open=True)


@dataclass
class CodeSettings(EnvSettings):
    """Keyword arguments of :class:`~corrgrpo_envs.code.env.CodeEnv`."""

    dataset: str | Path = "humaneval"
    """``humaneval``, a LeetCodeDataset JSONL(.gz) path, or any JSONL with ``prompt``, ``test``,
    ``entry_point`` and a reference."""
    format: str | None = None
    """Force a file format (``leetcode`` or ``jsonl``) instead of detecting it."""
    split: Literal["train", "eval", "all"] = "all"
    """The task split (the trainer's ``train.split`` sets it in a run)."""
    backend: str | Sandbox = "auto"
    """Sandbox backend: ``auto`` (bwrap when it works, else process), ``process``, ``bwrap`` or
    ``docker``; from Python also a ready ``Sandbox`` (used as given)."""
    timeout: float = num_field(5.0, _POSITIVE)
    """Wall seconds per program (paper: 5)."""
    memory_mb: int = num_field(1024, Range(low=1))
    """Address-space limit per program in MiB (paper: 1024)."""
    workers: int | None = num_field(None, Range(low=1))
    """Parallel programs when scoring many answers (default: one per CPU)."""
    efficiency: Literal[EFFICIENCY_MODES] = "lazy"
    """``lazy`` (measure a reference's runtime on first use and cache it), ``cached`` (only
    precomputed times, else 0) or ``off``."""
    reference_runs: int = num_field(3, Range(low=1))
    """Runs averaged per reference time."""
    reference_cache_dir: str | Path | None = None
    """Cache root of reference times (default ``$CORRGRPO_CODE_REFS`` or
    ``~/.cache/corrgrpo/code_refs``)."""
    reward_weights: list[float] | None = num_field(None, length=7)
    """Weights of the seven rewards (default: the paper's; the trainer's
    ``algorithm.reward_weights`` sets them in a run)."""
    system_prompt: str | None = None
    """A system message put before the problem."""
    judge_seconds: float = num_field(JUDGE_CPU_SECONDS, _POSITIVE)
    """CPU seconds the host-side verdict of one answer may take; past it the answer scores
    ``correct = 0`` (status ``judge:bound``)."""
