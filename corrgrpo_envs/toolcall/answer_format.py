"""The RLLA (ToolRL) answer format: ``<think>``, ``<tool_call>`` and ``<response>`` blocks.

An answer looks like::

    <think> reasoning </think>
    <tool_call>
    {"name": "get_weather", "parameters": {"city": "Paris"}}
    {"name": "get_time", "parameters": {"timezone": "CET"}}
    </tool_call>
    <response> text for the user </response>

The tool-call block holds one JSON object per line. Only the text after the
first ``</think>`` is searched for tool calls and the response, so a reasoning
block that mentions ``<tool_call>`` does not count as a call. Parsing never
raises: problems go to :attr:`ParsedAnswer.errors`.

Parsing and the shape check take time linear in the answer: blocks are found
with ``str.find`` (:func:`corrgrpo_envs.toolcalls.tag_blocks`), with exactly
the results of the lazy regular expressions ``<tag>(.*?)</tag>`` they replace
(those rescan the rest of the answer from every unclosed tag: quadratic).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corrgrpo_envs.toolcalls import first_tag_block, load_json, tag_blocks

__all__ = [
    "ParsedAnswer",
    "parse_answer",
    "render_answer",
    "has_expected_shape",
    "MAX_LINE_ERRORS",
    "THINK_OPEN",
    "THINK_CLOSE",
    "TOOL_OPEN",
    "TOOL_CLOSE",
    "RESPONSE_OPEN",
    "RESPONSE_CLOSE",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<response>", "</response>"
#: Unreadable tool-call lines after which the rest of the calls is not read.
MAX_LINE_ERRORS = 16


@dataclass
class ParsedAnswer:
    """An answer split into its blocks.

    Attributes:
        think: the text of the leading ``<think>`` block (``None`` if there is none).
        tool_calls: the calls ``{"name", "parameters"}`` of every well-formed line
            of every ``<tool_call>`` block after the reasoning.
        num_tool_blocks: how many ``<tool_call>`` blocks were found.
        response: the text of the first ``<response>`` block (``None`` if none).
        errors: why some tool-call text could not be read (a line that is not a
            JSON object with a string ``name``, unbalanced tags); after
            ``MAX_LINE_ERRORS`` unreadable lines the remaining lines are not read.
    """

    think: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    num_tool_blocks: int = 0
    response: str | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def calls_readable(self) -> bool:
        """At least one ``<tool_call>`` block, and every line of every block is a call."""
        return self.num_tool_blocks > 0 and not self.errors


def _call_from_line(line: str) -> dict[str, Any] | str:
    obj, error = load_json(line)
    if error:
        return f"tool-call line {error}: {line[:60]!r}"
    if not isinstance(obj, dict):
        return "tool-call line is not a JSON object"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "tool call has no string 'name'"
    # "arguments" is the Hermes spelling; accept it so such answers are scored, not dropped.
    params = obj.get("parameters", obj.get("arguments", {}))
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return f"parameters of {name!r} are not a JSON object"
    return {"name": name, "parameters": params}


def _leading_think(text: str) -> tuple[str, str] | None:
    """``(reasoning, rest)`` when ``text`` starts (after whitespace) with a closed ``<think>`` block.

    ``str.lstrip`` strips exactly what the regular expression ``\\A\\s*`` skips.
    """
    stripped = text.lstrip()
    if not stripped.startswith(THINK_OPEN):
        return None
    end = stripped.find(THINK_CLOSE, len(THINK_OPEN))
    if end < 0:
        return None
    return stripped[len(THINK_OPEN) : end], stripped[end + len(THINK_CLOSE) :]


def _after_think(text: str) -> tuple[str | None, str]:
    leading = _leading_think(text)
    if leading is not None:
        return leading
    cut = text.find(THINK_CLOSE)
    return None, (text if cut < 0 else text[cut + len(THINK_CLOSE) :])


def parse_answer(text: Any) -> ParsedAnswer:
    """Split an answer into think / tool calls / response; never raises, linear time."""
    if not isinstance(text, str):
        return ParsedAnswer(None, errors=[f"answer must be a str, got {type(text).__name__}"])
    think, rest = _after_think(text)
    parsed = ParsedAnswer(think=think)
    blocks, leftover = tag_blocks(rest, TOOL_OPEN, TOOL_CLOSE)
    parsed.num_tool_blocks = len(blocks)
    for block in blocks:
        for line in block.splitlines():
            line = line.strip()
            if not line:
                continue
            call = _call_from_line(line)
            if isinstance(call, str):
                parsed.errors.append(call)
                # One error already makes the calls unreadable; a flood of bad lines costs no more.
                if len(parsed.errors) == MAX_LINE_ERRORS:
                    parsed.errors.append(f"stopped reading tool calls after {MAX_LINE_ERRORS} unreadable lines")
                    break
            else:
                parsed.tool_calls.append(call)
        if len(parsed.errors) > MAX_LINE_ERRORS:
            break
    if TOOL_OPEN in leftover or TOOL_CLOSE in leftover:
        parsed.errors.append("unbalanced <tool_call> tags")
    response = first_tag_block(leftover, RESPONSE_OPEN, RESPONSE_CLOSE)
    if response is not None:
        parsed.response = response.strip()
    return parsed


def has_expected_shape(text: str, expects_calls: bool, expects_response: bool) -> bool:
    """The format rule: ``<think>`` first, then exactly the expected blocks, nothing else.

    The tool-call block must have a newline right after ``<tool_call>`` and right
    before ``</tool_call>``. Whitespace around the answer and between blocks is
    allowed; tags inside the reasoning are its own business.
    """
    if not isinstance(text, str):
        return False
    leading = _leading_think(text)
    if leading is None:
        return False
    rest = leading[1]
    wanted = {
        THINK_OPEN: 0,
        THINK_CLOSE: 0,
        TOOL_OPEN: int(expects_calls),
        TOOL_CLOSE: int(expects_calls),
        RESPONSE_OPEN: int(expects_response),
        RESPONSE_CLOSE: int(expects_response),
    }
    if not all(rest.count(tag) == n for tag, n in wanted.items()):
        return False
    # Each tag occurs at most once now, so the blocks can be read off with find.
    rest = rest.lstrip()
    if expects_calls:
        if not rest.startswith(TOOL_OPEN):
            return False
        end = rest.find(TOOL_CLOSE)
        inner = rest[len(TOOL_OPEN) : end]
        # "\n.*?\n": two distinct newlines, one after the opening tag, one before the closing tag
        if end < 0 or len(inner) < 2 or inner[0] != "\n" or inner[-1] != "\n":
            return False
        rest = rest[end + len(TOOL_CLOSE) :].lstrip()
    if expects_response:
        if not rest.startswith(RESPONSE_OPEN):
            return False
        end = rest.find(RESPONSE_CLOSE)
        if end < 0:
            return False
        rest = rest[end + len(RESPONSE_CLOSE) :].lstrip()
    return rest == ""


def render_answer(
    calls: Sequence[Mapping[str, Any]] = (),
    response: str | None = None,
    think: str = "I should use the appropriate tools to answer the user.",
) -> str:
    """Write an answer in the RLLA format (calls as ``{"name", "parameters"}`` mappings)."""
    parts = [f"{THINK_OPEN} {think} {THINK_CLOSE}"]
    if calls:
        lines = [
            json.dumps({"name": c["name"], "parameters": dict(c.get("parameters", {}))}, ensure_ascii=False)
            for c in calls
        ]
        parts.append(TOOL_OPEN + "\n" + "\n".join(lines) + "\n" + TOOL_CLOSE)
    if response is not None:
        parts.append(f"{RESPONSE_OPEN} {response} {RESPONSE_CLOSE}")
    return "\n".join(parts)
