"""Gymnasium spaces for conversations and free text.

``gymnasium.spaces.Text`` rejects characters outside its charset and has a
fixed maximum length, which makes it useless for model outputs. These spaces
accept any Unicode text; ``Conversation`` checks the chat-message structure.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["UnicodeText", "Conversation"]

_SAMPLE_ALPHABET = list("abcdefghijklmnopqrstuvwxyz0123456789 \n{}[]():,.\"'_-+=<>/")


class UnicodeText(spaces.Space[str]):
    """Any Python ``str`` of at most ``max_length`` characters (any Unicode code point)."""

    def __init__(self, max_length: int = 1 << 24, seed: int | np.random.Generator | None = None):
        self.max_length = int(max_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(0, 64))
        return "".join(self.np_random.choice(_SAMPLE_ALPHABET, size=n).tolist())

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnicodeText) and other.max_length == self.max_length


class Conversation(spaces.Space[dict]):
    """A chat: ``{"messages": [{"role": str, "content": str, ...}], "tools": [dict, ...]}``.

    Messages may carry extra keys (``tool_calls``, ``name``, ``tool_call_id``);
    ``tools`` holds JSON schemas of the callable tools (possibly empty).
    """

    ROLES = ("system", "user", "assistant", "tool")

    def __init__(self, seed: int | np.random.Generator | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> dict:
        text = UnicodeText(seed=int(self.np_random.integers(1 << 31))).sample()
        return {"messages": [{"role": "user", "content": text}], "tools": []}

    def contains(self, x: Any) -> bool:
        if not isinstance(x, dict) or not isinstance(x.get("messages"), list):
            return False
        if not isinstance(x.get("tools", []), list):
            return False
        for m in x["messages"]:
            if not isinstance(m, dict) or m.get("role") not in self.ROLES:
                return False
            if not isinstance(m.get("content"), str):
                return False
        return all(isinstance(t, dict) for t in x.get("tools", []))

    def __repr__(self) -> str:
        return "Conversation()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Conversation)
