"""Tool calls in assistant text: the Hermes / Qwen format, and the scanning both formats share.

A tool call is a JSON object inside ``<tool_call>`` tags::

    <tool_call>
    {"name": "send_email", "arguments": {"to": "a@b.c"}}
    </tool_call>

Several calls may follow each other in one message. Parsing never raises:
junk yields a :class:`ParsedMessage` with ``errors`` set, so environments can
decide how to answer a malformed turn.

Everything here runs in time linear in the text, whatever the text: tag blocks
are found with ``str.find`` from a moving cursor (a lazy ``open(.*?)close``
regular expression rescans the rest of the text from every unclosed tag, which
is quadratic in a flood of tags), and JSON is read by :func:`load_json`, which
turns every way ``json.loads`` can fail (syntax, integers longer than Python's
int-string conversion limit, nesting deep enough to raise ``RecursionError``)
into an error message, and rejects values nested deeper than
:data:`MAX_JSON_DEPTH` so that code walking a call recursively stays within the
interpreter's stack.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ToolCall",
    "ParsedMessage",
    "parse_hermes",
    "render_hermes",
    "tag_blocks",
    "first_tag_block",
    "load_json",
    "json_depth_exceeds",
    "MAX_JSON_DEPTH",
    "OPEN_TAG",
    "CLOSE_TAG",
]

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"

#: Deepest nesting of arrays/objects accepted in a tool call (real calls use a handful of levels).
MAX_JSON_DEPTH = 64


def tag_blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[str], str]:
    """The contents of the ``open_tag ... close_tag`` blocks of ``text`` and the text outside them.

    Blocks are what ``re.finditer(open(.*?)close, re.DOTALL)`` finds (leftmost,
    shortest, not overlapping), and the outside text is what ``re.sub`` leaves,
    but in linear time: once an opening tag has no closing tag after it, no
    later one has either, so the scan stops there.
    """
    blocks: list[str] = []
    outside: list[str] = []
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            break
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            break
        outside.append(text[pos:start])
        blocks.append(text[start + len(open_tag) : end])
        pos = end + len(close_tag)
    outside.append(text[pos:])
    return blocks, "".join(outside)


def first_tag_block(text: str, open_tag: str, close_tag: str) -> str | None:
    """The contents of the first ``open_tag ... close_tag`` block (``re.search`` of the lazy pattern), or None."""
    start = text.find(open_tag)
    if start < 0:
        return None
    end = text.find(close_tag, start + len(open_tag))
    return None if end < 0 else text[start + len(open_tag) : end]


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether arrays/objects in ``value`` nest more than ``limit`` levels (iterative: any depth is safe)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def load_json(text: str, max_depth: int = MAX_JSON_DEPTH) -> tuple[Any, str | None]:
    """``(value, None)`` for readable JSON, ``(None, why)`` otherwise (``why`` reads after "the text"); never raises.

    Besides syntax errors this catches integers longer than the int-string
    conversion limit (``ValueError``), nesting that exhausts the stack while
    decoding (``RecursionError``) and values nested deeper than ``max_depth``.
    """
    try:
        value = json.loads(text)
    except RecursionError:
        return None, "is nested too deeply"
    except ValueError as exc:  # JSONDecodeError, or an integer over the conversion limit
        return None, f"is not valid JSON: {str(exc)[:120]}"
    # Fewer brackets than the limit cannot nest past it: skip the walk for ordinary calls.
    if text.count("[") + text.count("{") > max_depth and json_depth_exceeds(value, max_depth):
        return None, f"is nested deeper than {max_depth} levels"
    return value, None


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
    obj, error = load_json(text)
    if error:
        return f"tool call {error}"
    if not isinstance(obj, dict):
        return "tool call must be a JSON object"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "tool call has no string 'name'"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments JSON-encoded
        args, error = load_json(args)
        if error:
            return f"arguments of {name!r} are not a JSON object"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return f"arguments of {name!r} must be a JSON object"
    return ToolCall(name=name, arguments=args)


def parse_hermes(text: Any, max_calls: int | None = None) -> ParsedMessage:
    """Parse Hermes-format tool calls out of ``text``; never raises, linear time.

    With ``max_calls``, only the first ``max_calls`` blocks are read; more blocks add
    one error saying how many there were (so a flood of calls costs neither JSON
    decoding nor tool executions downstream).
    """
    if not isinstance(text, str):
        return ParsedMessage("", [], [f"message must be a str, got {type(text).__name__}"])
    calls: list[ToolCall] = []
    errors: list[str] = []
    blocks, rest = tag_blocks(text, OPEN_TAG, CLOSE_TAG)
    for block in blocks if max_calls is None else blocks[:max_calls]:
        result = _call_from_json(block.strip())
        if isinstance(result, str):
            errors.append(result)
        else:
            calls.append(result)
    if max_calls is not None and len(blocks) > max_calls:
        errors.append(f"{len(blocks)} tool calls in one message, more than the {max_calls} allowed")
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
