"""Tool calls in assistant text: the Hermes / Qwen format.

A tool call is a JSON object inside ``<tool_call>`` tags::

    <tool_call>
    {"name": "send_email", "arguments": {"to": "a@b.c"}}
    </tool_call>

Several calls may follow each other in one message. Parsing never raises:
junk yields a :class:`ParsedMessage` with ``errors`` set, so environments can
decide how to answer a malformed turn.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolCall", "ParsedMessage", "parse_hermes", "render_hermes", "OPEN_TAG", "CLOSE_TAG"]

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN_TAG) + r"(.*?)" + re.escape(CLOSE_TAG), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments)}


@dataclass
class ParsedMessage:
    """An assistant message split into its free text and its tool calls.

    ``content`` is the text outside the tool-call blocks (stripped);
    ``errors`` lists what could not be parsed (empty when the message is well formed).
    """

    content: str
    tool_calls: list[ToolCall]
    errors: list[str]

    @property
    def ok(self) -> bool:
        return not self.errors


def _call_from_json(text: str) -> ToolCall | str:
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        return f"tool call is not valid JSON: {exc}"
    if not isinstance(obj, dict):
        return "tool call must be a JSON object"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "tool call has no string 'name'"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments JSON-encoded
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            return f"arguments of {name!r} are not a JSON object"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return f"arguments of {name!r} must be a JSON object"
    return ToolCall(name=name, arguments=args)


def parse_hermes(text: Any) -> ParsedMessage:
    """Parse Hermes-format tool calls out of ``text``; never raises."""
    if not isinstance(text, str):
        return ParsedMessage("", [], [f"message must be a str, got {type(text).__name__}"])
    calls: list[ToolCall] = []
    errors: list[str] = []
    for match in _BLOCK.finditer(text):
        result = _call_from_json(match.group(1).strip())
        if isinstance(result, str):
            errors.append(result)
        else:
            calls.append(result)
    rest = _BLOCK.sub("", text)
    if OPEN_TAG in rest or CLOSE_TAG in rest:
        errors.append("unbalanced <tool_call> tags")
    return ParsedMessage(content=rest.strip(), tool_calls=calls, errors=errors)


def render_hermes(calls: list[ToolCall] | list[dict[str, Any]], content: str = "") -> str:
    """Render calls (ToolCall or ``{"name", "arguments"}`` dicts) as a Hermes message."""
    parts = [content] if content else []
    for c in calls:
        d = c.to_dict() if isinstance(c, ToolCall) else {"name": c["name"], "arguments": c.get("arguments", {})}
        parts.append(f"{OPEN_TAG}\n{json.dumps(d, ensure_ascii=False)}\n{CLOSE_TAG}")
    return "\n".join(parts)
