"""The toy domain's rewards, as pure functions of the answer text.

Two reward sets:

* ``default``: ``digits`` (digit characters, capped at ``max_digits``),
  ``has_{letter}`` (the text contains the target letter) and
  ``word_with_{letter}`` (a word of two or more letters contains it). The two
  letter rewards nearly coincide on a random-init model's text; the digit
  count's spread is about ten times theirs.
* ``anchor``: the TRL anchor setting's three rewards, ``digits`` (uncapped),
  ``has_a`` and ``has_b``: two different, weakly correlated letter signals.
"""

from __future__ import annotations

import re

__all__ = [
    "REWARD_NAMES",
    "ANCHOR_REWARD_NAMES",
    "REWARD_SETS",
    "reward_names",
    "score_text",
    "score_anchor_text",
]

#: The reward names of the default set with the default letter ``"a"``.
REWARD_NAMES: tuple[str, ...] = ("digits", "has_a", "word_with_a")
#: The reward names of the ``anchor`` set.
ANCHOR_REWARD_NAMES: tuple[str, ...] = ("digits", "has_a", "has_b")
#: The reward sets the env offers.
REWARD_SETS = ("default", "anchor")

_DIGITS = frozenset("0123456789")


def reward_names(letter: str = "a", reward_set: str = "default") -> tuple[str, ...]:
    """The component names of ``reward_set`` for the target ``letter`` (the anchor set has none)."""
    if reward_set == "anchor":
        return ANCHOR_REWARD_NAMES
    if reward_set != "default":
        raise ValueError(f"rewards must be one of {REWARD_SETS}, got {reward_set!r}")
    return ("digits", f"has_{letter}", f"word_with_{letter}")


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
