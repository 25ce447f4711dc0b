"""System prompts in the RLLA layout, and tool schemas read back out of them.

RLLA-4K and API-Bank rows carry their tools only inside the system prompt
(``N. Name: ...`` / ``Description: ...`` / ``Parameters: {...}``, JSON in RLLA,
a Python literal in API-Bank). :func:`tools_from_system_prompt` turns that list
into JSON schemas for the observation's ``tools``; :func:`system_prompt`
writes the same layout for tools given as schemas (generator, BFCL), with a
``Required: [...]`` line for a schema's required parameters.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["system_prompt", "tools_from_system_prompt", "dialogue_history", "PROMPT_FORMATS", "house_messages"]

_INTRO = (
    "You are a helpful multi-turn dialogue assistant that can call tools to solve the "
    "user's tasks and answer with structured chat responses."
)
_FORMAT = """**Steps for Each Turn**
1. **Think:** recall the context and work out the user's current goal.
2. **Decide on Tool Usage:** if tools are needed, choose them and their parameters.
3. **Respond Appropriately:** if a reply is needed, write one consistent with the dialogue.

**Output Format**
```plaintext
<think> Your thoughts and reasoning </think>
<tool_call>
{"name": "Tool name", "parameters": {"Parameter name": "Parameter content", "... ...": "... ..."}}
{"name": "... ...", "parameters": {"... ...": "... ...", "... ...": "... ..."}}
...
</tool_call>
<response> AI's final response </response>
```

**Important Notes**
1. Always start with the `<think>` block. Give at least one of `<tool_call>` or `<response>`, or both.
2. Several tool calls may go in one `<tool_call>` block, one JSON object per line, each with a "name" and a "parameters" dictionary (empty when the tool takes no parameters).
3. Use the dialogue history: the user's turns, earlier `<tool_call>` and `<response>` blocks, and tool results shown as `<obs>`."""


def _properties(tool: Mapping[str, Any]) -> dict[str, Any]:
    params = tool.get("parameters") or {}
    if isinstance(params, Mapping) and isinstance(params.get("properties"), Mapping):
        return dict(params["properties"])
    return dict(params) if isinstance(params, Mapping) else {}


def _required(tool: Mapping[str, Any]) -> list[str]:
    params = tool.get("parameters") or {}
    required = params.get("required") if isinstance(params, Mapping) else None
    return [r for r in required if isinstance(r, str)] if isinstance(required, list) else []


def system_prompt(
    tools: Sequence[Mapping[str, Any]], preamble: str = "", required: bool = True
) -> str:
    """The RLLA-layout system prompt for tools given as ``{"name", "description", "parameters"}``
    schemas.

    ``required``: a tool whose schema lists required parameters gets a ``Required: [...]`` line
    after its parameters (BFCL's checker rejects a call without them, so the model must see them).
    """
    lines = [_INTRO, ""]
    if preamble:
        lines += [preamble.strip(), ""]
    lines += ["**Available Tools**", "In your response, you can use the following tools:"]
    for i, tool in enumerate(tools, 1):
        lines.append(f"{i}. Name: {tool['name']}")
        lines.append(f"Description: {tool.get('description', '')}")
        lines.append(f"Parameters: {json.dumps(_properties(tool), ensure_ascii=False)}")
        if required and _required(tool):
            lines.append(f"Required: {json.dumps(_required(tool), ensure_ascii=False)}")
    return "\n".join(lines) + "\n\n" + _FORMAT


_TOOL_ENTRY = re.compile(
    r"^\d+\. Name: (?P<name>.*?)\nDescription: (?P<desc>.*?)\nParameters: (?P<params>.*?)$"
    r"(?:\nRequired: (?P<required>\[[^\n]*\])$)?",
    re.MULTILINE | re.DOTALL,
)
# API-Bank level 3 writes "N. ToolName: description" on one line.
_TOOL_ENTRY_SHORT = re.compile(
    r"^\d+\. (?P<name>[^:\n]+): (?P<desc>.*?)\nParameters: (?P<params>.*?)$",
    re.MULTILINE | re.DOTALL,
)


def _literal(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def tools_from_system_prompt(text: str) -> list[dict[str, Any]]:
    """JSON schemas of the tools an RLLA-layout system prompt lists (unreadable parameters give ``{}``)."""
    section = text.split("**Available Tools**", 1)
    if len(section) < 2:
        return []
    body = section[1].split("\n\n**", 1)[0]
    tools = []
    entries = list(_TOOL_ENTRY.finditer(body)) or list(_TOOL_ENTRY_SHORT.finditer(body))
    for m in entries:
        params = _literal(m.group("params").strip())
        props = params if isinstance(params, dict) else {}
        schema: dict[str, Any] = {"type": "object", "properties": props}
        written = m.groupdict().get("required")
        required = _literal(written) if written else None
        if isinstance(required, list) and all(isinstance(r, str) for r in required):
            schema["required"] = required
        tools.append({"name": m.group("name").strip(), "description": m.group("desc").strip(),
                      "parameters": schema})
    return tools


def dialogue_history(turns: Sequence[tuple[str, str]]) -> str:
    """The RLLA user message: ``**Dialogue Records History**`` then ``<role> text </role>`` turns.

    ``turns`` are ``(tag, text)`` with tag ``user``, ``response``, ``obs`` or ``raw``
    (``raw`` text, e.g. an earlier assistant answer, goes in unchanged).
    """
    out = ["**Dialogue Records History**"]
    for tag, text in turns:
        out.append(text if tag == "raw" else f"<{tag}> {text} </{tag}>")
    return "\n".join(out)


#: ``source``: each data set's prompts as it ships them; ``house``: every data set in this
#: module's RLLA layout (:func:`system_prompt` over the task's tool schemas, the dialogue as
#: :func:`dialogue_history`), so a model trained on one data set meets the same words on another.
PROMPT_FORMATS = ("source", "house")

_HISTORY_HEADER = "**Dialogue Records History**"
_HISTORY_TAGS = {"user": "user", "assistant": "response", "tool": "obs"}


def _own_text(system: str) -> str:
    """What a system message says besides an RLLA-layout prompt: all of it when it lists no
    tools; the preamble of a house prompt; nothing of another RLLA-layout prompt (its intro
    and format notes are what the house layout replaces)."""
    if "**Available Tools**" not in system:
        return system.strip()
    head = system.split("**Available Tools**", 1)[0]
    return head[len(_INTRO):].strip() if head.startswith(_INTRO) else ""


def house_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``messages`` in the house layout: one system message from :func:`system_prompt` (the
    tools, and any system text that is not already an RLLA-layout prompt as its preamble), then
    one user message holding the dialogue as :func:`dialogue_history`. A dialogue that already is
    a history (RLLA-4K, API-Bank, the generator) is kept word for word."""
    preamble = "\n".join(p for m in messages if m.get("role") == "system"
                         if (p := _own_text(str(m.get("content") or ""))))
    dialogue = [m for m in messages if m.get("role") != "system"]
    if len(dialogue) == 1 and str(dialogue[0].get("content") or "").startswith(_HISTORY_HEADER):
        user = str(dialogue[0]["content"])
    else:
        user = dialogue_history([(_HISTORY_TAGS.get(str(m.get("role")), "user"), str(m.get("content") or ""))
                                 for m in dialogue])
    return [{"role": "system", "content": system_prompt(tools, preamble)}, {"role": "user", "content": user}]
