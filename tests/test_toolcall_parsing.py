"""The linear-time tag scanning gives exactly what the lazy regular expressions gave.

The regular expressions below are the specification (they were the implementation until
they turned out quadratic on tag floods); the scanner must agree with them on any text.
"""

from __future__ import annotations

import re

import pytest
from cpu_budget import CpuBudget, least_cpu_seconds
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo_envs.toolcall.answer_format import MAX_LINE_ERRORS, has_expected_shape, parse_answer
from corrgrpo_envs.toolcall.rewards import score_answer
from corrgrpo_envs.toolcalls import (
    MAX_JSON_DEPTH,
    first_tag_block,
    json_depth_exceeds,
    load_json,
    parse_hermes,
    tag_blocks,
)

TOOL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
RESPONSE = re.compile(r"<response>(.*?)</response>", re.DOTALL)
THINK_FIRST = re.compile(r"\A\s*<think>(.*?)</think>", re.DOTALL)


def regex_shape(text: str, calls: bool, reply: bool) -> bool:
    match = THINK_FIRST.match(text)
    if not match:
        return False
    rest = text[match.end() :]
    pattern = ""
    if calls:
        pattern += r"\s*<tool_call>\n.*?\n</tool_call>"
    if reply:
        pattern += r"\s*<response>.*?</response>"
    if not re.fullmatch(pattern + r"\s*", rest, re.DOTALL):
        return False
    wanted = {"<think>": 0, "</think>": 0, "<tool_call>": int(calls), "</tool_call>": int(calls),
              "<response>": int(reply), "</response>": int(reply)}
    return all(rest.count(tag) == n for tag, n in wanted.items())


def regex_split(text: str) -> tuple[str | None, str]:
    match = THINK_FIRST.match(text)
    if match:
        return match.group(1), text[match.end() :]
    cut = text.find("</think>")
    return None, (text if cut < 0 else text[cut + len("</think>") :])


PIECES = st.sampled_from(
    ["<think>", "</think>", "<tool_call>", "</tool_call>", "<response>", "</response>", "\n", " ", "\t",
     "\u00a0", "\x1c", "\u2028", "x", '{"name": "f"}', '{"name": "f", "parameters": {"a": 1}}', "<tool_",
     "call>", "</", "<"]
)
SOUP = st.lists(PIECES, max_size=40).map("".join)


@settings(max_examples=600, deadline=None)
@given(SOUP)
def test_tag_blocks_equal_finditer_and_sub(text):
    blocks, outside = tag_blocks(text, "<tool_call>", "</tool_call>")
    assert blocks == [m.group(1) for m in TOOL.finditer(text)]
    assert outside == TOOL.sub("", text)
    found = RESPONSE.search(text)
    assert first_tag_block(text, "<response>", "</response>") == (found.group(1) if found else None)


@settings(max_examples=600, deadline=None)
@given(SOUP, st.booleans(), st.booleans())
def test_shape_rule_equals_the_regular_expression(text, calls, reply):
    assert has_expected_shape(text, calls, reply) == regex_shape(text, calls, reply)


@settings(max_examples=400, deadline=None)
@given(SOUP)
def test_parse_answer_equals_the_regular_expressions(text):
    think, rest = regex_split(text)
    parsed = parse_answer(text)
    assert parsed.think == think
    assert parsed.num_tool_blocks == len(TOOL.findall(rest))
    leftover = TOOL.sub("", rest)
    found = RESPONSE.search(leftover)
    assert parsed.response == (found.group(1).strip() if found else None)
    lines = [ln.strip() for b in TOOL.findall(rest) for ln in b.splitlines() if ln.strip()]
    unbalanced = "<tool_call>" in leftover or "</tool_call>" in leftover
    if len(parsed.errors) < MAX_LINE_ERRORS:  # else the rest of the lines is not read
        assert len(parsed.tool_calls) + len(parsed.errors) == len(lines) + unbalanced


def test_json_failures_become_errors():
    assert load_json('{"a": 1}') == ({"a": 1}, None)
    value, error = load_json('{"a": ' + "9" * 5000 + "}")  # over the int-string conversion limit
    assert value is None and error.startswith("is not valid JSON") and "digits" in error
    value, error = load_json("[" * 100_000 + "]" * 100_000)  # RecursionError inside json
    assert value is None and "nested" in error
    deep = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    assert load_json(deep) == (None, f"is nested deeper than {MAX_JSON_DEPTH} levels")
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert load_json(ok)[1] is None
    assert json_depth_exceeds([[[]]], 2) and not json_depth_exceeds([[[]]], 3)


def test_hermes_errors_and_call_limit():
    big = '<tool_call>{"name": "f", "arguments": {"a": ' + "1" * 5000 + "}}</tool_call>"
    parsed = parse_hermes(big)
    assert not parsed.tool_calls and parsed.errors[0].startswith("tool call is not valid JSON")
    nested = '<tool_call>{"name": "f", "arguments": "' + "[" * 3000 + '"}</tool_call>'
    assert parse_hermes(nested).errors == ["arguments of 'f' are not a JSON object"]
    calls = '<tool_call>{"name": "f"}</tool_call>' * 40
    parsed = parse_hermes(calls, max_calls=32)
    assert len(parsed.tool_calls) == 32
    assert parsed.errors == ["40 tool calls in one message, more than the 32 allowed"]
    assert parse_hermes(calls).ok and len(parse_hermes(calls).tool_calls) == 40


def test_reading_stops_after_many_unreadable_lines():
    answer = "<think> x </think>\n<tool_call>\n" + '{"name": "f"}\n' + "oops\n" * 1000 + '{"name": "g"}\n</tool_call>'
    parsed = parse_answer(answer)
    assert [c["name"] for c in parsed.tool_calls] == ["f"]
    assert len(parsed.errors) == MAX_LINE_ERRORS + 1
    assert parsed.errors[-1] == f"stopped reading tool calls after {MAX_LINE_ERRORS} unreadable lines"
    assert not parsed.calls_readable


def test_deeply_nested_value_scores_without_recursion():
    expected = [{"name": "f", "parameters": {"a": [[1]]}}]
    for depth in (60, 990, 5000):
        value = "[" * depth + "]" * depth
        answer = '<think> x </think>\n<tool_call>\n{"name": "f", "parameters": {"a": ' + value + "}}\n</tool_call>"
        score = score_answer(answer, expected, False)
        assert all(-1.5 <= v <= 1.5 for v in score.rewards.values())


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" * 18_000,
        "<think> x </think>\n" + "<tool_call>\n</tool_call>" * 4000 + "<response>" * 10_000,
        "<think> x </think>\n<tool_call>\n" + "\n</tool_call>" * 15_000,
    ],
)
def test_floods_parse_in_linear_time(text):
    def parse_all() -> None:
        parse_answer(text)
        parse_hermes(text)
        for calls in (False, True):
            for reply in (False, True):
                has_expected_shape(text, calls, reply)

    # linear parsing costs a few ms here; a lazy regular expression on these floods takes seconds
    budget = CpuBudget(9, "parsing a flood")  # ~0.1 s here
    _, seconds = least_cpu_seconds(lambda: None, parse_all, enough=budget.seconds)
    print(budget.describe(seconds))
    budget.check(seconds)
