"""``corrgrpo/ToolCall-v0``: answer a dialogue with tool calls and/or a reply, scored four ways.

Single-turn. The observation is the system prompt (tool list and answer
format) and the dialogue so far, with the tools' JSON schemas in ``tools``.
The action is an answer in the RLLA format (see
:mod:`corrgrpo_envs.toolcall.answer_format`); the reward vector is
``(function_name, parameter, values, format)`` in
``[-0.5, 0.5] x [-1, 1] x [-1.5, 1.5] x {0, 1}`` (see
:mod:`corrgrpo_envs.toolcall.rewards`). ``info["exact"]`` is the all-exact verdict: on a BFCL
task of a Python category BFCL's own (:mod:`corrgrpo_envs.toolcall.bfcl_verdict`), elsewhere
the three correctness rewards at their maxima. ``dataset=`` picks the tasks: the
built-in generator (default), RLLA-4K, the RLLA SFT file, API-Bank, BFCL, or
a list of these.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from corrgrpo_envs.core import MultiRewardEnv, StepOutcome
from corrgrpo_envs.metrics import EpisodeRecord
from corrgrpo_envs.tasks import Task, TaskSource
from corrgrpo_envs.toolcall.answer_format import render_answer
from corrgrpo_envs.toolcall.bfcl_verdict import bfcl_verdict
from corrgrpo_envs.toolcall.datasets import DATASETS
from corrgrpo_envs.toolcall.metrics import toolcall_metrics
from corrgrpo_envs.toolcall.prompts import PROMPT_FORMATS, house_messages
from corrgrpo_envs.toolcall.rewards import (
    REWARD_HIGH,
    REWARD_LOW,
    REWARD_NAMES,
    score_answer,
)
from corrgrpo_envs.toolcall.settings import REFERENCE_ANSWERS, ToolCallSettings

__all__ = ["ToolCallEnv", "toolcall_metrics", "load_tasks", "in_prompt_format", "REFERENCE_ANSWERS"]

_REFERENCE_THINK = "I should use the appropriate tools with the right parameters for the user's request."
_REPLY_THINK = "I should reply to the user directly."


def _bfcl_accepts(case: Mapping[str, Any], calls: list[dict[str, Any]] | None) -> bool:
    return bfcl_verdict(calls, case["category"], case["functions"], case["answer"])[0]


def _benchmark_verdict(task: Task) -> Callable[[list[dict[str, Any]] | None], bool] | None:
    """The verdict that decides ``exact`` for ``task``: BFCL's checker's rules for a BFCL task
    of a Python category, else none (the rewards at their maxima)."""
    case = task.get("bfcl")
    return functools.partial(_bfcl_accepts, case) if case else None


def load_tasks(
    dataset: str | Path | TaskSource | Sequence[str | Path] = "generated",
    format: str | None = None,
    split: str = "all",
    num_tasks: int = 1000,
    seed: int = 0,
    dataset_options: dict[str, Any] | None = None,
) -> TaskSource:
    """Load one data set, or several (a list, concatenated; each keeps its own train/eval split).

    ``num_tasks`` and ``seed`` go to the generator, ``dataset_options`` to the loader (for the
    generator: ``max_extra_tools``, ``prompt``; see :func:`~corrgrpo_envs.toolcall.generator.generate_task`).
    """
    if isinstance(dataset, (list, tuple)):
        if not dataset:
            raise ValueError("dataset list is empty")
        parts = [load_tasks(d, format, "all", num_tasks, seed, dataset_options) for d in dataset]
        split_of = {t.id: part.split_of(t) for part in parts for t in part}
        combined = TaskSource(
            [t for part in parts for t in part],
            name="+".join(part.name for part in parts),
            split_of=lambda t: split_of[t.id],
        )
        return combined.split(split)
    if isinstance(dataset, str) and dataset == "generated":
        return DATASETS.load(dataset, split=split, num_tasks=num_tasks, seed=seed, **(dataset_options or {}))
    return DATASETS.load(dataset, format=format, split=split, **(dataset_options or {}))


def _split_by_id(splits: Mapping[str, str], task: Task) -> str:
    return splits[task.id]


def in_prompt_format(tasks: TaskSource, prompt_format: str) -> TaskSource:
    """``tasks`` with their prompts in ``prompt_format`` (one of :data:`PROMPT_FORMATS`); ids,
    order and train/eval splits are unchanged."""
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"prompt_format must be one of {PROMPT_FORMATS}, got {prompt_format!r}")
    if prompt_format == "source":
        return tasks
    restyled = [Task(t.id, {**t.data, "messages": house_messages(t["messages"], t["tools"])}) for t in tasks]
    splits = {t.id: tasks.split_of(t) for t in tasks}
    return TaskSource(restyled, name=tasks.name, split_of=functools.partial(_split_by_id, splits))


class ToolCallEnv(MultiRewardEnv):
    """Single-turn tool calling with the four RLLA rewards.

    Its keyword arguments are the fields of :class:`~corrgrpo_envs.toolcall.settings.ToolCallSettings`
    (names, defaults and allowed values declared there once: the data set, the split, the rule
    set, the prompt format, the reference answers); a ``ToolCallSettings`` object may be given
    instead (``settings``), keyword arguments then go over it.
    """

    def __init__(self, settings: ToolCallSettings | None = None, **kwargs: Any):
        s = ToolCallSettings.read(settings, kwargs)
        self.rules = s.rules
        self.reference_answers = s.reference_answers
        tasks = load_tasks(s.dataset, s.format, s.split, s.num_tasks, s.seed, s.dataset_options)
        super().__init__(
            tasks=in_prompt_format(tasks, s.prompt_format),
            reward_names=REWARD_NAMES,
            reward_low=REWARD_LOW,
            reward_high=REWARD_HIGH,
            reward_weights=s.reward_weights,
            max_action_chars=s.max_action_chars,
            render_mode=s.render_mode,
        )

    def _observe_task(self, task: Task) -> dict:
        return {
            "messages": [dict(m) for m in task["messages"]],
            "tools": [dict(t) for t in task["tools"]],
        }

    def _act(self, action: str) -> StepOutcome:
        assert self.task is not None
        expected = self.task["expected_calls"]
        score = score_answer(action, expected, self.task["expects_response"], self.rules,
                             ordered=not self.task.get("calls_in_any_order", False),
                             benchmark=_benchmark_verdict(self.task))
        info: dict[str, Any] = {
            "dataset": self.task["dataset"],
            "expects_calls": bool(expected),
            "exact": score.exact,
            "num_predicted_calls": score.num_predicted_calls,
        }
        if score.error:
            info["error"] = score.error
        return StepOutcome(rewards=score.rewards, terminated=True, info=info)

    def reference_action(self, task_id: str) -> list[str]:
        """The ground-truth answer as the episode's one message: a short ``<think>``, the expected
        calls and reply; with ``reference_answers="dataset"`` the data set's own answer where it
        has one. It scores the maxima."""
        task = self.tasks.get(task_id)
        if self.reference_answers == "dataset" and task.get("ground_truth"):
            return [task["ground_truth"]]
        calls = task["expected_calls"]
        response = None
        if task["expects_response"]:
            response = task.get("response") or "Here is my answer."
        return [render_answer(calls, response, think=_REFERENCE_THINK if calls else _REPLY_THINK)]

    def metrics(self, records: Sequence[EpisodeRecord]) -> dict[str, float]:
        """All-exact accuracy and the rewards in percent, overall and per data set
        (:func:`corrgrpo_envs.toolcall.metrics.toolcall_metrics`)."""
        return toolcall_metrics(records)
