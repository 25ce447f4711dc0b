"""``corrgrpo/Regime-v0``: the toy domain's prompts scored by reward sets built to separate estimators.

Each *regime* is a set of text rewards that realises one situation in which multi-reward
advantage estimators differ by design. Every reward is a pure function of the answer text and
is dense enough at the first step of a random-init tiny model (measured on 512 answers of the
``tiny-anchor`` model at 24 new tokens; the rates below) for a run of a few dozen steps on two
CPU cores to move it:

========== ============================================== =========================================
regime     rewards (range)                                what a good estimator does there
========== ============================================== =========================================
scale      ``digits`` (digit count x 100/32, [0, 100]),   raises the two 0/1 rewards too: a 100x
           ``has_a``, ``has_b`` (0/1)                     larger range must not drown them
redundant  ``has_a``, ``word_with_a`` (0/1, correlation   raises ``has_b`` as much as the letter
           0.99 at step 1), ``has_b`` (0/1)               ``a``: a duplicated signal must not count
                                                          twice
tradeoff   ``letters`` and ``digits`` (shares of the      raises the total share without unstable
           answer's characters, [0, 1]; correlation       steps: groups whose two rewards cancel
           -0.83 at step 1)                               must not blow up
sparse     ``has_a`` (0/1, 67 % at step 1), ``digit_run``  learns the rare reward without giving up
           (5 digits in a row, 0/1, 4.7 % at step 1)      the dense one
mixed      seven rewards of mixed scales and shapes:      moves every reward, none at the others'
           ``digits`` [0, 32], ``spaces`` [0, 16],         expense (the code domain's situation)
           ``has_a``, ``word_with_a``, ``has_b``,
           ``digit_run`` (0/1), ``vowels`` (share, [0, 1])
========== ============================================== =========================================

The regimes are options of one env, so every regime shares the prompts (``write a short
string: {k}``), the task split and the reference answer of the toy domain.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from corrgrpo_envs.core import MultiRewardEnv, StepOutcome
from corrgrpo_envs.metrics import EpisodeRecord
from corrgrpo_envs.tasks import Task
from corrgrpo_envs.toy.datasets import DATASETS
from corrgrpo_envs.toy.metrics import toy_metrics
from corrgrpo_envs.toy.settings import RegimeSettings

__all__ = ["REGIMES", "Regime", "RegimeEnv", "RewardComponent"]

_DIGITS = frozenset("0123456789")
_VOWELS = frozenset("aeiou")
_WORD = re.compile(r"[^\W\d_]+")
_DIGIT_RUN = re.compile(r"[0-9]{5}")


def _digit_count(text: str, cap: int = 32) -> float:
    return float(min(cap, sum(ch in _DIGITS for ch in text)))


def _share(text: str, keep: Callable[[str], bool]) -> float:
    return sum(1 for ch in text if keep(ch)) / len(text) if text else 0.0


def _word_with(letter: str) -> Callable[[str], float]:
    return lambda text: float(any(len(w) >= 2 and letter in w for w in _WORD.findall(text)))


def _has(letter: str) -> Callable[[str], float]:
    return lambda text: float(letter in text)


@dataclass(frozen=True)
class RewardComponent:
    """One reward of a regime: its name, its range ``[0, high]`` and its score of a text."""

    name: str
    high: float
    score: Callable[[str], float]


@dataclass(frozen=True)
class Regime:
    """A named reward set and what a good estimator should do with it."""

    name: str
    components: tuple[RewardComponent, ...]
    goal: str

    @property
    def reward_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.components)


_HAS_A = RewardComponent("has_a", 1.0, _has("a"))
_HAS_B = RewardComponent("has_b", 1.0, _has("b"))
_WORD_WITH_A = RewardComponent("word_with_a", 1.0, _word_with("a"))
_DIGIT_RUN_5 = RewardComponent("digit_run", 1.0, lambda t: float(_DIGIT_RUN.search(t) is not None))

#: The regimes by name (``regime:`` of ``corrgrpo/Regime-v0``).
REGIMES: dict[str, Regime] = {
    r.name: r
    for r in (
        Regime("scale", (RewardComponent("digits", 100.0, lambda t: _digit_count(t) * 100.0 / 32.0),
                         _HAS_A, _HAS_B),
               "raise has_a and has_b too: a reward with a 100x larger range must not drown them"),
        Regime("redundant", (_HAS_A, _WORD_WITH_A, _HAS_B),
               "raise has_b as much as the letter a: a duplicated signal must not count twice"),
        Regime("tradeoff", (RewardComponent("letters", 1.0, lambda t: _share(t, str.isalpha)),
                            RewardComponent("digits", 1.0, lambda t: _share(t, _DIGITS.__contains__))),
               "raise the total share without unstable steps where the two rewards cancel"),
        Regime("sparse", (_HAS_A, _DIGIT_RUN_5),
               "learn the rare all-or-nothing reward without giving up the dense one"),
        Regime("mixed", (RewardComponent("digits", 32.0, _digit_count),
                         RewardComponent("spaces", 16.0, lambda t: float(min(16, t.count(" ")))),
                         _HAS_A, _WORD_WITH_A, _HAS_B, _DIGIT_RUN_5,
                         RewardComponent("vowels", 1.0, lambda t: _share(t, _VOWELS.__contains__))),
               "move every reward, none at the others' expense"),
    )
}


class RegimeEnv(MultiRewardEnv):
    """Single-turn toy env whose rewards are one of :data:`REGIMES`.

    Its keyword arguments are the fields of :class:`~corrgrpo_envs.toy.settings.RegimeSettings`
    (declared there once); a ``RegimeSettings`` object may be given instead (``settings``).
    """

    def __init__(self, settings: RegimeSettings | None = None, **kwargs: Any):
        s = RegimeSettings.read(settings, kwargs)
        if s.regime not in REGIMES:
            raise ValueError(f"regime must be one of {sorted(REGIMES)}, got {s.regime!r}")
        self.regime = REGIMES[s.regime]
        options = {"num_tasks": s.num_tasks, "prompt_template": s.prompt_template}
        tasks = DATASETS.load(
            s.dataset, format=s.format, split=s.split, **(options if s.dataset == "short-strings" else {})
        )
        super().__init__(
            tasks=tasks,
            reward_names=self.regime.reward_names,
            reward_low=tuple(0.0 for _ in self.regime.components),
            reward_high=tuple(c.high for c in self.regime.components),
            reward_weights=s.reward_weights,
            max_action_chars=s.max_action_chars,
            render_mode=s.render_mode,
        )

    def _observe_task(self, task: Task) -> dict:
        return {"messages": [{"role": "user", "content": task["prompt"]}], "tools": []}

    def _act(self, action: str) -> StepOutcome:
        values = {c.name: float(np.float32(c.score(action))) for c in self.regime.components}
        return StepOutcome(rewards=values, terminated=True)

    def reference_action(self, task_id: str) -> list[str]:
        """A good answer for every regime: words with ``a`` and ``b``, five digits and more."""
        self.tasks.get(task_id)  # unknown ids raise KeyError like every domain
        return ["a banana abacus bab 0123456789"]

    def metrics(self, records: Sequence[EpisodeRecord]) -> dict[str, float]:
        """Mean of each component over episodes, and the mean weighted total (``total``)."""
        return toy_metrics(records, self.reward_names, self.reward_weights)
