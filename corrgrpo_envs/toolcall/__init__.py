"""The tool-calling domain: ``corrgrpo/ToolCall-v0`` (RLLA-4K / ToolRL rewards)."""

from corrgrpo_envs.toolcall.answer_format import ParsedAnswer, parse_answer, render_answer
from corrgrpo_envs.toolcall.rewards import REWARD_HIGH, REWARD_LOW, REWARD_NAMES, score_answer

__all__ = [
    "ParsedAnswer",
    "parse_answer",
    "render_answer",
    "score_answer",
    "REWARD_NAMES",
    "REWARD_LOW",
    "REWARD_HIGH",
]
