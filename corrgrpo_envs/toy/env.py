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
setting: ``digits`` (the number of digit characters,
uncapped), ``has_a`` and ``has_b`` (1 if the text contains that letter). There
the two letter rewards are two different, weakly correlated signals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from corrgrpo_envs.core import MultiRewardEnv, StepOutcome
from corrgrpo_envs.metrics import EpisodeRecord
from corrgrpo_envs.tasks import Task
from corrgrpo_envs.toy.datasets import DATASETS, PROMPT_TEMPLATE
from corrgrpo_envs.toy.metrics import toy_metrics
from corrgrpo_envs.toy.rewards import REWARD_SETS, reward_names, score_anchor_text, score_text
from corrgrpo_envs.toy.settings import ToySettings

__all__ = ["ScaleDominanceEnv", "score_text", "score_anchor_text", "DATASETS", "PROMPT_TEMPLATE", "REWARD_SETS"]


class ScaleDominanceEnv(MultiRewardEnv):
    """Single-turn toy env with one large-range and two strongly correlated 0/1 rewards.

    Its keyword arguments are the fields of :class:`~corrgrpo_envs.toy.settings.ToySettings`
    (names, defaults and allowed values declared there once); a ``ToySettings`` object may be
    given instead (``settings``), keyword arguments then go over it.
    """

    def __init__(self, settings: ToySettings | None = None, **kwargs: Any):
        s = ToySettings.read(settings, kwargs)
        self.reward_set = s.rewards
        if len(s.letter) != 1 or not s.letter.isalpha():
            raise ValueError(f"letter must be a single alphabetic character, got {s.letter!r}")
        self.letter = s.letter
        self.max_digits = s.max_digits
        scales: Any = s.scales
        if scales == "unit":
            if s.rewards == "anchor":
                raise ValueError("scales='unit' needs a capped digit reward; rewards='anchor' is uncapped")
            scales = (1.0 / self.max_digits, 1.0, 1.0)
        self.scales = np.asarray(scales, dtype=np.float64)
        if self.scales.shape != (3,) or not np.all(np.isfinite(self.scales)) or np.any(self.scales <= 0):
            raise ValueError(f"scales must be 3 positive numbers, got {scales!r}")
        options = {"num_tasks": s.num_tasks, "prompt_template": s.prompt_template}
        tasks = DATASETS.load(
            s.dataset, format=s.format, split=s.split, **(options if s.dataset == "short-strings" else {})
        )
        names = reward_names(s.letter, s.rewards)
        # anchor: uncapped, but an accepted action has at most max_action_chars characters
        digit_high = float(s.max_action_chars if s.rewards == "anchor" else self.max_digits)
        highs = self.scales * np.array([digit_high, 1.0, 1.0])
        super().__init__(
            tasks=tasks,
            reward_names=names,
            reward_low=(0.0, 0.0, 0.0),
            reward_high=tuple(float(h) for h in highs),
            reward_weights=s.reward_weights,
            max_action_chars=s.max_action_chars,
            render_mode=s.render_mode,
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

    def reference_action(self, task_id: str) -> list[str]:
        """A best answer, as the episode's one message: a word with the target letter, then digits."""
        self.tasks.get(task_id)  # unknown ids raise KeyError like every domain
        digits = ("0123456789" * (self.max_digits // 10 + 1))[: self.max_digits]
        if self.reward_set == "anchor":
            return [f"ab {digits}"]  # digits are uncapped there: any longer string of digits scores more
        return [f"{self.letter}{self.letter} {digits}"]

    def metrics(self, records: Sequence[EpisodeRecord]) -> dict[str, float]:
        """Mean of each component over episodes, and the mean weighted total (``total``)."""
        return toy_metrics(records, self.reward_names, self.reward_weights)
