"""Tool-call formats through agents, and the scripted policies."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo.agents import (
    Episode,
    RandomPolicy,
    ReferencePolicy,
    ToolCall,
    parse_hermes,
    parse_rlla,
    render_hermes,
    render_rlla,
)

JUNK = st.one_of(
    st.text(max_size=300),
    st.text(alphabet=st.sampled_from(list('<>/{}[]":,tool_call ')), max_size=200),
    st.builds(lambda a, b: f"<tool_call>{a}</tool_call>{b}", st.text(max_size=80), st.text(max_size=20)),
    st.builds(lambda a: f"<think>{a}</think><tool_call>\n{a}\n</tool_call><response>{a}", st.text(max_size=60)),
    st.none(),
    st.integers(),
    st.binary(max_size=30),
)


@settings(max_examples=300, deadline=None)
@given(JUNK)
def test_parsing_junk_never_raises(text):
    hermes = parse_hermes(text)
    rlla = parse_rlla(text)
    assert isinstance(hermes.errors, list) and isinstance(rlla.errors, list)
    if not isinstance(text, str):
        assert hermes.errors


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(alphabet="abcdefghij_", min_size=1, max_size=10),
            st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=10)), max_size=3),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_hermes_round_trip(calls):
    text = render_hermes([ToolCall(name, args) for name, args in calls], content="thinking")
    parsed = parse_hermes(text)
    assert parsed.ok and parsed.content == "thinking"
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == calls


def test_rlla_round_trip():
    calls = [{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]
    parsed = parse_rlla(render_rlla(calls, "Here it is.", think="look it up"))
    assert parsed.tool_calls == calls and parsed.response == "Here it is." and not parsed.errors


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "send_email",
            "parameters": {
                "type": "object",
                "properties": {"to": {"type": "string"}, "n": {"type": "integer"}, "urgent": {"type": "boolean"}},
            },
        },
    },
    {"name": "noop", "parameters": {}},
]


def test_random_policy_is_deterministic_and_calls_known_tools():
    obs = [{"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}] * 40
    a = [x.text for x in RandomPolicy(seed=3, tool_call_prob=0.5).act(obs)]
    b = [x.text for x in RandomPolicy(seed=3, tool_call_prob=0.5).act(obs)]
    assert a == b and a != [x.text for x in RandomPolicy(seed=4).act(obs)]
    parsed = [parse_hermes(t) for t in a if "<tool_call>" in t]
    assert 5 < len(parsed) < 35
    for p in parsed:
        assert p.ok and {c.name for c in p.tool_calls} <= {"send_email", "noop"}
        for c in p.tool_calls:
            if c.name == "send_email":
                assert isinstance(c.arguments["n"], int) and isinstance(c.arguments["urgent"], bool)
    no_tools = RandomPolicy(seed=0).act([{"messages": [], "tools": []}] * 5)
    assert all(x.text and "<tool_call>" not in x.text for x in no_tools)


def test_reference_policy_plays_turns_in_order():
    refs = {"single": ["the answer"], "multi": ["call 1", "call 2", "final"]}
    policy = ReferencePolicy(refs.__getitem__)
    obs = {"messages": [{"role": "user", "content": "go"}], "tools": []}
    episodes = [Episode(task_id="single"), Episode(task_id="multi")]
    texts = []
    for _ in range(4):
        texts.append([a.text for a in policy.act([obs, obs], episodes=episodes)])
    assert texts == [["the answer", "call 1"], ["the answer", "call 2"], ["the answer", "final"], ["the answer", "final"]]
    # without episodes, the turn is the number of assistant messages so far
    seen = {"messages": obs["messages"] + [{"role": "assistant", "content": "call 1"}], "tools": []}
    assert policy.act([seen], task_ids=["multi"])[0].text == "call 2"
    assert json.dumps(episodes[1].to_dict()["texts"]) == json.dumps(["call 1", "call 2", "final", "final"])
