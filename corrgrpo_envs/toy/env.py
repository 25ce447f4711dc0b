"""``corrgrpo/ScaleDominance-v0``: write a short string, get three rewards of very different scales.

The prompt is ``"write a short string: {k}"``; the answer is scored by

* ``digits``: the number of digit characters, capped at ``max_digits`` (range
  ``[0, 32]`` by default). Large range, weakly correlated with the others.
* ``has_a``: 1 if the text contains the target letter (default ``"a"``).
* ``word_with_a``: 1 if the text contains a word of at least two letters that
  includes the target letter.

On the text a randomly initialised tiny model writes, ``has_a`` and
``word_with_a`` are almost the same signal (correlation about 0.99: a lone
target letter is rare), and both correlate only about 0.1 with ``digits``,
whose standard deviation is about ten times theirs. That is the shape of the
paper's worked example: with plain GRPO the digit count swamps the
normalisation, and the two letter rewards count twice. Every reward is dense
(a random-init model already scores about 8 digits and hits the letters half
the time), so a ~0.5M-parameter model learns all three in a few dozen steps.

``scales`` multiplies each component (and its range); ``scales="unit"`` puts
every component in ``[0, 1]`` (the shared-range setting).

``rewards="anchor"`` swaps in exactly the three rewards of the TRL anchor
setting (``../shared/anchors``): ``digits`` (the number of digit characters,
uncapped), ``has_a`` and ``has_b`` (1 if the text contains that letter). There
the two letter rewards are two different, weakly correlated signals.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from corrgrpo_envs.core import MAX_ACTION_CHARS, MultiRewardEnv, StepOutcome
from corrgrpo_envs.tasks import DatasetRegistry, Task, TaskSource

__all__ = ["ScaleDominanceEnv", "score_text", "score_anchor_text", "DATASETS", "PROMPT_TEMPLATE", "REWARD_SETS"]

PROMPT_TEMPLATE = "write a short string: {k}"
_DIGITS = frozenset("0123456789")
#: The reward sets the env offers: ``default`` (capped digits, two letter rewards that nearly
#: coincide) and ``anchor`` (the TRL anchor's uncapped digits, has 'a', has 'b').
REWARD_SETS = ("default", "anchor")

DATASETS = DatasetRegistry("toy")


def _prompt_tasks(prompts: Sequence[tuple[str, str]], name: str) -> TaskSource:
    return TaskSource([Task(tid, {"prompt": p}) for tid, p in prompts], name=name)


@DATASETS.builtin("short-strings", "num_tasks prompts 'write a short string: {k}', k = 0..num_tasks-1")
def _short_strings(num_tasks: int = 64, prompt_template: str = PROMPT_TEMPLATE) -> TaskSource:
    if int(num_tasks) < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    return _prompt_tasks(
        [(f"prompt-{k:04d}", prompt_template.format(k=k)) for k in range(int(num_tasks))],
        name="short-strings",
    )


@DATASETS.file_format("txt", detect=lambda p: p.suffix == ".txt", description="one prompt per line")
def _txt(path: Path, **_: Any) -> TaskSource:
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    return _prompt_tasks(
        [(f"prompt-{i:04d}", ln) for i, ln in enumerate(x for x in lines if x)], name=path.stem
    )


@DATASETS.file_format(
    "jsonl", detect=lambda p: p.suffix == ".jsonl", description='{"id": ..., "prompt": ...} per line'
)
def _jsonl(path: Path, **_: Any) -> TaskSource:
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            obj = json.loads(line)
            if not isinstance(obj, dict) or "prompt" not in obj:
                raise ValueError(f"{path}:{i + 1}: expected an object with a 'prompt' key")
            rows.append((str(obj.get("id", f"prompt-{i:04d}")), str(obj["prompt"])))
    return _prompt_tasks(rows, name=path.stem)


def score_text(text: str, letter: str = "a", max_digits: int = 32) -> tuple[float, float, float]:
    """The three unscaled components ``(digits, has_letter, word_with_letter)`` of ``text``."""
    digits = min(max_digits, sum(ch in _DIGITS for ch in text))
    has_letter = letter in text
    word_with_letter = any(
        len(w) >= 2 and letter in w for w in re.findall(r"[^\W\d_]+", text)
    )
    return float(digits), float(has_letter), float(word_with_letter)


def score_anchor_text(text: str) -> tuple[float, float, float]:
    """The TRL anchor's three components ``(digits, has_a, has_b)``: the digit count is uncapped."""
    return float(sum(ch in _DIGITS for ch in text)), float("a" in text), float("b" in text)


class ScaleDominanceEnv(MultiRewardEnv):
    """Single-turn toy env with one large-range and two strongly correlated 0/1 rewards.

    Args:
        num_tasks: number of built-in prompts (ids ``prompt-0000`` ...).
        letter: the target letter of the two 0/1 rewards.
        max_digits: cap (and upper bound) of the digit count.
        scales: a factor per component, or ``"unit"`` for every range ``[0, 1]``
            (``"unit"`` needs the capped ``default`` reward set).
        rewards: ``"default"`` or ``"anchor"`` (the TRL anchor's ``digits`` uncapped,
            ``has_a``, ``has_b``; ``letter`` and ``max_digits`` do not apply to it).
        reward_weights: weights of the components (default all 1).
        prompt_template: the built-in prompt, with ``{k}`` for the task number.
        dataset, format, split: where the prompts come from (``"short-strings"``,
            a ``.txt`` file with one prompt per line, or a ``.jsonl`` of
            ``{"id", "prompt"}``) and which split to use.
    """

    def __init__(
        self,
        num_tasks: int = 64,
        letter: str = "a",
        max_digits: int = 32,
        scales: Sequence[float] | str = (1.0, 1.0, 1.0),
        reward_weights: Sequence[float] | None = None,
        prompt_template: str = PROMPT_TEMPLATE,
        dataset: str | Path | TaskSource = "short-strings",
        format: str | None = None,
        split: str = "all",
        rewards: str = "default",
        **kwargs: Any,
    ):
        if rewards not in REWARD_SETS:
            raise ValueError(f"rewards must be one of {REWARD_SETS}, got {rewards!r}")
        self.reward_set = rewards
        if not isinstance(letter, str) or len(letter) != 1 or not letter.isalpha():
            raise ValueError(f"letter must be a single alphabetic character, got {letter!r}")
        if int(max_digits) < 1:
            raise ValueError(f"max_digits must be >= 1, got {max_digits}")
        self.letter = letter
        self.max_digits = int(max_digits)
        if isinstance(scales, str):
            if scales != "unit":
                raise ValueError(f"scales must be 3 numbers or 'unit', got {scales!r}")
            if rewards == "anchor":
                raise ValueError("scales='unit' needs a capped digit reward; rewards='anchor' is uncapped")
            scales = (1.0 / self.max_digits, 1.0, 1.0)
        self.scales = np.asarray(scales, dtype=np.float64)
        if self.scales.shape != (3,) or not np.all(np.isfinite(self.scales)) or np.any(self.scales <= 0):
            raise ValueError(f"scales must be 3 positive numbers, got {scales!r}")
        options = {"num_tasks": num_tasks, "prompt_template": prompt_template}
        tasks = DATASETS.load(
            dataset, format=format, split=split, **(options if dataset == "short-strings" else {})
        )
        if rewards == "anchor":
            # uncapped, but an accepted action has at most max_action_chars characters
            digit_high = float(kwargs.get("max_action_chars", MAX_ACTION_CHARS))
            names: tuple[str, ...] = ("digits", "has_a", "has_b")
        else:
            digit_high = float(self.max_digits)
            names = ("digits", f"has_{letter}", f"word_with_{letter}")
        highs = self.scales * np.array([digit_high, 1.0, 1.0])
        super().__init__(
            tasks=tasks,
            reward_names=names,
            reward_low=(0.0, 0.0, 0.0),
            reward_high=tuple(float(h) for h in highs),
            reward_weights=reward_weights,
            **kwargs,
        )

    def _observe_task(self, task: Task) -> dict:
        return {"messages": [{"role": "user", "content": task["prompt"]}], "tools": []}

    def _act(self, action: str) -> StepOutcome:
        if self.reward_set == "anchor":
            raw = score_anchor_text(action)
        else:
            raw = score_text(action, self.letter, self.max_digits)
        values = [float(np.float32(r * s)) for r, s in zip(raw, self.scales)]
        return StepOutcome(rewards=dict(zip(self.reward_names, values)), terminated=True)

    def reference_action(self, task_id: str) -> str:
        """A best answer: a word with the target letter, then ``max_digits`` digits."""
        self.tasks.get(task_id)  # unknown ids raise KeyError like every domain
        digits = ("0123456789" * (self.max_digits // 10 + 1))[: self.max_digits]
        if self.reward_set == "anchor":
            return f"ab {digits}"  # digits are uncapped there: any longer string of digits scores more
        return f"{self.letter}{self.letter} {digits}"

    def metrics(self, results: list[dict]) -> dict[str, float]:
        """Mean of each component over episodes, and the mean weighted total (``total``)."""
        if not results:
            return {}
        table = np.array(
            [[float(r["reward_components"][n]) for n in self.reward_names] for r in results]
        )
        out = {n: float(v) for n, v in zip(self.reward_names, table.mean(axis=0))}
        out["total"] = float((table @ self.reward_weights.astype(np.float64)).mean())
        return out
