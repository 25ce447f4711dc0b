"""Tool-call formats, re-exported from the environments so policies and envs agree.

* Hermes / Qwen: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
  (:func:`parse_hermes`, :func:`render_hermes`).
* RLLA (the tool-calling domain's answer format): ``<think>``, a ``<tool_call>``
  block of one JSON object per line, ``<response>`` (:func:`parse_rlla`,
  :func:`render_rlla`).

Parsing never raises; problems are reported in the result's ``errors``.
"""

from __future__ import annotations

from corrgrpo_envs.toolcall.answer_format import ParsedAnswer
from corrgrpo_envs.toolcall.answer_format import parse_answer as parse_rlla
from corrgrpo_envs.toolcall.answer_format import render_answer as render_rlla
from corrgrpo_envs.toolcalls import ParsedMessage, ToolCall, parse_hermes, render_hermes

__all__ = [
    "ToolCall",
    "ParsedMessage",
    "parse_hermes",
    "render_hermes",
    "ParsedAnswer",
    "parse_rlla",
    "render_rlla",
]
